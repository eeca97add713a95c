"""`searchrl train`: the shipped config loads, a run and its resume go through the real CLI in process.

The policy is the tiny model of `test_ppo_trainer.py` saved to a folder (standing in for the SFT warm
start), the index folder does not exist yet (the command builds it from the corpus), the rubric is the
shipped `configs/rewards_default.yaml`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_ppo_trainer import CORPUS, QA
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.config import load_config
from searchrl.common.io import write_jsonl
from searchrl.ppo.config import PPOConfig

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "configs" / "ppo_tiny.yaml"


@pytest.fixture(scope="module")
def setup(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo_cli")
    world["policy"].save_pretrained(root / "policy")
    world["tok"].save_pretrained(root / "policy")
    write_jsonl(root / "train.jsonl", [dict(q, id=f"{q['id']}-{k}") for k in range(2) for q in QA])
    write_jsonl(root / "dev.jsonl", QA[:2])
    write_jsonl(root / "corpus.jsonl", CORPUS)
    return root


def sets(root: Path, **extra) -> list[str]:
    values = {
        "policy_model_path": root / "policy",
        "train_file": root / "train.jsonl",
        "dev_file": root / "dev.jsonl",
        "corpus_path": root / "corpus.jsonl",
        "index_dir": root / "index",
        "reward_config_path": REPO / "configs" / "rewards_default.yaml",
        "output_dir": root / "run",
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "total_episodes": 8,
        "max_new_tokens_per_turn": 8,
        "max_episode_tokens": 40,
        "save_steps": 1,
        "eval_steps": 1,
        "num_eval_questions": 2,
        "progress_bar": "false",
    }
    values.update(extra)
    out: list[str] = []
    for k, v in values.items():
        out += ["--set", f"{k}={v}"]
    return out


def test_shipped_config_loads_with_the_collapse_guard_on():
    cfg = load_config(PPOConfig, SHIPPED)
    assert cfg.collapse_guard is True
    assert cfg.eval_on_start is True  # the warm start is the first point of the dev curve
    assert (
        cfg.reward_config_path == "configs/rewards_default.yaml" and (REPO / cfg.reward_config_path).exists()
    )
    assert cfg.index_dir and cfg.train_file and cfg.dev_file


def test_train_runs_then_resumes_through_the_cli(setup):
    runner = CliRunner()
    first = runner.invoke(app, ["train", "--config", str(SHIPPED), *sets(setup)])
    assert first.exit_code == 0, first.output
    run = setup / "run"
    assert (setup / "index" / "meta.json").exists()  # built from the corpus on first use
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # the shipped config evaluates the start (step 0)
    assert "eval/f1" in rows[-1] and "reward/f1" in rows[-1]
    assert (run / "checkpoints" / "step-2" / "trainer_state.json").exists()
    evals = sorted(p.name for p in (run / "eval").glob("*.json"))
    assert evals == ["step-0.json", "step-1.json", "step-2.json"]
    # --resume with a larger budget continues at step 3 instead of starting over.
    again = runner.invoke(
        app, ["train", "--config", str(SHIPPED), "--resume", *sets(setup, total_episodes=12)]
    )
    assert again.exit_code == 0, again.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0 is not evaluated again
    assert rows[-1]["episode"] == 12
    train_s = [r["time/train_s"] for r in rows]
    assert train_s[0] == 0.0 and train_s == sorted(set(train_s))  # the clock goes on across --resume


def test_bad_input_gets_a_clear_error(setup):
    runner = CliRunner()
    bad_set = runner.invoke(app, ["train", "--config", str(SHIPPED), "--set", "kl_coef"])
    assert bad_set.exit_code == 2 and "write FIELD=VALUE" in bad_set.output
    missing = runner.invoke(
        app, ["train", "--config", str(SHIPPED), *sets(setup, train_file=setup / "nope.jsonl")]
    )
    assert missing.exit_code == 2 and "searchrl data synth" in missing.output
    unknown = runner.invoke(app, ["train", "--config", str(SHIPPED), "--set", "kl_cof=0.1"])
    assert unknown.exit_code == 2 and "kl_cof" in unknown.output


def test_shipped_ppo_config_matches_the_demo_ppo_stage():
    """configs/ppo_tiny.yaml says it runs the demo's PPO stage by hand: the same environment and budgets."""
    from searchrl.demo.configs import DemoConfig

    shipped = load_config(PPOConfig, SHIPPED)
    demo = DemoConfig().ppo_config()
    assert shipped.env_config() == demo.env_config()
    for name in (
        "total_episodes", "per_device_train_batch_size", "gradient_accumulation_steps", "num_mini_batches",
        "num_ppo_epochs", "learning_rate", "value_learning_rate", "kl_coef", "temperature", "eval_steps",
        "num_eval_questions", "max_new_tokens_per_turn", "max_episode_tokens", "value_lam", "cliprange_value",
        "value_replay_steps", "value_mode",
    ):  # fmt: skip
        assert getattr(shipped, name) == getattr(demo, name), name
