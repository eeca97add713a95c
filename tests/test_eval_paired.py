"""The paired bootstrap of two policies on the same questions (`searchrl.evaluation.statistics`).

Properties: identical per-question values give a difference of 0 with the interval [0, 0]; a constant shift
gives that shift as the mean and as both ends; the paired interval is narrower than the unpaired one when the
two samples are correlated; the same seed gives the same interval. `paired_comparison` pairs trajectories by
question id, whatever their order, and refuses two sides that hold different questions.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_eval_metrics import traj

from searchrl.evaluation.statistics import (
    bootstrap_ci,
    bootstrap_statistic_ci,
    paired_comparison,
    paired_difference,
    unpaired_difference_ci,
)

scores = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=120)


@given(scores, st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_identical_values_give_zero_and_a_point_interval(values, seed):
    out = paired_difference(values, list(values), n_resamples=200, seed=seed)
    assert out["mean"] == 0.0 and out["ci95"] == [0.0, 0.0] and out["n"] == len(values)


@given(scores, st.floats(-1.0, 1.0, allow_nan=False), st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_a_constant_shift_gives_that_shift(values, shift, seed):
    shifted = [v - shift for v in values]  # a - b == shift for every question (up to rounding)
    out = paired_difference(values, shifted, n_resamples=200, seed=seed)
    assert out["mean"] == pytest.approx(shift, abs=1e-9)
    assert out["ci95"][0] == pytest.approx(shift, abs=1e-9) and out["ci95"][1] == pytest.approx(
        shift, abs=1e-9
    )


@given(
    st.integers(40, 300),
    st.floats(0.02, 0.2),
    st.integers(0, 2**16),
)
@settings(max_examples=30, deadline=None)
def test_paired_interval_is_narrower_when_the_two_are_correlated(n, flip, seed):
    # Exact match of two policies that agree on most questions: b is a with a few answers flipped.
    rng = np.random.default_rng(seed)
    a = (rng.random(n) < 0.5).astype(float)
    if a.min() == a.max():
        a[0] = 1.0 - a[0]
    b = np.where(rng.random(n) < flip, 1.0 - a, a)
    low, high = paired_difference(a, b, n_resamples=500, seed=seed)["ci95"]
    u_low, u_high = unpaired_difference_ci(a, b, n_resamples=500, seed=seed)
    assert low <= np.mean(a - b) <= high
    assert high - low < u_high - u_low


def test_seeded_and_refusing_bad_input():
    a, b = [1.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]
    assert paired_difference(a, b, seed=3) == paired_difference(a, b, seed=3)
    assert paired_difference(a, b, seed=3)["mean"] == pytest.approx(0.4)
    assert "ci0.9" in paired_difference(a, b, confidence=0.9)  # summarise's key rule
    with pytest.raises(ValueError, match="equally long"):
        paired_difference([1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="equally long"):
        paired_difference([], [])
    with pytest.raises(ValueError, match="n_resamples"):
        paired_difference(a, b, n_resamples=0)


def test_paired_comparison_pairs_by_question_id():
    first = [traj("a", "Velmora", ["Velmora"]), traj("b", "Anna", ["Anna Berg"]), traj("c", None, ["x"])]
    second = [traj("c", "x", ["x"]), traj("a", "Velmora", ["Velmora"]), traj("b", "nobody", ["Anna Berg"])]
    out = paired_comparison(first, second, n_resamples=100)
    # a: 1 - 1, b: 0 - 0 (EM) and 2/3 - 0 (F1), c: 0 - 1.
    assert out["exact_match"]["mean"] == pytest.approx(-1 / 3)
    assert out["f1"]["mean"] == pytest.approx((0.0 + 2 / 3 - 1.0) / 3)
    assert set(out) == {"exact_match", "f1"} and out["f1"]["n"] == 3
    # The same resampled questions for every metric and the same figures whatever the second side's order.
    assert paired_comparison(first, list(reversed(second)), n_resamples=100) == out
    assert paired_comparison(first, first, n_resamples=100)["f1"] == {"mean": 0.0, "ci95": [0.0, 0.0], "n": 3}
    with pytest.raises(ValueError, match="same questions"):
        paired_comparison(first, second[:2])
    with pytest.raises(ValueError, match="same questions"):
        paired_comparison(first, [*second, traj("a", "y", ["y"])])
    # A task's own per-question figures (the support demo's task success, denied calls): the same pairing.
    answered = paired_comparison(
        first,
        second,
        metrics=("answered",),
        n_resamples=100,
        values=lambda t: {"answered": float(t.answer is not None)},
    )
    assert answered["answered"]["mean"] == pytest.approx(-1 / 3) and answered["answered"]["n"] == 3


@given(scores, st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_the_statistic_bootstrap_of_a_mean_is_bootstrap_ci(values, seed):
    x = np.asarray(values)
    assert bootstrap_statistic_ci(len(x), lambda idx: float(x[idx].mean()), 200, seed) == bootstrap_ci(
        values, 200, seed
    )


def test_the_statistic_bootstrap_refuses_no_units():
    with pytest.raises(ValueError, match="no units"):
        bootstrap_statistic_ci(0, lambda idx: 0.0)
