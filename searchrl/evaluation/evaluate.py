"""Offline evaluation of a search agent: greedy rollouts on held-out questions, metrics with bootstrap CIs.

What: `evaluate_policy` runs the policy through the real rollout engine (`HFGenerator`) against real
`SearchEnvironment`s, greedily (temperature 0, so a checkpoint always gives the same answers), and
`summarise` turns the trajectories into exact match, F1, citation support, format validity, searches per
question, tool failure rate, termination shares, tokens and latency per question, overall and broken down
by hop count, each with a seeded 95% percentile-bootstrap confidence interval.

Why it is one function used everywhere: training-time validation and offline evaluation must use the
same prompt, retriever, decoding and answer extraction, or a "gain" can be a change of protocol. The
answer is the one the environment extracted (`traj.answer`, via `env.protocol.parse_turn`), scored with
`rewards.qa`; citation support and format validity are the rewards' own definitions.

Timing (latency, wall seconds) is the only part of a result that is not deterministic; it lives under
the `timing` key so the rest of the JSON can be compared byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.common.trajectory import TERMINATION_REASONS, Trajectory
from searchrl.data.datasets import load_qa
from searchrl.env.environment import EnvConfig, SearchEnvironment
from searchrl.rewards.citation import citation_status
from searchrl.rewards.combine import default_rubric
from searchrl.rewards.qa import exact_match, f1_score
from searchrl.rewards.shaping import is_well_formed
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.run.errors import RunTargetError
from searchrl.run.reader import RunReader
from searchrl.run.writer import step_of, write_evaluation

# Metrics that are a mean over questions (one value per trajectory).
PER_QUESTION_METRICS = (
    "exact_match",
    "f1",
    "citation_support",
    "format_valid",
    "searches_per_question",
    "action_tokens_per_question",
    "tokens_per_question",
    "turns_per_question",
)
# A ratio of sums (failed calls / all calls): bootstrapped over questions, not over calls.
RATIO_METRICS = ("tool_failure_rate",)
TIMING_METRICS = ("latency_s_per_question", "search_latency_ms_per_question")

DEFAULT_BOOTSTRAP = 1000
DEFAULT_CONFIDENCE = 0.95

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


# -- per-trajectory values ------------------------------------------------------------------------


def trajectory_values(traj: Trajectory) -> dict[str, float]:
    """Every per-question metric of one trajectory (the unit the bootstrap resamples)."""
    answer = traj.answer or ""
    golds = traj.golds or [""]
    failures = sum(1 for c in traj.tool_calls if c.status != "ok")
    return {
        "exact_match": exact_match(answer, golds) if traj.answer is not None else 0.0,
        "f1": f1_score(answer, golds) if traj.answer is not None else 0.0,
        "citation_support": float(traj.answer is not None and citation_status(traj) == "supported"),
        "format_valid": float(traj.termination == "answered" and is_well_formed(traj.final_text)),
        "searches_per_question": float(len(traj.tool_calls)),
        "action_tokens_per_question": float(traj.num_action_tokens),
        "tokens_per_question": float(len(traj.input_ids)),
        "turns_per_question": float(traj.num_turns),
        "tool_calls": float(len(traj.tool_calls)),
        "tool_failures": float(failures),
        "latency_s_per_question": float(traj.metadata.get("latency_s", 0.0)),
        "search_latency_ms_per_question": float(sum(c.latency_ms for c in traj.tool_calls)),
    }


# -- bootstrap ------------------------------------------------------------------------------------


def _resample_indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def bootstrap_ci(
    values: Sequence[float],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of `values` (seeded: same input, same CI)."""
    _check_bootstrap_args(n_resamples, confidence)
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci: no values; an interval needs at least one observation")
    means = x[_resample_indices(x.size, n_resamples, seed)].mean(axis=1)
    return _percentile_interval(means, confidence)


def bootstrap_ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """CI of `sum(num) / sum(den)` resampling whole questions (a resample with no calls counts as 0)."""
    _check_bootstrap_args(n_resamples, confidence)
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape or num.size == 0:
        raise ValueError(
            f"bootstrap_ratio_ci: numerators ({num.size}) and denominators ({den.size}) must be equally long "
            "and non-empty"
        )
    idx = _resample_indices(num.size, n_resamples, seed)
    n_sum, d_sum = num[idx].sum(axis=1), den[idx].sum(axis=1)
    ratios = np.divide(n_sum, d_sum, out=np.zeros_like(n_sum), where=d_sum > 0)
    return _percentile_interval(ratios, confidence)


def _percentile_interval(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(stats, [tail, 100.0 - tail])
    return float(low), float(high)


def _check_bootstrap_args(n_resamples: int, confidence: float) -> None:
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples!r} must be an integer >= 1 (1000 is typical)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1), e.g. 0.95")


# -- summaries ------------------------------------------------------------------------------------


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _summarise_group(
    values: list[dict[str, float]], terminations: list[str], n_resamples: int, seed: int, confidence: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(values)}
    ci: dict[str, list[float]] = {}
    for name in PER_QUESTION_METRICS:
        column = [v[name] for v in values]
        out[name] = float(np.mean(column))
        ci[name] = list(bootstrap_ci(column, n_resamples, seed, confidence))
    calls = [v["tool_calls"] for v in values]
    fails = [v["tool_failures"] for v in values]
    out["tool_failure_rate"] = _ratio(sum(fails), sum(calls))
    ci["tool_failure_rate"] = list(bootstrap_ratio_ci(fails, calls, n_resamples, seed, confidence))
    shares: dict[str, float] = {}
    for reason in TERMINATION_REASONS:
        column = [float(t == reason) for t in terminations]
        shares[reason] = float(np.mean(column))
        ci[f"termination/{reason}"] = list(bootstrap_ci(column, n_resamples, seed, confidence))
    out["termination"] = shares
    out[_ci_key(confidence)] = ci
    return out


def _timing_group(values: list[dict[str, float]], n_resamples: int, seed: int, confidence: float) -> dict:
    out: dict[str, Any] = {}
    for name in TIMING_METRICS:
        column = [v[name] for v in values]
        out[name] = float(np.mean(column))
        out[f"{name}_ci"] = list(bootstrap_ci(column, n_resamples, seed, confidence))
    return out


def _hops_key(traj: Trajectory) -> str:
    hops = traj.metadata.get("hops")
    return "unknown" if hops is None else str(hops)


def summarise(
    trajectories: Sequence[Trajectory],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict[str, Any]:
    """Metrics of a set of evaluation trajectories, overall and by hop count, each with a bootstrap CI.

    Keys: `n`, one float per metric in `PER_QUESTION_METRICS` and `RATIO_METRICS`, `termination`
    (share per reason), `ci95` (`{metric: [low, high]}`, termination shares as `termination/<reason>`),
    `by_hops` (`{"1": {...same keys...}, "2": ...}`, from `traj.metadata["hops"]`) and `timing`
    (latency per question; the only non-deterministic part). If `reward` is set on the trajectories,
    `reward` (the training rubric's mean score) is added too.
    """
    trajs = list(trajectories)
    if not trajs:
        raise ValueError("summarise: no trajectories; evaluate at least one question")
    values = [trajectory_values(t) for t in trajs]
    terms = [t.termination for t in trajs]
    out = _summarise_group(values, terms, n_resamples, seed, confidence)
    rewards = [t.reward for t in trajs if t.reward is not None]
    if len(rewards) == len(trajs):
        out["reward"] = float(np.mean(rewards))
        out[_ci_key(confidence)]["reward"] = list(bootstrap_ci(rewards, n_resamples, seed, confidence))
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(_hops_key(t), []).append(i)
    out["by_hops"] = {
        key: _summarise_group(
            [values[i] for i in idx], [terms[i] for i in idx], n_resamples, seed, confidence
        )
        for key, idx in sorted(groups.items())
    }
    out["timing"] = _timing_group(values, n_resamples, seed, confidence)
    out["timing"]["by_hops"] = {
        key: _timing_group([values[i] for i in idx], n_resamples, seed, confidence)
        for key, idx in sorted(groups.items())
    }
    out["bootstrap"] = {"resamples": n_resamples, "seed": seed, "confidence": confidence}
    return out


def dev_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The periodic dev evaluation's figures, the same for every trainer: `eval/exact_match`, `eval/f1`,
    `eval/searches_per_question` and, when every trajectory was scored (`evaluate_policy` with a rubric),
    `eval/reward` (the training reward). `summarise` is the full report with intervals; this is the
    per-step line."""
    if not trajs:
        return {}
    n = len(trajs)
    out = {
        "eval/exact_match": sum(exact_match(t.answer or "", t.golds) for t in trajs) / n,
        "eval/f1": sum(f1_score(t.answer or "", t.golds) for t in trajs) / n,
        "eval/searches_per_question": sum(len(t.tool_calls) for t in trajs) / n,
    }
    if all(t.reward is not None for t in trajs):
        out["eval/reward"] = sum(float(t.reward) for t in trajs) / n  # type: ignore[arg-type]
    return out


def _ci_key(confidence: float) -> str:
    return "ci95" if abs(confidence - 0.95) < 1e-12 else f"ci{confidence:g}"


def flat_metrics(summary: dict[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """The headline numbers of a summary as a flat dict (`eval/exact_match`, `eval/f1`, ...)."""
    names = (*PER_QUESTION_METRICS, *RATIO_METRICS, "reward")
    out = {f"{prefix}{n}": float(summary[n]) for n in names if n in summary}
    for reason, share in summary.get("termination", {}).items():
        out[f"{prefix}termination/{reason}"] = float(share)
    for hops, group in summary.get("by_hops", {}).items():
        out[f"{prefix}hops{hops}/exact_match"] = float(group["exact_match"])
    return out


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
    generator = make_generator(policy, tokenizer, dataclasses.replace(config, seed=seed))
    envs = [env_factory() for _ in rows]
    started = time.perf_counter()
    batch = generator.rollout(envs, rows)
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
) -> dict[str, float]:
    """The periodic dev evaluation of every trainer (`PPOTrainer.evaluate`, GRPO's run callback).

    `evaluate_policy` at the generation config's own temperature (the run's `eval_temperature`, so the
    training-time curve and a later `searchrl eval --temperature` agree), reduced to `dev_metrics`. The
    caller writes `RUN/eval/step-N.json` (`RunDir.write_eval`) and keeps the clock. `generator` reuses a
    trainer's own rollout engine (HF or vLLM, its weights in sync): its `config` is set for each chunk and
    restored afterwards; without one each chunk gets a fresh `HFGenerator`.
    """
    saved = generator.config if generator is not None else None

    def own_engine(model: Any, tok: Any, config: GenerationConfig) -> Any:
        generator.config = config
        return generator

    try:
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
    finally:
        if generator is not None:
            generator.config = saved
    return dev_metrics(result.trajectories)


# -- run directories: which model, which data, which index ---------------------------------------------


@dataclass
class EvalTarget:
    """Everything `evaluate_run` resolved: the model folder, its name in file names, rows and search."""

    model_dir: Path
    checkpoint: str
    rows_path: Path
    index_dir: Path | None
    output: Path


def load_run_config(run_dir: str | Path) -> Any:
    """The run's `config.yaml` as its trainer's config (`PPOConfig` or `GRPORunConfig`, from manifest.json).

    `run_dir` may also be a demo directory (its PPO run's config). Raises FileNotFoundError when the run
    has no config.yaml and `RunTargetError` (a ValueError) when the path is not a run at all.
    """
    reader = RunReader(run_dir)
    root = reader.require_run("searchrl eval")
    if reader.config is None:
        raise FileNotFoundError(
            f"{root / 'config.yaml'}: no config.yaml, so {root} is not a run directory written by `searchrl train` "
            "or `searchrl grpo`; pass --model, --data and --index to evaluate a plain model folder"
        )
    return reader.config


def resolve_checkpoint(run_dir: str | Path, checkpoint: str = "latest") -> tuple[Path, str]:
    """(policy folder, checkpoint name) for `latest`, `step-N` or `N` in `RUN/checkpoints/` (read only)."""
    return RunReader(run_dir).checkpoint_policy(checkpoint)


def split_file(config: Any, split: str, data_dir: str | Path | None) -> Path:
    """The questions to evaluate: `data_dir` itself when it is a file, else `<data dir>/<split>.jsonl`.

    The data dir is `data_dir` or the folder of the run config's train/dev file. Raises FileNotFoundError
    saying what to pass when neither names one, or when the folder has no such split.
    """
    if data_dir is not None:
        path = Path(data_dir)
        if path.is_file():
            return path
        if not path.exists():
            raise FileNotFoundError(
                f"--data {path}: no such file or folder; pass a folder of <split>.jsonl files or one JSONL file of "
                "questions (rows with id, question, golds)"
            )
        if not (path / f"{split}.jsonl").is_file():
            present = sorted(p.name for p in path.glob("*.jsonl"))
            raise FileNotFoundError(
                f"--data {path}: no {split}.jsonl in this folder (it has {present or 'no .jsonl files'}); pass "
                "--split NAME for one of them, or --data FILE"
            )
        return path / f"{split}.jsonl"
    if config is not None:
        known = {"train": config.train_file, "dev": config.dev_file}
        if known.get(split):
            return Path(known[split])
        for anchor in (config.dev_file, config.train_file):
            if anchor:
                return Path(anchor).parent / f"{split}.jsonl"
    raise FileNotFoundError(
        f"cannot tell where the {split!r} split lives: the run config names no train_file/dev_file; "
        "pass --data DIR (the folder of train/dev/test.jsonl) or --data FILE (a JSONL file of questions)"
    )


def env_config_from_ppo(config: Any) -> Any:
    """The `EnvConfig` a `PPOConfig` (or a `GRPORunConfig`, same field names) implies: training's environment."""
    return config.env_config()


def generation_config_from_ppo(config: Any) -> GenerationConfig:
    """The rollout limits of a `PPOConfig` (or `GRPORunConfig`) as a `GenerationConfig` (temperature set by the caller)."""
    return GenerationConfig(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_new_tokens_per_turn=config.max_new_tokens_per_turn,
        max_episode_tokens=config.max_episode_tokens,
        seed=config.seed,
    )


def evaluate_with_ppo_limits(
    policy: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    env_factory: Callable[[], Any],
    ppo_config: Any,
    rubric: Any = None,
    seed: int = 0,
) -> EvalResult:
    """The demo's held-out measurement: greedy, with the PPO stage's rollout limits, 32 questions a batch.

    One function so that the demo, the trainer comparison and the experiments measure a final policy the
    same way (their figures sit side by side in docs/real_loop.md).
    """
    config = dataclasses.replace(generation_config_from_ppo(ppo_config), seed=seed)
    return evaluate_policy(
        policy, tokenizer, rows, env_factory, config, rubric=rubric, batch_size=32, seed=seed
    )


def _resolve_model(
    reader: Any, config: Any, model: str | Path | None, checkpoint: str | None
) -> tuple[Path, str]:
    """(model folder, name for file names) from --model, or the run's checkpoint (latest/step-N/initial)."""
    if model is not None:
        if checkpoint not in (None, "latest"):
            raise ValueError(
                f"--model {model} and --checkpoint {checkpoint} both name the model to evaluate; give one of them"
            )
        return Path(model), Path(model).name
    if reader is None:
        raise ValueError("give a run directory (--run) or a model folder (--model)")
    if checkpoint == "initial":
        # The policy the run started from (e.g. the SFT warm start): the baseline every gain is measured against.
        initial = reader.initial_policy()
        if initial is None:
            raise ValueError(
                f"--checkpoint initial needs a run whose config.yaml names policy_model_path ({reader.root} names "
                "none and is not a demo's PPO run); pass --model DIR instead"
            )
        return initial, "initial"
    return reader.checkpoint_policy(checkpoint or "latest")


def evaluate_run(
    run_dir: str | Path | None,
    split: str = "test",
    checkpoint: str | None = "latest",
    model: str | Path | None = None,
    data_dir: str | Path | None = None,
    index_dir: str | Path | None = None,
    output: str | Path | None = None,
    batch_size: int = 16,
    limit: int | None = None,
    seed: int = 0,
    n_resamples: int = DEFAULT_BOOTSTRAP,
    env_config: Any = None,
    generation_config: GenerationConfig | None = None,
    rubric: Any = None,
    corpus: str | Path | None = None,
    generator_factory: GeneratorFactory | None = None,
) -> tuple[EvalResult, Path]:
    """Evaluate a run's checkpoint, or any model folder, on a split; write JSON and trajectories.

    The run (`run_dir`: a PPO or GRPO run directory, or a demo directory, read through `RunReader`) gives
    the prompt, protocol, citation style, budgets, rubric and, by default, the data, index and model. Any
    of them can be replaced: `model` (a base model, the SFT policy, a checkpoint folder; or `checkpoint`
    `latest` / `step-N` / `initial` = the run's starting policy, `policy_model_path` or the demo's
    `sft/policy`), `data_dir` (a folder of `<split>.jsonl` or one JSONL file; rows need id, question,
    golds), `index_dir` (a `searchrl index` folder) or `corpus` (a JSONL corpus with id, title, contents,
    indexed with BM25 into a temporary folder for this evaluation), and `env_config`,
    `generation_config`, `rubric`. Without a run, `model`, `data_dir` and an index or corpus are needed.
    `generator_factory` swaps the rollout engine, as in `evaluate_policy` (tests force turns through it).

    The JSON goes to `RUN/eval/<split>-<checkpoint>.json` (or `output`), the trajectories beside it as
    `<same name>.trajectories.jsonl.gz`. Returns the result and the JSON path.
    """
    check_search_args(index_dir, corpus)
    reader, root, config, model_dir, name = open_eval_target(run_dir, model, checkpoint)
    if data_dir is None and reader is not None and reader.split_file(split) is not None:
        data_dir = reader.split_file(split)
        if not Path(data_dir).is_file():
            raise FileNotFoundError(
                f"{data_dir}: the run has no {split!r} split there; pass --data DIR or --data FILE"
            )
    rows_path = split_file(config, split, data_dir)
    with search_for_eval(reader, config, index_dir, corpus) as (backend, search):
        return _evaluate_target(
            reader,
            root,
            config,
            model_dir,
            name,
            rows_path,
            limit,
            backend,
            search,
            output,
            dict(
                split=split,
                env_config=env_config,
                generation_config=generation_config,
                rubric=rubric,
                batch_size=batch_size,
                seed=seed,
                n_resamples=n_resamples,
                generator_factory=generator_factory,
            ),
        )


def check_search_args(index_dir: str | Path | None, corpus: str | Path | None) -> None:
    """`--index` and `--corpus` are alternatives; a corpus must be a file."""
    if corpus is not None and index_dir is not None:
        raise ValueError("--index and --corpus both name the search engine; give one of them")
    if corpus is not None and not Path(corpus).is_file():
        raise FileNotFoundError(f"--corpus {corpus}: no such file; pass a JSONL corpus (id, title, contents)")


def open_run(run_dir: str | Path | None) -> tuple[Any, Path | None, Any]:
    """(RunReader, run root, run config) of an evaluation's `--run`, or Nones without one."""
    reader = RunReader(run_dir) if run_dir is not None else None
    if reader is not None and reader.kind == "trajectories":
        raise RunTargetError(
            f"--run {run_dir}: searchrl eval needs a run directory or a demo directory (its config, checkpoints, "
            "data and index), not a trajectories file; pass the run the file came from"
        )
    root = reader.require_run("searchrl eval") if reader is not None else None
    config = load_run_config(run_dir) if run_dir is not None else None
    return reader, root, config


def open_eval_target(
    run_dir: str | Path | None, model: str | Path | None, checkpoint: str | None
) -> tuple[Any, Path | None, Any, Path, str]:
    """(RunReader, run root, run config, model folder, checkpoint name) of an evaluation: `open_run`, then
    `--model`, else the run's `checkpoint`; FileNotFoundError when that folder is missing."""
    reader, root, config = open_run(run_dir)
    model_dir, name = _resolve_model(reader, config, model, checkpoint)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{model_dir}: model folder not found")
    return reader, root, config, model_dir, name


def eval_setup(
    reader: Any,
    root: Path | None,
    config: Any,
    model_dir: Path,
    env_config: Any = None,
    generation_config: GenerationConfig | None = None,
    rubric: Any = None,
) -> tuple[Any, Any, Any, GenerationConfig, Any]:
    """(policy, tokenizer, env config, generation config, rubric) of an evaluation: the model folder's policy,
    and each setting as given, else the run's (`RunReader.environment`, `default_generation_config`,
    `RunReader.rubric`; without a run, the defaults)."""
    policy, tokenizer = load_policy_for_eval(reader, config, model_dir)
    if env_config is None:
        env_config = reader.environment() if reader is not None else EnvConfig()
    gen_cfg = generation_config or default_generation_config(config, env_config)
    if rubric is None:
        rubric = reader.rubric() if reader is not None else default_rubric()
    return policy, tokenizer, env_config, gen_cfg, rubric


def default_eval_output(root: Path | None, model_dir: Path, stem: str) -> Path:
    """`RUN/eval/<stem>.json`, or beside the model folder (`<model>/../eval/`) without a run."""
    base = root / "eval" if root is not None else model_dir.parent / "eval"
    return base / f"{stem}.json"


def write_eval(output: Path, payload: dict[str, Any], trajectories: Sequence[Trajectory]) -> None:
    """An evaluation's JSON and its trajectories beside it, through the run writer (`write_evaluation`)."""
    write_evaluation(output, payload, trajectories)


@contextlib.contextmanager
def search_for_eval(
    reader: Any, config: Any, index_dir: str | Path | None, corpus: str | Path | None
) -> Iterator[tuple[Any, dict[str, str]]]:
    """(backend, what it is for the JSON): `--corpus` (a temporary BM25 index, removed afterwards), `--index`,
    else the run's index folder, else the run's search URL."""
    uses_url = (
        bool(getattr(config, "search_url", None)) and getattr(config, "search_backend", "http") == "http"
    )
    if (
        index_dir is None
        and corpus is None
        and reader is not None
        and reader.index_dir is not None
        and not uses_url
    ):
        index_dir = reader.index_dir
    if corpus is not None:
        from searchrl.search.index import build_index  # bm25s and numba: only when a search is opened

        with tempfile.TemporaryDirectory(prefix="searchrl-eval-index-") as tmp:
            yield build_index(corpus, Path(tmp) / "index", backend="bm25"), {"corpus": str(corpus)}
        return
    from searchrl.search.index import SearchConfig, open_backend  # bm25s and numba, as above

    if index_dir is not None and not Path(index_dir).is_dir():
        raise FileNotFoundError(
            f"--index {index_dir}: no such folder; pass a folder built by `searchrl index`, or --corpus FILE "
            "(rows with id, title, contents) to index one for this evaluation"
        )
    if index_dir is None and (
        config is None or not (config.index_dir or getattr(config, "search_url", None))
    ):
        raise FileNotFoundError(
            "no search index: the run config names no index_dir and --index was not given; build one with "
            "`searchrl index --corpus FILE --out DIR` and pass --index DIR, or pass --corpus FILE"
        )
    if index_dir is not None:
        backend = open_backend(SearchConfig(index=str(index_dir)))  # the search room's one opener
    else:
        backend = config.open_backend(read_timeout=config.search_timeout_s)
    yield backend, {"index": str(index_dir if index_dir is not None else getattr(config, "search_url", ""))}


def _evaluate_target(
    reader: Any,
    root: Path | None,
    config: Any,
    model_dir: Path,
    name: str,
    rows_path: Path,
    limit: int | None,
    backend: Any,
    search: dict[str, str],
    output: str | Path | None,
    options: dict[str, Any],
) -> tuple[EvalResult, Path]:
    split = options.get("split")
    rows = load_qa(rows_path, limit=limit)
    policy, tokenizer, env_cfg, gen_cfg, rubric = eval_setup(
        reader,
        root,
        config,
        model_dir,
        options["env_config"],
        options["generation_config"],
        options["rubric"],
    )
    result = evaluate_policy(
        policy,
        tokenizer,
        rows,
        lambda: SearchEnvironment(backend, env_cfg, tokenizer=tokenizer),
        gen_cfg,
        rubric=rubric,
        batch_size=options["batch_size"],
        seed=options["seed"],
        n_resamples=options["n_resamples"],
        generator_factory=options["generator_factory"],
    )
    output = Path(output) if output is not None else default_eval_output(root, model_dir, f"{split}-{name}")
    step = 0 if name == "initial" else step_of(name)
    payload = {
        "split": split,
        "checkpoint": name,
        "step": step,
        "model": str(model_dir),
        "run": None if root is None else str(root),
        "trainer": None if reader is None else reader.trainer,
        "data": str(rows_path),
        **search,
        "num_questions": len(rows),
        "generation_config": result.generation_config,
        "env_config": dataclasses.asdict(env_cfg),
        **result.summary,
    }
    write_eval(output, payload, result.trajectories)
    return result, output


def load_policy_for_eval(reader: Any, config: Any, model_dir: Path) -> tuple[Any, Any]:
    """(policy, tokenizer) of a model folder; the tokenizer from the folder, else the run's. A LoRA checkpoint
    (an adapter folder) is merged into its base model, found from any working directory
    (`searchrl.models.adapter`; the run's starting policy is the fallback)."""
    # trl, datasets and pyarrow come with the model loaders: loaded when a model is.
    from searchrl.models.adapter import adapter_base_dir, is_adapter_dir, load_adapter_policy
    from searchrl.models.tiny import load_policy, load_tokenizer

    tok_dir = model_dir if (model_dir / "tokenizer_config.json").exists() else None
    if tok_dir is None and config is not None and config.tokenizer_path:
        tok_dir = Path(config.tokenizer_path)
    if tok_dir is None and reader is not None:
        tok_dir = reader.tokenizer_dir()
    if tok_dir is None:
        raise FileNotFoundError(
            f"{model_dir}: no tokenizer files here and the run config names no tokenizer_path"
        )
    if is_adapter_dir(model_dir):
        # The starting policy as recorded: `adapter_base_dir` resolves it near the adapter itself.
        start = reader.recorded_initial_policy() if reader is not None else None
        return load_adapter_policy(model_dir, adapter_base_dir(model_dir, [start])), load_tokenizer(tok_dir)
    return load_policy(model_dir), load_tokenizer(tok_dir)


def default_generation_config(config: Any, env_cfg: Any) -> GenerationConfig:
    """The run's rollout limits, or (no run) 64 tokens a turn within the environment's token budget."""
    if config is not None:
        return generation_config_from_ppo(config)
    return GenerationConfig(max_new_tokens_per_turn=64, max_episode_tokens=env_cfg.max_total_tokens)
