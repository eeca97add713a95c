"""benchmarks/compare_trainers.py at toy size, on a real `--smoke` demo run directory.

The toy warm start is too weak to answer anything, so this checks the experiment's machinery, not its
result: all three trainers start from the demo's SFT policy with the demo PPO stage's environment and
budget, each has a dev curve from step 0 to its last step with episodes and training seconds, each final
policy is measured on the demo's test questions, and the JSON, the PNG and the report agree.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from support.benchmarks import load_benchmark

from searchrl.common.config import load_config
from searchrl.demo.configs import smoke_config
from searchrl.demo.pipeline import run_demo
from searchrl.grpo.config import GRPORunConfig


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    cfg = smoke_config(out_dir=str(out))
    cfg.progress_bar = False
    run_demo(cfg)
    return out


def test_compare_trainers_end_to_end_on_a_smoke_demo(demo_run: Path, tmp_path: Path) -> None:
    script = load_benchmark("compare_trainers")
    out_json = tmp_path / "cmp.json"
    work = tmp_path / "work"
    payload = script.main(
        ["--run", str(demo_run), "--json", str(out_json), "--episodes", "16", "--work-dir", str(work)]
    )
    assert json.loads(out_json.read_text()) == json.loads(json.dumps(payload))
    assert payload["trainers_order"] == ["ppo", "grpo_trl_loop", "grpo_our_rollout"]
    demo = smoke_config()
    stage = demo.ppo_config()
    per_step = stage.per_device_train_batch_size * stage.gradient_accumulation_steps
    assert payload["episodes"] == 16 and payload["settings"]["episodes_per_step"] == per_step == 8
    assert payload["settings"]["env"]["max_observation_tokens"] == demo.environment.max_observation_tokens
    for name, r in payload["trainers"].items():
        curve, final = r["curve"], r["final"]
        # Step 0 (the warm start), every eval step, the last step: episodes and seconds at each point.
        assert curve["step"] == [0, 1, 2], name
        assert curve["episode"] == [0, 8, 16], name
        assert curve["train_s"][0] < 1.0 and curve["train_s"] == sorted(curve["train_s"]), name
        assert all(0.0 <= v <= 1.0 for v in curve["dev_exact_match"])
        assert final["test_n"] == demo.test_questions and 0.0 <= final["test_exact_match"] <= 1.0
        for key in ("train_s", "seconds_per_step", "wall_seconds", "dev_exact_match", "test_f1"):
            assert isinstance(final[key], float) and math.isfinite(final[key]), (name, key)
        assert final["seconds_per_step"] == pytest.approx(final["train_s"] / 2)
        assert final["wall_seconds"] >= final["train_s"]
        test_file = json.loads((Path(r["run_dir"]) / "eval" / "test-final.json").read_text())
        assert test_file["split"] == "test" and test_file["exact_match"] == final["test_exact_match"]
    # Both GRPO runs start from the demo's warm start with the demo PPO stage's environment and budget.
    for mode in ("trl_loop", "our_rollout"):
        cfg = load_config(GRPORunConfig, work / f"grpo_{mode}" / "config.yaml")
        assert cfg.mode == mode and Path(cfg.policy_model_path) == demo_run / "sft" / "policy"
        assert cfg.env_config() == demo.environment.env_config() and cfg.total_episodes == 16
    assert Path(payload["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = Path(payload["report"]).read_text()
    episodes_svg = re.search(r'<svg class="compare" data-x="episodes".*?</svg>', page, re.S).group(0)
    labels = re.findall(r'<polyline class="curve" data-label="([^"]+)" data-x="([^"]+)"', episodes_svg)
    assert labels == [
        ("PPO", "0,8,16"),
        ("GRPO (TRL loop)", "0,8,16"),
        ("GRPO (our rollout)", "0,8,16"),
    ]
    assert "test EM [95% CI]" in page  # the test split's result is in the report's trainer table


def test_grpo_episodes_gives_grpo_its_own_budget_for_an_equal_time_comparison(
    demo_run: Path, tmp_path: Path
) -> None:
    script = load_benchmark("compare_trainers")
    work = tmp_path / "work"
    payload = script.main(
        [
            "--run",
            str(demo_run),
            "--json",
            str(tmp_path / "cmp.json"),
            "--trainers",
            "ppo",
            "grpo_our_rollout",
            "--episodes",
            "8",
            "--grpo-episodes",
            "16",
            "--work-dir",
            str(work),
        ]
    )
    assert payload["episodes"] == 8 and payload["grpo_episodes"] == 16
    assert payload["trainers"]["ppo"]["curve"]["episode"] == [0, 8]
    assert payload["trainers"]["grpo_our_rollout"]["curve"]["episode"] == [0, 8, 16]
    assert load_config(GRPORunConfig, work / "grpo_our_rollout" / "config.yaml").total_episodes == 16


def test_compare_trainers_refuses_bad_input(tmp_path: Path) -> None:
    script = load_benchmark("compare_trainers")
    with pytest.raises(FileNotFoundError, match="searchrl demo"):
        script.main(["--run", str(tmp_path / "nope"), "--json", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        script.main(["--run", str(tmp_path), "--json", str(tmp_path / "x.json"), "--episodes", "0"])
    with pytest.raises(SystemExit):
        script.main(["--run", str(tmp_path), "--json", str(tmp_path / "x.json"), "--grpo-episodes", "-1"])
