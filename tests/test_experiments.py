"""The issue-6 experiment scripts (benchmarks/kl_sweep.py, benchmarks/unstable_search.py) at toy size.

They run on a real `--smoke` demo directory (data, index, tokenizer, SFT warm start); the toy policy is
too weak to search much, so these tests check the experiment machinery — settings really differ in the
way they claim, every named key is there and finite, curves have a point per step, the plots are PNGs —
not the learning results, which come from the full-size runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support.benchmarks import load_benchmark

from searchrl.demo.configs import smoke_config
from searchrl.demo.pipeline import run_demo
from searchrl.evaluation.audit import audit_run


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    cfg = smoke_config(out_dir=str(out))
    cfg.progress_bar = False
    run_demo(cfg)
    return out


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _finite(values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def test_kl_sweep_fixed_zero_stays_zero_and_adaptive_moves(demo_run, tmp_path):
    kl_sweep = load_benchmark("kl_sweep")
    out_json, out_png = tmp_path / "kl.json", tmp_path / "kl.png"
    argv = ["--run", str(demo_run), "--json", str(out_json), "--plot", str(out_png), "--kl", "0", "adaptive"]
    argv += [
        "--episodes",
        "16",
        "--eval-steps",
        "1",
        "--eval-questions",
        "8",
        "--work-dir",
        str(tmp_path / "w"),
    ]
    kl_sweep.main(argv)
    payload = json.loads(out_json.read_text())
    assert payload["settings_order"] == ["0", "adaptive"]
    zero, adaptive = payload["settings"]["0"], payload["settings"]["adaptive"]
    steps = payload["steps"]
    for setting in (zero, adaptive):
        curves = setting["curves"]
        assert curves["step"] == list(range(1, steps + 1))
        for key in ("kl", "kl_coef", "entropy", "answer_length"):
            assert len(curves[key]) == steps and _finite(curves[key]), key
        assert setting["eval"]["step"][0] == 0  # the warm start is measured before the first update
        assert _finite(setting["eval"]["exact_match"])
    assert set(zero["curves"]["kl_coef"]) == {0.0}
    assert (
        adaptive["adaptive"]
        and len(set(adaptive["curves"]["kl_coef"] + [adaptive["final"]["kl_coef_next"]])) > 1
    )
    assert _is_png(out_png)


def test_kl_sweep_rejects_a_bad_setting_with_a_clear_error(demo_run, tmp_path):
    kl_sweep = load_benchmark("kl_sweep")
    argv = ["--run", str(demo_run), "--json", str(tmp_path / "x.json"), "--plot", str(tmp_path / "x.png")]
    with pytest.raises(ValueError, match="coefficient >= 0"):
        kl_sweep.main([*argv, "--kl", "strong"])


def test_unstable_search_reports_every_mode_and_seed(demo_run, tmp_path):
    unstable = load_benchmark("unstable_search")
    out_json, out_png = tmp_path / "us.json", tmp_path / "us.png"
    argv = ["--run", str(demo_run), "--json", str(out_json), "--plot", str(out_png), "--seeds", "0", "1"]
    argv += [
        "--episodes",
        "16",
        "--test-questions",
        "8",
        "--record-questions",
        "16",
        "--work-dir",
        str(tmp_path / "w"),
    ]
    unstable.main(argv)
    payload = json.loads(out_json.read_text())
    assert payload["fault_injection"]["fault_rate"] == 0.3
    for mode in ("off", "replay"):
        summary = payload["summary"][mode]
        assert summary["seeds"] == [0, 1]
        assert set(summary["final_test_exact_match_per_seed"]) == {"0", "1"}
        assert len(summary["reward_variance_per_step"]) == len(summary["steps"])
        assert _finite([summary["final_reward_variance"], summary["final_test_exact_match_mean"]])
    assert _is_png(out_png)


def test_demo_seeds_gathers_each_run_and_refuses_an_unfinished_one(demo_run, tmp_path):
    demo_seeds = load_benchmark("demo_seeds")
    out_json, out_png = tmp_path / "seeds.json", tmp_path / "seeds.png"
    assert (
        demo_seeds.main(
            ["--run", str(demo_run), str(demo_run), "--json", str(out_json), "--plot", str(out_png)]
        )
        == 0
    )
    table = json.loads(out_json.read_text())
    summary = json.loads((demo_run / "summary.json").read_text())
    assert len(table["seeds"]) == 2
    row = table["seeds"][0]
    assert row["ppo_exact_match"] == summary["ppo"]["test"]["exact_match"]
    assert row["improvement"] == pytest.approx(row["ppo_exact_match"] - row["sft_exact_match"], abs=1e-4)
    assert row["kl_steps"] == summary["ppo"]["steps"] and row["dev_curve"][0][0] == 0
    assert table["mean"]["ppo_exact_match"] == pytest.approx(row["ppo_exact_match"])
    assert row["not_learning"] is summary["ppo"]["learning"]["not_learning"]
    assert row["explained_variance_2nd_half"] == pytest.approx(
        summary["ppo"]["learning"]["explained_variance_2nd_half"], abs=1e-4
    )
    assert row["warm_start_reused"] is False and row["ppo_seconds"] == summary["stages_seconds"]["ppo"]
    paired = summary["ppo_minus_sft"]["test"]["exact_match"]  # the demo's own paired figure
    assert row["paired_improvement"] == paired and paired["n"] == summary["test_questions"]
    assert paired["mean"] == pytest.approx(row["improvement"], abs=1e-9)
    assert paired["ci95"][0] <= paired["mean"] <= paired["ci95"][1]
    # The audit ran on the directory: the training trajectories and both hidden-test evaluations.
    audit = audit_run(demo_run)
    assert row["audit_verdict"] == audit.verdict
    assert (
        set(row["fabricated_citations_evaluations"])
        == set(audit.evaluations)
        == set(row["evaluation_verdicts"])
    )
    assert len(audit.evaluations) >= 2
    assert _is_png(out_png)
    unfinished = tmp_path / "half"
    unfinished.mkdir()
    with pytest.raises(ValueError, match="no summary.json"):
        demo_seeds.main(["--run", str(unfinished), "--json", str(out_json), "--plot", str(out_png)])
