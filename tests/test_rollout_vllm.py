"""The vLLM rollout backend's loop on CPU: same trajectories as HFGenerator, weight sync, PPO and GRPO wiring.

`VLLMGenerator` keeps every vLLM call behind a `TokenEngine`. Here the engine is `HFTokenEngine`: the
same tiny Qwen2 model answering the same token-id requests with real forward passes and a real KV
prefix cache. Both generators are driven by the same `ScriptedPolicy` (forced tokens, the model's
logprobs) or by greedy decoding, over the real `SearchEnvironment` and a real BM25 index, and their
trajectories are compared token for token: ids, masks, spans, messages, terminations. The world is
conftest.py's `rollout_world`, the one tests/test_rollout_golden.py pins.

`VLLMEngine` itself (the only code that calls vLLM) runs against a stand-in `vllm` module shaped like
vLLM 0.24's API (`LLM(...)` arguments, `SamplingParams`, request outputs with per-token logprob dicts,
`num_cached_tokens`, the in-process and `collective_rpc` weight paths, `reset_prefix_cache`).

The last tests need vLLM and a CUDA GPU; CPU CI skips them with the reason.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import replace

import pytest
import torch
from worlds import SCRIPTS, VARNHOLT_QA, answer, call

from searchrl.common.config import ConfigError
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.ppo.config import PPOConfig
from searchrl.rollout.generator import GenerationConfig, HFGenerator, ScriptedPolicy, sampling_log_probs
from searchrl.rollout.vllm_generator import (
    HFTokenEngine,
    TurnCompletion,
    TurnParams,
    VLLMGenerator,
    check_vllm_available,
    policy_weights,
    weights_version,
)

torch.set_num_threads(1)  # tiny models on a shared 2-core machine
VLLM_ON_GPU = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()

QA = VARNHOLT_QA


def make_envs(world, n: int, **cfg) -> list[SearchEnvironment]:
    cfg.setdefault("system_prompt", "Answer with search.")  # a short prompt keeps the tests fast
    return [SearchEnvironment(world["backend"], EnvConfig(**cfg), tokenizer=world["tok"]) for _ in range(n)]


def rows_for(n: int) -> list[dict]:
    return [QA[i % len(QA)] for i in range(n)]


def both(world, scripts, protocol="chat", engine_wrapper=None, env_cfg=None, **gen):
    """Roll the same rows out with HFGenerator and VLLMGenerator(HFTokenEngine); returns both batches."""
    gen.setdefault("max_new_tokens_per_turn", 96)
    gen.setdefault("max_episode_tokens", 1500)
    cfg = GenerationConfig(**gen)
    n = len(scripts)
    env_cfg = {"protocol": protocol, **(env_cfg or {})}
    forcing = ScriptedPolicy(world["tok"], scripts, append_eos=(protocol == "chat")) if any(scripts) else None
    hf = HFGenerator(world["model"], world["tok"], replace(cfg), forcing=forcing)
    hf_batch = hf.rollout(make_envs(world, n, **env_cfg), rows_for(n))
    engine = HFTokenEngine(world["model"], world["tok"], forcing=forcing)
    gen_v = VLLMGenerator(
        world["model"],
        world["tok"],
        replace(cfg),
        engine=engine_wrapper(engine) if engine_wrapper else engine,
    )
    v_batch = gen_v.rollout(make_envs(world, n, **env_cfg), rows_for(n))
    return hf_batch, v_batch, engine


def assert_same_trajectories(hf_batch, v_batch, logprob_tol=1e-4) -> None:
    assert len(hf_batch.trajectories) == len(v_batch.trajectories)
    for a, b in zip(hf_batch.trajectories, v_batch.trajectories, strict=True):
        b.validate()
        assert b.input_ids == a.input_ids
        assert b.action_mask == a.action_mask
        assert b.spans == a.spans
        assert b.messages == a.messages
        assert b.observations == a.observations
        assert [(c.name, c.arguments, c.status) for c in b.tool_calls] == [
            (c.name, c.arguments, c.status) for c in a.tool_calls
        ]
        assert (b.termination, b.num_turns, b.answer, b.citations) == (
            a.termination,
            a.num_turns,
            a.answer,
            a.citations,
        )
        gap = (torch.tensor(b.logprobs) - torch.tensor(a.logprobs)).abs().max().item()
        assert gap <= logprob_tol
        assert b.metadata["engine"] == "hf"


def test_scripted_chat_rollouts_are_the_hf_generators_token_for_token(rollout_world):
    hf_batch, v_batch, engine = both(rollout_world, SCRIPTS, temperature=1.0)
    assert_same_trajectories(hf_batch, v_batch)
    assert [t.termination for t in v_batch.trajectories] == ["answered"] * 4
    assert [t.num_turns for t in v_batch.trajectories] == [1, 2, 3, 4]
    # Observations really went in with mask 0, between the actions.
    assert sum(s.kind == "observation" for t in v_batch.trajectories for s in t.spans) == 6
    # One engine call per round; a round's paused rows share one step_batch.
    assert v_batch.stats["rollout/engine_calls"] == 4
    # Each re-submitted prompt is the row's previous prompt + the tokens sampled + the observation: the
    # growing prefix a prefix cache serves (here most of every later prompt came from the cache).
    by_row: dict[int, list[list[int]]] = {}
    for prompt, p in engine.requests:
        by_row.setdefault(p.row, []).append(prompt)
    for prompts in by_row.values():
        for earlier, later in zip(prompts, prompts[1:], strict=False):
            assert later[: len(earlier)] == earlier and len(later) > len(earlier)
    assert v_batch.stats["rollout/prefix_cache_hit_rate"] > 0.5
    # Nothing is computed twice: about one position run per trajectory token, like HFGenerator's cache.
    assert v_batch.stats["rollout/prefill_ratio"] <= 1.05
    assert v_batch.stats["tools/calls_per_episode"] == hf_batch.stats["tools/calls_per_episode"]


def test_search_r1_stop_strings_end_turns_where_hf_ends_them(rollout_world):
    scripts = [
        ["<search>Varnholt province</search>", answer("Quessa", "d1")],
        ["<search>capital of Quessa</search>", "<search>Orlenn founded</search>", answer("Amsel Drov", "d3")],
    ]
    hf_batch, v_batch, _ = both(rollout_world, scripts, protocol="search_r1", temperature=0.7)
    assert_same_trajectories(hf_batch, v_batch)
    assert [t.num_turns for t in v_batch.trajectories] == [2, 3]
    assert all(t.termination == "answered" for t in v_batch.trajectories)


def test_greedy_free_decoding_matches_hf(rollout_world):
    # No forcing: the untrained model decodes greedily in both engines until EOS or the turn budget.
    hf_batch, v_batch, _ = both(rollout_world, [[], [], []], temperature=0.0, max_new_tokens_per_turn=20)
    assert_same_trajectories(hf_batch, v_batch)
    assert all(t.num_action_tokens > 0 for t in v_batch.trajectories)


class ShortAnswers:
    """An engine that returns at most 3 tokens per call (a stop the loop does not count)."""

    def __init__(self, inner: HFTokenEngine) -> None:
        self.inner, self.name = inner, inner.name

    def generate(self, prompts, params):
        return self.inner.generate(prompts, [replace(p, max_tokens=min(3, p.max_tokens)) for p in params])

    def load_weights(self, weights):
        self.inner.load_weights(weights)


class RunsPastStops:
    """An engine that ignores every stop (as an engine that checks stops late would) and samples on."""

    def __init__(self, inner: HFTokenEngine) -> None:
        self.inner, self.name = inner, inner.name

    def generate(self, prompts, params):
        return self.inner.generate(prompts, [replace(p, stop_token_ids=[], stop=[]) for p in params])

    def load_weights(self, weights):
        self.inner.load_weights(weights)


@pytest.mark.parametrize("wrapper", [ShortAnswers, RunsPastStops], ids=["stops_short", "runs_past"])
def test_where_the_engine_stops_does_not_change_the_trajectory(rollout_world, wrapper):
    hf_batch, v_batch, _ = both(rollout_world, SCRIPTS[1:3], engine_wrapper=wrapper, temperature=1.0)
    assert_same_trajectories(hf_batch, v_batch)
    if wrapper is ShortAnswers:
        assert v_batch.stats["rollout/engine_calls"] > 10  # turns were continued over many calls
    else:
        assert v_batch.stats["rollout/dropped_engine_tokens"] > 0  # tokens past our stop were dropped


def test_token_budgets_end_episodes_exactly_as_hf(rollout_world):
    long_turn = [[call("Varnholt province " * 6), answer("Quessa", "d1")]] * 2
    hf_batch, v_batch, _ = both(rollout_world, long_turn, max_new_tokens_per_turn=12, max_episode_tokens=60)
    assert_same_trajectories(hf_batch, v_batch)
    assert [t.termination for t in v_batch.trajectories] == ["token_budget"] * 2
    # The episode budget cuts an observation that would not fit, as in HFGenerator.
    hf_batch, v_batch, _ = both(
        rollout_world, SCRIPTS[1:2], max_new_tokens_per_turn=96, max_episode_tokens=60
    )
    assert_same_trajectories(hf_batch, v_batch)
    assert v_batch.trajectories[0].termination == "token_budget"


def test_a_context_limit_ends_the_episode_with_token_budget(rollout_world):
    class Short(HFTokenEngine):
        max_model_len = 0  # set per test below

    engine = Short(
        rollout_world["model"],
        rollout_world["tok"],
        forcing=ScriptedPolicy(rollout_world["tok"], SCRIPTS[1:2]),
    )
    envs = make_envs(rollout_world, 1)
    prompt_len = len(
        HFGenerator(rollout_world["model"], rollout_world["tok"])._start_row(0, envs[0], QA[0]).ids
    )
    engine.max_model_len = prompt_len + 5
    gen = VLLMGenerator(rollout_world["model"], rollout_world["tok"], GenerationConfig(), engine=engine)
    traj = gen.rollout(make_envs(rollout_world, 1), rows_for(1)).trajectories[0]
    assert traj.termination == "token_budget"
    assert len(traj.input_ids) == prompt_len + 5 and traj.num_action_tokens == 5


def test_an_environment_failure_ends_only_the_rows_of_that_step(rollout_world):
    from searchrl.env.environment import step_batch

    rounds = {"n": 0}

    def flaky(envs, texts):
        rounds["n"] += 1
        if rounds["n"] == 2:
            raise RuntimeError("index went away")
        return step_batch(envs, texts)

    cfg = GenerationConfig(max_new_tokens_per_turn=96, max_episode_tokens=1500)
    engine = HFTokenEngine(
        rollout_world["model"], rollout_world["tok"], forcing=ScriptedPolicy(rollout_world["tok"], SCRIPTS)
    )
    gen = VLLMGenerator(rollout_world["model"], rollout_world["tok"], cfg, engine=engine, step_batch=flaky)
    trajs = gen.rollout(make_envs(rollout_world, 4), rows_for(4)).trajectories
    # Round 1 answered row 0; round 2 failed for rows 1-3, which end with "error" and the exception.
    assert trajs[0].termination == "answered"
    assert [t.termination for t in trajs[1:]] == ["error"] * 3
    assert all("index went away" in t.metadata["error"] for t in trajs[1:])


def test_engine_answers_are_checked(rollout_world):
    class Broken:
        name = "broken"

        def generate(self, prompts, params):
            return [TurnCompletion([5, 6], [0.0]) for _ in prompts]

        def load_weights(self, weights):
            pass

    gen = VLLMGenerator(rollout_world["model"], rollout_world["tok"], GenerationConfig(), engine=Broken())
    with pytest.raises(RuntimeError, match="2 tokens but 1 logprobs"):
        gen.rollout(make_envs(rollout_world, 1), rows_for(1))
    with pytest.raises(ValueError, match="one environment per row"):
        gen.rollout(make_envs(rollout_world, 2), rows_for(1))
    with pytest.raises(ValueError, match="only apply when no engine is passed"):
        VLLMGenerator(
            rollout_world["model"], rollout_world["tok"], engine=Broken(), gpu_memory_utilization=0.5
        )


def test_sampled_logprobs_are_the_sampling_distributions(rollout_world):
    # Free sampling with filters through the engine: every recorded logprob equals a one-pass recompute
    # under the same temperature / top-k / top-p (what PPO's old logprobs reproduce), and a seed repeats.
    cfg = GenerationConfig(temperature=0.8, top_k=40, top_p=0.9, max_new_tokens_per_turn=24, seed=3)
    run = lambda seed: VLLMGenerator(  # noqa: E731
        rollout_world["model"],
        rollout_world["tok"],
        replace(cfg, seed=seed),
        engine=HFTokenEngine(rollout_world["model"], rollout_world["tok"]),
    ).rollout(make_envs(rollout_world, 3), rows_for(3))
    first, again, other = run(3), run(3), run(4)
    assert [t.input_ids for t in first.trajectories] == [t.input_ids for t in again.trajectories]
    assert [t.input_ids for t in first.trajectories] != [t.input_ids for t in other.trajectories]
    for traj in first.trajectories:
        ids = torch.tensor([traj.input_ids])
        with torch.no_grad():
            logits = rollout_world["model"](ids).logits[0, :-1]
        logp = sampling_log_probs(logits, 0.8, 40, 0.9).gather(1, ids[0, 1:, None]).squeeze(1)
        mask = torch.tensor(traj.action_mask[1:], dtype=torch.bool)
        assert (logp[mask] - torch.tensor(traj.logprobs[1:])[mask]).abs().max().item() <= 1e-4


def test_sync_weights_pushes_updates_and_rollout_syncs_stale_weights(rollout_world):
    policy = copy.deepcopy(rollout_world["model"])
    engine = HFTokenEngine(copy.deepcopy(rollout_world["model"]), rollout_world["tok"])
    cfg = GenerationConfig(temperature=0.0, max_new_tokens_per_turn=16)
    gen = VLLMGenerator(policy, rollout_world["tok"], cfg, engine=engine)
    gen.rollout(make_envs(rollout_world, 1), rows_for(1))
    assert gen.weight_syncs == 0 and engine.loads == 0  # nothing changed yet
    # One optimizer step on the policy: the engine is stale until synced.
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.05)
    ids = torch.tensor([list(range(3, 40))])
    policy(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    before = weights_version(policy)
    assert any(
        not torch.equal(a, b) for a, b in zip(policy.parameters(), engine.model.parameters(), strict=True)
    )
    batch = gen.rollout(make_envs(rollout_world, 2), rows_for(2))  # auto-sync before sampling
    assert gen.weight_syncs == 1 and engine.loads == 1 and batch.stats["rollout/weight_syncs"] == 1
    for a, b in zip(policy.parameters(), engine.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # What the engine now samples is what HFGenerator samples with the updated policy.
    hf = HFGenerator(policy, rollout_world["tok"], replace(cfg)).rollout(
        make_envs(rollout_world, 2), rows_for(2)
    )
    assert [t.input_ids for t in batch.trajectories] == [t.input_ids for t in hf.trajectories]
    # An explicit sync (what PPOTrainer calls after each update) also drops the stale prefix cache.
    assert engine._prefix_cache
    gen.sync_weights(policy)
    assert engine.loads == 2 and not engine._prefix_cache and weights_version(policy) == before


def test_policy_weights_merge_a_lora_adapter_under_the_base_names(rollout_world):
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(rollout_world["model"])
    names = [n for n, _ in base.named_parameters()]
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_()  # a trained adapter (B starts at zero)
    merged = copy.deepcopy(peft_model).merge_and_unload()
    ids = torch.tensor([[3, 4, 5, 6]])
    out_before = peft_model(input_ids=ids).logits
    with policy_weights(peft_model) as weights:
        got = {n: t.clone() for n, t in weights}
    assert list(got) == names  # the base model's names, no lora tensors
    for n, t in merged.named_parameters():
        assert torch.allclose(got[n], t, atol=1e-6), n
    assert not torch.allclose(
        got["model.layers.0.self_attn.q_proj.weight"], base.model.layers[0].self_attn.q_proj.weight
    )
    # Unmerged again afterwards: the PEFT model computes what it computed before.
    assert torch.allclose(peft_model(input_ids=ids).logits, out_before, atol=1e-5)
    # And an engine loaded from them samples like the merged model.
    engine = HFTokenEngine(copy.deepcopy(base), rollout_world["tok"])
    gen = VLLMGenerator(
        peft_model,
        rollout_world["tok"],
        GenerationConfig(temperature=0.0, max_new_tokens_per_turn=12),
        engine=engine,
    )
    gen.sync_weights()
    hf = HFGenerator(
        merged, rollout_world["tok"], GenerationConfig(temperature=0.0, max_new_tokens_per_turn=12)
    )
    a = gen.rollout(make_envs(rollout_world, 1), rows_for(1)).trajectories[0]
    b = hf.rollout(make_envs(rollout_world, 1), rows_for(1)).trajectories[0]
    assert a.input_ids == b.input_ids


# -------------------------------------------------------------------------------------------------
# configuration and the trainer
# -------------------------------------------------------------------------------------------------


def test_config_validates_the_rollout_backend():
    assert PPOConfig().rollout_backend == "hf" and PPOConfig().vllm_enable_prefix_caching is True
    with pytest.raises(ValueError, match=r"rollout_backend='sglang' is not one of \['hf', 'vllm'\]"):
        PPOConfig(rollout_backend="sglang")
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="vllm_gpu_memory_utilization.*must be in \\(0, 1\\]"):
            PPOConfig(vllm_gpu_memory_utilization=bad)
    with pytest.raises(ValueError, match="use_cpu is true; set use_cpu: false"):
        PPOConfig(rollout_backend="vllm", use_cpu=True)
    assert PPOConfig(rollout_backend="vllm", vllm_gpu_memory_utilization=1.0).rollout_backend == "vllm"


def test_vllm_missing_or_no_cuda_is_a_config_error_saying_how_to_fix(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match=r"needs the vllm package.*rollout_backend: \"hf\""):
        check_vllm_available()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"needs a CUDA GPU.*rollout_backend: \"hf\""):
        check_vllm_available()


@pytest.fixture()
def ppo_parts(rollout_world, tmp_path):
    from searchrl.rewards.combine import default_rubric

    def env():
        return SearchEnvironment(
            rollout_world["backend"],
            EnvConfig(max_turns=2, max_tool_calls=1, system_prompt="Answer with search."),
            tokenizer=rollout_world["tok"],
        )

    def args(**kw):
        base = dict(
            output_dir=str(tmp_path / "run"),
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            total_episodes=4,
            num_ppo_epochs=1,
            max_new_tokens_per_turn=8,
            max_episode_tokens=40,
            learning_rate=1e-2,
            temperature=1.0,
            save_steps=1000,
            eval_steps=1000,
            progress_bar=False,
            save_trajectories=False,
            seed=0,
        )
        return PPOConfig(**{**base, **kw})

    return {"env": env, "args": args, "rubric": default_rubric()}


@pytest.mark.skipif(
    VLLM_ON_GPU,
    reason="vllm and CUDA are present: the trainer builds a real vLLM engine instead of raising",
)
def test_trainer_with_vllm_backend_and_no_vllm_raises_config_error(rollout_world, ppo_parts):
    from searchrl.ppo.trainer import PPOTrainer

    with pytest.raises(ConfigError, match=r"rollout_backend=\"vllm\" needs"):
        PPOTrainer(
            ppo_parts["args"](rollout_backend="vllm"),
            rollout_world["tok"],
            copy.deepcopy(rollout_world["model"]),
            None,
            None,
            QA,
            reward_funcs=ppo_parts["rubric"],
            environment=ppo_parts["env"],
        )


class LikedTokens:
    """A learnable reward (share of sampled ids divisible by 4) so the update really moves the policy."""

    def score(self, traj):
        sampled = [t for t, m in zip(traj.input_ids, traj.action_mask, strict=True) if m]
        value = sum(t % 4 == 0 for t in sampled) / max(1, len(sampled))
        return value, {"liked_tokens": value}


def test_ppo_trainer_pushes_weights_to_the_engine_after_every_update(rollout_world, ppo_parts):
    from searchrl.ppo.trainer import PPOTrainer

    engines: list[HFTokenEngine] = []

    def factory(model, tok, cfg):
        # A separate copy of the weights, as vLLM holds; auto_sync off so only the trainer's call syncs.
        engines.append(HFTokenEngine(copy.deepcopy(model), tok))
        return VLLMGenerator(model, tok, cfg, engine=engines[-1], auto_sync=False)

    trainer = PPOTrainer(
        ppo_parts["args"](),
        rollout_world["tok"],
        copy.deepcopy(rollout_world["model"]),
        None,
        None,
        QA,
        reward_funcs=LikedTokens(),
        environment=ppo_parts["env"],
        generator_factory=factory,
    )
    engine = engines[0]
    for step in (1, 2):
        metrics = trainer.step()
        assert engine.loads == step
        for a, b in zip(trainer.policy.parameters(), engine.model.parameters(), strict=True):
            assert torch.equal(a, b)
        # The rollout came from the engine's copy: its logprobs equal the trainer's recompute only
        # because that copy held the policy's current weights (step 2 samples after the first update).
        assert metrics["rollout/logprob_max_abs_diff"] <= 1e-4
        assert metrics["rollout/engine_calls"] >= 1


class LikedTokensRubric(LikedTokens):
    """`LikedTokens` as a `Rubric` scores: written onto the trajectory too (GRPO's reward logs the breakdown)."""

    def score(self, traj):
        value, parts = super().score(traj)
        traj.reward, traj.reward_breakdown = value, parts
        return value, parts


def grpo_config(tmp_path, **kw):
    from searchrl.grpo.config import GRPORunConfig

    base = dict(
        output_dir=str(tmp_path / "grpo"),
        mode="our_rollout",
        rollout_backend="vllm",
        seed=0,
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_turns=2,
        max_tool_calls=1,
        max_new_tokens_per_turn=8,
        max_episode_tokens=160,
        tool_schema_in_prompt=False,
        system_prompt="Answer with search.",
        temperature=1.0,
        learning_rate=1e-2,
        eval_steps=2,
        num_eval_questions=2,
        eval_batch_size=2,
        save_steps=0,
        save_trajectories=False,
        progress_bar=False,
    )
    return GRPORunConfig(**{**base, **kw})


def test_grpo_our_rollout_on_the_vllm_backend_syncs_the_engine_after_every_optimizer_step(
    rollout_world, tmp_path
):
    from transformers import TrainerCallback

    from searchrl.grpo.trainer import build_grpo_trainer

    engines: list[HFTokenEngine] = []

    def factory(model, tok, cfg):
        # A separate copy of the weights, as vLLM holds; auto_sync off so only the trainer's call syncs.
        engines.append(HFTokenEngine(copy.deepcopy(model), tok))
        return VLLMGenerator(model, tok, cfg, engine=engines[-1], auto_sync=False)

    seen = []

    class EngineAfterStep(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            engine = engines[0]
            same = all(
                torch.equal(a, b) for a, b in zip(model.parameters(), engine.model.parameters(), strict=True)
            )
            seen.append((state.global_step, engine.loads, same))

    cfg = grpo_config(tmp_path)
    policy = copy.deepcopy(rollout_world["model"])
    start = [p.detach().clone() for p in policy.parameters()]
    trainer = build_grpo_trainer(
        cfg,
        policy,
        rollout_world["tok"],
        rollout_world["backend"],
        QA[:2],
        eval_rows=QA[:2],
        rubric=LikedTokensRubric(),
        callbacks=[EngineAfterStep()],
        generator_factory=factory,
    )
    trainer.train()
    # One engine for the run; after each optimizer step it was loaded once more and holds the policy's weights.
    assert len(engines) == 1
    assert seen == [(1, 1, True), (2, 2, True)]
    assert any(not torch.equal(a, b) for a, b in zip(start, policy.parameters(), strict=True))  # it trained
    # The rollouts came from the engine (a request per live row and turn), and so did the dev evaluation at
    # the last step (at eval_temperature), as PPO's evaluation uses its own engine.
    temperatures = {p.temperature for _, p in engines[0].requests}
    assert temperatures == {cfg.temperature, cfg.eval_temperature}
    evaluated = json.loads((cfg.run_dir / "eval" / "step-2.json").read_text())
    assert evaluated["step"] == 2 and "eval/reward" in evaluated


def test_grpo_rollout_backend_vllm_is_checked_in_both_modes(rollout_world, tmp_path):
    from searchrl.grpo.trainer import build_grpo_trainer

    with pytest.raises(ConfigError, match=r"needs mode: our_rollout.*TRL's use_vllm.*another engine"):
        grpo_config(tmp_path, mode="trl_loop")
    with pytest.raises(ConfigError, match="use_cpu is true"):
        grpo_config(tmp_path, use_cpu=True)
    if VLLM_ON_GPU:
        return  # the check passes where vLLM can run; the real engine is exercised by the GPU tests below
    with pytest.raises(ConfigError, match=r"rollout_backend=\"vllm\" needs"):
        build_grpo_trainer(
            grpo_config(tmp_path),
            copy.deepcopy(rollout_world["model"]),
            rollout_world["tok"],
            rollout_world["backend"],
            QA[:2],
            rubric=LikedTokensRubric(),
        )


# -------------------------------------------------------------------------------------------------
# VLLMEngine's calls into vLLM, against a stand-in `vllm` module (CPU)
# -------------------------------------------------------------------------------------------------


class FakeLLM:
    """Stands in for `vllm.LLM` with the API VLLMEngine uses (vLLM 0.24, checked against its source).

    It loads the model folder it is given (as vLLM does, before `from_model`'s temporary folder goes)
    and answers `generate` with an `HFTokenEngine` over that model, translating each `SamplingParams`
    back and each completion into vLLM's output shape: `outputs[0].token_ids`, `.logprobs` (one
    {token_id: Logprob} dict per token), `.finish_reason`, `num_cached_tokens`. `in_process=False`
    hides the driver model, as when the engine runs in another process.
    """

    in_process = True
    instances: list = []

    def __init__(self, model, **kwargs):
        from types import SimpleNamespace

        from searchrl.models.io import load_policy, load_tokenizer

        self.kwargs = {"model": model, **kwargs}
        self.hf = HFTokenEngine(load_policy(model), load_tokenizer(model))
        self.resets = 0
        self.rpc_calls = []
        executor = SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=self.hf.model))
        )
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=kwargs.get("max_model_len") or 4096),
            **({"model_executor": executor} if self.in_process else {}),
        )
        FakeLLM.instances.append(self)

    def generate(self, prompts, sampling, use_tqdm=True):
        from types import SimpleNamespace

        assert use_tqdm is False and len(prompts) == len(sampling)
        params = []
        for sp in sampling:
            assert sp.n == 1 and sp.ignore_eos is True and sp.logprobs == 0
            assert sp.include_stop_str_in_output is True and sp.skip_special_tokens is False
            assert sp.detokenize == bool(sp.stop)  # vLLM refuses stop strings without detokenize
            params.append(
                TurnParams(
                    max_tokens=sp.max_tokens,
                    temperature=sp.temperature,
                    top_p=sp.top_p,
                    top_k=sp.top_k,
                    seed=sp.seed,
                    stop_token_ids=list(sp.stop_token_ids),
                    stop=list(sp.stop or []),
                )
            )
        done = self.hf.generate([p["prompt_token_ids"] for p in prompts], params)
        return [
            SimpleNamespace(
                num_cached_tokens=c.cached_tokens,
                outputs=[
                    SimpleNamespace(
                        token_ids=tuple(c.token_ids),
                        logprobs=[
                            {t: SimpleNamespace(logprob=lp)}
                            for t, lp in zip(c.token_ids, c.logprobs, strict=True)
                        ],
                        finish_reason=c.finish_reason,
                    )
                ],
            )
            for c in done
        ]

    def reset_prefix_cache(self):
        self.resets += 1
        self.hf._prefix_cache.clear()

    def collective_rpc(self, method, args=()):
        from types import SimpleNamespace

        self.rpc_calls.append(args)
        return [method(SimpleNamespace(model_runner=SimpleNamespace(model=self.hf.model)), *args)]


@pytest.fixture()
def fake_vllm(monkeypatch, rollout_world):
    import sys
    import types

    from searchrl.rollout import vllm_generator as vg

    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(vg, "check_vllm_available", lambda: None)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)  # the external launcher's variables: restored afterwards
    FakeLLM.instances = []
    monkeypatch.setattr(FakeLLM, "in_process", True)
    # HF's Qwen2 load_weights equivalent for the fake's model: copy by name (vLLM's loader does more).
    monkeypatch.setattr(
        type(rollout_world["model"]),
        "load_weights",
        lambda self, weights: [dict(self.named_parameters())[n].data.copy_(t) for n, t in weights],
        raising=False,
    )
    return FakeLLM


def test_vllm_engine_requests_and_answers_round_trip_through_the_vllm_api(rollout_world, fake_vllm):
    import os

    from searchrl.rollout.vllm_generator import VLLMEngine

    cfg = GenerationConfig(temperature=0.0, max_new_tokens_per_turn=20, max_episode_tokens=300)
    policy = copy.deepcopy(rollout_world["model"])
    gen = VLLMGenerator(
        policy, rollout_world["tok"], replace(cfg), gpu_memory_utilization=0.25, max_model_len=512
    )
    assert isinstance(gen.engine, VLLMEngine) and gen.engine.max_model_len == 512
    llm = fake_vllm.instances[0]
    kw = llm.kwargs
    # TRL 1.16's colocate settings: in-process engine, processed logprobs, batched-token cap.
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["enable_prefix_caching"] is True and kw["gpu_memory_utilization"] == 0.25
    assert kw["max_num_batched_tokens"] == 4096
    assert os.environ["WORLD_SIZE"] == "1" and os.environ["RANK"] == "0"
    # Greedy rollouts through the vLLM-shaped requests and answers equal HFGenerator's.
    a = gen.rollout(make_envs(rollout_world, 3), rows_for(3))
    b = HFGenerator(policy, rollout_world["tok"], replace(cfg)).rollout(
        make_envs(rollout_world, 3), rows_for(3)
    )
    assert [t.input_ids for t in a.trajectories] == [t.input_ids for t in b.trajectories]
    assert [t.action_mask for t in a.trajectories] == [t.action_mask for t in b.trajectories]
    assert all(t.metadata["engine"] == "vllm" for t in a.trajectories)
    # Weight sync, in-process path (TRL's model_runner.model.load_weights), then the prefix cache reset.
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    gen.sync_weights(policy)
    assert llm.resets == 1 and not llm.rpc_calls
    for x, y in zip(policy.parameters(), llm.hf.model.parameters(), strict=True):
        assert torch.equal(x, y)
    a = gen.rollout(make_envs(rollout_world, 2), rows_for(2))
    b = HFGenerator(policy, rollout_world["tok"], replace(cfg)).rollout(
        make_envs(rollout_world, 2), rows_for(2)
    )
    assert [t.input_ids for t in a.trajectories] == [t.input_ids for t in b.trajectories]


def test_vllm_engine_stop_strings_and_worker_process_weight_path(rollout_world, fake_vllm, monkeypatch):
    from searchrl.rollout.vllm_generator import VLLMEngine

    monkeypatch.setattr(fake_vllm, "in_process", False)  # no driver model: collective_rpc
    policy = copy.deepcopy(rollout_world["model"])
    engine = VLLMEngine.from_model(policy, rollout_world["tok"])
    llm = fake_vllm.instances[0]
    stop = TurnParams(max_tokens=6, temperature=0.0, stop=["</search>"], stop_token_ids=[3])
    plain = TurnParams(max_tokens=6, temperature=0.0, stop_token_ids=[3])
    prompt = rollout_world["tok"]("Where is Varnholt?")["input_ids"]
    out = engine.generate([prompt, prompt], [stop, plain])
    assert [len(o.token_ids) for o in out] == [len(o.logprobs) for o in out]
    assert out[0].token_ids == out[1].token_ids  # greedy, and no stop string was produced
    # A request extending an earlier prompt and answer: `num_cached_tokens` comes back as cached_tokens.
    again = engine.generate([prompt + out[1].token_ids + [5]], [plain])[0]
    assert out[1].cached_tokens == 0 and again.cached_tokens == len(prompt) + len(out[1].token_ids) - 1
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(0.5)
    with policy_weights(policy) as weights:
        engine.load_weights(weights)
    assert len(llm.rpc_calls) == 1 and llm.resets == 1
    sent = llm.rpc_calls[0][0]
    assert all(t.device.type == "cpu" for _, t in sent)
    for x, y in zip(policy.parameters(), llm.hf.model.parameters(), strict=True):
        assert torch.equal(x, y)


def test_vllm_engine_refuses_answers_without_logprobs(rollout_world, fake_vllm, monkeypatch):
    from types import SimpleNamespace

    from searchrl.rollout.vllm_generator import VLLMEngine

    engine = VLLMEngine.from_model(copy.deepcopy(rollout_world["model"]), rollout_world["tok"])
    monkeypatch.setattr(
        engine.llm,
        "generate",
        lambda prompts, sampling, use_tqdm: [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5], logprobs=None, finish_reason="length")])
        ],
    )
    with pytest.raises(RuntimeError, match=r"no per-token logprobs"):
        engine.generate([[1, 2, 3]], [TurnParams(max_tokens=1)])


# -------------------------------------------------------------------------------------------------
# real vLLM (GPU only)
# -------------------------------------------------------------------------------------------------


def _require_vllm_gpu():
    pytest.importorskip("vllm", reason="vLLM is not installed (GPU-only backend; CPU CI skips this)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the vLLM backend runs on GPUs only")


def test_real_vllm_greedy_rollouts_match_hf_and_follow_weight_syncs(rollout_world):
    _require_vllm_gpu()
    policy = copy.deepcopy(rollout_world["model"]).cuda()
    cfg = GenerationConfig(temperature=0.0, max_new_tokens_per_turn=24, max_episode_tokens=200)
    gen = VLLMGenerator(
        policy, rollout_world["tok"], replace(cfg), dtype="float32", gpu_memory_utilization=0.2
    )
    hf = HFGenerator(policy, rollout_world["tok"], replace(cfg))
    a = gen.rollout(make_envs(rollout_world, 4), rows_for(4))
    b = hf.rollout(make_envs(rollout_world, 4), rows_for(4))
    assert [t.input_ids for t in a.trajectories] == [t.input_ids for t in b.trajectories]
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    gen.sync_weights(policy)
    a = gen.rollout(make_envs(rollout_world, 4), rows_for(4))
    b = hf.rollout(make_envs(rollout_world, 4), rows_for(4))
    assert [t.input_ids for t in a.trajectories] == [t.input_ids for t in b.trajectories]


def test_real_vllm_logprobs_are_the_tempered_filtered_ones(rollout_world):
    _require_vllm_gpu()
    policy = copy.deepcopy(rollout_world["model"]).cuda()
    cfg = GenerationConfig(temperature=0.7, top_k=50, top_p=0.9, max_new_tokens_per_turn=32)
    gen = VLLMGenerator(policy, rollout_world["tok"], cfg, dtype="float32", gpu_memory_utilization=0.2)
    batch = gen.rollout(make_envs(rollout_world, 4), rows_for(4))
    for traj in batch.trajectories:
        ids = torch.tensor([traj.input_ids], device="cuda")
        with torch.no_grad():
            logits = policy(ids).logits[0, :-1]
        logp = sampling_log_probs(logits, 0.7, 50, 0.9).gather(1, ids[0, 1:, None]).squeeze(1).cpu()
        mask = torch.tensor(traj.action_mask[1:], dtype=torch.bool)
        assert (logp[mask] - torch.tensor(traj.logprobs[1:])[mask]).abs().max().item() <= 1e-3
