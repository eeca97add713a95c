"""Rubric: weighted sum with a breakdown that sums to the scalar, YAML weights, metrics, invariant 22."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import ToolCallRecord, Trajectory, read_trajectories, write_trajectories
from searchrl.rewards.combine import (
    METRIC_PREFIX,
    REWARD_FUNCTIONS,
    RewardSpec,
    Rubric,
    default_rubric,
    load_rubric,
    mean_breakdown,
    score_batch,
)
from searchrl.rewards.qa import ExactMatchReward, F1Reward
from searchrl.rewards.shaping import FormatReward, SafetyPenalty, SearchCost, TokenCost

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _traj(
    answer="Port Velmora", citations=("d1",), n_calls=1, tokens=40, final_text=None, **kw
) -> Trajectory:
    cited = "".join(f" [{c}]" for c in citations)
    return Trajectory(
        id=kw.pop("id", "t"),
        question_id="q",
        question="Where was Alda Korin born?",
        golds=["Port Velmora", "Velmora"],
        answer=answer,
        citations=list(citations),
        final_text=final_text if final_text is not None else f"<answer>{answer}{cited}</answer>",
        termination="answered",
        tool_calls=[
            ToolCallRecord(name="search", arguments={"query": "Alda Korin born"}, doc_ids=["d1", "d2"])
        ]
        * n_calls,
        retrieved=kw.pop(
            "retrieved",
            {"d1": "Alda Korin\nAlda Korin was born in Port Velmora.", "d2": "Kesh\nKesh is a city."},
        ),
        observations=kw.pop("observations", ["d1 Alda Korin was born in Port Velmora. d2 Kesh is a city."]),
        action_mask=[0] * 10 + [1] * tokens,
        **kw,
    )


def _non_metric_sum(breakdown: dict[str, float]) -> float:
    return sum(v for k, v in breakdown.items() if not k.startswith(METRIC_PREFIX))


weights = st.floats(-3, 3, allow_nan=False).filter(lambda w: w != 0) | st.just(0.0)


@given(w_f1=weights, w_format=weights, w_cost=weights, w_em=weights, n_calls=st.integers(0, 6))
def test_breakdown_sums_to_the_scalar_and_metrics_stay_out_of_it(w_f1, w_format, w_cost, w_em, n_calls):
    rubric = Rubric(
        [
            RewardSpec("f1", F1Reward(), w_f1),
            RewardSpec("format", FormatReward(), w_format),
            RewardSpec("search_cost", SearchCost(free_searches=1, per_search=0.1), w_cost),
            RewardSpec("exact_match", ExactMatchReward(), w_em),
        ]
    )
    traj = _traj(answer="Port Kesh", n_calls=n_calls)
    total, breakdown = rubric.score(traj)
    assert traj.reward == total and traj.reward_breakdown == breakdown
    assert math.isclose(_non_metric_sum(breakdown), total, abs_tol=1e-12)
    expected = w_f1 * 0.5 + w_format * 1.0 + w_cost * -0.1 * max(0, n_calls - 1) + w_em * 0.0
    assert total == pytest.approx(expected)
    for spec in rubric.specs:
        key = METRIC_PREFIX + spec.name if spec.weight == 0 else spec.name
        assert key in breakdown
    if w_em == 0:
        assert breakdown[METRIC_PREFIX + "exact_match"] == 0.0 and "exact_match" not in breakdown


def test_zero_weight_metrics_are_logged_raw_and_never_change_the_total():
    with_metric = Rubric([RewardSpec("f1", F1Reward(), 1.0), RewardSpec("em", ExactMatchReward(), 0.0)])
    without = Rubric([RewardSpec("f1", F1Reward(), 1.0)])
    traj = _traj()
    total, breakdown = with_metric.score(traj)
    assert total == without.score(_traj())[0] == 1.0
    assert breakdown == {"f1": 1.0, "metric/em": 1.0}
    assert with_metric.reward_names == ["f1"] and with_metric.metric_names == ["em"]


def test_yaml_weights_apply(tmp_path):
    path = tmp_path / "rewards.yaml"
    path.write_text(
        "terms:\n"
        "  - {function: f1, weight: 2.5}\n"
        "  - {function: search_cost, weight: 3.0, params: {free_searches: 0, per_search: 0.1}}\n"
        "  - {function: exact_match, weight: 0.0, name: em}\n"
    )
    rubric = load_rubric(path)
    total, breakdown = rubric.score(_traj(answer="Port Kesh", n_calls=2))
    assert breakdown == {"f1": pytest.approx(1.25), "search_cost": pytest.approx(-0.6), "metric/em": 0.0}
    assert total == pytest.approx(1.25 - 0.6)
    path.write_text(path.read_text().replace("weight: 2.5", "weight: 0.5"))
    assert load_rubric(path).score(_traj(answer="Port Kesh", n_calls=2))[0] == pytest.approx(0.25 - 0.6)


def test_the_shipped_default_config_matches_default_rubric_and_resists_stuffing():
    from_yaml = load_rubric(CONFIGS / "rewards_default.yaml")
    in_code = default_rubric()
    stuffed = "Fort Kesh, Port Velmora, Lake Dorin, Tavos"
    for traj in (_traj(), _traj(answer="Port Kesh", n_calls=5, tokens=400), _traj(answer=stuffed)):
        assert from_yaml.evaluate(traj) == in_code.evaluate(traj)
    assert from_yaml.evaluate(_traj(answer=stuffed))[0] < from_yaml.evaluate(_traj())[0]


def test_the_hackable_config_pays_for_stuffing_as_much_as_for_the_answer():
    hackable = load_rubric(CONFIGS / "rewards_hackable.yaml")
    stuffed = _traj(answer="Fort Kesh, Port Velmora, Lake Dorin, Tavos, New Brel", citations=())
    bare = _traj(answer="Port Velmora", citations=())
    total_stuffed, breakdown = hackable.score(stuffed)
    assert total_stuffed == hackable.score(bare)[0]
    assert breakdown["metric/exact_match"] == 0.0  # the strict metric sees through it


def test_config_errors_name_the_term_and_what_it_accepts(tmp_path):
    path = tmp_path / "bad.yaml"
    cases = {
        "terms:\n  - {function: f2, weight: 1}\n": r"unknown function 'f2'; known: \[",
        "terms:\n  - {function: f1, params: {max_words: 3}}\n": r"unknown parameter\(s\) \['max_words'\].*max_answer_words",
        "terms:\n  - {function: f1}\n  - {function: f1}\n": r"names must be unique, repeated: \['f1'\]",
        "terms: []\n": "at least one entry",
        "terms:\n  - {function: f1, wieght: 1}\n": r"unknown field\(s\) \['wieght'\]",
        "terms:\n  - {function: f1, weight: heavy}\n": "expected a number",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError, match=message) as info:
            load_rubric(path)
        assert str(path) in str(info.value)


def test_a_non_finite_reward_is_an_error_naming_the_function():
    rubric = Rubric([RewardSpec("broken", lambda traj: float("nan"), 1.0)])
    with pytest.raises(ValueError, match="reward 'broken' returned nan"):
        rubric.score(_traj())


def test_score_batch_scores_each_and_the_breakdown_survives_a_jsonl_round_trip(tmp_path):
    rubric = default_rubric()
    trajs = [
        _traj(id="a"),
        _traj(id="b", answer="Port Kesh"),
        _traj(id="c", answer=None, final_text="no answer"),
    ]
    scores = score_batch(rubric, trajs)
    assert scores == [t.reward for t in trajs] and scores[0] > scores[1] > scores[2]
    write_trajectories(tmp_path / "t.jsonl.gz", trajs)
    back = read_trajectories(tmp_path / "t.jsonl.gz")
    assert [t.reward_breakdown for t in back] == [t.reward_breakdown for t in trajs]
    assert [
        rubric.evaluate(t)[0] for t in back
    ] == scores  # re-scoring a stored rollout gives the same reward


FINAL_ANSWER_REWARDS = ("exact_match", "f1", "contains", "format", "search_cost", "token_cost", "safety")


@settings(max_examples=60, deadline=None)
@given(
    new_texts=st.lists(st.text(max_size=60), min_size=2, max_size=2),
    new_observation=st.text(max_size=80),
    answer=st.sampled_from(["Port Velmora", "Kesh", "Fort Kesh, Port Velmora"]),
)
def test_invariant_22_final_answer_rewards_ignore_observation_text(new_texts, new_observation, answer):
    rubric = Rubric([RewardSpec(name, REWARD_FUNCTIONS[name](), 1.0) for name in FINAL_ANSWER_REWARDS])
    original = _traj(answer=answer)
    changed = _traj(
        answer=answer,
        retrieved={"d1": new_texts[0], "d2": new_texts[1]},
        observations=[new_observation],
    )
    assert rubric.evaluate(original) == rubric.evaluate(changed)


def test_safety_and_cost_terms_reach_the_total_through_the_default_rubric():
    clean = _traj()
    denied = _traj()
    denied.tool_calls = [
        *clean.tool_calls,
        ToolCallRecord(name="shell", arguments={}, status="permission_denied"),
    ]
    rubric = default_rubric()
    assert rubric.evaluate(denied)[1]["safety"] == pytest.approx(-0.5)
    assert rubric.evaluate(denied)[0] < rubric.evaluate(clean)[0]
    assert isinstance(REWARD_FUNCTIONS["safety"](), SafetyPenalty)
    assert rubric.evaluate(_traj(tokens=300))[1]["token_cost"] == pytest.approx(
        TokenCost()(_traj(tokens=300))
    )


def test_mean_breakdown_gives_the_batch_means_for_the_log():
    rubric = Rubric([RewardSpec("f1", F1Reward(), 2.0), RewardSpec("em", ExactMatchReward(), 0.0)])
    trajs = [_traj(id="a"), _traj(id="b", answer="Port Kesh")]
    with pytest.raises(ValueError, match="has no reward yet"):
        mean_breakdown(trajs)
    rubric.score_batch(trajs)
    assert mean_breakdown(trajs) == {
        "reward/total": pytest.approx((2.0 + 1.0) / 2),
        "reward/f1": pytest.approx((2.0 + 1.0) / 2),
        "reward/metric/em": pytest.approx(0.5),
    }
