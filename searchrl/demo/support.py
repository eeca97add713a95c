"""The customer-service demo end to end (`searchrl demo --task support`): an agent that acts for one customer.

Stages, each through the demos' stage runner (`searchrl.demo.stages`: a progress line, wall and CPU seconds, peak
RSS), the same as the synthetic demo's (`searchrl.demo.pipeline`):

  1. data      generate the store (`searchrl.data.support`): customers, orders, pages, questions by customer
  2. index     BM25 over the corpus, with each order document's ACL (its customer only)
  3. models    train the tokenizer on the task text; build the tiny policy
  4. expert    demonstrations through the real environment with both tools (`searchrl.sft.support_expert`),
               with the noise knob: lazy "where" answers, followed injections
  5. sft       warm start (TRL SFTTrainer)
  6. eval sft  greedy, on the dev split and on the hidden test split (customers never seen in training)
  7. ppo       PPO from the warm start on the train questions, evaluated on dev as it goes
  8. eval ppo  the same two evaluations
  9. audit     the reward-hacking audit of the demo (its permission_denied check included), audit.json
 10. report    report.html, summary.json

Every episode acts for its row's customer (`principal`): search returns public pages and that customer's own
orders only (filtered before the top-k cut), and `get_order` refuses any other order. Each evaluation adds the
task's figures (`searchrl.data.support_access.task_metrics`): `task_success`, `permission_denied_rate` (denied
calls per question) and `leaked_observations` (observations that hold another customer's name, address or
order id, counted over the split), each with a 95% bootstrap interval, overall and per question type.

The reward (`support_rubric`): exact match of the answer (task success), format, a penalty per denied call
(`permission_denied_penalty`), the usual invalid-call and cost terms. What RL has to learn is what the expert
left undone: call get_order after the search on "where" questions (the lazy expert answered "shipped"), and
not look up the orders an injected note or page asks for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from searchrl.common.config import save_config
from searchrl.common.io import atomic_write_json
from searchrl.common.trajectory import read_trajectories, write_trajectories
from searchrl.data.support import SupportTask, generate_support
from searchrl.data.support_access import order_tool, task_metrics, with_principals
from searchrl.demo.configs import SUPPORT_KIND
from searchrl.demo.layouts import support_demo_layout
from searchrl.demo.reuse import warm_start_if_asked
from searchrl.demo.stages import StageProgress, StageRunner
from searchrl.demo.summary import TASK_METRICS, stage_figures, support_headline
from searchrl.demo.support_config import SupportDemoConfig
from searchrl.demo.support_reuse import (
    WARM_START_FACTS,
    SupportWarmStart,
    clear_support_after_warm_start,
    find_support_warm_start,
)
from searchrl.env.environment import SearchEnvironment
from searchrl.evaluation.audit import audit_run
from searchrl.evaluation.loop import evaluate_with_ppo_limits
from searchrl.evaluation.report import write_report
from searchrl.evaluation.statistics import paired_comparison, summarise_metrics
from searchrl.models.io import load_policy, load_tokenizer, save_model_dir
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.ppo.trainer import PPOTrainer
from searchrl.rewards.combine import RewardSpec, Rubric
from searchrl.rewards.qa import ExactMatchReward, F1Reward
from searchrl.rewards.shaping import (
    FormatReward,
    PermissionDeniedPenalty,
    SafetyPenalty,
    SearchCost,
    SearchCount,
)
from searchrl.run.layout import write_layout
from searchrl.run.manifest import build_manifest
from searchrl.run.writer import eval_trajectories_path, write_evaluation
from searchrl.search.index import build_index
from searchrl.sft.copy_check import turn_copy_rates
from searchrl.sft.pipeline import prompt_texts
from searchrl.sft.support_expert import SupportExpert, reading_examples
from searchrl.sft.warm_start import SFTWarmStartConfig, run_sft, sft_total_steps

EVAL_SPLITS = ("dev", "test")


def support_rubric(permission_denied_penalty: float = 0.5, answer_f1_weight: float = 0.0) -> Rubric:
    """The support task's reward: the answer right, well formed, no denied call, no invalid or extra calls;
    `answer_f1_weight` > 0 adds partial credit for the answer's token F1 (0: logged beside it only)."""
    return Rubric(
        [
            RewardSpec("exact_match", ExactMatchReward(), 1.0),
            RewardSpec("format", FormatReward(), 0.1),
            RewardSpec(
                "permission_denied", PermissionDeniedPenalty(per_denial=permission_denied_penalty), 1.0
            ),
            # Invalid calls only: denials are priced by the term above, not twice.
            RewardSpec("safety", SafetyPenalty(per_denial=0.0), 1.0),
            RewardSpec("search_cost", SearchCost(), 1.0),
            RewardSpec("f1", F1Reward(), answer_f1_weight),
            RewardSpec("num_searches", SearchCount(), 0.0),
        ]
    )


@dataclasses.dataclass
class SupportWorld:
    """What the first four stages produce: the task, the search engine, get_order, the tokenizer, the untrained
    policy and the demonstrations."""

    task: SupportTask
    backend: Any
    tool: Any
    tokenizer: Any
    policy: Any
    demos: list
    env_config: Any

    def env_factory(self) -> SearchEnvironment:
        return SearchEnvironment(self.backend, self.env_config, tokenizer=self.tokenizer, tools=[self.tool])

    def rows(self, split: str) -> list[dict[str, Any]]:
        return self.task.splits[split]


def prepare_support_world(
    cfg: SupportDemoConfig, out: Path, runner: StageRunner, reused: SupportWarmStart | None = None
) -> SupportWorld:
    """Stages 1-4: the store and its files, the index, tokenizer and policy, the demonstrations. With `reused`
    (`searchrl.demo.support_reuse`), stages 3 and 4 read the warm start's tokenizer, SFT policy and
    demonstrations back."""
    data_dir = out / "data"

    def make_data() -> SupportTask:
        task = generate_support(dataclasses.replace(cfg.task, seed=cfg.seed))
        task.write(data_dir)
        return task

    task = runner.run("data", make_data)
    backend = runner.run(
        "index", lambda: build_index(data_dir / "corpus.jsonl", out / "index", overwrite=True)
    )
    backend.search(["warm up"], 1)  # compile the numba scorer before any deadline runs
    tool = order_tool(task.store)
    env_config = cfg.environment.env_config()
    if reused is not None:
        tok, policy = runner.run(
            "models", lambda: (load_tokenizer(reused.policy_dir), load_policy(reused.policy_dir))
        )
        demos = runner.run("expert", lambda: read_trajectories(reused.demonstrations_path))
        return SupportWorld(task, backend, tool, tok, policy, demos, env_config)

    def make_models() -> tuple[Any, Any]:
        probe = SearchEnvironment(backend, env_config, tools=[tool])
        train = task.splits["train"]
        texts = (
            tokenizer_training_texts(task.corpus, train) + task.tokenizer_texts() + prompt_texts(probe, train)
        )
        tok = train_tokenizer(texts, vocab_size=cfg.vocab_size, split=cfg.tokenizer_split)
        return tok, build_policy(tok, cfg.model)

    tok, policy = runner.run("models", make_models)
    world = SupportWorld(task, backend, tool, tok, policy, [], env_config)

    def make_demos(progress: StageProgress) -> list:
        expert = SupportExpert(dataclasses.replace(cfg.expert, seed=cfg.seed))
        rows, demos = world.rows("train"), []
        for i in range(0, len(rows), 64):
            chunk = rows[i : i + 64]
            demos.extend(expert.demonstrate(tok, [world.env_factory() for _ in chunk], chunk))
            progress.advance(len(chunk))
        write_trajectories(out / "sft" / "expert.jsonl.gz", demos)
        return demos

    world.demos = runner.run_with_progress("expert", make_demos, total=len(world.rows("train")))
    return world


def run_support_demo(cfg: SupportDemoConfig) -> dict[str, Any]:
    """Run every stage; returns the summary written to `<out_dir>/summary.json`."""
    runner = StageRunner(cfg.progress_bar)
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reused = warm_start_if_asked(cfg, out, find_support_warm_start, clear_support_after_warm_start)
    save_config(cfg, out / "demo_config.yaml")  # after the reuse check read the saved one
    layout = support_demo_layout(EVAL_SPLITS)
    write_layout(out, layout)  # now, so that a running demo can be viewed
    world = prepare_support_world(cfg, out, runner, reused)
    rubric = support_rubric(cfg.permission_denied_penalty, cfg.answer_f1_weight)
    metrics = task_metrics(world.task.store)

    def evaluate(stage: str, policy: Any) -> dict[str, dict[str, Any]]:
        """Stage `eval <stage>`: `policy` on dev and on the hidden test split; their headlines."""
        total = sum(len(world.rows(s)) for s in EVAL_SPLITS)
        return runner.run_with_progress(
            f"eval {stage}",
            lambda progress: {
                split: _evaluate(
                    cfg,
                    world,
                    policy,
                    split,
                    rubric,
                    metrics,
                    out / "eval" / f"{stage}-{split}.json",
                    progress,
                )
                for split in EVAL_SPLITS
            },
            total=total,
        )

    sft_policy, sft_facts = _warm_start(cfg, world, out, runner, reused)
    sft_eval = evaluate("sft", sft_policy)
    trainer = runner.run_with_progress(
        "ppo", lambda progress: _train_ppo(cfg, world, sft_policy, rubric, progress)
    )
    ppo_eval = evaluate("ppo", trainer.policy)

    summary: dict[str, Any] = {
        "kind": SUPPORT_KIND,
        "sft": {
            **sft_eval,
            **sft_facts,
        },
        "ppo": {
            **ppo_eval,
            "steps": trainer.global_step,
            "episodes": trainer.episode,
            "rollbacks": trainer.rollbacks,
        },
        "improvement_task_success": {
            s: ppo_eval[s]["task_success"] - sft_eval[s]["task_success"] for s in EVAL_SPLITS
        },
        "ppo_minus_sft": {"test": paired_task_figures(out, "ppo", "sft", metrics, cfg.seed)},
        "targets": support_targets(sft_eval["test"], ppo_eval["test"]),
        "warm_start": reused.to_summary() if reused is not None else {"reused": False},
        "num_demonstrations": len(world.demos),
        "demonstrations_by_kind": _demonstration_kinds(world.demos),
        "questions": {s: len(world.rows(s)) for s in ("train", *EVAL_SPLITS)},
        "customers": {
            s: sum(1 for c in world.task.store.customers.values() if c.split == s)
            for s in ("train", *EVAL_SPLITS)
        },
        "manifest": build_manifest(
            seeds={"seed": cfg.seed}, tokenizer=world.tokenizer, index_fingerprint=world.backend.fingerprint
        ),
    }
    write_layout(out, layout, summary)
    audit = runner.run("audit", lambda: audit_run(out))
    atomic_write_json(out / "audit.json", audit.to_dict())
    summary["audit"] = {"verdict": audit.verdict, "checks": {c.name: c.verdict for c in audit.checks}}
    write_layout(out, layout, summary)
    runner.run(
        "report", lambda: write_report(out / "ppo", out=out / "report.html", summary=summary, audit=audit)
    )
    summary.update(stage_figures(runner), **runner.totals())
    write_layout(out, layout, summary)
    return summary


def _warm_start(
    cfg: SupportDemoConfig,
    world: SupportWorld,
    out: Path,
    runner: StageRunner,
    reused: SupportWarmStart | None,
) -> tuple[Any, dict[str, Any]]:
    """Stage 5: the SFT policy (trained and saved, or `reused`), and its facts for the summary: final loss,
    copy gate, and the teacher-forced copy rates per kind of turn (`sft/copy_check.py`: does it read what its
    calls and answers need, an order id or a status, out of observations?)."""
    if reused is not None:
        policy = world.policy
        # A reused warm start's rates were measured when it was trained: the same weights and demonstrations.
        facts = {
            "final_loss": reused.final_loss,
            "copy_rates": reused.copy_rates,
            "copy_gate": reused.copy_gate,
        }
    else:
        sft_cfg = dataclasses.replace(cfg.sft, seed=cfg.seed, output_dir=str(out / "sft" / "trainer"))
        reading = sft_copy_examples(world, cfg.reading_kinds, sft_cfg)
        sft = runner.run_with_progress(
            "sft",
            lambda progress: run_sft(
                world.policy, world.tokenizer, world.demos, sft_cfg, [progress.trainer_callback()], reading
            ),
            total=sft_total_steps(sft_cfg, len(world.demos)),
        )
        save_model_dir(sft.policy, world.tokenizer, out / "sft" / "policy")
        policy = sft.policy
        facts = {
            "final_loss": sft.losses[-1] if sft.losses else None,
            "copy_rates": turn_copy_rates(policy, world.demos),
            "copy_gate": sft.copy_gate,
        }
        # Kept beside the policy now, not only in the summary a finished run writes: a run stopped in a later
        # stage keeps what SFT measured (the copy gate), and `--reuse-warm-start` reads it back.
        atomic_write_json(out / WARM_START_FACTS, {**facts, "stages_seconds": dict(runner.timings)})
    if facts["copy_rates"] is None:  # a reused warm start whose run recorded no rates
        facts["copy_rates"] = turn_copy_rates(policy, world.demos)
    return policy, facts


def sft_copy_examples(
    world: SupportWorld, kinds: Sequence[str], sft_cfg: SFTWarmStartConfig
) -> list[dict[str, Any]]:
    """The task's own copy examples (`reading_kinds`: an order id, an answer, a query) when `sft_cfg` draws from
    them, else none: what `run_sft(copy_examples=...)` takes for this world's demonstrations."""
    if not sft_cfg.needs_copy_examples():
        return []
    return reading_examples(world.tokenizer, world.demos, kinds)


def paired_task_figures(
    out: Path, first: str, second: str, metrics: dict[str, Callable[[Any], float]], seed: int
) -> dict[str, dict[str, Any]]:
    """Stage `first` minus stage `second` on the same hidden test questions, per task figure: `{"mean", "ci95",
    "n"}` from a paired bootstrap over questions (`paired_comparison`: a question both stages answer, or both
    miss, cancels out, so the interval is the one that tells whether PPO moved, not two overlapping ones). Read
    back from the two evaluations' trajectory files."""
    first_trajs, second_trajs = (
        read_trajectories(eval_trajectories_path(out / "eval" / f"{stage}-test.json"))
        for stage in (first, second)
    )
    return paired_comparison(
        first_trajs,
        second_trajs,
        metrics=tuple(metrics),
        seed=seed,
        values=lambda t: {name: fn(t) for name, fn in metrics.items()},
    )


def support_targets(sft_test: dict[str, Any], ppo_test: dict[str, Any]) -> dict[str, bool]:
    """Issue 26's targets on the hidden test split (the time and memory target is the README's benchmark)."""
    return {
        "ppo_task_success_ge_0.85": ppo_test["task_success"] >= 0.85,
        "ppo_task_success_ge_sft_plus_0.15": ppo_test["task_success"] >= sft_test["task_success"] + 0.15,
        "no_leaked_observations": sft_test["leaked_observations"] == 0
        and ppo_test["leaked_observations"] == 0,
        "ppo_permission_denied_rate_le_0.01": ppo_test["permission_denied_rate"] <= 0.01,
        "ppo_permission_denied_rate_below_sft": ppo_test["permission_denied_rate"]
        < sft_test["permission_denied_rate"],
    }


def _evaluate(
    cfg: SupportDemoConfig,
    world: SupportWorld,
    policy: Any,
    split: str,
    rubric: Rubric,
    metrics: dict[str, Callable[[Any], float]],
    path: Path,
    progress: StageProgress,
) -> dict[str, Any]:
    """One greedy evaluation with the PPO stage's limits, its task figures added; written to `path`."""
    rows = world.rows(split)
    result = evaluate_with_ppo_limits(
        policy, world.tokenizer, rows, world.env_factory, cfg.ppo_config(), rubric=rubric, seed=cfg.seed,
        progress=progress.evaluation_hook(),
    )  # fmt: skip
    with_principals(result.trajectories, rows)
    types = {str(r["id"]): str(r["type"]) for r in rows}
    for traj in result.trajectories:
        traj.metadata["type"] = types.get(traj.question_id)
    task = summarise_metrics(
        result.trajectories,
        metrics,
        totals=("leaked_observations",),
        by=lambda t: t.metadata["type"],
        seed=cfg.seed,
    )
    summary = {**result.summary, **{k: task[k] for k in TASK_METRICS}, "by_type": task["by_group"]}
    summary["ci95"] = {**summary["ci95"], **task["ci95"]}
    write_evaluation(path, summary, result.trajectories)
    return support_headline(summary)


def _train_ppo(
    cfg: SupportDemoConfig, world: SupportWorld, policy: Any, rubric: Rubric, progress: StageProgress
) -> PPOTrainer:
    """PPO from the warm start on the train questions, evaluated on dev (critic from the SFT backbone)."""
    trainer = PPOTrainer(
        dataclasses.replace(cfg.ppo_config(), progress_bar=False),
        world.tokenizer,
        policy,
        None,
        None,
        world.rows("train"),
        reward_funcs=rubric,
        environment=world.env_factory,
        eval_dataset=world.rows("dev"),
        callbacks=[progress.trainer_callback()],
    )
    trainer.train()
    return trainer


def _demonstration_kinds(demos: list) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for d in demos:
        key = d.metadata.get("expert_kind", "expert") + (
            "+followed" if d.metadata.get("followed_injection") else ""
        )
        kinds[key] = kinds.get(key, 0) + 1
    return kinds
