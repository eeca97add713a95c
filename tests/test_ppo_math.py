"""The PPO math of `searchrl.ppo` against hand-computed cases and hypothesis properties.

Covers the contracts in DESIGN.md: GAE over action tokens, masked statistics and whitening, the KL
estimators and controllers, reward placement, the clipped policy and value losses, and PPOConfig
(YAML loading, validation and batch arithmetic). The rl_methods.md §8 invariants each have their own
named test in tests/test_ppo_invariants.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from searchrl.common.config import ConfigError, config_help, load_config
from searchrl.ppo import (
    AdaptiveKLController,
    FixedKLController,
    PPOConfig,
    apply_missing_eos_penalty,
    compute_gae,
    entropy_from_logits,
    kl_penalty,
    last_action_index,
    make_kl_controller,
    masked_explained_variance,
    masked_mean,
    masked_var,
    masked_whiten,
    per_sequence_kl,
    place_rewards,
    policy_loss,
    sequence_kl,
    value_loss,
)

PROPERTY = settings(max_examples=150, deadline=None)
finite = st.floats(min_value=-10.0, max_value=10.0, allow_nan=False, allow_infinity=False)
unit = st.floats(min_value=0.0, max_value=1.0)


def textbook_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> tuple[list, list]:
    """Schulman et al. 2016 on one contiguous episode, written as plainly as possible."""
    n = len(rewards)
    advantages = [0.0] * n
    running = 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    returns = [a + v for a, v in zip(advantages, values, strict=True)]
    return advantages, returns


def tensor(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# --- GAE -------------------------------------------------------------------------------------------


def test_gae_hand_computed_single_turn() -> None:
    # Two action tokens, gamma 1, lam 0.5: delta_1 = 1 - 0.5 = 0.5; delta_0 = 0 + 0.5 - 0.25 = 0.25;
    # A_0 = 0.25 + 0.5 * 0.5 = 0.5.
    rewards = tensor([[0.0, 1.0]])
    values = tensor([[0.25, 0.5]])
    advantages, returns = compute_gae(rewards, values, torch.ones(1, 2), gamma=1.0, lam=0.5)
    assert advantages.tolist() == [[0.5, 0.5]]
    assert returns.tolist() == [[0.75, 1.0]]


def test_gae_hand_computed_across_an_observation_block() -> None:
    # [a0, obs, obs, a1, pad]: a0 bootstraps from V(a1) = 2, not from the observation's value 50.
    rewards = tensor([[0.0, 9.0, 9.0, 1.0, 9.0]])
    values = tensor([[1.0, 50.0, 50.0, 2.0, 100.0]])
    mask = torch.tensor([[1, 0, 0, 1, 0]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lam=0.5)
    delta_1 = 1.0 - 2.0
    delta_0 = 0.0 + 0.9 * 2.0 - 1.0
    expected_a0 = delta_0 + 0.9 * 0.5 * delta_1
    assert advantages[0].tolist() == pytest.approx([expected_a0, 0.0, 0.0, delta_1, 0.0])
    assert returns[0].tolist() == pytest.approx([expected_a0 + 1.0, 0.0, 0.0, delta_1 + 2.0, 0.0])


@PROPERTY
@given(
    data=st.data(),
    prompt_len=st.integers(0, 4),
    pad_len=st.integers(0, 4),
    gamma=unit,
    lam=unit,
)
def test_gae_equals_textbook_recursion_on_a_single_turn(data, prompt_len, pad_len, gamma, lam) -> None:
    n = data.draw(st.integers(1, 12))
    rewards = data.draw(st.lists(finite, min_size=n, max_size=n))
    values = data.draw(st.lists(finite, min_size=n, max_size=n))
    expected_adv, expected_ret = textbook_gae(rewards, values, gamma, lam)

    filler = data.draw(st.lists(finite, min_size=prompt_len + pad_len, max_size=prompt_len + pad_len))
    row_r = filler[:prompt_len] + rewards + filler[prompt_len:]
    row_v = filler[:prompt_len] + values + filler[prompt_len:]
    mask = [0] * prompt_len + [1] * n + [0] * pad_len
    advantages, returns = compute_gae(tensor([row_r]), tensor([row_v]), torch.tensor([mask]), gamma, lam)

    window = slice(prompt_len, prompt_len + n)
    assert advantages[0, window].tolist() == pytest.approx(expected_adv, abs=1e-9)
    assert returns[0, window].tolist() == pytest.approx(expected_ret, abs=1e-9)


@PROPERTY
@given(data=st.data(), gamma=unit, lam=unit)
def test_gae_rows_are_independent(data, gamma, lam) -> None:
    # A batch computes each row as if it were alone.
    batch = data.draw(st.integers(2, 4))
    length = data.draw(st.integers(1, 8))
    rows = [data.draw(st.lists(finite, min_size=length, max_size=length)) for _ in range(2 * batch)]
    masks = [data.draw(st.lists(st.integers(0, 1), min_size=length, max_size=length)) for _ in range(batch)]
    rewards, values, mask = tensor(rows[:batch]), tensor(rows[batch:]), torch.tensor(masks)
    advantages, returns = compute_gae(rewards, values, mask, gamma, lam)
    for b in range(batch):
        adv_b, ret_b = compute_gae(rewards[b : b + 1], values[b : b + 1], mask[b : b + 1], gamma, lam)
        assert torch.allclose(advantages[b], adv_b[0])
        assert torch.allclose(returns[b], ret_b[0])


def test_gae_masked_positions_get_zero_advantage_and_return() -> None:
    rewards = tensor([[1.0, 2.0, 3.0, 4.0]])
    values = tensor([[5.0, 6.0, 7.0, 8.0]])
    mask = torch.tensor([[0, 1, 0, 1]])
    advantages, returns = compute_gae(rewards, values, mask, 1.0, 0.95)
    assert advantages[0, 0] == 0 and advantages[0, 2] == 0
    assert returns[0, 0] == 0 and returns[0, 2] == 0


def test_gae_row_without_action_tokens_is_all_zero() -> None:
    advantages, returns = compute_gae(tensor([[1.0, 2.0]]), tensor([[3.0, 4.0]]), torch.zeros(1, 2), 1.0, 1.0)
    assert advantages.abs().sum() == 0 and returns.abs().sum() == 0


def test_gae_works_in_float32_from_bfloat16_inputs() -> None:
    rewards = torch.tensor([[0.0, 1.0]], dtype=torch.bfloat16)
    values = torch.tensor([[0.5, 0.5]], dtype=torch.bfloat16)
    advantages, returns = compute_gae(rewards, values, torch.ones(1, 2), 1.0, 1.0)
    assert advantages.dtype == torch.float32
    assert advantages[0].tolist() == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": 1.5}, "gamma must be in"),
        ({"lam": -0.1}, "lam must be in"),
    ],
)
def test_gae_rejects_out_of_range_coefficients(kwargs, message) -> None:
    args = {"gamma": 1.0, "lam": 0.95} | kwargs
    with pytest.raises(ValueError, match=message):
        compute_gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), **args)


def test_gae_rejects_mismatched_shapes_and_non_binary_masks() -> None:
    with pytest.raises(ValueError, match=r"\(batch, T\) tensors of one shape"):
        compute_gae(torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 2), 1.0, 1.0)
    with pytest.raises(ValueError, match="only 0 and 1"):
        compute_gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[0.5, 1.0]]), 1.0, 1.0)


# --- masked statistics and whitening ---------------------------------------------------------------


def test_masked_mean_and_var_hand_computed() -> None:
    values = torch.tensor([[1.0, 2.0, 99.0], [3.0, float("nan"), float("inf")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    # Values 1, 2, 3: mean 2, squared deviations 1 + 0 + 1 = 2; unbiased 2 / 2 = 1, biased 2 / 3.
    assert masked_var(values, mask).item() == pytest.approx(1.0)
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(2.0 / 3.0)
    assert masked_mean(values, mask, axis=1).tolist() == pytest.approx([1.5, 3.0])


def test_masked_mean_per_row_of_an_empty_row_is_zero() -> None:
    values = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    assert masked_mean(values, torch.tensor([[1, 1], [0, 0]]), axis=1).tolist() == [2.0, 0.0]


def test_masked_statistics_refuse_an_empty_mask_with_a_clear_error() -> None:
    values = torch.ones(2, 3)
    with pytest.raises(ValueError, match="selects no position"):
        masked_mean(values, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="selects no position"):
        masked_var(values, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="at least 2 valid positions"):
        masked_var(values, torch.tensor([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="shape"):
        masked_mean(values, torch.ones(3, 2))


@PROPERTY
@given(data=st.data())
def test_masked_var_matches_torch_var_over_the_selected_values(data) -> None:
    length = data.draw(st.integers(2, 12))
    values = data.draw(st.lists(finite, min_size=length, max_size=length))
    mask = data.draw(st.lists(st.booleans(), min_size=length, max_size=length).filter(lambda m: sum(m) >= 2))
    selected = torch.tensor([v for v, m in zip(values, mask, strict=True) if m], dtype=torch.float64)
    got = masked_var(tensor([values]), torch.tensor([mask]))
    assert got.item() == pytest.approx(selected.var(unbiased=True).item(), abs=1e-9)


@PROPERTY
@given(data=st.data(), shift=finite, scale=st.floats(0.5, 5.0))
def test_masked_whiten_gives_mean_zero_std_one_over_valid_positions(data, shift, scale) -> None:
    length = data.draw(st.integers(3, 16))
    base = data.draw(st.lists(st.integers(-20, 20), min_size=length, max_size=length, unique=True))
    values = tensor([[shift + scale * b for b in base]])
    mask = torch.ones(1, length, dtype=torch.bool)
    mask[0, data.draw(st.integers(0, length - 1))] = False  # one masked position holding any value
    values[~mask] = 1e6
    whitened = masked_whiten(values, mask)
    assert masked_mean(whitened, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(whitened, mask).item() == pytest.approx(1.0, rel=1e-4)
    assert whitened[~mask].tolist() == [0.0]


@PROPERTY
@given(data=st.data())
def test_masked_whiten_without_mean_shift_preserves_the_mean(data) -> None:
    length = data.draw(st.integers(2, 16))
    values = tensor([data.draw(st.lists(finite, min_size=length, max_size=length))])
    mask = torch.ones(1, length, dtype=torch.bool)
    whitened = masked_whiten(values, mask, shift_mean=False)
    assert masked_mean(whitened, mask).item() == pytest.approx(masked_mean(values, mask).item(), abs=1e-6)


def test_masked_whiten_of_a_constant_does_not_divide_by_zero() -> None:
    whitened = masked_whiten(torch.full((1, 4), 3.0), torch.ones(1, 4))
    assert torch.isfinite(whitened).all() and whitened.abs().max() == 0


def test_masked_explained_variance() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert masked_explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    assert masked_explained_variance(torch.zeros(1, 4) + 2.0, returns, mask) == pytest.approx(0.0)
    assert math.isnan(masked_explained_variance(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)))


# --- KL estimators ---------------------------------------------------------------------------------


def test_kl_estimators_hand_computed() -> None:
    logprobs = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    # log r = log(0.25 / 0.5) = -log 2, r = 0.5
    log2 = math.log(2.0)
    assert kl_penalty(logprobs, ref, "k1").item() == pytest.approx(log2)
    assert kl_penalty(logprobs, ref, "k2").item() == pytest.approx(0.5 * log2**2)
    assert kl_penalty(logprobs, ref, "k3").item() == pytest.approx(0.5 - 1.0 + log2)


@PROPERTY
@given(logp=st.floats(-20.0, 0.0), ref=st.floats(-20.0, 0.0))
def test_kl_estimators_match_their_formulas(logp, ref) -> None:
    lp, rf = torch.tensor([logp], dtype=torch.float64), torch.tensor([ref], dtype=torch.float64)
    assert kl_penalty(lp, rf, "k1").item() == pytest.approx(logp - ref, abs=1e-12)
    assert kl_penalty(lp, rf, "k2").item() == pytest.approx(0.5 * (logp - ref) ** 2, abs=1e-12)
    k3 = math.exp(ref - logp) - (ref - logp) - 1.0
    assert kl_penalty(lp, rf, "k3").item() == pytest.approx(k3, rel=1e-9, abs=1e-12)


def test_kl_penalty_rejects_unknown_estimators_and_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"Unknown KL estimator 'kl'.*k1"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "kl")
    with pytest.raises(ValueError, match="same token positions"):
        kl_penalty(torch.zeros(2), torch.zeros(3), "k1")


def test_sequence_kl_is_the_batch_mean_of_per_trajectory_sums_over_action_tokens() -> None:
    kl = torch.tensor([[1.0, 2.0, 50.0], [0.5, float("nan"), 0.25]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert per_sequence_kl(kl, mask).tolist() == [3.0, 0.75]
    assert sequence_kl(kl, mask).item() == pytest.approx((3.0 + 0.75) / 2)


# --- KL controllers --------------------------------------------------------------------------------


def test_adaptive_controller_hand_computed_and_clipped() -> None:
    controller = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    # KL 7.2: error = 7.2 / 6 - 1 = 0.2 (at the clip), batch 100 -> factor 1 + 0.2 * 100 / 10000 = 1.002
    assert controller.update(7.2, 100) == pytest.approx(0.2 * 1.002)
    controller = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    # KL 60 is clipped to error 0.2 too
    assert controller.update(60.0, 100) == pytest.approx(0.2 * 1.002)
    controller = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    # KL 5.4: error -0.1 -> factor 0.999
    assert controller.update(5.4, 100) == pytest.approx(0.2 * 0.999)


def test_controllers_round_trip_through_state_dict() -> None:
    adaptive = AdaptiveKLController(0.2, 6.0, 1000)
    for kl in (1.0, 9.0, 12.0):
        adaptive.update(kl, 64)
    restored = AdaptiveKLController(1.0, 1.0, 1.0)
    restored.load_state_dict(adaptive.state_dict())
    assert restored.value == adaptive.value
    assert restored.update(3.0, 8) == adaptive.update(3.0, 8)

    fixed = FixedKLController(0.05)
    with pytest.raises(ValueError, match="different kl_target setting"):
        fixed.load_state_dict(adaptive.state_dict())


def test_make_kl_controller_follows_the_config() -> None:
    assert isinstance(make_kl_controller(0.05), FixedKLController)
    adaptive = make_kl_controller(0.1, kl_target=6.0, kl_horizon=5000)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.1 and adaptive.horizon == 5000


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: AdaptiveKLController(0.0, 6.0, 10000), "init_kl_coef must be > 0"),
        (lambda: AdaptiveKLController(0.1, -1.0, 10000), "target must be > 0"),
        (lambda: AdaptiveKLController(0.1, 6.0, 0), "horizon must be > 0"),
        (lambda: FixedKLController(-0.1), "kl_coef must be >= 0"),
        (lambda: AdaptiveKLController(0.1, 6.0, 10).update(6.0, 64), "exceeds horizon"),
        (lambda: AdaptiveKLController(0.1, 6.0, 100).update(float("nan"), 8), "must be finite"),
        (lambda: FixedKLController(0.1).update(1.0, -3), "non-negative int"),
    ],
)
def test_controllers_reject_bad_settings(build, message) -> None:
    with pytest.raises(ValueError, match=message):
        build()


# --- reward placement --------------------------------------------------------------------------------


def test_place_rewards_hand_computed() -> None:
    # [prompt, a, obs, a, pad]: score 2 on index 3, -0.5 * kl on indices 1 and 3 only.
    kl = torch.tensor([[7.0, 1.0, 7.0, 2.0, 7.0]])
    mask = torch.tensor([[0, 1, 0, 1, 0]])
    rewards = place_rewards(torch.tensor([2.0]), kl, mask, kl_coef=0.5)
    assert rewards.tolist() == [[0.0, -0.5, 0.0, 2.0 - 1.0, 0.0]]


def test_last_action_index_and_rows_without_actions() -> None:
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1], [1, 0, 0, 0]])
    assert last_action_index(mask).tolist() == [1, 3, 0]
    with pytest.raises(ValueError, match=r"Rows \[1\] have no action token"):
        place_rewards(torch.zeros(2), torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]), 0.1)
    with pytest.raises(ValueError, match="one score per trajectory"):
        place_rewards(torch.zeros(3), torch.zeros(2, 3), torch.ones(2, 3), 0.1)


def test_missing_eos_penalty_applies_only_to_unfinished_episodes() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0])
    ended = torch.tensor([True, False, False])
    assert apply_missing_eos_penalty(scores, ended, 2.0).tolist() == [1.0, -1.0, -2.0]
    assert apply_missing_eos_penalty(scores, ended, None) is scores
    with pytest.raises(ValueError, match="must be >= 0"):
        apply_missing_eos_penalty(scores, ended, -1.0)


# --- losses ------------------------------------------------------------------------------------------


def test_policy_loss_hand_computed_with_clipping() -> None:
    # ratio e^{0.5} ~ 1.65 with A = +1: clipped to 1.2 -> loss -1.2, clipfrac 1.
    # ratio e^{-0.5} ~ 0.61 with A = +1: the unclipped -0.61 is larger, no clip.
    logprobs = torch.tensor([[0.5, -0.5]], requires_grad=True)
    old = torch.zeros(1, 2)
    advantages = torch.ones(1, 2)
    loss, stats = policy_loss(logprobs, old, advantages, torch.tensor([[1, 0]]), cliprange=0.2)
    assert loss.item() == pytest.approx(-1.2)
    assert stats["clipfrac"].item() == 1.0
    assert stats["approxkl"].item() == pytest.approx(0.5 * 0.25)
    loss.backward()
    assert logprobs.grad.tolist() == [[0.0, 0.0]]  # clipped: no gradient; masked: no gradient

    loss, stats = policy_loss(logprobs, old, advantages, torch.tensor([[0, 1]]), cliprange=0.2)
    assert loss.item() == pytest.approx(-math.exp(-0.5))
    assert stats["clipfrac"].item() == 0.0
    assert stats["ratio"].item() == pytest.approx(math.exp(-0.5))


@PROPERTY
@given(data=st.data(), cliprange=st.floats(0.05, 0.5))
def test_policy_loss_is_never_below_the_clipped_objective_bound(data, cliprange) -> None:
    # PPO's pessimism: loss >= the mean of -A * clip(ratio) and >= the mean of -A * ratio.
    length = data.draw(st.integers(1, 8))
    logprobs = tensor([data.draw(st.lists(st.floats(-2, 2), min_size=length, max_size=length))])
    old = tensor([data.draw(st.lists(st.floats(-2, 2), min_size=length, max_size=length))])
    advantages = tensor([data.draw(st.lists(finite, min_size=length, max_size=length))])
    mask = torch.ones(1, length)
    loss, stats = policy_loss(logprobs, old, advantages, mask, cliprange)
    ratio = torch.exp(logprobs - old)
    assert loss.item() >= (-advantages * ratio).mean().item() - 1e-9
    assert loss.item() >= (-advantages * ratio.clamp(1 - cliprange, 1 + cliprange)).mean().item() - 1e-9
    assert 0.0 <= stats["clipfrac"].item() <= 1.0


def test_value_loss_hand_computed_with_clipping() -> None:
    # V = 1.0, V_old = 0.0, R = 1.0, c = 0.2: unclipped 0, clipped (0.2 - 1)^2 = 0.64 -> 0.5 * 0.64.
    values = torch.tensor([[1.0, 5.0]], requires_grad=True)
    loss, stats = value_loss(values, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1, 0]]), 0.2)
    assert loss.item() == pytest.approx(0.32)
    assert stats["clipfrac"].item() == 1.0
    loss.backward()
    assert values.grad.tolist() == [[0.0, 0.0]]  # the clipped branch is flat in V; masked V gets none


def test_losses_reject_bad_clip_ranges_and_shapes() -> None:
    with pytest.raises(ValueError, match="cliprange must be > 0"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 0.0)
    with pytest.raises(ValueError, match="cliprange_value must be > 0"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), -1.0)
    with pytest.raises(ValueError, match="old_logprobs has shape"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 2), 0.2)
    with pytest.raises(ValueError, match="selects no position"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), 0.2)


def test_entropy_from_logits() -> None:
    uniform = torch.zeros(1, 2, 4)
    assert entropy_from_logits(uniform)[0].tolist() == pytest.approx([math.log(4)] * 2)
    # A top-k-filtered row (-inf logits) has the entropy of what is left, not NaN.
    filtered = torch.tensor([[[0.0, 0.0, float("-inf"), float("-inf")]]])
    assert entropy_from_logits(filtered)[0].tolist() == pytest.approx([math.log(2)])


# --- PPOConfig ---------------------------------------------------------------------------------------


def test_config_defaults_are_trl_1_12s() -> None:
    cfg = PPOConfig()
    trl_defaults = {
        "kl_coef": 0.05,
        "kl_estimator": "k1",
        "cliprange": 0.2,
        "cliprange_value": 0.2,
        "vf_coef": 0.1,
        "gamma": 1.0,
        "lam": 0.95,
        "num_ppo_epochs": 4,
        "num_mini_batches": 1,
        "whiten_rewards": False,
        "temperature": 0.7,
        "missing_eos_penalty": None,
        "learning_rate": 3e-6,
        "local_rollout_forward_batch_size": 64,
        "num_sample_generations": 10,
    }
    assert {name: getattr(cfg, name) for name in trl_defaults} == trl_defaults
    assert cfg.kl_target is None and cfg.kl_horizon == 10000 and cfg.max_grad_norm == 1.0
    assert cfg.report_to == ["none"] and cfg.collapse_guard is False
    assert cfg.eval_on_start is False  # TRL's PPO had no step-0 evaluation
    assert cfg.effective_value_learning_rate == cfg.learning_rate


def test_every_config_field_has_help() -> None:
    missing = [name for name, help_text, _ in config_help(PPOConfig) if not help_text.strip()]
    assert missing == []


def test_config_loads_from_yaml_with_overrides(tmp_path) -> None:
    path = tmp_path / "ppo.yaml"
    path.write_text("kl_estimator: k3\nkl_target: 6\nreport_to: [tensorboard]\ncollapse_guard: true\n")
    cfg = load_config(PPOConfig, path, {"learning_rate": 1e-5, "value_learning_rate": "2e-5"})
    assert cfg.kl_estimator == "k3" and cfg.kl_target == 6.0 and cfg.adaptive_kl
    assert cfg.report_to == ["tensorboard"] and cfg.collapse_guard is True
    assert cfg.learning_rate == 1e-5 and cfg.effective_value_learning_rate == 2e-5


def test_a_finalized_config_saved_and_reloaded_is_equal(tmp_path) -> None:
    from searchrl.common.config import save_config

    cfg = PPOConfig(per_device_train_batch_size=2, gradient_accumulation_steps=2).finalize(1, 10)
    save_config(cfg, tmp_path / "config.yaml")
    reloaded = load_config(PPOConfig, tmp_path / "config.yaml").finalize(1, 10)
    assert dataclasses.asdict(reloaded) == dataclasses.asdict(cfg)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("kl_estimator: kl\n", r"kl_estimator.*not one of \['k1', 'k2', 'k3'\]"),
        ("cliprange: 1.5\n", r"cliprange=1.5 must be in \(0, 1\)"),
        ("gamma: 2\n", r"gamma=2.0 must be in \[0, 1\]"),
        ("kl_target: 0\n", "kl_target=0.0 must be > 0"),
        ("learning_rate: -1\n", "learning_rate=-1.0 must be > 0"),
        ("report_to: [none, tensorboard]\n", 'mixes "none"'),
        ("value_mode: critic\n", r"not one of \['separate', 'shared_backbone'\]"),
        ("search_backend: http\n", "search_url is not set"),
        ("collapse_lr_decay: 2\n", r"collapse_lr_decay=2.0 must be in \(0, 1\]"),
        ("collapse_format_min: 1.5\n", "collapse_format_min=1.5 must be in"),
        ("per_device_train_batch_size: 0\n", "per_device_train_batch_size=0 must be an integer >= 1"),
        ("max_episode_tokens: 8\nmax_new_tokens_per_turn: 16\n", "raise max_episode_tokens"),
        ("kl_coeff: 0.1\n", r"unknown field\(s\) \['kl_coeff'\]"),
    ],
)
def test_config_rejects_bad_values_with_messages_that_fix(tmp_path, yaml_text, message) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_config(PPOConfig, path)


def test_finalize_batch_arithmetic_is_trls() -> None:
    cfg = PPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=4, num_mini_batches=2)
    cfg.finalize(world_size=2, num_train_rows=100)
    assert cfg.local_batch_size == 16
    assert cfg.batch_size == 32
    assert cfg.micro_batch_size == 8
    assert cfg.local_mini_batch_size == 8
    assert cfg.mini_batch_size == 16
    assert cfg.micro_batches_per_mini_batch == 2
    assert cfg.total_episodes == 300  # num_train_epochs 3 * 100 questions
    assert cfg.num_total_batches == math.ceil(300 / 32)


def test_finalize_with_total_episodes_needs_no_row_count() -> None:
    cfg = PPOConfig(per_device_train_batch_size=3, total_episodes=10).finalize()
    assert cfg.num_total_batches == 4 and cfg.batch_size == 3


@pytest.mark.parametrize(
    ("kwargs", "finalize_args", "message"),
    [
        (
            {"per_device_train_batch_size": 3, "num_mini_batches": 2},
            (1, 10),
            "does not divide into num_mini_batches=2",
        ),
        (
            {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3, "num_mini_batches": 2},
            (1, 10),
            r"make gradient_accumulation_steps \(3\) a multiple of num_mini_batches \(2\)",
        ),
        ({"per_device_train_batch_size": 8}, (2, 10), "needs batch_size = 16"),
        ({}, (1, None), "needs num_train_rows"),
        ({}, (0, 10), "world_size=0 must be an int >= 1"),
    ],
)
def test_finalize_rejects_sizes_that_do_not_divide(kwargs, finalize_args, message) -> None:
    with pytest.raises(ValueError, match=message):
        PPOConfig(**kwargs).finalize(*finalize_args)
