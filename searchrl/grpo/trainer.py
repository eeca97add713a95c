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
`log_metric`, with the stability kit's likelihood monitors (`searchrl.common.health`, PPO's names) from the
rollouts' sampling logprobs; TRL's `entropy` is logged under PPO's `objective/entropy_per_token` too.
`RunDirCallback` writes the run directory the PPO trainer writes, through the same run layer
(`searchrl.common.run`: `Cadence`, `BestCheckpoint`, `RunDir`): `metrics.jsonl` (with `episode` and the
clocks), `eval/step-N.json` from the dev loop every trainer shares
(`evaluation.evaluate.evaluate_during_training`), `trajectories/step-N.jsonl.gz`, `samples.jsonl`,
`best_checkpoint.json` and `checkpoints/step-N/` (`policy/`, TRL's optimizer/scheduler/RNG/trainer state
in `trl/`, our `trainer_state.json`), pruned by `save_total_limit`.

Resume (`build_grpo_trainer(..., resume=True)`, `run_grpo(cfg, resume=True)`, `searchrl grpo --resume`)
is TRL's `resume_from_checkpoint` on that `trl/` folder (weights from `policy/`), plus what TRL does not
know: the episode count, `our_rollout`'s per-batch sampling seed, both clocks and the run directory's
history after the checkpoint. `EpochRepeatSampler` makes TRL's data order depend on the epoch alone, so
a resumed run replays the uninterrupted run bit for bit on CPU (tested in both modes).

`SearchGRPOTrainer` is TRL's class with read-only hooks: it remembers the batch rows (the `rollout_func`
contract passes only the prompts, and our environments need `golds` and `id`) and the token-level output
of `_generate` (TRL does not pass its tool mask to reward functions), and saves and loads our checkpoint
layout; each private method it overrides says why no public hook would do. Nothing in TRL's algorithm is
changed. With compact prompts (`tool_schema_in_prompt: false`) `hide_tool_schemas` empties TRL's
per-environment schema list so that its prompts carry no tool section either.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func/environment_factory warnings

import torch
from transformers import TrainerCallback
from transformers.utils import get_json_schema

from searchrl.common.clock import TrainingClock
from searchrl.common.config import ConfigError, save_config
from searchrl.common.health import likelihood_metrics, trajectory_logprobs
from searchrl.common.io import atomic_write_json, atomic_write_text
from searchrl.common.run import BestCheckpoint, Cadence, RunDir, build_manifest
from searchrl.common.trajectory import Span, ToolCallRecord, Trajectory
from searchrl.env.environment import EnvConfig, SearchEnvironment
from searchrl.env.protocol import parse_turn
from searchrl.env.trl_adapter import SearchToolEnv
from searchrl.evaluation.evaluate import evaluate_during_training, generation_config_from_ppo
from searchrl.grpo.config import GRPORunConfig
from searchrl.models.forward_patches import remove_trainer_forward_patches, shares_storage
from searchrl.rewards.combine import Rubric, default_rubric, load_rubric, mean_breakdown
from searchrl.rewards.qa import exact_match
from searchrl.rollout.chat import ChatTokenMeter
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.rollout.stats import termination_stats, tool_stats
from searchrl.search.base import Backend

try:  # TRL is a hard dependency; the import is here so the error names what to install
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler
except ImportError as exc:  # pragma: no cover
    raise ImportError("searchrl.grpo needs trl>=1.16 (pip install 'trl>=1.16')") from exc

# Dataset columns handed to TRL (and back to our environments); nested row fields stay out of Arrow.
ROW_COLUMNS = ("id", "question", "golds")


# ---------------------------------------------------------------------------------------------
# Settings shared by both modes
# ---------------------------------------------------------------------------------------------


def env_config_for(cfg: GRPORunConfig) -> EnvConfig:
    """The environment of a run: its environment section's one mapping (`EnvironmentSection.env_config`)."""
    return cfg.env_config()


def generation_config_for(cfg: GRPORunConfig, temperature: float | None = None) -> GenerationConfig:
    """The rollout limits of a run: `generation_config_from_ppo`, PPO's own mapping (the same sections)."""
    config = generation_config_from_ppo(cfg)
    return config if temperature is None else replace(config, temperature=temperature)


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

    # The token budget counts each tool result as TRL inserts it: the template's glue included.
    meter = ChatTokenMeter(tokenizer) if tokenizer is not None else None

    def factory() -> SearchToolEnv:
        # failure_penalty 0: the rubric alone is the reward, exactly as for PPO and our_rollout.
        return env_class(backend, env_config, tokenizer, failure_penalty=0.0, meter=meter)

    return factory


# ---------------------------------------------------------------------------------------------
# The trainer: TRL's, plus the hook that remembers the batch
# ---------------------------------------------------------------------------------------------


class EpochRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` with `set_epoch`: epoch e's shuffle is the same in a fresh and a resumed run.

    TRL's sampler draws each epoch's permutation from one generator seeded once, so a resumed run (a new
    sampler) would replay epoch 0's order where the killed run was at epoch e. `set_epoch(e)` (called by
    transformers' training loop before every epoch) reseeds and skips e permutations: exactly the order
    TRL's own sampler gives a run that never stopped.
    """

    def set_epoch(self, epoch: int) -> None:
        if not self.shuffle or self.seed is None:
            return
        self.generator.manual_seed(self.seed)
        for _ in range(epoch):
            torch.randperm(self.num_samples, generator=self.generator)


class SearchGRPOTrainer(GRPOTrainer):
    """TRL 1.16's `GRPOTrainer`, remembering each generation batch's rows and token-level output, with our
    run directory's checkpoints. Nothing in TRL's algorithm is changed.

    Public hooks first: `train` (resume from `resume_checkpoint`) and `training_step` (the batch rows) are
    transformers' documented overridables. Four private methods remain, each because no public hook gives
    what it needs (TRL 1.16, transformers 5); each says why.
    """

    current_inputs: list[dict[str, Any]] | None = None
    last_generation: dict[str, Any] | None = None
    resume_checkpoint: Path | None = None
    run_callback: RunDirCallback | None = None

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        if resume_from_checkpoint is None and self.resume_checkpoint is not None:
            resume_from_checkpoint = str(self.resume_checkpoint)
            saved = self.run_callback.resume_state if self.run_callback is not None else None
            done = int(saved["global_step"]) if saved else 0
            if done >= self.args.max_steps:
                # Already at its budget. transformers would still run one step past max_steps when resumed
                # there (it checks the budget after a step), so there is nothing to call.
                from transformers.trainer_utils import TrainOutput

                return TrainOutput(done, 0.0, {})
            # TRL counts micro-steps (`_step`) to decide when to generate and which buffered slice to train
            # on; transformers' resume restores the global step but TRL's counter starts at 0 and has no
            # setter, so set it to where the killed run was.
            self._step = done * self.args.gradient_accumulation_steps
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        # The generation batch's rows: `rollout_func(prompts, trainer)` gets only the prompts, and our
        # environments need each row's `golds` and `id` (rows with the same question may differ in them).
        self.current_inputs = inputs
        return super().training_step(model, inputs, num_items_in_batch)

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        # Private, because transformers builds the sampler inside `get_train_dataloader` with no hook: TRL's
        # `RepeatSampler` draws epoch e's order from a generator seeded once, so a resumed run (a new sampler)
        # would replay epoch 0's order; `EpochRepeatSampler.set_epoch` makes the order depend on the epoch.
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is not RepeatSampler:  # pragma: no cover - a TRL version with another sampler
            return sampler
        return EpochRepeatSampler(
            data_source=sampler.data_source,
            mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size,
            repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
        )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # Private, because `on_save` fires only after transformers has written its own `checkpoint-N/` (the
        # weights a second time, no atomic completion marker, pruned by its own rules): our layout instead,
        # `RUN/checkpoints/step-N/` written atomically and pruned by the run layer (`RunDirCallback`).
        if self.run_callback is None:
            raise RuntimeError(
                "SearchGRPOTrainer saves through its RunDirCallback; build it with build_grpo_trainer"
            )
        self.run_callback.save_checkpoint(int(self.state.global_step))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        # Private, because transformers loads the weights from `resume_from_checkpoint` itself: ours keep
        # TRL's optimizer/scheduler/RNG/state files in `step-N/trl/` and the weights once, in `step-N/policy/`
        # (a loadable model directory), so point it there.
        policy = Path(resume_from_checkpoint).parent / "policy"
        source = policy if (policy / "config.json").is_file() else Path(resume_from_checkpoint)
        super()._load_from_checkpoint(str(source), model)

    def _generate(self, prompts: list) -> Any:
        # Private, because TRL hands reward functions the completion ids but not the prompt ids, the tool mask
        # or the sampling logprobs, which `trl_loop` needs to rebuild each rollout as a `Trajectory`.
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
        citations=[env.resolve_citation(c) for c in turn.citations] if answered else [],
        final_text=final_text,
        num_turns=len(assistant),
        termination=_termination(final, answered, ended_with_eos),
        metadata={"trainer": "grpo", "mode": "trl_loop", "sampling_logprobs": logprobs is not None},
    )


# ---------------------------------------------------------------------------------------------
# The reward: our Rubric behind TRL's reward-function signature
# ---------------------------------------------------------------------------------------------


def sampling_likelihood_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The stability kit's likelihood monitors (`searchrl.common.health`, PPO's names) from the sampling
    logprobs each rollout returned: our engine's in `our_rollout`, TRL's generation's in `trl_loop` when it
    has them (vLLM; TRL's transformers generation returns none, and those episodes are left out)."""
    sampled = [t for t in trajs if t.metadata.get("sampling_logprobs", True)]
    if not sampled:
        return {}
    logprobs, mask = trajectory_logprobs(sampled)
    correct = [
        t.answer is not None and bool(t.golds) and bool(exact_match(t.answer, t.golds)) for t in sampled
    ]
    return likelihood_metrics(logprobs, mask, correct)


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
        out.update(sampling_likelihood_metrics(trajs))
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
# The run directory: metrics.jsonl, eval/, trajectories/, checkpoints/ (the PPO trainer's layout)
# ---------------------------------------------------------------------------------------------

# TRL's names for what PPO logs under the stability kit's names (both are kept in metrics.jsonl).
TRL_TO_PPO_NAMES = {"entropy": "objective/entropy_per_token"}


class RunDirCallback(TrainerCallback):
    """Writes the run directory through the run layer (`searchrl.common.run`), on the same cadence as PPO.

    TRL's logs go to `metrics.jsonl` with `step`, `episode` and the clocks (`Cadence`: every
    `logging_steps`, and always a step that evaluated or ended the run); the dev evaluation runs every
    `eval_steps` and at the last step (`eval/step-N.json`); checkpoints every `save_steps`, at the end and
    on each new best `best_metric` (`BestCheckpoint`, never pruned; `save_total_limit` prunes the rest);
    each step's trajectories, and text samples `num_sample_generations` times over the run.

    `time/train_s` is wall-clock time minus the time spent in evaluation: the x axis of the side-by-side
    plots, so a trainer is not charged for how often it was evaluated.

    A resumed run (`resume_state`, our `trainer_state.json` of the checkpoint) keeps the run directory's
    history up to the checkpoint's step and drops what the killed run wrote after it (metrics lines,
    eval files, trajectory files), so no step is missing or written twice; `episode`, the best checkpoint
    and both clocks continue from the checkpoint's values.
    """

    def __init__(
        self,
        cfg: GRPORunConfig,
        run: RunDir,
        reward: RubricReward,
        evaluate: Callable[[Any], dict[str, float]] | None,
    ):
        self.cfg = cfg
        self.run = run
        self.reward = reward
        self.evaluate = evaluate  # model -> dev metrics (`evaluate_during_training` on the dev rows)
        self.trainer: SearchGRPOTrainer | None = None
        self.rollout: EngineRollout | None = None  # our_rollout: its batch counter seeds the sampling
        self.resume_state: dict[str, Any] | None = None
        self.cadence = Cadence(
            cfg.num_steps, cfg.logging_steps, cfg.eval_steps, cfg.save_steps, cfg.num_sample_generations
        )
        self.best = BestCheckpoint(run, cfg.best_metric)
        self.best_pending = False  # this step's evaluation is a new best: record its checkpoint when saved
        self.training_clock = TrainingClock()
        self.pending_eval: dict[str, float] = {}
        self.last_saved_step = -1

    # -- clocks -----------------------------------------------------------------------------------
    def clock(self) -> dict[str, float]:
        return self.training_clock.reading()

    def _tokenizer(self) -> Any:
        assert self.trainer is not None, "RunDirCallback.trainer must be set to the trainer it logs"
        return self.trainer.processing_class

    def _model(self) -> Any:
        assert self.trainer is not None, "RunDirCallback.trainer must be set to the trainer it logs"
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def _evaluate(self, step: int) -> None:
        if self.evaluate is None:
            return
        model = self._model()
        was_training = model.training
        with self.training_clock.evaluating() as clock:
            results = self.evaluate(model)
        model.train(was_training)
        self.run.write_eval(step, {"episode": self.reward.episodes, **clock, **results})
        self.pending_eval.update(results)
        self.best_pending = self.best.improves(step, results) or self.best_pending

    # -- events -----------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.resume_state is not None:
            self._continue(self.resume_state)
            return
        self.training_clock = TrainingClock()
        self.training_clock.start()
        # A fresh run: no lines from an earlier run in the same directory.
        atomic_write_text(self.run.metrics, "")
        if self.cfg.eval_on_start:
            self._evaluate(0)
            self.run.log_metrics({"step": 0, "episode": 0, **self.clock(), **self.pending_eval})
            self.pending_eval = {}
            if self.best_pending:  # the starting policy itself may stay the best of the run
                self.save_checkpoint(0)

    def _continue(self, saved: dict[str, Any]) -> None:
        """Resume: the history up to the checkpoint stays, the killed run's later steps go, clocks go on."""
        step = int(saved["global_step"])
        self.run.truncate_after(step)
        eval_s = float(saved.get("eval_s", 0.0))
        self.training_clock = TrainingClock(float(saved.get("elapsed_s", 0.0)) - eval_s, eval_s)
        self.training_clock.start()
        self.best.restore(saved.get("best"))
        self.last_saved_step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        trajs = self.reward.pop_trajectories()
        if self.cfg.save_trajectories and trajs:
            for t in trajs:
                t.metadata["step"] = step
            self.run.write_step_trajectories(step, trajs)
        if trajs and self.cadence.should_sample(step):
            self.run.write_samples(step, trajs, self._tokenizer())
        if self.cadence.should_evaluate(step):
            self._evaluate(step)
        # Set here, acted on by transformers right after this event: the log line first, then the checkpoint
        # (SearchGRPOTrainer._save_checkpoint), so a checkpoint never lacks its own step in metrics.jsonl.
        if self.cadence.should_log(step, self.pending_eval):
            control.should_log = True
        if self.cadence.should_save(step) or self.best_pending:
            control.should_save = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        numbers = {k: v for k, v in (logs or {}).items() if isinstance(v, int | float)}
        numbers.update({ours: numbers[trl] for trl, ours in TRL_TO_PPO_NAMES.items() if trl in numbers})
        line = {"step": int(state.global_step), "episode": self.reward.episodes, **self.clock(), **numbers}
        line.update(self.pending_eval)
        self.pending_eval = {}
        self.run.log_metrics(line)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if self.last_saved_step != step:
            self.save_checkpoint(step)

    # -- checkpoints: a temporary folder renamed into place, `trainer_state.json` marks completion ---
    def save_checkpoint(self, step: int) -> Path:
        """`step-N/policy` (weights + tokenizer), `step-N/trl` (TRL's optimizer, scheduler, RNG and trainer
        state, what `resume_from_checkpoint` reads), and our `step-N/trainer_state.json` last; then the best
        is named and old checkpoints pruned (`save_total_limit`, never the newest or the best)."""
        final = self.run.write_checkpoint(step, lambda folder: self._fill_checkpoint(folder, step))
        if self.best_pending:
            self.best_pending = False
            self.best.record(final)
        self.run.prune_checkpoints(self.cfg.save_total_limit, {final, self.best.checkpoint})
        self.last_saved_step = step
        return final

    def _fill_checkpoint(self, folder: Path, step: int) -> None:
        model = self._model()
        model.save_pretrained(folder / "policy")
        trainer = self.trainer
        assert trainer is not None
        trainer.processing_class.save_pretrained(folder / "policy")
        trl_dir = folder / "trl"
        trl_dir.mkdir()
        # transformers' own pieces of `Trainer._save_checkpoint`, minus the weights (saved above, once). Private
        # methods of transformers' Trainer: the public `save_model` writes weights only, and nothing public
        # writes the optimizer, scheduler, scaler and RNG states that `resume_from_checkpoint` reads.
        trainer._save_optimizer_and_scheduler(str(trl_dir))
        trainer._save_scaler(str(trl_dir))
        trainer._save_rng_state(str(trl_dir))
        trainer.state.save_to_json(str(trl_dir / "trainer_state.json"))
        clock = self.clock()
        atomic_write_json(
            folder / "trainer_state.json",
            {
                "global_step": step,
                "episode": self.reward.episodes,
                "trainer": "grpo",
                "mode": self.cfg.mode,
                **clock,
                "elapsed_s": clock["time/elapsed_s"],
                "eval_s": self.training_clock.eval_seconds,
                "rollout_calls": self.rollout.calls if self.rollout is not None else 0,
                "best": self.best.best,
            },
        )


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


def _check_reference_matches_policy(trainer: Any, model: Any) -> None:
    """TRL's reference (reloaded from disk) must be the policy GRPO starts from, weight for weight.

    A policy changed in memory after it was loaded (an in-process SFT) would otherwise be regularised
    towards the stale weights on disk; and the reference must not share storage with the policy.
    """
    ref = getattr(trainer, "ref_model", None)
    if ref is None:
        return
    ref = trainer.accelerator.unwrap_model(ref)
    if shares_storage(ref, model):
        raise RuntimeError("GRPO's reference model shares storage with the policy (a bug; please report)")
    ref_state = ref.state_dict()
    differ = [
        name
        for name, value in model.state_dict().items()
        if name in ref_state and not torch.equal(ref_state[name].to(value.device, value.dtype), value)
    ]
    if differ:
        raise ConfigError(
            f"beta={trainer.beta}: TRL loaded the reference from {model.config._name_or_path!r}, but the policy "
            f"you passed has other weights ({len(differ)} tensors differ, e.g. {differ[0]}): it was changed "
            "after it was loaded. Save the policy (save_pretrained) and load it from that directory, or set beta: 0."
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
    resume: bool = False,
) -> SearchGRPOTrainer:
    """A ready-to-train `SearchGRPOTrainer` for `cfg.mode`, with config.yaml and manifest.json written.

    The trainer carries `.run` (the `RunDir`), `.rubric_reward` and `.run_callback`. With `resume=True`
    and a complete checkpoint in `cfg.output_dir`, `trainer.train()` continues from the newest one
    (`resume_state`); without a checkpoint the run starts fresh, as `searchrl train --resume` does.
    """
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise ValueError("the tokenizer needs a pad token distinct from EOS (Qwen2.5: <|endoftext|>)")
    _check_reference_model_source(cfg, model)
    # Wrappers an earlier trainer (an in-process SFT) left on `forward` go before TRL adds its own.
    remove_trainer_forward_patches(model)
    rubric = rubric if rubric is not None else default_rubric()
    run = RunDir(cfg.output_dir)
    resume_from = resume_state(cfg, run) if resume else None
    env_config = env_config_for(cfg)

    def search_env() -> SearchEnvironment:
        return SearchEnvironment(backend, env_config, tokenizer=tokenizer)

    reward = RubricReward(rubric, tokenizer)
    evaluate = None
    if eval_rows and (cfg.eval_steps or cfg.eval_on_start):
        dev_rows = [
            {k: r[k] for k in ROW_COLUMNS if k in r} for r in list(eval_rows)[: cfg.num_eval_questions]
        ]
        eval_config = generation_config_for(cfg, temperature=cfg.eval_temperature)

        def evaluate(model: Any) -> dict[str, float]:
            # The dev loop every trainer shares, with our engine in both modes, at eval_temperature.
            return evaluate_during_training(
                model,
                tokenizer,
                dev_rows,
                search_env,
                eval_config,
                rubric=rubric,
                batch_size=cfg.eval_batch_size,
                seed=eval_config.seed,
            )

    run_callback = RunDirCallback(cfg, run, reward, evaluate)
    mode_kwargs: dict[str, Any]
    if cfg.mode == "trl_loop":
        mode_kwargs = {"environment_factory": tool_env_factory(backend, env_config, tokenizer)}
    else:
        run_callback.rollout = EngineRollout(tokenizer, search_env, generation_config_for(cfg))
        mode_kwargs = {"rollout_func": run_callback.rollout}
    trainer = SearchGRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=cfg.to_trl_args(cuda_available=torch.cuda.is_available()),
        train_dataset=prompt_dataset(train_rows, backend, env_config),
        processing_class=tokenizer,
        callbacks=[run_callback, *(callbacks or [])],
        **mode_kwargs,
    )
    _check_reference_matches_policy(trainer, model)
    if cfg.mode == "trl_loop" and not cfg.tool_schema_in_prompt:
        hide_tool_schemas(trainer)
    reward.trainer = trainer
    run_callback.trainer = trainer
    trainer.run = run  # type: ignore[attr-defined]
    trainer.rubric_reward = reward  # type: ignore[attr-defined]
    trainer.run_callback = run_callback
    if resume_from is not None:
        checkpoint, saved = resume_from
        reward.episodes = int(saved["episode"])
        if run_callback.rollout is not None:
            run_callback.rollout.calls = int(saved.get("rollout_calls", 0))
        run_callback.resume_state = saved
        trainer.resume_checkpoint = checkpoint / "trl"
    save_config(cfg, run.config)
    run.write_manifest(
        build_manifest(
            seeds={"seed": cfg.seed},
            tokenizer=tokenizer,
            generation_config=asdict(generation_config_for(cfg)),
            index_fingerprint=getattr(backend, "fingerprint", None),
            config=cfg,
            extra={
                "trainer": "grpo",
                "mode": cfg.mode,
                "num_generations": cfg.num_generations,
                "beta": cfg.beta,
                "loss_type": cfg.loss_type,
                "episodes_per_step": cfg.episodes_per_step,
                "max_steps": cfg.num_steps,
                "resumed_from_step": None if resume_from is None else int(resume_from[1]["global_step"]),
            },
        )
    )
    return trainer


# Settings a resumed run must share with the run that wrote the checkpoint: they fix the data order, the
# groups and the batch arithmetic the saved optimizer, scheduler and RNG states belong to.
RESUME_INVARIANTS = (
    "mode",
    "seed",
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_iterations",
    "protocol",
)


def resume_state(cfg: GRPORunConfig, run: RunDir) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint of `run` and our saved state, or None when there is none yet.

    Refuses (ConfigError, saying what to do) a checkpoint written before GRPO runs could resume (no
    `trl/` folder) and a config whose `RESUME_INVARIANTS` differ from the checkpointed run's. The budget
    (`max_steps`, `total_episodes`), evaluation and saving settings may change.
    """
    from searchrl.common.config import load_config

    checkpoint = run.latest_checkpoint()
    if checkpoint is None:
        return None
    saved = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    if saved.get("trainer") != "grpo":
        raise ConfigError(
            f"{checkpoint}: not a GRPO checkpoint (trainer {saved.get('trainer')!r}); resume it with its own command"
        )
    if not (checkpoint / "trl" / "trainer_state.json").is_file():
        raise ConfigError(
            f"{checkpoint}: no trl/ folder (optimizer, scheduler and RNG states), so it cannot be resumed; it was "
            "written before GRPO runs could resume. Start a fresh run (another output_dir, or drop --resume)."
        )
    if run.config.is_file():
        before = load_config(GRPORunConfig, run.config)
        changed = [
            f"{name}: {getattr(before, name)!r} in the checkpointed run, {getattr(cfg, name)!r} now"
            for name in RESUME_INVARIANTS
            if getattr(before, name) != getattr(cfg, name)
        ]
        if changed:
            raise ConfigError(
                f"resume {run.root}: "
                + "; ".join(changed)
                + ". Resume with the run's own settings (only the "
                "budget, evaluation and saving may change), or start a new output_dir."
            )
    return checkpoint, saved


def run_grpo(cfg: GRPORunConfig, resume: bool = False) -> Path:
    """Train GRPO as `cfg` says and return the run directory (what the demo's side-by-side reads).

    `resume=True` continues a killed run from its newest checkpoint in `cfg.output_dir` (TRL's
    `resume_from_checkpoint` for optimizer, scheduler, RNG and data position; our episode count, rollout
    seeds, clocks and run-directory history), or starts fresh when it has none.
    """
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
    backend = cfg.open_backend(read_timeout=cfg.search_timeout_s)
    rubric = load_rubric(cfg.reward_config_path) if cfg.reward_config_path else default_rubric()
    train_rows = load_qa(cfg.train_file)
    eval_rows = load_qa(cfg.dev_file) if cfg.dev_file else None
    trainer = build_grpo_trainer(cfg, model, tokenizer, backend, train_rows, eval_rows, rubric, resume=resume)
    trainer.train()
    return cfg.run_dir
