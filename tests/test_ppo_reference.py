"""The reference and the critic stay independent of the policy, whatever an earlier trainer left on it.

The bug these tests pin down: TRL 1.16's SFTTrainer (and accelerate's bf16 autocast) replace `forward` on
the model instance with wrappers that close over the original bound method. After an in-process SFT a
`copy.deepcopy` of the policy then ran the live policy (PPO's KL to its "reference" was exactly 0 in every
step of the demo), and the autocast wrapper kept sampling in bfloat16 (sampling and PPO's recomputation
disagreed by 0.05-0.12 nats). Each test runs the same process and order as the demo: SFT, then PPO.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_ppo_trainer import QA, TINY, call, env_factory, make_args

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.models.forward_patches import (
    ForwardPatchError,
    find_forward_patches,
    independent_copy,
    remove_trainer_forward_patches,
    shares_storage,
)
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.ppo.modeling import position_ids_from_mask
from searchrl.ppo.trainer import PPOTrainer, collate_trajectories
from searchrl.rewards.combine import default_rubric
from searchrl.rollout.generator import ScriptedPolicy
from searchrl.sft.expert import ExpertConfig, ExpertPolicy
from searchrl.sft.pipeline import prompt_texts
from searchrl.sft.warm_start import SFTWarmStartConfig, run_sft


@pytest.fixture(scope="module")
def synth(synthetic_index):
    """The synthetic task at toy size, its index, a tokenizer and expert demonstrations (a few seconds)."""
    synthetic = synthetic_index(0)
    task, backend = synthetic.task, synthetic.backend
    rows = task.splits["train"]
    env_cfg = EnvConfig(max_turns=4, max_tool_calls=3, topk=1)
    tok = train_tokenizer(
        tokenizer_training_texts(task.corpus, rows) + prompt_texts(SearchEnvironment(backend, env_cfg), rows),
        vocab_size=700,
    )
    envs = [SearchEnvironment(backend, env_cfg, tokenizer=tok) for _ in rows]
    demos = ExpertPolicy(ExpertConfig(noise=0.3, k=1)).demonstrate(None, tok, envs, rows)
    return {"task": task, "backend": backend, "tok": tok, "demos": demos, "env_cfg": env_cfg, "rows": rows}


def sft_policy(synth, bf16: bool, steps: int = 2):
    policy = build_policy(synth["tok"], TINY)
    config = SFTWarmStartConfig(
        max_steps=steps, per_device_train_batch_size=4, learning_rate=3e-3, bf16=bf16, logging_steps=1
    )
    return run_sft(policy, synth["tok"], synth["demos"][:16], config).policy


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    mask = torch.ones_like(ids)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits


def perturb(model: torch.nn.Module, scale: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def synth_trainer(synth, policy, tmp_path, **kw) -> PPOTrainer:
    args = make_args(
        tmp_path,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        total_episodes=kw.pop("total_episodes", 8),
        max_new_tokens_per_turn=40,  # the demo's
        max_episode_tokens=300,
        topk=1,
        max_turns=4,
        max_tool_calls=3,
        **kw,
    )
    return PPOTrainer(
        args,
        synth["tok"],
        policy,
        None,
        None,
        synth["rows"],
        reward_funcs=default_rubric(),
        environment=lambda: SearchEnvironment(synth["backend"], synth["env_cfg"], tokenizer=synth["tok"]),
    )


@pytest.mark.parametrize("bf16", [False, True])
def test_run_sft_returns_a_policy_without_trainer_forward_wrappers(synth, bf16):
    policy = sft_policy(synth, bf16=bf16)
    assert find_forward_patches(policy) == []
    assert "_original_forward" not in vars(policy)
    # The class's own forward in float32: the same logits as calling it explicitly.
    ids = torch.tensor([synth["demos"][0].input_ids[:40]])
    plain = type(policy).forward(policy, input_ids=ids).logits
    assert torch.equal(logits_of(policy, ids), plain)


def test_after_an_in_process_sft_the_reference_and_the_critic_stay_put_when_the_policy_moves(synth, tmp_path):
    policy = sft_policy(synth, bf16=True)
    trainer = synth_trainer(synth, policy, tmp_path)
    assert not shares_storage(trainer.ref_model, trainer.policy)
    assert not shares_storage(trainer.model.value_model, trainer.policy)
    ids = torch.tensor([synth["demos"][1].input_ids[:60]])
    mask = torch.ones_like(ids)
    ref_before = logits_of(trainer.ref_model, ids)
    policy_before = logits_of(trainer.policy, ids)
    assert torch.allclose(ref_before, policy_before, atol=1e-6)  # the reference starts as the policy
    with torch.no_grad():
        values_before = trainer.model(ids, mask)[1]
    perturb(trainer.policy)
    assert (logits_of(trainer.policy, ids) - policy_before).abs().max() > 1e-2  # the policy moved ...
    assert torch.equal(logits_of(trainer.ref_model, ids), ref_before)  # ... its reference did not
    with torch.no_grad():
        assert torch.equal(trainer.model(ids, mask)[1], values_before)  # nor did the critic


def test_a_deep_copy_of_a_trl_patched_policy_passed_as_reference_is_made_independent(world, tmp_path):
    from trl.trainer.utils import add_fused_lm_head

    policy = copy.deepcopy(world["policy"])
    add_fused_lm_head(policy)
    assert [p.package for p in find_forward_patches(policy)] == ["trl"]
    ref = copy.deepcopy(policy)  # what `frozen_copy` used to do: the copy's forward runs `policy`
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    before = logits_of(ref, ids)
    perturb(policy)
    assert torch.equal(logits_of(ref, ids), logits_of(policy, ids)), "the bug: the copy follows the policy"
    perturb(policy, scale=-0.05)  # undo (same noise, opposite sign)
    trainer = PPOTrainer(
        make_args(tmp_path),
        world["tok"],
        policy,
        ref,
        None,
        QA,
        reward_funcs=default_rubric(),
        environment=env_factory(world),
    )
    assert find_forward_patches(trainer.policy) == [] and find_forward_patches(trainer.ref_model) == []
    perturb(trainer.policy)
    assert torch.allclose(logits_of(trainer.ref_model, ids), before, atol=1e-5)
    assert not torch.allclose(logits_of(trainer.policy, ids), before, atol=1e-3)


def test_an_unknown_forward_wrapper_is_refused_with_a_clear_message(world, tmp_path):
    policy = copy.deepcopy(world["policy"])
    original = policy.forward

    def my_forward(*args, **kwargs):
        return original(*args, **kwargs)

    policy.forward = my_forward
    with pytest.raises(ForwardPatchError, match="my_forward.*del module.forward"):
        PPOTrainer(
            make_args(tmp_path),
            world["tok"],
            policy,
            None,
            None,
            QA,
            reward_funcs=default_rubric(),
            environment=env_factory(world),
        )
    with pytest.raises(ForwardPatchError):
        remove_trainer_forward_patches(policy)
    assert "forward" in vars(policy)  # refused means untouched


def test_a_reference_that_shares_the_policys_weights_is_refused(world, tmp_path):
    policy = copy.deepcopy(world["policy"])
    alias = build_policy(world["tok"], TINY)
    alias.load_state_dict(policy.state_dict(), assign=True)  # same tensors, another module
    with pytest.raises(ValueError, match="ref_model shares weights with the policy"):
        PPOTrainer(
            make_args(tmp_path),
            world["tok"],
            policy,
            alias,
            None,
            QA,
            reward_funcs=default_rubric(),
            environment=env_factory(world),
        )


def test_independent_copy_has_its_own_storage_and_the_same_function(world):
    policy = copy.deepcopy(world["policy"])
    clone = independent_copy(policy)
    assert not shares_storage(policy, clone)
    ids = torch.tensor([[3, 4, 5, 6]])
    assert torch.equal(logits_of(policy, ids), logits_of(clone, ids))
    bf16 = copy.deepcopy(world["policy"]).to(torch.bfloat16)
    assert next(independent_copy(bf16).parameters()).dtype == torch.bfloat16


def test_ppo_right_after_an_in_process_bf16_sft_has_kl_and_sampling_matches_training(synth, tmp_path):
    """The demo's order (SFT bf16, then PPO in the same process) on a batch of the demo's shape: prompts of
    different lengths, rows that answer at once, after one search and after two (observations inserted
    into the shared KV cache, finished rows dropped from it), and freely sampled rows."""
    policy = sft_policy(synth, bf16=True, steps=6)
    trainer = synth_trainer(
        synth, policy, tmp_path, kl_coef=0.1, learning_rate=3e-3, num_ppo_epochs=2, total_episodes=24
    )
    rows = trainer.train_rows
    scripts = [
        ["<answer>Nobody [d000001]</answer>"],
        [call(rows[1]["question"].split()[-1]), "<answer>Someone</answer>"],
        [call("first hop"), call("second hop"), "<answer>Else</answer>"],
        [],  # sampled freely
    ] * 2
    trainer.generator.forcing = ScriptedPolicy(synth["tok"], scripts)
    metrics = [trainer.step() for _ in range(trainer.num_total_batches)]
    trajs, _ = trainer.rollout(rows[:8], seed=5)
    assert {t.num_turns for t in trajs} >= {1, 2, 3}, "the batch must mix episode shapes"
    assert len({t.prompt_length for t in trajs}) > 1
    gaps = [m["rollout/logprob_max_abs_diff"] for m in metrics]
    # float32 on both sides: measured 5e-7 here; 3e-5 to 1.7e-4 before the fix (bf16 sampling and recomputing;
    # the demo's larger model showed 0.05-0.12).
    assert max(gaps) < 1e-5, gaps
    kls = [m["objective/kl"] for m in metrics]
    assert kls[0] == pytest.approx(0.0, abs=1e-4)  # step 1 samples the reference itself
    assert all(abs(k) > 1e-4 for k in kls[1:]), kls  # exactly 0.0 before the fix
    assert all(m["objective/non_score_reward"] != 0.0 for m in metrics[1:])
    batch = collate_trajectories(trajs, synth["tok"].pad_token_id)
    assert not torch.allclose(trainer._ref_logprobs(batch), trainer._policy_and_values(batch)[0], atol=1e-4)
