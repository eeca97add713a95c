"""The not-learning check (`searchrl.ppo.learning_check`): it fires on a run whose greedy policy never changed,
and on nothing else."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from searchrl.ppo.learning_check import NOT_LEARNING_KL, LearningCheck, logged_kls

START = {"0:q0": "Anna", "1:q1": "Bram", "2:q2": "Cato", "3:q3": "Dirk"}


def first_evaluated(check: LearningCheck) -> LearningCheck:
    assert check.after_evaluation(START, {"eval/exact_match": 0.5}, 0, 20, []) == {
        "eval/answers_changed": 0.0,
        "eval/not_learning": 0.0,
    }
    return check


def test_a_run_that_changes_nothing_is_flagged_once_past_half_of_training(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = first_evaluated(LearningCheck())
    early = check.after_evaluation(dict(START), {"eval/exact_match": 0.5}, 5, 20, [0.002] * 5)
    assert early == {"eval/answers_changed": 0.0, "eval/not_learning": 0.0}  # too early to tell
    with caplog.at_level(logging.WARNING, logger="searchrl.ppo.learning_check"):
        late = check.after_evaluation(dict(START), {"eval/exact_match": 0.5}, 10, 20, [0.002] * 10)
        again = check.after_evaluation(dict(START), {"eval/exact_match": 0.5}, 20, 20, [0.002] * 20)
    assert late["eval/not_learning"] == 1.0 and again["eval/not_learning"] == 1.0
    warnings = [r for r in caplog.records if "PPO is not learning" in r.getMessage()]
    assert len(warnings) == 1 and "learning_rate" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("answers", "exact_match", "kl"),
    [
        ({**START, "2:q2": "Vera"}, 0.5, 0.002),  # one greedy answer changed
        (START, 0.75, 0.002),  # dev exact match moved (another question set or sampling)
        (START, 0.5, NOT_LEARNING_KL * 2),  # the policy moved away from its reference
    ],
)
def test_any_sign_of_learning_clears_the_flag(answers: dict[str, str], exact_match: float, kl: float) -> None:
    check = first_evaluated(LearningCheck())
    out = check.after_evaluation(answers, {"eval/exact_match": exact_match}, 15, 20, [kl] * 15)
    assert out["eval/not_learning"] == 0.0
    assert out["eval/answers_changed"] == (0.25 if answers != START else 0.0)


def test_the_first_evaluation_survives_a_checkpoint() -> None:
    check = first_evaluated(LearningCheck())
    restored = LearningCheck()
    restored.load_state_dict(json.loads(json.dumps(check.state_dict())))
    out = restored.after_evaluation({**START, "0:q0": "Zed"}, {"eval/exact_match": 0.5}, 20, 20, [0.0])
    assert out["eval/answers_changed"] == 0.25
    fresh = LearningCheck()
    fresh.load_state_dict(None)
    assert fresh.first_answers is None


def test_logged_kls_reads_every_logged_step_and_the_current_one(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "eval/exact_match": 0.5},
        {"step": 1, "objective/kl": 0.01},
        {"step": 2, "objective/kl": 0.03},
    ]
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines) + "not json\n")
    assert logged_kls(metrics, {"objective/kl": 0.05}) == [0.01, 0.03, 0.05]
    assert logged_kls(tmp_path / "missing.jsonl", {}) == []


@pytest.mark.parametrize(("exact_match", "warned"), [(0.0, True), (0.25, False)])
def test_a_start_that_answers_nothing_right_is_said(
    caplog: pytest.LogCaptureFixture, exact_match: float, warned: bool
) -> None:
    with caplog.at_level(logging.WARNING, logger="searchrl.ppo.learning_check"):
        LearningCheck().after_evaluation(START, {"eval/exact_match": exact_match}, 0, 20, [])
    said = [r for r in caplog.records if "answers none of the 4 dev questions" in r.getMessage()]
    assert bool(said) == warned
    assert not said or "warm start" in said[0].getMessage()
