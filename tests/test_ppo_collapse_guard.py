"""The collapse guard: its format bound is relative to the run's own start (a weak warm start is not a
collapse), and after each step it decides (`GuardDecision`) what `PPOTrainer.train` then carries out."""

from __future__ import annotations

from searchrl.ppo.config import PPOConfig
from searchrl.ppo.guard import CollapseGuard, GuardDecision


def _args(**kw) -> PPOConfig:
    base = dict(
        output_dir="unused",
        collapse_guard=True,
        collapse_window=2,
        collapse_entropy_min=None,
        collapse_kl_max=None,
        collapse_reward_drop=None,
    )
    return PPOConfig(**{**base, **kw})


def _step(fmt: float) -> dict[str, float]:
    return {"reward/format": fmt, "objective/scores": 0.0, "objective/kl": 0.0}


def test_a_weak_but_stable_start_does_not_trip_the_relative_format_bound():
    guard = CollapseGuard(_args(collapse_format_drop=0.3))
    assert [guard.check(_step(f)) for f in (0.2, 0.15, 0.25, 0.1)] == [None] * 4


def test_a_weak_start_would_trip_the_old_absolute_bound():
    guard = CollapseGuard(_args(collapse_format_min=0.5, collapse_format_drop=None))
    assert "format validity" in (guard.check(_step(0.2)) or "")


def test_format_falling_below_its_start_trips_and_says_why():
    guard = CollapseGuard(_args(collapse_format_drop=0.3))
    assert guard.check(_step(0.9)) is None
    assert guard.check(_step(0.8)) is None
    reason = guard.check(_step(0.3))  # window mean 0.55 < 0.9 - 0.3
    assert reason is not None and "below its start 0.9" in reason


def test_the_baseline_survives_a_checkpoint_and_a_rollback():
    guard = CollapseGuard(_args(collapse_format_drop=0.3))
    guard.check(_step(0.9))
    restored = CollapseGuard(_args(collapse_format_drop=0.3))
    restored.load_state_dict(guard.state_dict())
    restored.reset_window()  # what a rollback does: the window restarts, the baseline stays
    assert restored.format_baseline == 0.9
    assert restored.check(_step(0.4)) is not None


def _entropy(e: float) -> dict[str, float]:
    return {"objective/entropy_per_token": e, "objective/scores": 0.0, "objective/kl": 0.0}


def test_a_confident_warm_start_below_the_entropy_floor_is_not_a_collapse():
    # The demo's warm start: 0.017 nats per action token, under the default floor of 0.05.
    guard = CollapseGuard(_args(collapse_entropy_min=0.05, collapse_window=1))
    assert [guard.check(_entropy(e)) for e in (0.017, 0.015, 0.02, 0.009)] == [None] * 4
    assert guard.entropy_floor() == 0.0085
    reason = guard.check(_entropy(0.004))  # below half of where the run began
    assert reason is not None and "entropy per action token 0.004 < 0.0085" in reason


def test_the_absolute_entropy_floor_still_holds_for_a_start_above_it():
    guard = CollapseGuard(_args(collapse_entropy_min=0.05, collapse_window=1))
    assert guard.check(_entropy(1.2)) is None and guard.entropy_floor() == 0.05
    assert "< 0.05" in (guard.check(_entropy(0.04)) or "")
    restored = CollapseGuard(_args(collapse_entropy_min=0.05, collapse_window=1))
    restored.load_state_dict(guard.state_dict())
    assert restored.entropy_baseline == 1.2


def _scored(entropy: float, score: float) -> dict[str, float]:
    return {"objective/entropy_per_token": entropy, "objective/scores": score, "objective/kl": 0.0}


def test_entropy_falling_while_the_score_rises_is_the_policy_settling_not_a_collapse():
    # The support demo, seed 0: score 0.85 -> 1.2-1.4 while entropy fell from 0.054 to 0.027 a token.
    guard = CollapseGuard(_args(collapse_entropy_min=0.05, collapse_window=2))
    assert guard.check(_scored(0.054, 0.85)) is None  # the start: floor 0.027, score baseline 0.85
    assert [guard.check(_scored(e, s)) for e, s in ((0.026, 1.3), (0.024, 1.25))] == [None, None]
    # The same entropy with the score back at (or under) its start is a collapse, and says so.
    assert guard.check(_scored(0.024, 0.6)) is None  # window mean score 0.925: still above the start
    reason = guard.check(_scored(0.02, 0.7))  # window mean 0.65 <= 0.85
    assert reason is not None and "entropy per action token 0.022 < 0.027" in reason
    restored = CollapseGuard(_args(collapse_entropy_min=0.05, collapse_window=1))
    restored.load_state_dict(guard.state_dict())  # a rollback or a resume keeps the start's score
    assert restored.score_baseline == 0.85 and restored.check(_scored(0.02, 0.9)) is None


def test_the_guard_decides_and_the_decision_says_what_to_log_and_where_to_go(tmp_path):
    args = _args(collapse_format_min=0.5, collapse_format_drop=None, collapse_window=1)
    args.collapse_max_rollbacks, args.collapse_lr_decay = 2, 0.5
    guard = CollapseGuard(args)
    good = tmp_path / "checkpoints" / "step-2"
    assert guard.decide(_step(0.9), 4, good, rollbacks=0, lr_scale=1.0) == GuardDecision()  # healthy

    rollback = guard.decide(_step(0.2), 4, good, rollbacks=1, lr_scale=0.5)
    assert (rollback.action, rollback.checkpoint, rollback.rollbacks, rollback.lr_scale) == (
        "roll_back",
        good,
        2,
        0.25,
    )
    assert "format validity 0.2 < 0.5" in (rollback.reason or "")
    # The failed step's metrics line: these keys, in this order, after the step's own.
    assert list(rollback.metrics) == [
        "guard/rollback",
        "guard/rollbacks",
        "guard/lr_scale",
        "guard/rolled_back_to_step",
        "guard/failed_step",
        "guard/reason",
    ]
    assert (
        rollback.metrics["guard/rolled_back_to_step"] == 2.0 and rollback.metrics["guard/failed_step"] == 4.0
    )
    assert rollback.metrics["guard/rollbacks"] == 2.0 and rollback.metrics["guard/lr_scale"] == 0.25

    # Nothing to go back to: go on, silently (as before the first checkpoint).
    assert guard.decide(_step(0.2), 4, None, rollbacks=0, lr_scale=1.0) == GuardDecision()
    # The last good weights sampled this very step: say why, but do not redo the same rollouts.
    own = guard.decide(_step(0.2), 3, good, rollbacks=0, lr_scale=1.0)
    assert own.action == "continue" and own.reason and own.checkpoint is None
    assert own.metrics == {"guard/reason": own.reason, "guard/no_rollback": 1.0}
    # Out of rollbacks: give up, saying what to change.
    gave_up = guard.decide(_step(0.2), 4, good, rollbacks=2, lr_scale=0.25)
    assert gave_up.action == "give_up" and gave_up.metrics == {
        "guard/reason": gave_up.reason,
        "guard/gave_up": 1.0,
    }
    assert "collapse_max_rollbacks=2" in gave_up.message and "at step 4" in gave_up.message

    off = CollapseGuard(_args(collapse_guard=False, collapse_format_min=0.5, collapse_window=1))
    assert off.decide(_step(0.2), 4, good, rollbacks=0, lr_scale=1.0) == GuardDecision()
    assert off.history == []  # an unguarded run keeps no window
