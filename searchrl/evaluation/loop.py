"""The one evaluation loop: greedy rollouts of a policy on held-out questions, summarised.

What: `evaluate_policy` runs the policy through the real rollout engine (`HFGenerator`, or a trainer's own)
against real `SearchEnvironment`s, greedily (temperature 0, so a checkpoint always gives the same answers),
and summarises the trajectories (`statistics.summarise`: metrics with bootstrap intervals, by hop count).
`evaluate_during_training` is both trainers' periodic dev evaluation on the same loop, and
`evaluate_with_ppo_limits` the demos' held-out measurement of a final policy.

Why one loop used everywhere: training-time validation and offline evaluation must use the same prompt,
retriever, decoding and answer extraction, or a "gain" can be a change of protocol. The trainers import this
module only; resolving what `searchrl eval` evaluates (a run's checkpoint, data, index) is `targets.py`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchrl.common.trajectory import Trajectory
from searchrl.evaluation.statistics import DEFAULT_BOOTSTRAP, dev_metrics, flat_metrics, summarise
from searchrl.rollout.generator import GenerationConfig, HFGenerator

GeneratorFactory = Callable[[Any, Any, GenerationConfig], Any]


@dataclass
class EvalResult:
    """The trajectories of one evaluation and their summary (see `summarise` for its keys)."""

    trajectories: list[Trajectory]
    summary: dict[str, Any]
    generation_config: dict[str, Any] = field(default_factory=dict)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat `{prefix + name: mean}` of the headline metrics, for a training log line."""
        return flat_metrics(self.summary, prefix)


# -- running an evaluation --------------------------------------------------------------------------


def greedy(config: GenerationConfig | None) -> GenerationConfig:
    """A copy of `config` that decodes greedily (temperature 0); limits and seed are kept."""
    base = config if config is not None else GenerationConfig()
    return dataclasses.replace(base, temperature=0.0)


def _default_generator(model: Any, tokenizer: Any, config: GenerationConfig) -> HFGenerator:
    return HFGenerator(model, tokenizer, config)


def evaluate_policy(
    policy: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    env_factory: Callable[[], Any],
    generation_config: GenerationConfig | None = None,
    rubric: Any = None,
    batch_size: int = 16,
    seed: int = 0,
    n_resamples: int = DEFAULT_BOOTSTRAP,
    generator_factory: GeneratorFactory | None = None,
    decode_greedy: bool = True,
    progress: Callable[[int], None] | None = None,
) -> EvalResult:
    """Roll the policy out on `rows` (greedy by default) and summarise the trajectories.

    `env_factory()` returns a fresh environment per question (the training one: same prompt, retriever,
    budgets). `generation_config` gives the limits (max tokens per turn and per episode); its
    temperature is replaced by 0 unless `decode_greedy=False`. `rubric` (a `rewards.combine.Rubric`)
    scores each trajectory so the summary also holds the training reward. Each trajectory's metadata
    gets the row's `hops`, the question's amortised latency (`latency_s`: batch wall time / batch size,
    since questions of a batch decode together) and the batch index. `generator_factory(model,
    tokenizer, config)` swaps the rollout engine (tests force scripted turns through it; the PPO trainer
    passes its own, e.g. vLLM). The chunk of rows starting at index i samples with seed `seed + i`.
    `progress(n)` is called after each chunk with its number of questions (a progress bar's hook).
    """
    rows = [dict(r) for r in rows]
    if not rows:
        raise ValueError("evaluate_policy: no rows to evaluate; pass at least one question")
    if batch_size < 1:
        raise ValueError(f"evaluate_policy: batch_size={batch_size} must be >= 1")
    config = greedy(generation_config) if decode_greedy else dataclasses.replace(generation_config)
    make_generator = generator_factory or _default_generator
    trajectories: list[Trajectory] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        trajectories.extend(
            _evaluate_chunk(policy, tokenizer, chunk, env_factory, config, make_generator, seed + start)
        )
        if progress is not None:
            progress(len(chunk))
    if rubric is not None:
        for traj in trajectories:
            rubric.score(traj)
    summary = summarise(trajectories, n_resamples=n_resamples, seed=seed)
    return EvalResult(trajectories, summary, dataclasses.asdict(config))


def _evaluate_chunk(
    policy: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    env_factory: Callable[[], Any],
    config: GenerationConfig,
    make_generator: GeneratorFactory,
    seed: int,
) -> list[Trajectory]:
    # Each chunk gets its own generator, seeded by `seed` plus the chunk's first row index: a question's result
    # does not depend on what earlier chunks sampled (greedy decoding ignores the seed anyway; sampling does not).
    chunk_config = dataclasses.replace(config, seed=seed)
    generator = make_generator(policy, tokenizer, chunk_config)
    envs = [env_factory() for _ in rows]
    started = time.perf_counter()
    batch = generator.rollout(envs, rows, chunk_config.sampling())
    per_question = (time.perf_counter() - started) / len(rows)
    trajs = list(batch.trajectories)
    for traj, row in zip(trajs, rows, strict=True):
        traj.metadata["hops"] = row.get("hops")
        traj.metadata["latency_s"] = per_question
        traj.metadata["eval"] = True
    return trajs


def evaluate_during_training(
    policy: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    env_factory: Callable[[], Any],
    generation_config: GenerationConfig,
    rubric: Any = None,
    batch_size: int = 16,
    seed: int = 0,
    generator: Any = None,
    answers_out: dict[str, str] | None = None,
) -> dict[str, float]:
    """The periodic dev evaluation of every trainer (`PPOTrainer.evaluate`, GRPO's run callback).

    `evaluate_policy` at the generation config's own temperature (the run's `eval_temperature`, so the
    training-time curve and a later `searchrl eval --temperature` agree), reduced to `dev_metrics`. The
    caller writes `RUN/eval/step-N.json` (`RunDir.write_eval`) and keeps the clock. `generator` reuses a
    trainer's own rollout engine (HF or vLLM, its weights in sync; its config is left alone: each chunk's
    sampling goes with the call, its limits are the engine's); without one each chunk gets a fresh `HFGenerator`.
    `answers_out` receives each question's answer, keyed by its position and text (PPO's learning check).
    """

    def own_engine(model: Any, tok: Any, config: GenerationConfig) -> Any:
        return generator

    # One resample: the per-step line needs the means only, not `summarise`'s intervals.
    result = evaluate_policy(
        policy,
        tokenizer,
        rows,
        env_factory,
        generation_config,
        rubric=rubric,
        batch_size=batch_size,
        seed=seed,
        n_resamples=1,
        generator_factory=own_engine if generator is not None else None,
        decode_greedy=False,
    )
    if answers_out is not None:
        answers_out.update({f"{i}:{t.question}": t.answer or "" for i, t in enumerate(result.trajectories)})
    return dev_metrics(result.trajectories)


def evaluate_with_ppo_limits(
    policy: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    env_factory: Callable[[], Any],
    ppo_config: Any,
    rubric: Any = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> EvalResult:
    """The demo's held-out measurement: greedy, with the PPO stage's rollout limits, 32 questions a batch.

    One function so that the demo, the trainer comparison and the experiments measure a final policy the
    same way (their figures sit side by side in docs/real_loop.md).
    """
    config = dataclasses.replace(ppo_config.generation_config(), seed=seed)
    return evaluate_policy(
        policy,
        tokenizer,
        rows,
        env_factory,
        config,
        rubric=rubric,
        batch_size=32,
        seed=seed,
        progress=progress,
    )
