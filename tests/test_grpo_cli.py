"""`searchrl grpo`: help, clear errors, and one real run from files through `run_grpo`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from searchrl.common.config import ConfigError
from searchrl.grpo.commands import build_config, parse_overrides, register

REPO = Path(__file__).resolve().parents[1]


def grpo_app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        """Test root (forces typer to keep `grpo` as a subcommand)."""

    return app


def test_help_names_every_option() -> None:
    result = CliRunner().invoke(grpo_app(), ["grpo", "--help"])
    assert result.exit_code == 0
    for option in (
        "--config",
        "--mode",
        "--output-dir",
        "--max-steps",
        "--set",
        "--resume",
        "trl_loop",
        "our_rollout",
    ):
        assert option in result.output


def test_overrides_are_parsed_as_yaml_and_bad_ones_named() -> None:
    assert parse_overrides(["beta=0.04", "mode=trl_loop", "total_episodes=null"]) == {
        "beta": 0.04,
        "mode": "trl_loop",
        "total_episodes": None,
    }
    with pytest.raises(ConfigError, match="FIELD=VALUE"):
        parse_overrides(["beta"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "verl"], "mode"),
        (["--set", "policy_model_path=null"], "policy_model_path"),
        (["--set", "num_generationz=2"], "unknown field"),
    ],
)
def test_bad_input_exits_2_with_the_reason(args: list[str], message: str) -> None:
    config = str(REPO / "configs" / "grpo_tiny.yaml")
    result = CliRunner().invoke(grpo_app(), ["grpo", "--config", config, *args])
    assert result.exit_code == 2
    assert message in result.output


def test_max_steps_replaces_the_episode_budget_and_options_beat_set() -> None:
    config = REPO / "configs" / "grpo_tiny.yaml"
    assert build_config(config).num_steps == 20  # total_episodes 640 / 32 per step
    cfg = build_config(config, mode="trl_loop", max_steps=3, pairs=["mode=our_rollout", "beta=0.01"])
    assert (cfg.total_episodes, cfg.num_steps, cfg.mode, cfg.beta) == (None, 3, "trl_loop", 0.01)


def test_one_step_from_files_writes_the_run_directory(tmp_path: Path) -> None:
    from worlds import TINY_ONE_LAYER

    from searchrl.common.io import write_jsonl
    from searchrl.data.synthetic import generate, preset_config
    from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
    from searchrl.search.index import build_index

    task = generate(preset_config("tiny", seed=1))
    write_jsonl(tmp_path / "corpus.jsonl", task.corpus)
    build_index(tmp_path / "corpus.jsonl", tmp_path / "index")
    write_jsonl(tmp_path / "train.jsonl", task.splits["train"][:4])
    write_jsonl(tmp_path / "dev.jsonl", task.splits["dev"][:2])
    tok = train_tokenizer(tokenizer_training_texts(task.corpus, task.splits["train"]), vocab_size=600)
    policy = build_policy(tok, TINY_ONE_LAYER)
    policy.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    config = {
        "mode": "our_rollout",
        "policy_model_path": str(tmp_path / "policy"),
        "train_file": str(tmp_path / "train.jsonl"),
        "dev_file": str(tmp_path / "dev.jsonl"),
        "index_dir": str(tmp_path / "index"),
        "tool_schema_in_prompt": False,
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        "num_generations": 2,
        "max_turns": 2,
        "max_new_tokens_per_turn": 8,
        "max_episode_tokens": 16,
        "max_observation_tokens": 16,
        "eval_on_start": True,
        "eval_steps": 0,  # only the starting policy is evaluated
        "num_eval_questions": 2,
    }
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    result = CliRunner().invoke(
        grpo_app(),
        ["grpo", "--config", str(tmp_path / "grpo.yaml"), "--output-dir", str(run), "--set", "seed=5"],
    )
    assert result.exit_code == 0, result.output
    # the run directory is the last thing printed (a progress bar of transformers may share its line)
    assert result.output.strip().splitlines()[-1].endswith(str(run))
    assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == 5
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["mode"] == "our_rollout" and manifest["index_fingerprint"]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 0 and "eval/exact_match" in lines[0]  # the starting policy, evaluated
    assert any(line.get("step") == 1 and "loss" in line for line in lines)
    assert json.loads((run / "eval" / "step-0.json").read_text())["episode"] == 0
    assert (run / "checkpoints" / "step-1" / "trainer_state.json").is_file()
    assert len(list((run / "trajectories").glob("step-*.jsonl.gz"))) == 1
    # --resume with a larger budget continues at step 2: step 0's evaluation is not repeated.
    result = CliRunner().invoke(
        grpo_app(),
        ["grpo", "--config", str(tmp_path / "grpo.yaml"), "--output-dir", str(run), "--set", "seed=5"]
        + ["--max-steps", "2", "--resume"],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "loss" in m] == [1, 2]
    assert [m["step"] for m in lines if "eval/exact_match" in m] == [0]
    assert [m["episode"] for m in lines if "loss" in m] == [2, 4]
    assert json.loads((run / "manifest.json").read_text())["resumed_from_step"] == 1
    # step-0 holds the best (here the only) dev evaluation, the starting policy's, kept by best_metric.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0", "step-1", "step-2"]
    assert json.loads((run / "best_checkpoint.json").read_text())["checkpoint"] == "step-0"
    # Resuming a finished run trains nothing more and keeps its history as it is.
    again = CliRunner().invoke(
        grpo_app(),
        ["grpo", "--config", str(tmp_path / "grpo.yaml"), "--output-dir", str(run), "--set", "seed=5"]
        + ["--max-steps", "2", "--resume"],
    )
    assert again.exit_code == 0, again.output
    after = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in after if "loss" in m] == [1, 2]
