"""`summarise` and the bootstrap: every metric of the evaluation on hand-built trajectories.

The trajectories are built by hand so each expected number can be worked out on paper; the rollout
engine itself is exercised in `test_eval_run.py`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchrl.common.trajectory import ToolCallRecord, Trajectory
from searchrl.evaluation.loop import greedy
from searchrl.evaluation.statistics import (
    bootstrap_ci,
    bootstrap_ratio_ci,
    flat_metrics,
    summarise,
    trajectory_values,
)
from searchrl.rollout.generator import GenerationConfig


def traj(
    tid: str,
    answer: str | None,
    golds: list[str],
    hops: int | None = 1,
    calls: list[str] | None = None,
    citations: list[str] | None = None,
    retrieved: dict[str, str] | None = None,
    termination: str | None = None,
    n_tokens: int = 10,
    n_action: int = 4,
) -> Trajectory:
    statuses = calls or []
    final = (
        f"<answer>{answer}{''.join(f' [{c}]' for c in citations or [])}</answer>"
        if answer is not None
        else ""
    )
    return Trajectory(
        id=tid,
        question_id=tid,
        question="q?",
        golds=golds,
        input_ids=list(range(n_tokens)),
        action_mask=[0] * (n_tokens - n_action) + [1] * n_action,
        logprobs=[0.0] * n_tokens,
        prompt_length=n_tokens - n_action,
        tool_calls=[ToolCallRecord("search", {"query": f"q{i}"}, status=s) for i, s in enumerate(statuses)],
        retrieved=retrieved or {},
        answer=answer,
        citations=citations or [],
        final_text=final,
        num_turns=len(statuses) + 1,
        termination=termination or ("answered" if answer is not None else "no_answer"),
        metadata={"hops": hops},
    )


def fixture_set() -> list[Trajectory]:
    return [
        # right, cited a supporting doc, one ok search
        traj("a", "Velmora", ["Velmora"], 1, ["ok"], ["d1"], {"d1": "Rhen\nRhen was born in Velmora."}),
        # wrong answer (F1 0.5 vs "Anna Berg"), cites a doc that does not contain it
        traj("b", "Anna", ["Anna Berg"], 2, ["ok", "timeout"], ["d2"], {"d2": "Nothing here."}),
        # right after two searches, one failed; no citation
        traj("c", "the Quessa", ["Quessa"], 2, ["ok", "unavailable"]),
        # no answer at all
        traj("d", None, ["Orlenn"], 1, [], termination="max_turns"),
    ]


def test_per_trajectory_values_follow_the_reward_definitions():
    a, b, c, d = (trajectory_values(t) for t in fixture_set())
    assert (a["exact_match"], a["f1"], a["citation_support"], a["format_valid"]) == (1.0, 1.0, 1.0, 1.0)
    assert b["exact_match"] == 0.0 and b["f1"] == pytest.approx(2 / 3)
    assert b["citation_support"] == 0.0 and b["tool_failures"] == 1.0
    assert c["exact_match"] == 1.0 and c["citation_support"] == 0.0  # normalisation drops "the"
    assert d["exact_match"] == 0.0 and d["format_valid"] == 0.0 and d["searches_per_question"] == 0.0


def test_summary_means_ratio_and_termination_shares():
    s = summarise(fixture_set(), n_resamples=200, seed=1)
    assert s["n"] == 4
    assert s["exact_match"] == pytest.approx(0.5)
    assert s["f1"] == pytest.approx((1 + 2 / 3 + 1 + 0) / 4)
    assert s["citation_support"] == pytest.approx(0.25)
    assert s["format_valid"] == pytest.approx(0.75)
    assert s["searches_per_question"] == pytest.approx(5 / 4)
    # 2 failed calls of 5 calls: a ratio of sums, not a mean of per-question ratios (which would be 1/3).
    assert s["tool_failure_rate"] == pytest.approx(2 / 5)
    assert s["termination"]["answered"] == pytest.approx(0.75)
    assert s["termination"]["max_turns"] == pytest.approx(0.25)
    assert s["action_tokens_per_question"] == 4.0 and s["tokens_per_question"] == 10.0
    for name in ("exact_match", "f1", "tool_failure_rate", "termination/answered"):
        lo, hi = s["ci95"][name]
        assert 0.0 <= lo <= hi <= 1.0


def test_breakdown_by_hop_count():
    s = summarise(fixture_set(), n_resamples=100)
    assert set(s["by_hops"]) == {"1", "2"}
    one, two = s["by_hops"]["1"], s["by_hops"]["2"]
    assert one["n"] == 2 and two["n"] == 2
    assert one["exact_match"] == pytest.approx(0.5) and two["exact_match"] == pytest.approx(0.5)
    assert two["tool_failure_rate"] == pytest.approx(2 / 4) and one["tool_failure_rate"] == 0.0
    assert "ci95" in one and "timing" in s and "latency_s_per_question" in s["timing"]["by_hops"]["1"]


def test_unknown_hops_get_their_own_group_and_reward_is_summarised_when_scored():
    ts = fixture_set()
    ts[0].metadata.pop("hops")
    for i, t in enumerate(ts):
        t.reward = float(i)
    s = summarise(ts, n_resamples=50)
    assert "unknown" in s["by_hops"]
    assert s["reward"] == pytest.approx(1.5) and len(s["ci95"]["reward"]) == 2


def test_summary_is_deterministic_for_a_seed_and_differs_across_seeds():
    ts = fixture_set() * 5
    one, two = summarise(ts, seed=3), summarise(ts, seed=3)
    one.pop("timing"), two.pop("timing")
    assert one == two
    assert summarise(ts, seed=4)["ci95"]["f1"] != summarise(ts, seed=3)["ci95"]["f1"]


def test_flat_metrics_for_the_training_log():
    flat = flat_metrics(summarise(fixture_set(), n_resamples=20))
    assert flat["eval/exact_match"] == pytest.approx(0.5)
    assert flat["eval/hops2/exact_match"] == pytest.approx(0.5)
    assert "eval/termination/answered" in flat and all(isinstance(v, float) for v in flat.values())


def test_greedy_keeps_limits_and_zeroes_temperature():
    cfg = GenerationConfig(temperature=0.7, max_new_tokens_per_turn=11, max_episode_tokens=99, seed=5)
    g = greedy(cfg)
    assert (g.temperature, g.max_new_tokens_per_turn, g.max_episode_tokens, g.seed) == (0.0, 11, 99, 5)
    assert cfg.temperature == 0.7  # the caller's config is not modified


def test_bad_input_is_rejected_with_a_reason():
    with pytest.raises(ValueError, match="no trajectories"):
        summarise([])
    with pytest.raises(ValueError, match="at least one observation"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_ci([1.0], n_resamples=0)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0], confidence=1.5)
    with pytest.raises(ValueError, match="equally long"):
        bootstrap_ratio_ci([1.0], [1.0, 2.0])


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=40), st.integers(0, 2**31 - 1))
def test_bootstrap_interval_is_ordered_within_the_data_and_seeded(values, seed):
    lo, hi = bootstrap_ci(values, n_resamples=200, seed=seed)
    assert lo <= hi
    assert min(values) - 1e-6 <= lo and hi <= max(values) + 1e-6
    assert (lo, hi) == bootstrap_ci(values, n_resamples=200, seed=seed)


@settings(max_examples=40, deadline=None)
@given(finite, st.integers(1, 30))
def test_bootstrap_of_constant_values_is_a_point(value, n):
    lo, hi = bootstrap_ci([value] * n, n_resamples=50)
    assert math.isclose(lo, value, rel_tol=1e-9, abs_tol=1e-9) and math.isclose(
        hi, value, rel_tol=1e-9, abs_tol=1e-9
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=30))
def test_ratio_interval_lies_in_zero_one_for_failure_counts(pairs):
    fails = [min(f, c) for f, c in pairs]
    calls = [c for _, c in pairs]
    lo, hi = bootstrap_ratio_ci(fails, calls, n_resamples=100)
    assert 0.0 <= lo <= hi <= 1.0


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    covered = sum(
        lo <= 0.5 <= hi
        for lo, hi in (bootstrap_ci(rng.binomial(1, 0.5, 60).astype(float), 300, seed=i) for i in range(200))
    )
    assert 0.88 <= covered / 200 <= 0.99


STATUSES = st.sampled_from(["ok", "ok", "timeout", "unavailable", "malformed"])
TRAJ = st.builds(
    lambda i, ans, hops, calls, term: traj(f"t{i}", ans, ["Velmora"], hops, calls, termination=term),
    st.integers(0, 10**6),
    st.sampled_from([None, "Velmora", "velmora.", "Quessa", "the Velmora", ""]),
    st.sampled_from([1, 2, None]),
    st.lists(STATUSES, max_size=4),
    st.sampled_from([None, "token_budget", "max_turns"]),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(TRAJ, min_size=1, max_size=12))
def test_summary_invariants_on_random_trajectory_sets(ts):
    s = summarise(ts, n_resamples=50)
    assert s["n"] == len(ts) == sum(g["n"] for g in s["by_hops"].values())
    for name in ("exact_match", "f1", "citation_support", "format_valid", "tool_failure_rate"):
        assert 0.0 <= s[name] <= 1.0
        lo, hi = s["ci95"][name]
        assert lo <= hi
    assert s["exact_match"] <= s["f1"] + 1e-12  # an exact match is an F1 of 1
    assert sum(s["termination"].values()) == pytest.approx(1.0)
    calls = sum(len(t.tool_calls) for t in ts)
    assert s["searches_per_question"] == pytest.approx(calls / len(ts))
    # Every group's mean, weighted by its size, gives back the overall mean.
    weighted = sum(g["exact_match"] * g["n"] for g in s["by_hops"].values()) / len(ts)
    assert weighted == pytest.approx(s["exact_match"])
