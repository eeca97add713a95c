"""configs/search_r1/: the four Search-R1 recipes load as their config classes, carry the paper's settings, and
each runs one real step at toy size.

The toy substitutes only what a CPU cannot hold: a tiny Qwen2 policy (searchrl.models.tiny) saved where
`policy_model_path` points, a BM25 index over a toy corpus instead of the wiki-18 e5 server, HF rollouts
instead of vLLM, float32 on the CPU, and batch and length limits shrunk. Everything else (protocol, turns,
top-k, KL, clip ranges, GAE, learning rates and their warm-up schedule, the EM-only rubric, the system
prompt) is the file's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from worlds import TINY_ONE_LAYER

from searchrl.common.config import load_config
from searchrl.common.io import write_jsonl
from searchrl.common.trajectory import read_trajectories
from searchrl.env.protocol import format_answer, format_search_r1_call
from searchrl.grpo.config import GRPORunConfig
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.ppo.config import PPOConfig
from searchrl.rollout.generator import ScriptedPolicy
from searchrl.search.index import build_index

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "search_r1"
PPO_FILES = ["qwen2.5-3b_ppo.yaml", "qwen2.5-7b_ppo.yaml"]
GRPO_FILES = ["qwen2.5-3b_grpo.yaml", "qwen2.5-7b_grpo.yaml"]
PLACES = ["Orvel", "Tamsin", "Kesh", "Brindle", "Varro", "Quill"]
torch.set_num_threads(1)


def test_the_four_recipes_exist_and_nothing_else():
    assert sorted(p.name for p in CONFIGS.glob("qwen*.yaml")) == sorted(PPO_FILES + GRPO_FILES)


@pytest.mark.parametrize("name", PPO_FILES)
def test_ppo_recipe_has_search_r1_settings(name):
    cfg = load_config(PPOConfig, CONFIGS / name)  # unknown keys or wrong types would raise here
    assert (cfg.learning_rate, cfg.value_learning_rate) == (1e-6, 1e-5)
    assert (cfg.kl_coef, cfg.kl_estimator, cfg.kl_target) == (0.001, "k1", None)
    assert (cfg.gamma, cfg.lam, cfg.cliprange, cfg.cliprange_value, cfg.num_ppo_epochs) == (
        1.0,
        1.0,
        0.2,
        0.5,
        1,
    )
    assert (cfg.protocol, cfg.topk, cfg.max_turns, cfg.max_tool_calls) == ("search_r1", 3, 5, 4)
    assert (cfg.max_new_tokens_per_turn, cfg.max_observation_tokens, cfg.temperature) == (500, 500, 1.0)
    assert (cfg.rollout_backend, cfg.mixed_precision, cfg.use_cpu) == ("vllm", "bf16", False)
    assert cfg.reward_config_path == "configs/search_r1/rewards_em.yaml"
    assert cfg.search_backend == "http" and cfg.search_url == "http://127.0.0.1:8000/retrieve"
    assert cfg.lr_scheduler_type == "constant_with_warmup" and cfg.warmup_steps == round(0.285 * 2010)
    cfg.finalize(world_size=8)  # the launch lines' 8 processes
    assert (cfg.batch_size, cfg.mini_batch_size, cfg.num_total_batches) == (512, 256, 1005)
    assert cfg.per_device_train_batch_size == 8 and cfg.micro_batches_per_mini_batch == 4
    assert ("7B" in cfg.policy_model_path) == ("7b" in name)


@pytest.mark.parametrize("name", GRPO_FILES)
def test_grpo_recipe_has_search_r1_settings(name):
    cfg = load_config(GRPORunConfig, CONFIGS / name)
    assert (cfg.mode, cfg.protocol, cfg.topk, cfg.max_turns, cfg.max_tool_calls) == (
        "our_rollout",
        "search_r1",
        3,
        5,
        4,
    )
    assert (cfg.num_generations, cfg.beta, cfg.epsilon, cfg.learning_rate) == (5, 0.001, 0.2, 1e-6)
    assert (cfg.scale_rewards, cfg.temperature, cfg.num_steps) == ("group", 1.0, 2010)
    assert (cfg.rollout_backend, cfg.use_cpu) == ("vllm", False)  # Search-R1's engine, in our_rollout
    # 8 processes: 1,280 completions = 256 questions x 5 per optimizer step, two steps per Search-R1 step.
    assert cfg.episodes_per_step * 8 == 256 * 5
    assert cfg.env_config().topk == 3 and cfg.env_config().protocol == "search_r1"
    assert cfg.search_backend == "http" and cfg.search_url == "http://127.0.0.1:8000/retrieve"
    assert cfg.run_name == "search-r1-" + name.removesuffix(".yaml").replace("_", "-")
    assert ("7B" in cfg.policy_model_path) == ("7b" in name)


def test_the_rubric_pays_exact_match_only():
    from searchrl.rewards.combine import load_rubric

    rubric = load_rubric(ROOT / "configs" / "search_r1" / "rewards_em.yaml")
    assert rubric.reward_names == ["exact_match"]
    assert {"f1", "format", "contains", "num_searches"} <= set(rubric.metric_names)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A toy corpus and BM25 index, four questions, a tiny policy saved to disk (about two seconds)."""
    root = tmp_path_factory.mktemp("sr1")
    corpus = [
        {"id": f"e{i}", "title": f"Entity{i}", "contents": f"Entity{i} lives in {p}."}
        for i, p in enumerate(PLACES)
    ]
    write_jsonl(root / "corpus.jsonl", corpus)
    build_index(root / "corpus.jsonl", root / "index").search(["warm up"], 1)
    rows = [
        {"id": f"q{i}", "question": f"Where does Entity{i} live?", "golds": [PLACES[i]]} for i in range(4)
    ]
    write_jsonl(root / "train.jsonl", rows)
    write_jsonl(root / "dev.jsonl", rows[:2])
    tok = train_tokenizer(tokenizer_training_texts(corpus * 3, rows * 3), vocab_size=500)
    policy = build_policy(tok, TINY_ONE_LAYER)
    policy.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    return root


def toy_overrides(root: Path, out: str) -> dict:
    """What the CPU cannot hold, replaced; the recipe's own settings are kept."""
    return {
        "output_dir": str(root / out),
        "policy_model_path": str(root / "policy"),
        "train_file": str(root / "train.jsonl"),
        "dev_file": str(root / "dev.jsonl"),
        "index_dir": str(root / "index"),
        "search_backend": "bm25",
        "search_url": None,
        "use_cpu": True,
        "max_new_tokens_per_turn": 16,
        "max_episode_tokens": 240,
        "max_observation_tokens": 64,
        "eval_on_start": False,
        "num_eval_questions": 2,
    }


@pytest.mark.parametrize("name", PPO_FILES)
def test_ppo_recipe_runs_one_step_at_toy_size(toy, name):
    from searchrl.ppo.commands import build_trainer

    overrides = toy_overrides(toy, name)
    overrides |= {
        "rollout_backend": "hf",
        "mixed_precision": "no",
        "gradient_checkpointing": False,
        "report_to": ["none"],
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,  # 4 episodes, 2 mini-batches of 2 (the recipe's 2 mini-batches)
        "total_episodes": 4,
        "local_rollout_forward_batch_size": 4,
        "save_steps": 1,
        "progress_bar": False,
    }
    cfg = load_config(PPOConfig, CONFIGS / name, overrides)
    trainer = build_trainer(cfg)
    # Every episode searches, reads three documents, then answers "Orvel" (right for one of the four questions).
    script = [format_search_r1_call("Entity0 lives"), format_answer("Orvel")]
    trainer.generator.forcing = ScriptedPolicy(trainer.tokenizer, [script] * 4, append_eos=False)
    trainer.train()
    run = Path(cfg.output_dir)
    (line,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert line["step"] == 1 and line["episode"] == 4
    assert line["kl_coef"] == pytest.approx(0.001)
    # constant_with_warmup over 573 optimizer steps: two taken (two mini-batches, one epoch).
    assert line["lr"] == pytest.approx(1e-6 * 2 / 573)
    assert line["objective/scores"] == pytest.approx(0.25)  # EM only: one answer of four is right
    adam = [s for s in trainer.optimizer.state.values() if "exp_avg" in s]
    assert adam and any(float(s["exp_avg"].abs().max()) > 0 for s in adam)  # gradients reached the optimizer
    (step_file,) = (run / "trajectories").glob("step-*.jsonl*")
    trajs = read_trajectories(step_file)
    assert len(trajs) == 4 and all(t.answer == "Orvel" and len(t.tool_calls) == 1 for t in trajs)
    for t in trajs:
        assert t.messages[0]["content"] == cfg.system_prompt
        assert t.observations and t.observations[0].startswith("\n\n<information>Doc 1 (Title: Entity0) ")
        assert t.retrieved and len(t.tool_calls[0].doc_ids) == 3  # top-3, as the recipe says
        # Retrieved-token masking: no observation token is an action token.
        for span in t.spans:
            if span.kind == "observation":
                assert not any(t.action_mask[span.start : span.end])
    assert (run / "checkpoints" / "step-1" / "policy").is_dir()


@pytest.mark.parametrize("name", GRPO_FILES)
def test_grpo_recipe_runs_one_step_at_toy_size(toy, name):
    from searchrl.grpo.trainer import run_grpo

    overrides = toy_overrides(toy, name)
    overrides |= {
        "rollout_backend": "hf",
        "per_device_train_batch_size": 5,  # one question's group of num_generations=5
        "gradient_accumulation_steps": 1,
        "max_steps": 1,
        "eval_steps": 0,
        "save_steps": 1,
        "eval_batch_size": 2,
    }
    cfg = load_config(GRPORunConfig, CONFIGS / name, overrides)
    run_grpo(cfg)
    run = Path(cfg.output_dir)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (step,) = [x for x in lines if x.get("step") == 1 and "loss" in x]
    assert step["episode"] == 5 and "kl" in step  # beta 0.001 > 0: TRL computes the KL to the reference
    assert 0.0 <= step["learning_rate"] <= 1e-6 / 573  # still warming up over 573 steps
    assert "reward/exact_match" in step and "reward/metric/f1" in step  # the EM-only rubric's names
    (step_file,) = (run / "trajectories").glob("step-*.jsonl*")
    trajs = read_trajectories(step_file)
    assert len(trajs) == 5 and len({t.question_id for t in trajs}) == 1  # one group of five answers
    assert all(t.messages[0]["content"] == cfg.system_prompt for t in trajs)
    assert (run / "checkpoints" / "step-1" / "policy").is_dir()


def test_the_stability_recipes_f1_reward_charges_ending_without_an_answer():
    from searchrl.common.trajectory import Trajectory
    from searchrl.rewards.combine import load_rubric

    rubric = load_rubric(ROOT / "configs" / "search_r1" / "rewards_f1_penalised.yaml")
    assert rubric.reward_names == ["f1"]

    def score(answer):
        return rubric(
            Trajectory(id="t", question_id="q", question="Where?", golds=["New York"], answer=answer)
        )

    assert score(None) == pytest.approx(-0.1)  # no answer costs more than a wrong one ...
    assert score("Paris") == 0.0
    assert score("New York") == 1.0 and 0.0 < score("York") < 1.0  # ... and F1 pays partial answers
    for name in PPO_FILES:  # the recipes point at it where they say how to turn the stability settings on
        assert "rewards_f1_penalised.yaml" in (CONFIGS / name).read_text()
