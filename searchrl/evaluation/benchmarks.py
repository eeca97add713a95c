"""The seven QA sets of Search-R1's tables, by name, from local FlashRAG-style files: one suite evaluation.

What: `evaluate_benchmarks` runs the one evaluation loop (`loop.evaluate_policy`: greedy, the run's
prompt, protocol, budgets and rubric) on each set found in a folder laid out as FlashRAG publishes them,
`<dir>/<name>/test.jsonl` or `<dir>/<name>/dev.jsonl` (rows `id`, `question`, `golden_answers`; our rows
with `golds` work too), and writes one JSON: per set exact match, F1 and searches per question with 95%
bootstrap intervals (the full `summarise` summary), and their unweighted mean over the sets (the "Avg"
column of Search-R1's Table 2/3) with a stratified bootstrap interval (each set resampled within itself).
All sets' trajectories go to one file beside it (`metadata.benchmark` says whose).

Which split: Search-R1's evaluation data takes a set's test split where it has one, else its dev split
(FlashRAG ships test for NQ, TriviaQA, PopQA and Bamboogle, only dev for HotpotQA, 2WikiMultiHopQA and
Musique). The same rule is applied here, and the JSON records the file used and whether it is the split
Search-R1 used. Questions are stripped and end with "?", as Search-R1's data processing writes them
(`question_mark=False` keeps them as they are); answers are scored with SQuAD's `normalize_answer`
(`rewards.qa`), as Search-R1's exact match is.

Why one suite and not seven `searchrl eval` calls: the headline number is the unweighted average, and its
interval needs every set's per-question values together; and one file per checkpoint is what the report's
Table-3 section reads. Scores compare only within one setup (corpus, retriever, top-k, prompt): the JSON
records the index or search URL and the environment so a reader can check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.data.benchmarks import (
    BENCHMARKS,
    SEARCH_R1_PAPER_EM,
    Benchmark,
    BenchmarkFile,
    benchmark_by_name,
    find_benchmark_files,
)
from searchrl.data.convert import search_r1_question
from searchrl.data.datasets import load_qa
from searchrl.env.environment import SearchEnvironment
from searchrl.evaluation.loop import GeneratorFactory, evaluate_policy
from searchrl.evaluation.statistics import DEFAULT_BOOTSTRAP, DEFAULT_CONFIDENCE, trajectory_values
from searchrl.evaluation.targets import (
    check_search_args,
    default_eval_output,
    eval_setup,
    open_eval_target,
    search_for_eval,
    write_eval,
)
from searchrl.run.writer import step_of

# The metrics of the table: exact match (the paper's metric), F1 and searches per question.
SUITE_METRICS: tuple[str, ...] = ("exact_match", "f1", "searches_per_question")
SUITE_KIND = "benchmarks"


def bootstrap_mean_of_means_ci(
    groups: Sequence[Sequence[float]],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the unweighted mean of the groups' means, each group resampled
    within itself (a stratified bootstrap: a set's size never changes its weight)."""
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("bootstrap_mean_of_means_ci: every group needs at least one value")
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples!r} must be an integer >= 1")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1)")
    rng = np.random.default_rng(seed)
    total = np.zeros(n_resamples)
    for group in groups:
        x = np.asarray(group, dtype=np.float64)
        total += x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    stats = total / len(groups)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(stats, [tail, 100.0 - tail])
    return float(low), float(high)


def _prepare_rows(rows: list[dict[str, Any]], name: str, question_mark: bool) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        row = dict(row)
        row["id"] = f"{name}-{row['id']}"  # unique across the sets in the one trajectories file
        if question_mark:
            row["question"] = search_r1_question(row["question"])
        out.append(row)
    return out


def average_over_sets(
    per_set_values: dict[str, list[dict[str, float]]], n_resamples: int, seed: int, confidence: float
) -> dict[str, Any]:
    """The unweighted mean over sets of each suite metric, with its stratified bootstrap interval."""
    names = list(per_set_values)
    out: dict[str, Any] = {"sets": names, "weighting": "unweighted mean over the sets (Search-R1's Avg)"}
    ci: dict[str, list[float]] = {}
    for metric in SUITE_METRICS:
        groups = [[v[metric] for v in per_set_values[n]] for n in names]
        out[metric] = float(np.mean([np.mean(g) for g in groups]))
        ci[metric] = list(bootstrap_mean_of_means_ci(groups, n_resamples, seed, confidence))
    out["ci95"] = ci
    return out


def evaluate_benchmarks(
    run_dir: str | Path | None,
    benchmarks_dir: str | Path,
    sets: Sequence[str] | None = None,
    checkpoint: str | None = "latest",
    model: str | Path | None = None,
    index_dir: str | Path | None = None,
    output: str | Path | None = None,
    batch_size: int = 16,
    limit: int | None = None,
    seed: int = 0,
    n_resamples: int = DEFAULT_BOOTSTRAP,
    env_config: Any = None,
    generation_config: Any = None,
    rubric: Any = None,
    corpus: str | Path | None = None,
    question_mark: bool = True,
    generator_factory: GeneratorFactory | None = None,
) -> tuple[dict[str, Any], Path]:
    """Evaluate a run's checkpoint (or any model) on the benchmark sets in `benchmarks_dir`; write one JSON.

    The model, search engine, environment and rubric are resolved exactly as `targets.evaluate_run` does
    (`run_dir`, `checkpoint`, `model`, `index_dir` or `corpus`, `env_config`, `generation_config`,
    `rubric`). `sets` picks sets by name (default: all seven, each required); `limit` evaluates the first N
    questions of each set. The JSON goes to `RUN/eval/benchmarks-<checkpoint>.json` (or `output`), the
    trajectories beside it. Returns the payload and the JSON path.
    """
    check_search_args(index_dir, corpus)
    files = find_benchmark_files(benchmarks_dir, sets)
    reader, root, config, model_dir, name = open_eval_target(run_dir, model, checkpoint)
    rows_by_set = {
        f.benchmark.name: _prepare_rows(load_qa(f.path, limit=limit), f.benchmark.name, question_mark)
        for f in files
    }
    policy, tokenizer, env_cfg, gen_cfg, suite_rubric = eval_setup(
        reader, root, config, model_dir, env_config, generation_config, rubric
    )
    per_set: dict[str, dict[str, Any]] = {}
    values: dict[str, list[dict[str, float]]] = {}
    trajectories = []
    used_generation: dict[str, Any] = {}
    with search_for_eval(reader, config, index_dir, corpus) as (backend, search):
        for f in files:
            result = evaluate_policy(
                policy,
                tokenizer,
                rows_by_set[f.benchmark.name],
                lambda: SearchEnvironment(backend, env_cfg, tokenizer=tokenizer),
                gen_cfg,
                rubric=suite_rubric,
                batch_size=batch_size,
                seed=seed,
                n_resamples=n_resamples,
                generator_factory=generator_factory,
            )
            for traj in result.trajectories:
                traj.metadata["benchmark"] = f.benchmark.name
            trajectories += result.trajectories
            values[f.benchmark.name] = [trajectory_values(t) for t in result.trajectories]
            used_generation = result.generation_config
            per_set[f.benchmark.name] = {
                "label": f.benchmark.label,
                "file": str(f.path),
                "split": f.split,
                "search_r1_split": f.benchmark.search_r1_split,
                "matches_search_r1_split": f.matches_search_r1,
                "in_domain": f.benchmark.in_domain,
                **result.summary,
            }
    average = average_over_sets(values, n_resamples, seed, DEFAULT_CONFIDENCE)
    output = (
        Path(output) if output is not None else default_eval_output(root, model_dir, f"{SUITE_KIND}-{name}")
    )
    payload = {
        "kind": SUITE_KIND,
        "split": SUITE_KIND,
        "checkpoint": name,
        "step": 0 if name == "initial" else step_of(name),
        "model": str(model_dir),
        "run": None if root is None else str(root),
        "trainer": None if reader is None else reader.trainer,
        "benchmarks_dir": str(benchmarks_dir),
        **search,
        "question_rule": "stripped, ending with '?' (Search-R1's processing)"
        if question_mark
        else "as in the file",
        "answer_normalisation": "SQuAD normalize_answer (lower case, no punctuation, no a/an/the, one space)",
        "limit_per_set": limit,
        "n": sum(len(v) for v in values.values()),
        "generation_config": used_generation,
        "env_config": dataclasses.asdict(env_cfg),
        # The table's headline: the unweighted average over the sets (also under `average`).
        **{m: average[m] for m in SUITE_METRICS},
        "ci95": average["ci95"],
        "average": average,
        "benchmarks": per_set,
        "bootstrap": {"resamples": n_resamples, "seed": seed, "confidence": DEFAULT_CONFIDENCE},
    }
    write_eval(output, payload, trajectories)
    return payload, output


def is_suite(data: dict[str, Any]) -> bool:
    """Whether an eval JSON is a benchmark suite (per-set results), as `evaluate_benchmarks` writes."""
    return data.get("kind") == SUITE_KIND and isinstance(data.get("benchmarks"), dict)


__all__ = [
    "BENCHMARKS",
    "SEARCH_R1_PAPER_EM",
    "Benchmark",
    "BenchmarkFile",
    "SUITE_METRICS",
    "average_over_sets",
    "benchmark_by_name",
    "bootstrap_mean_of_means_ci",
    "evaluate_benchmarks",
    "find_benchmark_files",
    "is_suite",
]
