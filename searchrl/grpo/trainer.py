"""GRPO through TRL 1.16's `GRPOTrainer` on the same environment, rewards and run directory as PPO.

Why: users ask whether PPO's critic is worth it. The honest answer needs GRPO trained on the same task,
with the same rubric, the same episode budget and the same evaluation, so this module wires TRL's
trainer to our pieces rather than writing another GRPO. Two modes:

- ``trl_loop``: TRL's own tool loop. Our `searchrl.env.trl_adapter.SearchToolEnv` is the
  `environment_factory`; TRL re-prefills the history every tool turn and runs calls row by row.
- ``our_rollout``: our batched engine (`searchrl.rollout.HFGenerator`) is the `rollout_func`. It
  returns `prompt_ids`, `completion_ids`, `logprobs` and `env_mask` (0 on every observation and
  template-glue token, TRL's tool-mask meaning), one batched search per turn, one KV cache, no
  re-prefill. The Trajectories travel to the reward function as an extra field.

Either way `RubricReward` scores a real `Trajectory` with our `Rubric` (in ``trl_loop`` it is rebuilt
from TRL's token ids, tool mask and completion messages plus the environment instances TRL passes as
`environments=`), and logs the breakdown and the environment's tool statistics through TRL's
`log_metric`. `RunDirCallback` writes the run directory the PPO trainer writes: `metrics.jsonl`
(with `episode` and wall-clock seconds per step), `eval/step-N.json` with `eval/exact_match` (the same
greedy dev evaluation as `PPOTrainer.evaluate`), `trajectories/step-N.jsonl.gz` and
`checkpoints/step-N/policy`.

`SearchGRPOTrainer` is TRL's class with one read-only hook: it remembers the batch rows (the
`rollout_func` contract passes only the prompts, and our environments need `golds` and `id`) and the
token-level output of `_generate` (TRL does not pass its tool mask to reward functions). Nothing in
TRL's algorithm is changed. With compact prompts (`tool_schema_in_prompt: false`) `hide_tool_schemas`
empties TRL's per-environment schema list so that its prompts carry no tool section either.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func/environment_factory warnings

import torch
from transformers import TrainerCallback
from transformers.utils import get_json_schema

from searchrl.common.config import ConfigError, save_config
from searchrl.common.io import append_jsonl, atomic_write_json, atomic_write_text
from searchrl.common.run import RunDir, build_manifest
from searchrl.env.environment import EnvConfig, SearchEnvironment
from searchrl.env.protocol import parse_turn
from searchrl.env.trl_adapter import SearchToolEnv
from searchrl.grpo.config import GRPORunConfig
from searchrl.rewards.combine import Rubric, default_rubric, load_rubric, mean_breakdown
from searchrl.rewards.qa import exact_match, f1_score
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.rollout.stats import termination_stats, tool_stats
from searchrl.rollout.trajectory import Span, ToolCallRecord, Trajectory, write_trajectories
from searchrl.search.base import Backend

try:  # TRL is a hard dependency; the import is here so the error names what to install
    from trl import GRPOTrainer
except ImportError as exc:  # pragma: no cover
    raise ImportError("searchrl.grpo needs trl>=1.16 (pip install 'trl>=1.16')") from exc

# Dataset columns handed to TRL (and back to our environments); nested row fields stay out of Arrow.
ROW_COLUMNS = ("id", "question", "golds")


# ---------------------------------------------------------------------------------------------
# Settings shared by both modes
# ---------------------------------------------------------------------------------------------


def env_config_for(cfg: GRPORunConfig) -> EnvConfig:
    """The environment settings of a run: the same budgets PPO's `searchrl train` uses."""
    return EnvConfig(
        max_turns=cfg.max_turns,
        max_tool_calls=cfg.max_tool_calls,
        max_total_tokens=cfg.max_episode_tokens,
        max_observation_tokens=max(16, cfg.max_observation_tokens),
        topk=cfg.topk,
        tool_timeout_s=cfg.search_timeout_s,
        system_prompt=cfg.system_prompt,
        tool_schema_in_prompt=cfg.tool_schema_in_prompt,
    )


def generation_config_for(cfg: GRPORunConfig, temperature: float | None = None) -> GenerationConfig:
    return GenerationConfig(
        temperature=cfg.temperature if temperature is None else temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        max_new_tokens_per_turn=cfg.max_new_tokens_per_turn,
        max_episode_tokens=cfg.max_episode_tokens,
        seed=cfg.seed,
    )


def prompt_dataset(rows: Sequence[dict[str, Any]], backend: Backend, env_config: EnvConfig) -> Any:
    """A conversational `datasets.Dataset`: `prompt` = the environment's [system, user] messages.

    The prompt is what `SearchEnvironment.reset` shows, so TRL's loop and our engine start from the same
    messages (TRL renders the tool schema of `SearchToolEnv.search`, our engine the environment's).
    """
    from datasets import Dataset

    env = SearchEnvironment(backend, env_config)
    out = []
    for i, row in enumerate(rows):
        if "question" not in row or "golds" not in row:
            raise ValueError(f"training row {i} needs 'question' and 'golds', got keys {sorted(row)}")
        clean = {
            "id": str(row.get("id", i)),
            "question": str(row["question"]),
            "golds": [str(g) for g in row["golds"]],
        }
        out.append({"prompt": env.reset(clean), **clean})
    return Dataset.from_list(out)


def tool_env_factory(backend: Backend, env_config: EnvConfig, tokenizer: Any) -> Callable[[], SearchToolEnv]:
    """TRL's `environment_factory` for `trl_loop`: `SearchToolEnv` whose `search` schema is our env's.

    TRL renders the tool schema from the method's signature and docstring (`get_json_schema`). The
    adapter's own `search(query)` renders differently from `SearchEnvironment.tools` (no `k`, other
    descriptions), so a policy warm-started on our engine's prompts would see other prompt tokens in
    TRL's loop. This subclass builds `search(query, k)` whose docstring reproduces the environment's
    schema exactly (checked here), so both modes and the SFT warm start share one prompt.
    """
    # The schema is rendered from the full registry even for compact prompts: TRL still needs a typed tool.
    schema = SearchEnvironment(backend, replace(env_config, tool_schema_in_prompt=True)).tools
    if len(schema) != 1 or schema[0]["function"]["name"] != "search":
        raise ValueError(f"trl_loop supports exactly one tool, 'search'; the environment offers {schema}")
    function = schema[0]["function"]
    args = "".join(
        f"    {name}: {prop.get('description', name)}\n"
        for name, prop in function["parameters"]["properties"].items()
    )

    # No return annotation: transformers would add a "return" entry the environment's schema lacks.
    def search(self, query: str, k: int = env_config.topk):  # noqa: ANN001, ANN202
        env = self.environment
        if env.row is None:
            env.reset({"question": "(no question given)"})
        if env.done:
            return f"Error: the episode has ended ({env.termination}); no more searches. Answer now."
        return env.call_tool("search", {"query": query, "k": k})[1]

    search.__doc__ = f"{function['description']}\n\nArgs:\n{args}"
    env_class = type(
        "SearchToolEnvGRPO", (SearchToolEnv,), {"search": search, "__doc__": SearchToolEnv.__doc__}
    )
    rendered = get_json_schema(env_class.search)
    if rendered != schema[0]:
        raise RuntimeError(f"TRL would render the search tool as {rendered}, the environment as {schema[0]}")

    def factory() -> SearchToolEnv:
        # failure_penalty 0: the rubric alone is the reward, exactly as for PPO and our_rollout.
        return env_class(backend, env_config, tokenizer, failure_penalty=0.0)

    return factory


# ---------------------------------------------------------------------------------------------
# The trainer: TRL's, plus the hook that remembers the batch
# ---------------------------------------------------------------------------------------------


class SearchGRPOTrainer(GRPOTrainer):
    """TRL 1.16's `GRPOTrainer`, remembering each generation batch's rows and token-level output."""

    current_inputs: list[dict[str, Any]] | None = None
    last_generation: dict[str, Any] | None = None

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self.current_inputs = inputs
        return super()._generate_and_score_completions(inputs)

    def _generate(self, prompts: list) -> Any:
        out = super()._generate(prompts)
        prompt_ids, completion_ids, tool_mask, _completions, logprobs = out[:5]
        self.last_generation = {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "tool_mask": tool_mask,
            "logprobs": logprobs,
        }
        return out


# ---------------------------------------------------------------------------------------------
# our_rollout: the batched engine as TRL's rollout_func
# ---------------------------------------------------------------------------------------------


class EngineRollout:
    """`rollout_func(prompts, trainer)`: one batched multi-turn rollout of our engine per generation batch.

    Returns per row `prompt_ids`, `completion_ids` (actions and observations, exactly the trajectory's
    tokens after the prompt), `logprobs` (the sampling logprobs, 0.0 on observation tokens), `env_mask`
    (the trajectory's action mask after the prompt: 0 on every observation/glue token) and `trajectory`.
    """

    def __init__(
        self,
        tokenizer: Any,
        env_factory: Callable[[], SearchEnvironment],
        generation_config: GenerationConfig,
    ) -> None:
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.generation_config = generation_config
        self.calls = 0
        self.last_stats: dict[str, float] = {}
        self._generator: HFGenerator | None = None

    def _generator_for(self, model: Any, config: GenerationConfig) -> HFGenerator:
        """One engine for the whole run (it caches the template glue); the model and seed follow the trainer."""
        if self._generator is None or self._generator.model is not model:
            self._generator = HFGenerator(model, self.tokenizer, config)
        else:
            self._generator.config = config
        return self._generator

    def __call__(self, prompts: list[Any], trainer: SearchGRPOTrainer) -> dict[str, Any]:
        rows = trainer.current_inputs
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError(
                "EngineRollout needs the batch rows: use SearchGRPOTrainer (it records them) as the trainer"
            )
        model = trainer.accelerator.unwrap_model(trainer.model)
        # A new seed per generation batch: the same seed would repeat the same samples every step.
        config = replace(self.generation_config, seed=self.generation_config.seed * 1_000_003 + self.calls)
        self.calls += 1
        generator = self._generator_for(model, config)
        env_rows = [{k: row[k] for k in ROW_COLUMNS if k in row} for row in rows]
        batch = generator.rollout([self.env_factory() for _ in rows], env_rows)
        self.last_stats = dict(batch.stats)
        trajectories = batch.trajectories
        return {
            "prompt_ids": [t.input_ids[: t.prompt_length] for t in trajectories],
            "completion_ids": [t.input_ids[t.prompt_length :] for t in trajectories],
            "logprobs": [t.logprobs[t.prompt_length :] for t in trajectories],
            "env_mask": [t.action_mask[t.prompt_length :] for t in trajectories],
            "trajectory": trajectories,
        }


# ---------------------------------------------------------------------------------------------
# trl_loop: a Trajectory rebuilt from what TRL's loop produced and what our environment recorded
# ---------------------------------------------------------------------------------------------


def spans_from_mask(prompt_length: int, mask: Sequence[int]) -> list[Span]:
    """Prompt span, then alternating action (mask 1) and observation (mask 0) runs of the completion."""
    spans = [Span("prompt", 0, prompt_length, "")]
    start = prompt_length
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start - prompt_length]:
            kind = "action" if mask[start - prompt_length] else "observation"
            spans.append(Span(kind, start, prompt_length + i, ""))
            start = prompt_length + i
    return spans


# How TRL's loop reports a call it could not dispatch (unknown argument, exception before our method ran).
TRL_TOOL_ERROR_PREFIX = "{'error':"


def unexecuted_call_records(completion: Sequence[dict[str, Any]]) -> list[ToolCallRecord]:
    """The calls of a TRL rollout that never reached our environment, as our environment would record them.

    So the rubric scores the same text the same way in both modes:
    - a `<tool_call>` TRL's parser rejected (TRL falls back to plain text and ends the episode; our
      environment records it as ``malformed``), found by parsing each assistant message's text;
    - a call TRL parsed but could not dispatch (its tool message holds TRL's ``{'error': ...}``), which
      our environment would have rejected as ``invalid_arguments``.
    """
    records: list[ToolCallRecord] = []
    turn_index = -1
    for message in completion:
        content = message.get("content")
        if message.get("role") == "assistant":
            turn_index += 1
            if isinstance(content, str) and content:
                turn = parse_turn(content)
                for problem in turn.malformed:
                    records.append(
                        ToolCallRecord("", {}, status="malformed", error=problem, turn_index=turn_index)
                    )
                for call in turn.tool_calls:  # well-formed for us, yet TRL did not run it
                    records.append(
                        ToolCallRecord(
                            call.name,
                            dict(call.arguments),
                            status="malformed",
                            error="not a tool call TRL's parser accepts",
                            turn_index=turn_index,
                        )
                    )
        elif (
            message.get("role") == "tool"
            and isinstance(content, str)
            and content.startswith(TRL_TOOL_ERROR_PREFIX)
        ):
            records.append(
                ToolCallRecord(
                    str(message.get("name", "")),
                    {},
                    status="invalid_arguments",
                    error=content,
                    turn_index=turn_index,
                )
            )
    return records


def _termination(final: dict[str, Any], answered: bool, ended_with_eos: bool) -> str:
    if final.get("tool_calls"):
        # The loop stopped with a call it never ran: the iteration cap, or the token budget rolled it back.
        return "max_turns" if ended_with_eos else "token_budget"
    if answered:
        return "answered"
    return "no_answer" if ended_with_eos else "token_budget"


def trajectory_from_trl(
    row: dict[str, Any],
    prompt: list[dict[str, Any]],
    completion: list[dict[str, Any]],
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    tool_mask: Sequence[int] | None,
    logprobs: Sequence[float] | None,
    env: SearchEnvironment,
    eos_token_id: int,
    index: int = 0,
) -> Trajectory:
    """The Trajectory of one TRL tool-loop rollout, so the rubric scores exactly what it scores for PPO."""
    mask = [int(m) for m in (tool_mask if tool_mask is not None else [1] * len(completion_ids))]
    assistant = [m for m in completion if m.get("role") == "assistant"]
    final = assistant[-1] if assistant else {"role": "assistant", "content": ""}
    final_text = final.get("content") or ""
    final_text = final_text if isinstance(final_text, str) else str(final_text)
    turn = parse_turn(final_text)
    answered = turn.answer is not None and not final.get("tool_calls")
    n_prompt = len(prompt_ids)
    lps = list(logprobs) if logprobs is not None else [0.0] * len(completion_ids)
    ended_with_eos = bool(completion_ids) and int(completion_ids[-1]) == int(eos_token_id)
    return Trajectory(
        id=f"{row.get('id', index)}#{index}",
        question_id=str(row.get("id", index)),
        question=str(row.get("question", env.question)),
        golds=list(row.get("golds", []) or []),
        input_ids=[int(i) for i in prompt_ids] + [int(i) for i in completion_ids],
        action_mask=[0] * n_prompt + mask,
        logprobs=[0.0] * n_prompt + [float(x) if m else 0.0 for x, m in zip(lps, mask, strict=False)],
        prompt_length=n_prompt,
        spans=spans_from_mask(n_prompt, mask),
        messages=list(prompt) + list(completion),
        tool_calls=[*env.records, *unexecuted_call_records(completion)],
        observations=list(env.observations),
        retrieved=dict(env.retrieved),
        answer=turn.answer if answered else None,
        citations=list(turn.citations) if answered else [],
        final_text=final_text,
        num_turns=len(assistant),
        termination=_termination(final, answered, ended_with_eos),
        metadata={"trainer": "grpo", "mode": "trl_loop"},
    )


# ---------------------------------------------------------------------------------------------
# The reward: our Rubric behind TRL's reward-function signature
# ---------------------------------------------------------------------------------------------


class RubricReward:
    """TRL reward function scoring each completion's Trajectory with a `Rubric`; logs breakdown and tools.

    our_rollout: the trajectories arrive as the `trajectory` extra field of `EngineRollout`.
    trl_loop: they are rebuilt (`trajectory_from_trl`) from the trainer's last generation and the
    `environments=` TRL passes. Training-batch trajectories are kept for the run directory until
    `pop_trajectories()`.
    """

    def __init__(self, rubric: Rubric, tokenizer: Any) -> None:
        self.__name__ = "rubric"  # TRL names the reward column after it
        self.rubric = rubric
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.trainer: SearchGRPOTrainer | None = None
        self.episodes = 0
        self._pending: list[Trajectory] = []

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        trajectory: list[Trajectory] | None = None,
        environments: list[Any] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **row_columns: Any,
    ) -> list[float]:
        trajs = (
            list(trajectory) if trajectory is not None else self._rebuild(prompts, completions, environments)
        )
        scores = [float(self.rubric.score(t)[0]) for t in trajs]
        if log_metric is not None:
            for name, value in self.batch_metrics(trajs).items():
                log_metric(name, value)
        if self.trainer is None or self.trainer.model.training:
            self.episodes += len(trajs)
            self._pending.extend(trajs)
        return scores

    @staticmethod
    def batch_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
        """Reward breakdown, the environment's tool statistics and terminations, batch means."""
        out = dict(mean_breakdown(trajs))
        out.update(tool_stats(trajs))
        out.update(termination_stats(trajs))
        out["answer/exact_match"] = sum(exact_match(t.answer or "", t.golds) for t in trajs) / max(
            1, len(trajs)
        )
        return out

    def pop_trajectories(self) -> list[Trajectory]:
        out, self._pending = self._pending, []
        return out

    def _rebuild(
        self, prompts: list[Any], completions: list[Any], environments: list[Any] | None
    ) -> list[Trajectory]:
        trainer = self.trainer
        if trainer is None or trainer.last_generation is None or environments is None:
            raise RuntimeError(
                "RubricReward got no trajectories: in trl_loop mode bind it to a SearchGRPOTrainer "
                "(reward.trainer = trainer) and use our SearchToolEnv environment_factory"
            )
        gen = trainer.last_generation
        rows = trainer.current_inputs or [{} for _ in prompts]
        trajs = []
        for i, (prompt, completion, env) in enumerate(zip(prompts, completions, environments, strict=True)):
            trajs.append(
                trajectory_from_trl(
                    rows[i],
                    prompt,
                    completion,
                    gen["prompt_ids"][i],
                    gen["completion_ids"][i],
                    gen["tool_mask"][i] if gen["tool_mask"] is not None else None,
                    gen["logprobs"][i] if gen["logprobs"] is not None else None,
                    env.environment,
                    self.eos_token_id,
                    index=i,
                )
            )
        return trajs


# ---------------------------------------------------------------------------------------------
# Evaluation: the same greedy dev rollout as PPOTrainer.evaluate, with our engine for both modes
# ---------------------------------------------------------------------------------------------


class DevEvaluator:
    """EM / F1 / searches / reward on dev rows with our engine; writes `RUN/eval/step-N.json`."""

    def __init__(
        self,
        run: RunDir,
        tokenizer: Any,
        env_factory: Callable[[], SearchEnvironment],
        rows: Sequence[dict[str, Any]],
        rubric: Rubric,
        generation_config: GenerationConfig,
        batch_size: int,
    ) -> None:
        self.run = run
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.rows = [{k: r[k] for k in ROW_COLUMNS if k in r} for r in rows]
        self.rubric = rubric
        self.generation_config = generation_config
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, model: Any, step: int, extra: dict[str, float] | None = None) -> dict[str, float]:
        if not self.rows:
            return {}
        trajs: list[Trajectory] = []
        for i in range(0, len(self.rows), self.batch_size):
            chunk = self.rows[i : i + self.batch_size]
            config = replace(self.generation_config, seed=self.generation_config.seed + i)
            generator = HFGenerator(model, self.tokenizer, config)
            trajs.extend(generator.rollout([self.env_factory() for _ in chunk], chunk).trajectories)
        n = len(trajs)
        out = {
            "eval/exact_match": sum(exact_match(t.answer or "", t.golds) for t in trajs) / n,
            "eval/f1": sum(f1_score(t.answer or "", t.golds) for t in trajs) / n,
            "eval/searches_per_question": sum(len(t.tool_calls) for t in trajs) / n,
            "eval/reward": sum(self.rubric.evaluate(t)[0] for t in trajs) / n,
        }
        atomic_write_json(self.run.eval / f"step-{step}.json", {"step": step, **(extra or {}), **out})
        return out


# ---------------------------------------------------------------------------------------------
# The run directory: metrics.jsonl, eval/, trajectories/, checkpoints/ (the PPO trainer's layout)
# ---------------------------------------------------------------------------------------------


class RunDirCallback(TrainerCallback):
    """Appends TRL's logs to `metrics.jsonl` with `step`, `episode` and wall-clock seconds; evaluates
    every `eval_steps`, saves every `save_steps` and at the end, writes each step's trajectories.

    `time/train_s` is wall-clock time minus the time spent in evaluation: the x axis of the
    side-by-side plots, so a trainer is not charged for how often it was evaluated.
    """

    def __init__(self, cfg: GRPORunConfig, run: RunDir, reward: RubricReward, evaluator: DevEvaluator | None):
        self.cfg = cfg
        self.run = run
        self.reward = reward
        self.evaluator = evaluator
        self.trainer: SearchGRPOTrainer | None = None
        self.started = time.perf_counter()
        self.eval_s = 0.0
        self.pending_eval: dict[str, float] = {}
        self.last_saved_step = -1

    # -- clocks -----------------------------------------------------------------------------------
    def clock(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        return {"time/elapsed_s": elapsed, "time/train_s": elapsed - self.eval_s}

    def _model(self) -> Any:
        assert self.trainer is not None, "RunDirCallback.trainer must be set to the trainer it logs"
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def _evaluate(self, step: int) -> None:
        if self.evaluator is None:
            return
        t0 = time.perf_counter()
        model = self._model()
        was_training = model.training
        results = self.evaluator(model, step, extra={"episode": self.reward.episodes, **self.clock()})
        model.train(was_training)
        self.eval_s += time.perf_counter() - t0
        self.pending_eval.update(results)

    # -- events -----------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()
        self.eval_s = 0.0
        # A fresh run (GRPO runs do not resume): no lines from an earlier run in the same directory.
        atomic_write_text(self.run.metrics, "")
        if self.cfg.eval_on_start:
            self._evaluate(0)
            append_jsonl(self.run.metrics, {"step": 0, "episode": 0, **self.clock(), **self.pending_eval})
            self.pending_eval = {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        trajs = self.reward.pop_trajectories()
        if self.cfg.save_trajectories and trajs:
            for t in trajs:
                t.metadata["step"] = step
            write_trajectories(self.run.trajectories / f"step-{step:06d}.jsonl.gz", trajs)
        if self.cfg.eval_steps and step % self.cfg.eval_steps == 0:
            self._evaluate(step)
        if self.cfg.save_steps and step % self.cfg.save_steps == 0:
            self.save_checkpoint(step)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        numbers = {k: v for k, v in (logs or {}).items() if isinstance(v, int | float)}
        line = {"step": int(state.global_step), "episode": self.reward.episodes, **self.clock(), **numbers}
        line.update(self.pending_eval)
        self.pending_eval = {}
        append_jsonl(self.run.metrics, line)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if self.last_saved_step != step:
            self.save_checkpoint(step)

    # -- checkpoints: a temporary folder renamed into place, `trainer_state.json` marks completion ---
    def save_checkpoint(self, step: int) -> Path:
        final = self.run.checkpoint_dir(step)
        tmp = final.with_name(f".tmp-{final.name}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        model = self._model()
        model.save_pretrained(tmp / "policy")
        assert self.trainer is not None
        self.trainer.processing_class.save_pretrained(tmp / "policy")
        atomic_write_json(
            tmp / "trainer_state.json",
            {"global_step": step, "episode": self.reward.episodes, "trainer": "grpo", "mode": self.cfg.mode},
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self.last_saved_step = step
        return final


# ---------------------------------------------------------------------------------------------
# Assembly
# ---------------------------------------------------------------------------------------------


def _check_reference_model_source(cfg: GRPORunConfig, model: Any) -> None:
    """TRL reloads the reference from `config._name_or_path` when beta > 0 (trl.md §2.7): it must be local."""
    if cfg.beta == 0:
        return
    source = getattr(model.config, "_name_or_path", "") or ""
    if not (Path(source) / "config.json").is_file():
        raise ConfigError(
            f"beta={cfg.beta}: TRL reloads the reference model from the policy's config._name_or_path "
            f"({source!r}), which is not a local model directory. Save the policy with save_pretrained and "
            "load it from that directory (searchrl.models.tiny.load_policy), or set beta: 0."
        )


def hide_tool_schemas(trainer: SearchGRPOTrainer) -> None:
    """Compact prompts in TRL's loop: render no tool section, exactly as our engine does.

    TRL renders (and parses) with the per-environment schema list `_env_tools` and dispatches calls
    through a separate name -> method table, so emptying the schema list changes only the prompt text
    (and makes argument parsing untyped JSON); the `search` tool is still callable. Tested by comparing
    TRL's prompt ids with the engine's.
    """
    env_tools = getattr(trainer, "_env_tools", None)
    if not isinstance(env_tools, dict):
        raise RuntimeError("this TRL version has no GRPOTrainer._env_tools; use tool_schema_in_prompt: true")
    for name in env_tools:
        env_tools[name] = []


def build_grpo_trainer(
    cfg: GRPORunConfig,
    model: Any,
    tokenizer: Any,
    backend: Backend,
    train_rows: Sequence[dict[str, Any]],
    eval_rows: Sequence[dict[str, Any]] | None = None,
    rubric: Rubric | None = None,
    callbacks: list[Any] | None = None,
) -> SearchGRPOTrainer:
    """A ready-to-train `SearchGRPOTrainer` for `cfg.mode`, with config.yaml and manifest.json written.

    The trainer carries `.run` (the `RunDir`), `.rubric_reward` and `.run_callback`.
    """
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise ValueError("the tokenizer needs a pad token distinct from EOS (Qwen2.5: <|endoftext|>)")
    _check_reference_model_source(cfg, model)
    rubric = rubric if rubric is not None else default_rubric()
    run = RunDir(cfg.output_dir)
    env_config = env_config_for(cfg)

    def search_env() -> SearchEnvironment:
        return SearchEnvironment(backend, env_config, tokenizer=tokenizer)

    reward = RubricReward(rubric, tokenizer)
    evaluator = None
    if eval_rows and (cfg.eval_steps or cfg.eval_on_start):
        evaluator = DevEvaluator(
            run,
            tokenizer,
            search_env,
            list(eval_rows)[: cfg.num_eval_questions],
            rubric,
            generation_config_for(cfg, temperature=cfg.eval_temperature),
            cfg.eval_batch_size,
        )
    run_callback = RunDirCallback(cfg, run, reward, evaluator)
    mode_kwargs: dict[str, Any]
    if cfg.mode == "trl_loop":
        mode_kwargs = {"environment_factory": tool_env_factory(backend, env_config, tokenizer)}
    else:
        mode_kwargs = {"rollout_func": EngineRollout(tokenizer, search_env, generation_config_for(cfg))}
    trainer = SearchGRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=cfg.to_trl_args(cuda_available=torch.cuda.is_available()),
        train_dataset=prompt_dataset(train_rows, backend, env_config),
        processing_class=tokenizer,
        callbacks=[run_callback, *(callbacks or [])],
        **mode_kwargs,
    )
    if cfg.mode == "trl_loop" and not cfg.tool_schema_in_prompt:
        hide_tool_schemas(trainer)
    reward.trainer = trainer
    run_callback.trainer = trainer
    trainer.run = run  # type: ignore[attr-defined]
    trainer.rubric_reward = reward  # type: ignore[attr-defined]
    trainer.run_callback = run_callback  # type: ignore[attr-defined]
    save_config(cfg, run.config)
    run.write_manifest(
        build_manifest(
            seeds={"seed": cfg.seed},
            tokenizer=tokenizer,
            generation_config=asdict(generation_config_for(cfg)),
            index_fingerprint=getattr(backend, "fingerprint", None),
            extra={
                "trainer": "grpo",
                "mode": cfg.mode,
                "num_generations": cfg.num_generations,
                "beta": cfg.beta,
                "loss_type": cfg.loss_type,
                "episodes_per_step": cfg.episodes_per_step,
                "max_steps": cfg.num_steps,
            },
        )
    )
    return trainer


def open_search_backend(cfg: GRPORunConfig) -> Backend:
    """The run's search engine: a local index directory or a `searchrl serve` URL."""
    if cfg.index_dir:
        from searchrl.search.index import load_index

        return load_index(cfg.index_dir)
    if cfg.search_url:
        from searchrl.search.client import HTTPBackend

        return HTTPBackend(cfg.search_url, token=os.environ.get("SEARCHRL_SERVE_TOKEN"))
    raise ConfigError(
        "no search backend: set index_dir (from `searchrl index`) or search_url (`searchrl serve`)"
    )


def run_grpo(cfg: GRPORunConfig) -> Path:
    """Train GRPO as `cfg` says and return the run directory (what the demo's side-by-side reads)."""
    from searchrl.data.datasets import load_qa
    from searchrl.models.tiny import load_policy, load_tokenizer

    if not cfg.policy_model_path:
        raise ConfigError(
            "policy_model_path: set it to the starting policy's directory (e.g. the SFT output)"
        )
    if not cfg.train_file:
        raise ConfigError("train_file: set it to the training questions (JSONL with question and golds)")
    torch.manual_seed(cfg.seed)
    tokenizer = load_tokenizer(cfg.tokenizer_path or cfg.policy_model_path)
    model = load_policy(cfg.policy_model_path)
    model.train()
    backend = open_search_backend(cfg)
    rubric = load_rubric(cfg.reward_config_path) if cfg.reward_config_path else default_rubric()
    train_rows = load_qa(cfg.train_file)
    eval_rows = load_qa(cfg.dev_file) if cfg.dev_file else None
    trainer = build_grpo_trainer(cfg, model, tokenizer, backend, train_rows, eval_rows, rubric)
    trainer.train()
    return cfg.run_dir
