"""benchmarks/critic_ceiling.py's arithmetic: the ideal first-token share of the returns' variance, corrected
for the noise of a per-question mean, and the critic's share, on returns whose answer is known."""

from __future__ import annotations

import random

import pytest
from support.benchmarks import load_benchmark


def _returns(questions: int, samples: int, spread: float, noise: float, seed: int = 0):
    """Each question has a true value drawn with sd `spread`; each sample adds noise with sd `noise`."""
    rng = random.Random(seed)
    truth, g0, groups = [], [], []
    for q in range(questions):
        value = rng.gauss(1.0, spread)
        groups.append(list(range(q * samples, (q + 1) * samples)))
        for _ in range(samples):
            truth.append(value)
            g0.append(value + rng.gauss(0.0, noise))
    return truth, g0, groups


def test_the_ideal_share_recovers_the_true_one_and_a_perfect_critic_reaches_it():
    ceiling = load_benchmark("critic_ceiling")
    # Var(value) 0.09 of a total 0.09 + 0.16: the question explains 36% of the returns' variance.
    truth, g0, groups = _returns(questions=2000, samples=4, spread=0.3, noise=0.4)
    shares = ceiling.variance_shares(g0, truth, groups)
    assert shares["ideal_first_token"] == pytest.approx(0.36, abs=0.03)
    assert shares["critic_first_token"] == pytest.approx(shares["ideal_first_token"], abs=0.03)
    # A critic that knows only the mean return explains nothing.
    mean = sum(g0) / len(g0)
    assert ceiling.variance_shares(g0, [mean] * len(g0), groups)["critic_first_token"] == pytest.approx(0.0)


def test_without_the_correction_a_few_samples_would_flatter_the_ceiling():
    ceiling = load_benchmark("critic_ceiling")
    # No question explains anything here: the uncorrected variance of the means would claim 1/samples.
    _, g0, groups = _returns(questions=2000, samples=4, spread=0.0, noise=0.5)
    assert abs(ceiling.variance_shares(g0, g0, groups)["ideal_first_token"]) < 0.03


def test_the_bootstrap_interval_holds_the_estimate():
    ceiling = load_benchmark("critic_ceiling")
    truth, g0, groups = _returns(questions=64, samples=8, spread=0.3, noise=0.4, seed=1)
    shares = ceiling.variance_shares(g0, truth, groups)
    ci = ceiling.bootstrap_shares(g0, truth, groups, draws=200)
    for key in ("ideal_first_token", "critic_first_token"):
        low, high = ci[key]
        assert low <= shares[key] <= high and high - low > 0.01
