"""`searchrl sft` and `searchrl reward-model train|eval` end to end on tiny sizes (real files, real training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.config import ConfigError, load_config
from searchrl.common.trajectory import read_trajectories
from searchrl.data.synthetic import generate, preset_config
from searchrl.env.config import EnvConfig
from searchrl.models.io import load_policy, load_tokenizer, load_value_model
from searchrl.search.index import build_index
from searchrl.sft.pipeline import SFTRunConfig

runner = CliRunner()

SFT_YAML = """
expert: {noise: 0.5, k: 1, seed: 0}
train: {learning_rate: 0.003, max_steps: 3, per_device_train_batch_size: 4}
model: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, intermediate_size: 64}
vocab_size: 512
eval_questions: 4
"""


@pytest.fixture(scope="module")
def task_dirs(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cli")
    paths = generate(preset_config("tiny", seed=2)).write(root / "data")
    build_index(paths["corpus"], root / "index", backend="bm25")
    (root / "sft.yaml").write_text(SFT_YAML)
    return root


@pytest.fixture(scope="module")
def sft_out(task_dirs):
    root = task_dirs
    result = runner.invoke(
        app,
        [
            "sft",
            "--data", str(root / "data"),
            "--index", str(root / "index"),
            "--out", str(root / "sft"),
            "--config", str(root / "sft.yaml"),
            "--limit", "12",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return root / "sft", json.loads(result.stdout)


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["sft", "--help"], ["--data", "--index", "--out", "--config", "--model", "--noise"]),
        (["reward-model", "--help"], ["train", "eval"]),
        (
            ["reward-model", "train", "--help"],
            ["--pairs", "--trajectories", "--model", "--tokenizer", "--out"],
        ),
        (["reward-model", "eval", "--help"], ["--model", "--pairs", "--trajectories"]),
    ],
)
def test_every_command_has_help(argv, needles):
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    for needle in needles:
        assert needle in result.output


def test_sft_command_writes_demonstrations_metrics_and_a_loadable_model(sft_out):
    out, summary = sft_out
    assert summary["demonstrations"] == 12
    assert sum(summary["kinds"].values()) == 12 and summary["kinds"].get("expert", 0) < 12
    assert 0.0 <= summary["dev_tool_call_rate"] <= 1.0
    demos = read_trajectories(out / "demonstrations.jsonl.gz")
    assert len(demos) == 12 and all(d.metadata["expert_kind"] for d in demos)
    metrics = json.loads((out / "sft_metrics.json").read_text())
    assert len(metrics["losses"]) == 3
    tok, policy = load_tokenizer(out / "model"), load_policy(out / "model")
    assert policy.config.hidden_size == 32 and tok.pad_token_id != tok.eos_token_id


def test_sft_command_refuses_a_bad_config_and_a_missing_index(task_dirs, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("expert: {noise: 2.0}\n")
    args = [
        "sft",
        "--data",
        str(task_dirs / "data"),
        "--index",
        str(task_dirs / "index"),
        "--out",
        str(tmp_path),
    ]
    result = runner.invoke(app, [*args, "--config", str(bad)])
    assert result.exit_code == 2 and "noise" in result.output
    result = runner.invoke(
        app,
        ["sft", "--data", str(task_dirs / "data"), "--index", str(tmp_path / "nope"), "--out", str(tmp_path)],
    )
    assert result.exit_code == 2 and "searchrl index" in result.output


def _pairs_file(path, n=12):
    rows = [
        {"prompt": f"Question {i}?\n", "chosen": f"<answer>Ans{i} [d{i}]</answer>", "rejected": f"Ans{i}"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_reward_model_train_and_eval_commands(sft_out, tmp_path):
    out, _ = sft_out
    pairs = _pairs_file(tmp_path / "pairs.jsonl")
    (tmp_path / "rm.yaml").write_text("max_steps: 3\nper_device_train_batch_size: 4\neval_fraction: 0.25\n")
    result = runner.invoke(
        app,
        ["reward-model", "train", "--pairs", str(pairs), "--tokenizer", str(out / "model"),
         "--out", str(tmp_path / "rm"), "--config", str(tmp_path / "rm.yaml")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    assert metrics["pairs"] == 12 and metrics["held_out_pairs"] == 3 and "eval_accuracy" in metrics
    assert load_value_model(tmp_path / "rm").config.num_labels == 1
    result = runner.invoke(
        app, ["reward-model", "eval", "--model", str(tmp_path / "rm"), "--pairs", str(pairs)]
    )
    assert result.exit_code == 0, result.output
    assert 0.0 <= json.loads(result.stdout)["eval_accuracy"] <= 1.0


def test_reward_model_train_refuses_scores_and_pairless_trajectories(sft_out, tmp_path):
    out, _ = sft_out
    scored = tmp_path / "scored.jsonl"
    scored.write_text(json.dumps({"prompt": "q", "response": "a", "score": 0.5}) + "\n")
    base = ["reward-model", "train", "--tokenizer", str(out / "model"), "--out", str(tmp_path / "rm")]
    result = runner.invoke(app, [*base, "--pairs", str(scored)])
    assert result.exit_code == 2 and "pair of texts" in result.output and "not a score" in result.output
    # One demonstration per question: no question has both a chosen and a rejected trajectory.
    demos = read_trajectories(out / "demonstrations.jsonl.gz")
    assert len({d.question_id for d in demos}) == len(demos)
    result = runner.invoke(app, [*base, "--trajectories", str(out / "demonstrations.jsonl.gz")])
    assert result.exit_code == 2 and "no preference pairs" in result.output
    result = runner.invoke(app, base)
    assert result.exit_code == 2 and "exactly one of --pairs" in result.output


def test_the_sft_environment_is_the_shared_section_with_the_environment_s_defaults():
    """`environment:` in an SFT YAML is the section PPO, GRPO and the demos use; unset, it is EnvConfig()'s."""
    assert SFTRunConfig().environment.env_config() == EnvConfig()
    shipped = load_config(SFTRunConfig, Path(__file__).resolve().parents[1] / "configs" / "sft_tiny.yaml")
    assert shipped.environment.env_config() == EnvConfig(max_turns=4, max_tool_calls=4)
    limits = load_config(SFTRunConfig, None, {"environment.max_turns": 2, "environment.topk": 1})
    assert limits.environment.env_config() == EnvConfig(max_turns=2, topk=1)
    with pytest.raises(ConfigError, match="max_turns"):
        load_config(SFTRunConfig, None, {"environment.max_turns": 0})
