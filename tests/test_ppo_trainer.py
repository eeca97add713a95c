"""PPOTrainer wiring on a real tiny world: tiny Qwen2 policy, real BM25 index, real SearchEnvironment.

The world is conftest.py's `world` (`worlds.build_varnholt_world`: the Varnholt index, its tokenizer and an
untrained `TINY_TWO_LAYERS` policy, which every trainer here copies).

Each test runs the trainer's own functions (`collate_trajectories`, `token_logprobs`, `PolicyAndValue`,
`PPOTrainer.score`, `PPOTrainer.step`) on real rollouts. An untrained tiny model earns 0 from the QA
rubric, which would make every advantage 0, so update tests use `LikedTokens`: a reward on the share of
sampled tokens in a fixed set of ids. It varies from episode to episode and a policy can learn it, so
parameters really move. The rl_methods.md §8 invariants are named `test_invariant_<n>_...`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch
from transformers import TrainerCallback
from worlds import TINY_TWO_LAYERS, VARNHOLT_CORPUS, VARNHOLT_QA

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.models.tiny import (
    build_value_model,
)
from searchrl.ppo.advantages import place_rewards
from searchrl.ppo.config import PPOConfig
from searchrl.ppo.losses import policy_loss
from searchrl.ppo.modeling import frozen_copy, position_ids_from_mask, token_logprobs
from searchrl.ppo.trainer import PPOTrainer, collate_trajectories
from searchrl.rewards.combine import default_rubric
from searchrl.rollout.generator import ScriptedPolicy

CORPUS = VARNHOLT_CORPUS
QA = VARNHOLT_QA
TINY = TINY_TWO_LAYERS
# Tiny models on a shared 2-core machine: intra-op threads only fight each other (10x slower measured).
torch.set_num_threads(1)
# Wall-clock figures differ between two identical runs; everything else must not. `time/*` are the
# training clocks (`time/train_s`, `time/elapsed_s`): wall-clock too, and a resumed run's also carry the
# killed run's seconds up to its checkpoint, so they cannot equal an uninterrupted run's.
TIMING_KEYS = (
    "seconds",
    "per_second",
    "tokens_per_s",
    "wall_s",
    "latency",
    "search_s",
    "search_share",
    "time/",
)


class LikedTokens:
    """A learnable stand-in reward: the share of sampled tokens whose id is a multiple of 4."""

    def score(self, traj) -> tuple[float, dict[str, float]]:
        sampled = [tid for tid, m in zip(traj.input_ids, traj.action_mask, strict=True) if m]
        value = sum(tid % 4 == 0 for tid in sampled) / max(1, len(sampled))
        traj.reward, traj.reward_breakdown = value, {"liked_tokens": value}
        return value, {"liked_tokens": value}


def env_factory(world, **cfg):
    cfg.setdefault("max_turns", 2)
    cfg.setdefault("max_tool_calls", 2)
    return lambda: SearchEnvironment(world["backend"], EnvConfig(**cfg), tokenizer=world["tok"])


def make_args(tmp_path, **kw) -> PPOConfig:
    base = dict(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        total_episodes=4,
        num_ppo_epochs=1,
        max_new_tokens_per_turn=8,
        max_episode_tokens=40,
        learning_rate=1e-3,
        temperature=1.0,
        save_steps=1000,
        eval_steps=1000,
        progress_bar=False,
        save_trajectories=False,
        seed=3,
    )
    base.update(kw)
    return PPOConfig(**base)


def make_trainer(world, tmp_path, policy=None, reward=None, **kw) -> PPOTrainer:
    extra = {
        k: kw.pop(k)
        for k in (
            "ref_model",
            "reward_model",
            "value_model",
            "optimizers",
            "callbacks",
            "peft_config",
            "eval_dataset",
        )
        if k in kw
    }
    env_cfg = kw.pop("env", {})
    return PPOTrainer(
        make_args(tmp_path, **kw),
        world["tok"],
        policy if policy is not None else copy.deepcopy(world["policy"]),
        extra.pop("ref_model", None),
        extra.pop("reward_model", None),
        QA,
        reward_funcs=reward if reward is not None else LikedTokens(),
        environment=env_factory(world, **env_cfg),
        **extra,
    )


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> list[str]:
    return [n for n, p in module.named_parameters() if not torch.equal(before[n], p.detach())]


def call(query: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query": query}}) + "\n</tool_call>"


def scripted_rollout(trainer: PPOTrainer, world, scripts):
    """Force `scripts` (turn texts per row) through the trainer's real generator and environment."""
    trainer.generator.forcing = ScriptedPolicy(world["tok"], scripts)
    try:
        trajs, _ = trainer.rollout(QA[: len(scripts)], seed=0)
    finally:
        trainer.generator.forcing = None
    return trajs


# --------------------------------------------------------------------------------------------------
# §8 invariants on the trainer's wiring
# --------------------------------------------------------------------------------------------------


def test_invariant_10_kl_zero_and_ratio_one_with_model_equal_ref_before_any_update(world, tmp_path):
    trainer = make_trainer(world, tmp_path, num_ppo_epochs=2)
    # Directly: recomputed policy and reference logprobs over the rollout's exact ids agree.
    trajs, _ = trainer.rollout(QA, seed=11)
    batch = collate_trajectories(trajs, world["tok"].pad_token_id)
    old, _, _ = trainer._policy_and_values(batch)
    ref = trainer._ref_logprobs(batch)
    mask = batch["action_mask"].bool()
    assert torch.equal(old[mask], ref[mask])
    # Rollout logprobs (invariant 11's parity, through the trainer): same distribution, same numbers.
    assert torch.allclose(old[mask], batch["rollout_logprobs"][mask], atol=1e-5)
    # Through a real step: the first micro-batch of the first epoch sees ratio 1 and approx KL 0.
    metrics = trainer.step()
    assert metrics["objective/kl"] == 0.0
    assert abs(metrics["policy/first_ratio"] - 1.0) < 1e-6
    assert metrics["policy/first_approxkl"] < 1e-12
    # ...and the second epoch does not (the policy moved), so the check above could fail.
    assert metrics["policy/approxkl_avg"] > 0.0


def test_invariant_1_observation_logits_do_not_change_the_policy_loss(world, tmp_path):
    trainer = make_trainer(world, tmp_path, max_new_tokens_per_turn=48, max_episode_tokens=400)
    trajs = scripted_rollout(trainer, world, [[call("Varnholt province"), "<answer>Quessa</answer>"]] * 2)
    assert all(any(sp.kind == "observation" for sp in t.spans) for t in trajs)
    batch = collate_trajectories(trajs, world["tok"].pad_token_id)
    ids, attn, act = batch["input_ids"], batch["attention_mask"], batch["action_mask"]
    old = batch["rollout_logprobs"]
    advantages = torch.randn(act.shape, generator=torch.Generator().manual_seed(0)) * act
    logits = trainer.model(ids, attn)[0].detach()

    def loss_and_grad(lg: torch.Tensor):
        lg = lg.clone().requires_grad_(True)
        loss = policy_loss(token_logprobs(lg, ids, 1.0), old, advantages, act, 0.2)[0]
        loss.backward()
        return loss.detach(), lg.grad

    # logits[:, t-1] predict token t: the positions that predict a non-action token.
    predicts_non_action = torch.zeros_like(act, dtype=torch.bool)
    predicts_non_action[:, :-1] = act[:, 1:] == 0
    noise = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)) * 5.0
    perturbed = logits + noise * predicts_non_action[..., None]
    loss_a, grad_a = loss_and_grad(logits)
    loss_b, grad_b = loss_and_grad(perturbed)
    assert torch.equal(loss_a, loss_b)
    assert torch.equal(grad_a, grad_b)
    assert grad_a[predicts_non_action].abs().max() == 0
    # Control: perturbing a position that predicts an action token does change the loss.
    predicts_action = ~predicts_non_action & (attn.bool())
    predicts_action[:, -1] = False
    assert not torch.equal(loss_a, loss_and_grad(logits + noise * predicts_action[..., None])[0])


def test_invariant_3_score_lands_on_the_last_policy_token(world, tmp_path):
    trainer = make_trainer(world, tmp_path, max_new_tokens_per_turn=48, max_episode_tokens=400)
    trajs = scripted_rollout(
        trainer, world, [[call("Quessa capital"), "<answer>Orlenn</answer>"], ["<answer>Tiberk</answer>"]]
    )
    batch = collate_trajectories(trajs, world["tok"].pad_token_id)
    scores = trainer.score(trajs, batch)
    kl = torch.rand(batch["action_mask"].shape) * batch["action_mask"]
    rewards = place_rewards(scores, kl, batch["action_mask"], 0.1)
    for i, t in enumerate(trajs):
        last = t.last_action_index
        assert t.input_ids[last] == world["tok"].eos_token_id  # the stop token, not a pad or observation
        assert rewards[i, last] == pytest.approx(float(scores[i]) - 0.1 * float(kl[i, last]))
        assert torch.all(rewards[i, last + 1 :] == 0)
        assert torch.all(rewards[i][batch["action_mask"][i] == 0] == 0)
        assert float(rewards[i].sum()) == pytest.approx(float(scores[i]) - 0.1 * float(kl[i].sum()), abs=1e-5)


def test_invariant_12_padding_invariance_of_logprobs_and_values(world, tmp_path):
    trainer = make_trainer(world, tmp_path)
    model = trainer.model.eval()
    short = torch.randint(10, 300, (1, 7), generator=torch.Generator().manual_seed(0))
    other = torch.randint(10, 300, (1, 12), generator=torch.Generator().manual_seed(1))
    pad = world["tok"].pad_token_id
    alone_lp = token_logprobs(model(short, torch.ones_like(short))[0], short, 0.7)
    alone_v = model(short, torch.ones_like(short))[1]
    for side in ("right", "left"):
        fill = torch.full((1, 5), pad)
        row = torch.cat([short, fill], 1) if side == "right" else torch.cat([fill, short], 1)
        mask = (
            torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], 1)
            if side == "right"
            else torch.cat([torch.zeros(1, 5), torch.ones(1, 7)], 1)
        )
        ids = torch.cat([row, other])
        attn = torch.cat([mask.long(), torch.ones(1, 12, dtype=torch.long)])
        logits, values = model(ids, attn)
        lp = token_logprobs(logits, ids, 0.7)
        real = slice(0, 7) if side == "right" else slice(5, 12)
        # Position 0 of a row has no logprob and no value by definition; compare the rest.
        assert torch.allclose(lp[0, real][1:], alone_lp[0, 1:], atol=1e-5), side
        assert torch.allclose(values[0, real][1:], alone_v[0, 1:], atol=1e-5), side
    assert position_ids_from_mask(torch.tensor([[0, 0, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2]]


def test_invariant_13_masks_come_from_lengths_and_pad_equal_eos_is_rejected(world, tmp_path):
    tok = copy.deepcopy(world["tok"])
    tok.pad_token = tok.eos_token
    with pytest.raises(ValueError, match="pad token must exist and differ from its EOS"):
        PPOTrainer(
            make_args(tmp_path),
            tok,
            copy.deepcopy(world["policy"]),
            None,
            None,
            QA,
            reward_funcs=LikedTokens(),
            environment=env_factory(world),
        )
    # A real token equal to the pad id keeps attention 1 and its action mask: masks come from lengths.
    trainer = make_trainer(world, tmp_path)
    (traj,), _ = trainer.rollout(QA[:1], seed=0)
    pad = world["tok"].pad_token_id
    ids = list(traj.input_ids)
    ids[traj.last_action_index] = pad
    fake = dataclasses.replace(traj, input_ids=ids)
    short = dataclasses.replace(
        traj, input_ids=traj.input_ids[:-3], action_mask=traj.action_mask[:-3], logprobs=traj.logprobs[:-3]
    )
    batch = collate_trajectories([fake, short], pad)
    n = len(ids)
    assert batch["attention_mask"][0].sum() == n
    assert batch["action_mask"][0, traj.last_action_index] == 1
    assert batch["attention_mask"][1].tolist() == [1] * (n - 3) + [0] * 3
    assert batch["action_mask"][1, n - 3 :].sum() == 0


def test_invariant_14_missing_eos_penalty_uses_the_configured_stop_token(world, tmp_path):
    trainer = make_trainer(
        world, tmp_path, missing_eos_penalty=1.5, max_new_tokens_per_turn=48, max_episode_tokens=400
    )
    stopped, cut = scripted_rollout(trainer, world, [["<answer>Quessa</answer>"], []])
    assert stopped.input_ids[stopped.last_action_index] == world["tok"].eos_token_id
    # Force the free row to be cut by the budget (a long turn without the stop token).
    trainer.args.max_new_tokens_per_turn = trainer.generator.config.max_new_tokens_per_turn = 6
    (cut,), _ = trainer.rollout(QA[1:2], seed=5)
    assert cut.termination == "token_budget"
    # The last sampled token is a real token equal to pad/`<|endoftext|>`: not the configured stop.
    ids = list(stopped.input_ids)
    ids[stopped.last_action_index] = world["tok"].pad_token_id
    wrong_stop = dataclasses.replace(stopped, input_ids=ids)
    trajs = [stopped, cut, wrong_stop]
    batch = collate_trajectories(trajs, world["tok"].pad_token_id)
    base = torch.tensor([LikedTokens().score(t)[0] for t in trajs])
    scores = trainer.score(trajs, batch)
    assert scores[0] == pytest.approx(float(base[0]))
    assert scores[1] == pytest.approx(float(base[1]) - 1.5)
    assert scores[2] == pytest.approx(float(base[2]) - 1.5)
    assert cut.reward_breakdown["missing_eos_penalty"] == -1.5


# --------------------------------------------------------------------------------------------------
# updates, frozen models, optimizer and scheduler
# --------------------------------------------------------------------------------------------------


def test_policy_and_value_move_while_reference_and_reward_model_get_no_gradient(world, tmp_path):
    reward_model = build_value_model(world["tok"], TINY)
    rm_before = snapshot(reward_model)
    trainer = make_trainer(world, tmp_path, reward_model=reward_model, reward_model_weight=0.5)
    policy_before, value_before = snapshot(trainer.policy), snapshot(trainer.model.value_model)
    ref_before = snapshot(trainer.ref_model)
    assert trainer.ref_model is not trainer.policy
    metrics = trainer.step()
    assert metrics["reward/reward_model"] != 0.0
    assert len(changed(policy_before, trainer.policy)) == len(policy_before)
    assert changed(value_before, trainer.model.value_model)
    assert changed(ref_before, trainer.ref_model) == []
    assert changed(rm_before, reward_model) == []
    assert all(p.grad is None and not p.requires_grad for p in trainer.ref_model.parameters())
    assert all(p.grad is None and not p.requires_grad for p in reward_model.parameters())


def test_ref_model_none_is_a_frozen_copy_of_the_policy(world, tmp_path):
    policy = copy.deepcopy(world["policy"])
    trainer = make_trainer(world, tmp_path, policy=policy)
    assert trainer.ref_model is not policy
    for (n, p), (_, r) in zip(policy.named_parameters(), trainer.ref_model.named_parameters(), strict=True):
        assert torch.equal(p, r) and r.data_ptr() != p.data_ptr(), n
        assert not r.requires_grad
    assert not trainer.ref_model.training
    with pytest.raises(ValueError, match="ref_model must not be the policy"):
        make_trainer(world, tmp_path, policy=policy, ref_model=policy)


def test_user_optimizer_must_cover_policy_and_value_parameters(world, tmp_path):
    policy = copy.deepcopy(world["policy"])
    only_policy = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="does not cover .* trainable parameters"):
        make_trainer(world, tmp_path, policy=policy, optimizers=(only_policy, None))
    value = build_value_model(world["tok"], TINY)
    both = torch.optim.AdamW([*policy.parameters(), *value.parameters()], lr=1e-3)
    trainer = make_trainer(world, tmp_path, policy=policy, value_model=value, optimizers=(both, None))
    assert trainer.optimizer is both


class LogRecorder(TrainerCallback):
    def __init__(self):
        self.logs, self.events = [], []

    def on_log(self, args, state, control, logs=None, **kw):
        self.logs.append(dict(logs))

    def on_step_end(self, args, state, control, **kw):
        self.events.append(("step_end", state.global_step))

    def on_save(self, args, state, control, **kw):
        self.events.append(("save", state.global_step))

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        self.events.append(("evaluate", state.global_step))


def test_scheduler_steps_once_per_optimizer_step(world, tmp_path):
    rec = LogRecorder()
    trainer = make_trainer(
        world,
        tmp_path,
        total_episodes=8,
        num_ppo_epochs=2,
        num_mini_batches=2,
        lr_scheduler_type="linear",
        learning_rate=1e-3,
        value_learning_rate=2e-3,
        callbacks=[rec],
    )
    assert trainer.num_optimizer_steps == 2 * 2 * 2  # PPO steps x epochs x mini-batches
    trainer.train()
    assert trainer.lr_scheduler.last_epoch == 8
    # Linear decay to 0 over 8 optimizer steps: after 4 and 8 of them.
    assert [round(log["lr"], 12) for log in rec.logs] == [round(1e-3 * 4 / 8, 12), 0.0]
    assert [g["name"] for g in trainer.optimizer.param_groups] == ["policy", "value"]
    assert trainer.optimizer.param_groups[1]["initial_lr"] == 2e-3


REQUIRED_METRICS = [
    "objective/kl",
    "objective/entropy",
    "objective/non_score_reward",
    "objective/rlhf_reward",
    "objective/scores",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "loss/policy_avg",
    "loss/value_avg",
    "val/clipfrac_avg",
    "val/ratio",
    "val/explained_variance",
    "kl_coef",
    "lr",
    "episode",
    "tools/calls_per_episode",
    "tools/failure_rate",
    "search/latency_p50_ms",
    "search/latency_p99_ms",
    "answer/length_words",
    "tokens_per_second",
    "policy/first_ratio",
    "policy/first_approxkl",
    *[
        f"termination/{r}"
        for r in ("answered", "no_answer", "max_turns", "max_tool_calls", "token_budget", "error")
    ],
    *[f"reward/{k}" for k in ("f1", "citation", "format", "search_cost", "token_cost", "safety")],
]


def test_every_issue_metric_is_in_metrics_jsonl_and_reaches_callbacks(world, tmp_path):
    rec = LogRecorder()
    trainer = make_trainer(
        world,
        tmp_path,
        reward=default_rubric(),
        callbacks=[rec],
        save_steps=1,
        max_new_tokens_per_turn=48,
        max_episode_tokens=400,
    )
    # A scripted search so the tool and latency metrics come from a real call.
    trainer.generator.forcing = ScriptedPolicy(
        world["tok"], [[call("Varnholt"), "<answer>Quessa</answer>"]] * 4
    )
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    missing = [k for k in REQUIRED_METRICS if k not in rows[0]]
    assert missing == []
    assert rows[0]["tools/calls_per_episode"] == 1.0 and rows[0]["search/latency_p50_ms"] > 0
    assert rows[0]["termination/answered"] == 1.0 and rows[0]["reward/f1"] == pytest.approx(
        0.25
    )  # one of the 4 golds is Quessa
    assert [set(REQUIRED_METRICS) <= set(log) for log in rec.logs] == [True]
    assert ("step_end", 1) in rec.events and ("save", 1) in rec.events
    ckpt = tmp_path / "run" / "checkpoints" / "step-1"
    for part in ("policy", "value", "optim_rng.pt", "trainer_state.json"):
        assert (ckpt / part).exists(), part
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert {"global_step", "episode", "data_epoch", "data_offset", "kl_controller"} <= set(state)
    assert (tmp_path / "run" / "manifest.json").exists() and (tmp_path / "run" / "config.yaml").exists()


def test_report_to_tensorboard_writes_every_logged_metric_at_its_step(world, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv(
        "TENSORBOARD_LOGGING_DIR", raising=False
    )  # transformers' default: RUN/runs/<date_host>
    rec = LogRecorder()
    trainer = make_trainer(
        world,
        tmp_path,
        total_episodes=8,
        report_to=["tensorboard"],
        eval_on_start=True,
        eval_steps=2,
        num_eval_questions=2,
        eval_dataset=QA,
        callbacks=[rec],
    )
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [e for e in rec.events if e[0] == "evaluate"] == [("evaluate", 0), ("evaluate", 2)]
    (events,) = (tmp_path / "run" / "runs").rglob("events.out.tfevents.*")
    board = EventAccumulator(str(events.parent))
    board.Reload()
    # transformers' TensorBoardCallback writes every numeric log under `train/` at TrainerState.global_step.
    for key in (
        "objective/kl",
        "objective/scores",
        "loss/policy_avg",
        "kl_coef",
        "lr",
        "episode",
        "time/train_s",
    ):
        logged = [(r["step"], r[key]) for r in rows if key in r]
        assert len(logged) >= 2, key
        written = [(e.step, e.value) for e in board.Scalars(f"train/{key}")]
        assert [s for s, _ in written] == [s for s, _ in logged], key
        assert [v for _, v in written] == pytest.approx([v for _, v in logged], rel=1e-6, abs=1e-12), key
    assert [e.step for e in board.Scalars("train/eval/exact_match")] == [0, 2]


def test_peft_lora_trains_the_adapter_and_the_reference_is_the_base_model(world, tmp_path):
    from peft import LoraConfig

    base = copy.deepcopy(world["policy"])
    pristine = frozen_copy(base)
    trainer = make_trainer(
        world,
        tmp_path,
        policy=base,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        learning_rate=5e-2,
        save_steps=1,
        total_episodes=4,
    )
    base_names = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if "lora_" not in n}
    lora_names = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if "lora_" in n}
    assert lora_names and all(
        not p.requires_grad for n, p in trainer.policy.named_parameters() if n in base_names
    )
    trainer.train()
    now = dict(trainer.policy.named_parameters())
    assert all(torch.equal(base_names[n], now[n]) for n in base_names)
    assert any(not torch.equal(lora_names[n], now[n]) for n in lora_names)
    assert trainer.ref_model is None
    trajs, _ = trainer.rollout(QA[:2], seed=1)
    batch = collate_trajectories(trajs, world["tok"].pad_token_id)
    ref = trainer._ref_logprobs(batch)
    attn = batch["attention_mask"]
    expected = token_logprobs(
        pristine(
            input_ids=batch["input_ids"], attention_mask=attn, position_ids=position_ids_from_mask(attn)
        ).logits,
        batch["input_ids"],
        1.0,
    )
    mask = batch["action_mask"].bool()
    assert torch.allclose(ref[mask], expected[mask], atol=1e-5)
    policy_lp, _, _ = trainer._policy_and_values(batch)
    assert not torch.allclose(policy_lp[mask], expected[mask], atol=1e-5)  # the adapter did change the policy
    # The adapter checkpoint reloads into a fresh PEFT trainer.
    fresh = make_trainer(
        world,
        tmp_path,
        policy=copy.deepcopy(world["policy"]),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        learning_rate=5e-2,
        save_steps=1,
        total_episodes=4,
    )
    fresh.load_checkpoint(tmp_path / "run" / "checkpoints" / "step-1")
    again = dict(fresh.policy.named_parameters())
    assert all(torch.equal(now[n], again[n]) for n in lora_names)


def test_shared_backbone_value_head_trains_and_is_checkpointed(world, tmp_path):
    trainer = make_trainer(world, tmp_path, value_mode="shared_backbone", save_steps=1)
    head_before = snapshot(trainer.model.value_head)
    assert not hasattr(trainer.model, "value_model")
    trainer.train()
    assert changed(head_before, trainer.model.value_head)
    assert (tmp_path / "run" / "checkpoints" / "step-1" / "value_head.pt").exists()


def test_adaptive_kl_controller_is_fed_the_measured_kl(world, tmp_path):
    # Target far below any real KL: the coefficient must grow once the policy has moved (step 2 on).
    trainer = make_trainer(
        world, tmp_path, total_episodes=8, kl_target=1e-6, kl_horizon=10.0, learning_rate=1e-2
    )
    first, second = trainer.step(), trainer.step()
    assert first["objective/kl"] == 0.0  # the policy has not moved yet: KL below target, coefficient falls
    assert first["kl_coef_next"] < first["kl_coef"]
    assert second["objective/kl"] > 0 and second["kl_coef_next"] > second["kl_coef"]
    assert second["kl_coef"] == first["kl_coef_next"]


def test_bf16_autocast_trains_and_fp16_is_refused_with_a_reason(world, tmp_path):
    trainer = make_trainer(world, tmp_path, mixed_precision="bf16")
    before = snapshot(trainer.policy)
    metrics = trainer.step()
    assert changed(before, trainer.policy) and math.isfinite(metrics["loss/policy_avg"])
    assert next(trainer.policy.parameters()).dtype == torch.float32  # weights stay fp32; only compute is bf16
    with pytest.raises(ValueError, match="use 'bf16'"):
        make_trainer(world, tmp_path, mixed_precision="fp16")


def test_invariant_14_search_r1_stop_strings_count_as_the_stop(world, tmp_path):
    # Search-R1 turns end on a stop string (`</answer>`), with no EOS token: not a missing EOS.
    trainer = make_trainer(
        world,
        tmp_path,
        env={"protocol": "search_r1"},
        missing_eos_penalty=1.0,
        max_new_tokens_per_turn=48,
        max_episode_tokens=400,
    )
    assert "</answer>" in trainer.stop_strings
    trainer.generator.forcing = ScriptedPolicy(world["tok"], [["<answer>Quessa</answer>"]], append_eos=False)
    (traj,), _ = trainer.rollout(QA[:1], seed=0)
    trainer.generator.forcing = None
    assert traj.termination == "answered"
    assert traj.input_ids[traj.last_action_index] != world["tok"].eos_token_id
    assert trainer.ends_with_stop(traj)
    batch = collate_trajectories([traj], world["tok"].pad_token_id)
    assert float(trainer.score([traj], batch)[0]) == pytest.approx(LikedTokens().score(traj)[0])


def test_a_run_whose_greedy_answers_never_change_says_it_is_not_learning(world, tmp_path):
    """The learning check in a real run: with a learning rate too small to move a weight, no dev answer
    changes, KL stays 0, and from half of training on each evaluation flags `eval/not_learning`; a run
    whose policy moves (a large learning rate: KL well above the threshold) is never flagged."""

    def run(name: str, lr: float) -> dict[int, dict]:
        trainer = make_trainer(
            world, tmp_path / name, total_episodes=12, learning_rate=lr, value_learning_rate=lr,
            eval_on_start=True, eval_steps=1, num_eval_questions=4, eval_dataset=QA, eval_temperature=0.0,
            kl_coef=0.0,
        )  # fmt: skip
        trainer.train()
        files = (tmp_path / name / "run" / "eval").glob("step-*.json")
        return {json.loads(f.read_text())["step"]: json.loads(f.read_text()) for f in files}

    flat = run("flat", 1e-12)
    assert sorted(flat) == [0, 1, 2, 3]
    assert all(e["eval/answers_changed"] == 0.0 for e in flat.values())
    assert [flat[s]["eval/not_learning"] for s in sorted(flat)] == [0.0, 0.0, 1.0, 1.0]  # steps 2, 3 of 3
    moved = run("moved", 0.3)  # this tiny policy answers nothing either way, but it moves: KL says so
    kls = [json.loads(line).get("objective/kl") for line in (tmp_path / "moved/run/metrics.jsonl").open()]
    assert sum(k for k in kls if k is not None) / len([k for k in kls if k is not None]) >= 0.01
    assert all(e["eval/not_learning"] == 0.0 for e in moved.values())
