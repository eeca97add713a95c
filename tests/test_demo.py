"""The smoke demo end to end: every stage runs and `summary.json` carries every key issue 6 names."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRED = ("exact_match", "f1", "citation_support", "searches_per_question", "tool_failure_rate")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "run"
    cmd = [
        sys.executable,
        "-m",
        "searchrl.cli",
        "demo",
        "--smoke",
        "--quiet",
        "--compare-grpo",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    headline = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])
    assert set(headline) == {
        "sft.test.exact_match",
        "ppo.test.exact_match",
        "grpo_trl_loop.test.exact_match",
        "grpo_our_rollout.test.exact_match",
        "wall_seconds",
        "peak_rss_mb",
    }
    return out


def test_smoke_demo_writes_every_summary_key(smoke_run: Path) -> None:
    summary = json.loads((smoke_run / "summary.json").read_text())
    for stage in ("sft", "ppo", "grpo_trl_loop", "grpo_our_rollout"):
        test = summary[stage]["test"]
        for key in REQUIRED:
            assert 0.0 <= test[key] <= (1.0 if key != "searches_per_question" else 10.0), (stage, key)
            assert key in test["ci95"] and test["ci95"][key][0] <= test[key] <= test["ci95"][key][1]
        assert set(test["by_hops"]) <= {"1", "2"} and test["by_hops"]
    assert summary["ppo"]["steps"] >= 1 and summary["ppo"]["episodes"] >= 1
    assert summary["wall_seconds"] > 0 and summary["peak_rss_mb"] > 100
    stages = summary["stages_seconds"]
    assert list(stages) == [
        "data",
        "index",
        "models",
        "expert",
        "sft",
        "eval sft",
        "closed book",
        "ppo",
        "eval ppo",
        "grpo trl_loop",
        "eval grpo trl_loop",
        "grpo our_rollout",
        "eval grpo our_rollout",
        "report",
    ]
    assert summary["num_demonstrations"] > 0 and summary["test_questions"] > 0
    # demonstrations of the world's train questions plus the practice world's
    demos = summary["num_demonstrations"]
    assert summary["practice_worlds"] == 1 and demos > 48
    closed = summary["sft"]["closed_book_test"]
    assert closed["searches_per_question"] >= 0 and 0.0 <= closed["exact_match"] <= 1.0
    assert summary["manifest"]["versions"]["trl"] and summary["manifest"]["index_fingerprint"]
    assert summary["improvement_exact_match"] == pytest.approx(
        summary["ppo"]["test"]["exact_match"] - summary["sft"]["test"]["exact_match"]
    )


def test_smoke_demo_writes_the_run_artifacts(smoke_run: Path) -> None:
    for rel in ("report.html", "eval/sft-test.json", "eval/ppo-test.json", "sft/expert.jsonl.gz",
                "sft/policy/config.json", "ppo/metrics.jsonl", "ppo/manifest.json", "ppo/config.yaml",
                "data/test.jsonl", "index/meta.json", "eval/sft-test-closed-book.json",
                "practice/world-0/corpus.jsonl", "practice/world-0/index/meta.json"):  # fmt: skip
        assert (smoke_run / rel).exists(), rel
    html = (smoke_run / "report.html").read_text()
    assert "<img" in html and "http://" not in html.replace("http://127.0.0.1", "")
    # --compare-grpo: the three trainers from one warm start, side by side, each with a test evaluation
    assert "<h2>Trainers side by side</h2>" in html
    for label in ("PPO", "GRPO (TRL loop)", "GRPO (our rollout)"):
        assert label in html
    for mode in ("trl_loop", "our_rollout"):
        final = json.loads((smoke_run / f"grpo_{mode}" / "eval" / "test-final.json").read_text())
        assert final["n"] == json.loads((smoke_run / "summary.json").read_text())["test_questions"]
        assert (smoke_run / f"grpo_{mode}" / "eval" / "step-0.json").exists()  # the shared warm start
    metrics = [json.loads(line) for line in (smoke_run / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics][:3] == [0, 1, 2]  # step 0: eval_on_start, the warm start


def test_demo_refuses_mismatched_expert_and_search_depth_before_writing_anything(tmp_path: Path) -> None:
    from searchrl.common.config import ConfigError
    from searchrl.demo.pipeline import run_demo, smoke_config

    out = tmp_path / "run"
    cfg = smoke_config(out_dir=str(out))
    cfg.expert = dataclasses.replace(cfg.expert, k=cfg.ppo.topk + 2)
    with pytest.raises(ConfigError, match="set them equal"):
        run_demo(cfg)
    assert not out.exists()


def test_a_partial_section_in_a_demo_yaml_keeps_the_demo_s_other_settings(tmp_path: Path) -> None:
    """`sft: {trl_loss: false}` changes that one field; the rest stays the demo's, not the class defaults."""
    from searchrl.common.config import ConfigError, load_config
    from searchrl.demo.pipeline import DemoConfig

    path = tmp_path / "demo.yaml"
    path.write_text("sft:\n  trl_loss: false\nppo:\n  kl_coef: 0.1\nexpert:\n  noise: 0.3\n")
    cfg = load_config(DemoConfig, path)
    demo = DemoConfig()
    assert cfg.sft.trl_loss is False and cfg.ppo.kl_coef == 0.1 and cfg.expert.noise == 0.3
    assert cfg.sft == dataclasses.replace(demo.sft, trl_loss=False)
    assert cfg.ppo == dataclasses.replace(demo.ppo, kl_coef=0.1)
    assert cfg.expert == dataclasses.replace(demo.expert, noise=0.3)
    assert cfg.model == demo.model
    # Dotted overrides complete the section the same way; a typo inside it is still named.
    assert load_config(DemoConfig, None, {"sft.max_steps": 7}).sft == dataclasses.replace(
        demo.sft, max_steps=7
    )
    with pytest.raises(ConfigError, match="did you mean 'trl_loss'"):
        load_config(DemoConfig, None, {"sft.trl_los": False})
