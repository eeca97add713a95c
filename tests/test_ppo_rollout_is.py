"""Importance weights for a sampler that disagrees with the trainer (`searchrl.ppo.rollout_is`, issue #25 §4).

Three layers, each on what a user relies on:
- the weights themselves (hypothesis): truncation never exceeds C and is min(r, C) exactly; masking zeroes
  exactly the out-of-range tokens and keeps r elsewhere; sequence modes put one weight on every action token
  of a trajectory, from the product of its ratios; equal logprobs give weight 1 everywhere and the unweighted
  loss; nothing off the action tokens counts;
- `policy_loss(..., weights)`: its gradient is the weights times the per-token gradients, and `weights=None`
  is the loss it always was;
- `PPOTrainer` on the tiny Varnholt world with a rollout engine that reports logprobs lower than the model's
  on purpose: the `rollout_is/*` metrics report the gap, the update is weighted as configured (plain SGD makes
  a uniform weight visible: truncation at C = 2 doubles the policy's step, masking removes it), and mode
  "none" gives exactly the update of a sampler that agrees.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ppo_trainer import LikedTokens, make_args
from worlds import TINY_TWO_LAYERS, VARNHOLT_QA

from searchrl.common.config import ConfigError, config_help, load_config
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.models.tiny import build_value_model
from searchrl.ppo import ROLLOUT_IS_MODES, PPOConfig, RolloutIS, policy_loss, rollout_is_weights
from searchrl.ppo import trainer as trainer_module
from searchrl.ppo.trainer import PPOTrainer
from searchrl.rollout.generator import HFGenerator

torch.set_num_threads(1)
PROPERTY = settings(max_examples=150, deadline=None)
MODES = [m for m in ROLLOUT_IS_MODES if m != "none"]


# --------------------------------------------------------------------------------------------------
# the weights (hypothesis)
# --------------------------------------------------------------------------------------------------


@st.composite
def batches(draw, max_rows: int = 4, max_len: int = 8):
    """(old_logprobs, rollout_logprobs, mask): log-ratios in [-3, 3], at least one action token per batch."""
    rows = draw(st.integers(1, max_rows))
    length = draw(st.integers(1, max_len))
    cells = rows * length
    old = draw(st.lists(st.floats(-8.0, 0.0), min_size=cells, max_size=cells))
    gap = draw(st.lists(st.floats(-3.0, 3.0), min_size=cells, max_size=cells))
    mask = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    mask[draw(st.integers(0, cells - 1))] = True
    old_t = torch.tensor(old).reshape(rows, length)
    rollout_t = old_t - torch.tensor(gap).reshape(rows, length)  # r = exp(gap)
    # Off the action tokens anything may sit (padding, observation tokens): NaN must stay out.
    mask_t = torch.tensor(mask).reshape(rows, length)
    rollout_t = torch.where(mask_t, rollout_t, torch.full_like(rollout_t, float("nan")))
    return old_t, rollout_t, mask_t.float()


clip_maxes = st.floats(1.0, 5.0)


@PROPERTY
@given(batches(), clip_maxes)
def test_token_truncate_is_min_of_ratio_and_c_never_above_c(batch, clip_max):
    old, rollout, mask = batch
    weights, stats = rollout_is_weights(old, rollout, mask, "token_truncate", clip_max)
    ratio = torch.exp(old - rollout)
    valid = mask.bool()
    assert torch.all(weights <= clip_max)
    assert torch.allclose(weights[valid], torch.clamp(ratio[valid], max=clip_max), rtol=1e-6)
    assert torch.all(weights[~valid] == 0)
    share = float((ratio[valid] > clip_max).float().mean())
    assert float(stats["truncated_frac"]) == pytest.approx(share)
    assert float(stats["ratio_max"]) == pytest.approx(float(ratio[valid].max()), rel=1e-6)
    assert float(stats["ratio_mean"]) == pytest.approx(float(ratio[valid].mean()), rel=1e-5)
    assert float(stats["weight_mean"]) == pytest.approx(float(weights[valid].mean()), rel=1e-5)


@PROPERTY
@given(batches(), clip_maxes, st.one_of(st.none(), st.floats(0.05, 0.95)))
def test_token_mask_zeroes_exactly_the_tokens_outside_the_range(batch, clip_max, clip_min):
    old, rollout, mask = batch
    weights, stats = rollout_is_weights(old, rollout, mask, "token_mask", clip_max, clip_min)
    ratio = torch.exp(old - rollout)
    valid = mask.bool()
    outside = (ratio > clip_max) | (ratio < (clip_min if clip_min is not None else 0.0))
    assert torch.all(weights[valid & outside] == 0)
    assert torch.allclose(weights[valid & ~outside], ratio[valid & ~outside], rtol=1e-6)
    assert torch.all(weights[~valid] == 0)
    assert float(stats["masked_frac"]) == pytest.approx(float(outside[valid].float().mean()))


@PROPERTY
@given(batches(), clip_maxes, st.sampled_from(["sequence_truncate", "sequence_mask"]))
def test_sequence_modes_give_one_weight_per_trajectory_from_the_product_of_its_ratios(batch, clip_max, mode):
    old, rollout, mask = batch
    weights, stats = rollout_is_weights(old, rollout, mask, mode, clip_max)
    valid = mask.bool()
    cut = 0
    for row in range(old.shape[0]):
        if not valid[row].any():
            assert torch.all(weights[row] == 0)
            continue
        seq_ratio = math.exp(float((old[row] - rollout[row])[valid[row]].sum()))
        expected = (
            min(seq_ratio, clip_max) if mode == "sequence_truncate" else seq_ratio * (seq_ratio <= clip_max)
        )
        cut += seq_ratio > clip_max
        row_weights = weights[row][valid[row]]
        assert torch.all(row_weights == row_weights[0])  # one weight for the whole trajectory
        assert float(row_weights[0]) == pytest.approx(expected, rel=1e-4)
        assert torch.all(weights[row][~valid[row]] == 0)
    frac = stats["truncated_frac" if mode == "sequence_truncate" else "masked_frac"]
    assert float(frac) == pytest.approx(cut / int(valid.any(dim=1).sum()))
    assert float(stats["seq_ratio_max"]) <= math.exp(20.0)


@PROPERTY
@given(batches(), clip_maxes, st.sampled_from(MODES))
def test_equal_logprobs_give_weight_one_and_the_unweighted_loss(batch, clip_max, mode):
    old, _, mask = batch
    weights, stats = rollout_is_weights(old, old.clone(), mask, mode, clip_max)
    valid = mask.bool()
    assert torch.all(weights[valid] == 1.0) and torch.all(weights[~valid] == 0)
    assert float(stats["ratio_mean"]) == 1.0 and float(stats["ratio_max"]) == 1.0
    logprobs = old + 0.1 * torch.randn_like(old)
    advantages = torch.randn_like(old)
    plain, plain_stats = policy_loss(logprobs, old, advantages, mask, 0.2)
    weighted, weighted_stats = policy_loss(logprobs, old, advantages, mask, 0.2, weights)
    assert torch.equal(plain, weighted)
    assert all(torch.equal(plain_stats[k], weighted_stats[k]) for k in plain_stats)


def test_nonfinite_sampler_logprobs_give_bounded_weights():
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    rollout = torch.tensor([[float("nan"), float("-inf"), -1.0 - 50.0, -1.0]])
    mask = torch.ones_like(old)
    weights, stats = rollout_is_weights(old, rollout, mask, "token_truncate", 2.0)
    assert weights.tolist() == [[1.0, 2.0, 2.0, 1.0]]  # NaN: ratio 1 (TRL's rule); the rest capped at C
    assert float(stats["ratio_max"]) == pytest.approx(math.exp(20.0))
    seq, _ = rollout_is_weights(old, rollout, mask, "sequence_mask", 2.0)
    assert seq.tolist() == [[0.0] * 4]


# --------------------------------------------------------------------------------------------------
# policy_loss with weights
# --------------------------------------------------------------------------------------------------


@PROPERTY
@given(batches(), st.sampled_from(MODES), clip_maxes)
def test_the_weighted_loss_gradient_is_the_weights_times_the_per_token_gradients(batch, mode, clip_max):
    old, rollout, mask = batch
    weights, _ = rollout_is_weights(old, rollout, mask, mode, clip_max)
    generator = torch.Generator().manual_seed(0)
    advantages = torch.randn(old.shape, generator=generator)
    start = old + 0.3 * torch.randn(old.shape, generator=generator)  # some tokens clipped, some not

    def grad(w):
        logprobs = start.clone().requires_grad_(True)
        loss, _ = policy_loss(logprobs, old, advantages, mask, 0.2, w)
        loss.backward()
        return logprobs.grad

    assert torch.allclose(grad(weights), weights * grad(None), atol=1e-7, rtol=1e-5)


def test_weights_none_is_the_unweighted_loss_and_masked_weights_never_leak():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.2]])
    logprobs = old + torch.tensor([[0.1, -0.4, 0.0], [0.3, 0.05, -0.2]])
    advantages = torch.tensor([[1.0, -0.5, 2.0], [-1.0, 0.7, 0.2]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    loss, _ = policy_loss(logprobs, old, advantages, mask, 0.2)
    assert torch.equal(loss, policy_loss(logprobs, old, advantages, mask, 0.2, None)[0])
    ones = torch.where(mask.bool(), torch.ones_like(mask), torch.full_like(mask, float("nan")))
    assert torch.equal(loss, policy_loss(logprobs, old, advantages, mask, 0.2, ones)[0])
    with pytest.raises(ValueError, match="weights has shape"):
        policy_loss(logprobs, old, advantages, mask, 0.2, torch.ones(2, 2))


# --------------------------------------------------------------------------------------------------
# PPOConfig
# --------------------------------------------------------------------------------------------------


def test_config_default_is_none_and_every_field_has_help():
    cfg = PPOConfig()
    assert (cfg.rollout_is_mode, cfg.rollout_is_clip_max, cfg.rollout_is_clip_min) == ("none", 2.0, None)
    helps = {name: text for name, text, _ in config_help(PPOConfig)}
    assert (
        "Yao et al." in helps["rollout_is_mode"]
        and "vllm_importance_sampling_mode" in helps["rollout_is_mode"]
    )
    assert "rollout_is_threshold" in helps["rollout_is_clip_max"]
    assert RolloutIS.of(cfg) == RolloutIS("none", 2.0, None)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("rollout_is_mode: tis\n", r"rollout_is_mode.*'tis'.* is not one of \['none', 'token_truncate'"),
        (
            "rollout_is_mode: token_truncate\nrollout_is_clip_max: 0.5\n",
            "rollout_is_clip_max=0.5 must be a number >= 1",
        ),
        (
            "rollout_is_mode: token_mask\nrollout_is_clip_min: 1.5\n",
            r"rollout_is_clip_min=1.5 must be in \(0, 1\)",
        ),
        (
            "rollout_is_mode: token_truncate\nrollout_is_clip_min: 0.5\n",
            "rollout_is_clip_min=0.5 applies to the mask modes only",
        ),
    ],
)
def test_config_rejects_bad_rollout_is_settings_with_messages_that_fix(tmp_path, yaml_text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_config(PPOConfig, path)


def test_config_built_in_python_is_checked_too():
    with pytest.raises(ConfigError, match=r"rollout_is_mode='tis' is not one of"):
        PPOConfig(rollout_is_mode="tis")
    with pytest.raises(ConfigError, match="rollout_is_clip_min=0.5 applies to the mask modes only"):
        PPOConfig(rollout_is_mode="sequence_truncate", rollout_is_clip_min=0.5)
    with pytest.raises(ConfigError, match="rollout_is_clip_max=0.9 must be a number >= 1"):
        PPOConfig(rollout_is_clip_max=0.9)


def test_config_loads_every_mode(tmp_path):
    for mode in ROLLOUT_IS_MODES:
        path = tmp_path / f"{mode}.yaml"
        path.write_text(f"rollout_is_mode: {mode}\nrollout_is_clip_max: 3\n")
        cfg = load_config(PPOConfig, path)
        assert cfg.rollout_is_mode == mode and cfg.rollout_is_clip_max == 3.0
    cfg = PPOConfig(rollout_is_mode="sequence_mask", rollout_is_clip_max=2.0, rollout_is_clip_min=0.5)
    assert RolloutIS.of(cfg) == RolloutIS("sequence_mask", 2.0, 0.5)


def test_the_vllm_configs_start_from_truncation_at_two_and_the_paper_recipes_stay_uncorrected():
    from searchrl.demo.configs import RealDemoConfig

    root = Path(__file__).resolve().parents[1] / "configs"
    full = load_config(PPOConfig, root / "real" / "qwen2.5-3b_ppo.yaml")
    lora = load_config(RealDemoConfig, root / "real" / "demo_real_qwen2.5-3b.yaml").ppo_config()
    for cfg in (full, lora):
        assert cfg.rollout_backend == "vllm"
        assert (cfg.rollout_is_mode, cfg.rollout_is_clip_max) == ("token_truncate", 2.0)
    for name in ("qwen2.5-3b_ppo.yaml", "qwen2.5-7b_ppo.yaml"):  # Search-R1 as published: no correction
        cfg = load_config(PPOConfig, root / "search_r1" / name)
        assert cfg.rollout_backend == "vllm" and cfg.rollout_is_mode == "none"
        assert "# rollout_is_mode: token_truncate" in (root / "search_r1" / name).read_text()


# --------------------------------------------------------------------------------------------------
# PPOTrainer with a sampler that disagrees on purpose
# --------------------------------------------------------------------------------------------------


class DisagreeingSampler(HFGenerator):
    """The HF engine, reporting logprobs `gap` nats *below* the model's on the action tokens at even positions
    (`every_token`: on all of them), as a bf16 or vLLM sampler would disagree: the trainer's ratio there is
    exp(gap)."""

    def __init__(self, *args, gap: float, every_token: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.gap, self.every_token = gap, every_token

    def rollout(self, envs, rows, sampling=None):
        batch = super().rollout(envs, rows, sampling)
        for t in batch.trajectories:
            for i, acting in enumerate(t.action_mask):
                if acting and (self.every_token or i % 2 == 0):
                    t.logprobs[i] -= self.gap
        return batch


def sampler(gap: float, every_token: bool = False):
    return lambda policy, tok, config: DisagreeingSampler(
        policy, tok, config, gap=gap, every_token=every_token
    )


def make_trainer(world, tmp_path, name, factory=None, optimizer_lr=None, **kw) -> PPOTrainer:
    args = make_args(tmp_path, **{"output_dir": str(tmp_path / name), **kw})  # test_ppo_trainer's tiny run
    policy = copy.deepcopy(world["policy"])
    extra = {}
    if optimizer_lr is not None:  # plain SGD: the step is lr x gradient, so a uniform weight shows in it
        value = copy.deepcopy(world["value"])
        extra = {
            "value_model": value,
            "optimizers": (
                torch.optim.SGD([*policy.parameters(), *value.parameters()], lr=optimizer_lr),
                None,
            ),
        }
    return PPOTrainer(
        args,
        world["tok"],
        policy,
        None,
        None,
        VARNHOLT_QA,
        reward_funcs=LikedTokens(),
        environment=lambda: SearchEnvironment(
            world["backend"], EnvConfig(max_turns=2, max_tool_calls=2), tokenizer=world["tok"]
        ),
        generator_factory=factory,
        **extra,
    )


@pytest.fixture(scope="module")
def sgd_world(world):
    return {**world, "value": build_value_model(world["tok"], TINY_TWO_LAYERS)}


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def recording_policy_loss(monkeypatch) -> list[tuple]:
    """Every (action mask, weights) the trainer passes to `policy_loss` from now on."""
    seen: list[tuple] = []
    original = trainer_module.policy_loss

    def recording(*args, **kwargs):
        seen.append((args[3], args[5] if len(args) > 5 else kwargs.get("weights")))
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", recording)
    return seen


def test_metrics_report_the_gap_and_the_share_truncated(world, tmp_path, monkeypatch):
    trainer = make_trainer(
        world, tmp_path, "truncate", sampler(1.0), rollout_is_mode="token_truncate", rollout_is_clip_max=2.0
    )
    seen = recording_policy_loss(monkeypatch)
    metrics = trainer.step()
    perturbed = total = 0
    for t in trainer.last_trajectories:
        perturbed += sum(1 for i, m in enumerate(t.action_mask) if m and i % 2 == 0)
        total += sum(t.action_mask)
    share = perturbed / total
    assert 0 < share < 1
    e = math.e
    assert metrics["rollout_is/ratio_max"] == pytest.approx(e, rel=1e-4)
    assert metrics["rollout_is/ratio_mean"] == pytest.approx(share * e + (1 - share), rel=1e-4)
    assert metrics["rollout_is/truncated_frac"] == pytest.approx(share)
    assert metrics["rollout_is/weight_mean"] == pytest.approx(share * 2.0 + (1 - share), rel=1e-4)
    assert metrics["rollout/logprob_max_abs_diff"] == pytest.approx(1.0, rel=1e-4)
    # The policy loss got the weights: 2 on the perturbed tokens (e truncated at C), about 1 on the others.
    assert len(seen) == 2  # one mini-batch of two micro-batches
    twos = 0
    for mask, weights in seen:
        acting = weights[mask.bool()]
        assert bool(torch.all(((acting - 2.0).abs() < 1e-4) | ((acting - 1.0).abs() < 1e-4)))
        assert torch.all(weights[~mask.bool()] == 0)
        twos += int(((acting - 2.0).abs() < 1e-4).sum())
    assert twos == perturbed


def test_an_agreeing_sampler_reports_ratio_one_in_mode_none(world, tmp_path):
    metrics = make_trainer(world, tmp_path, "agree").step()
    assert metrics["rollout_is/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout_is/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert not any(
        k.startswith("rollout_is/") and k.endswith("_frac") for k in metrics
    )  # no cut in mode none


def test_the_update_is_weighted_as_configured(sgd_world, tmp_path):
    """Every action token's ratio is e: truncation at C = 2 gives every token weight 2, so plain SGD takes
    twice the policy step of mode none; masking at C = 2 gives weight 0, so the policy does not move at all
    (the critic, unweighted, still does). Same start, same rollouts in every run."""
    runs = {}
    for mode in ROLLOUT_IS_MODES:
        trainer = make_trainer(
            sgd_world,
            tmp_path,
            mode,
            sampler(1.0, every_token=True),
            optimizer_lr=0.05,
            max_grad_norm=None,
            rollout_is_mode=mode,
            rollout_is_clip_max=2.0,
        )
        before_policy, before_value = params(trainer.policy), params(trainer.model.value_model)
        metrics = trainer.step()
        runs[mode] = {
            "policy": {n: p.detach() - before_policy[n] for n, p in trainer.policy.named_parameters()},
            "value": {
                n: p.detach() - before_value[n] for n, p in trainer.model.value_model.named_parameters()
            },
            "metrics": metrics,
        }
    none = runs["none"]
    assert any(d.abs().max() > 0 for d in none["policy"].values())
    for mode in ("token_truncate", "sequence_truncate"):
        for name, delta in runs[mode]["policy"].items():
            assert torch.allclose(delta, 2.0 * none["policy"][name], rtol=1e-3, atol=1e-6), (mode, name)
        assert runs[mode]["metrics"]["rollout_is/truncated_frac"] == 1.0
        assert runs[mode]["metrics"]["rollout_is/weight_mean"] == pytest.approx(2.0)
    for mode in ("token_mask", "sequence_mask"):
        assert all(torch.all(d == 0) for d in runs[mode]["policy"].values()), mode
        assert runs[mode]["metrics"]["rollout_is/masked_frac"] == 1.0
        assert runs[mode]["metrics"]["rollout_is/weight_mean"] == 0.0
    for mode in MODES:  # the value loss is never weighted: the critic takes the same step in every mode
        for name, delta in runs[mode]["value"].items():
            assert torch.allclose(delta, none["value"][name], rtol=1e-4, atol=1e-7), (mode, name)
    assert runs["sequence_truncate"]["metrics"]["rollout_is/seq_ratio_max"] > 2.0


def test_mode_none_ignores_the_samplers_logprobs_bit_for_bit(world, tmp_path, monkeypatch):
    """Mode none: the policy loss gets no weights, and a sampler 1 nat off gives the very update (and every
    metric but the gap's own) of a sampler that agrees."""
    seen = recording_policy_loss(monkeypatch)
    results = []
    for name, factory in (("agree", None), ("disagree", sampler(1.0))):
        trainer = make_trainer(world, tmp_path, name, factory)
        metrics = trainer.step()
        results.append((params(trainer.policy), params(trainer.model.value_model), metrics))
    assert seen and all(weights is None for _, weights in seen)
    (policy_a, value_a, metrics_a), (policy_b, value_b, metrics_b) = results
    assert all(torch.equal(policy_a[n], policy_b[n]) for n in policy_a)
    assert all(torch.equal(value_a[n], value_b[n]) for n in value_a)
    timing = (
        "seconds",
        "per_second",
        "tokens_per_s",
        "wall_s",
        "latency",
        "search_s",
        "search_share",
        "time/",
    )
    gap_keys = ("rollout_is/", "rollout/logprob_max_abs_diff")
    same = [k for k in metrics_a if not any(t in k for t in timing + gap_keys)]
    assert {k: metrics_a[k] for k in same} == {k: metrics_b[k] for k in same}
    assert metrics_b["rollout_is/ratio_max"] == pytest.approx(math.e, rel=1e-4)
