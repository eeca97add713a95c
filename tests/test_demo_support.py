"""The customer-service demo at smoke size end to end (`searchrl demo --task support --smoke`): every stage runs,
`summary.json` carries the task's figures per stage and split with their intervals, and the folder reads back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TASK_FIGURES = ("task_success", "permission_denied_rate", "leaked_observations")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo-support") / "run"
    cmd = [
        sys.executable,
        "-m",
        "searchrl.cli",
        "demo",
        "--task",
        "support",
        "--smoke",
        "--quiet",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    headline = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])
    assert "ppo.test.task_success" in headline and headline["wall_seconds"] > 0
    return out


def test_the_smoke_demo_writes_the_task_figures_per_stage_and_split(smoke_run: Path) -> None:
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["kind"] == "support"
    for stage in ("sft", "ppo"):
        for split in ("dev", "test"):
            figures = summary[stage][split]
            for key in TASK_FIGURES:
                low, high = figures["ci95"][key]
                assert low <= figures[key] <= high, (stage, split, key)
            assert figures["leaked_observations"] == 0  # the boundary holds whatever the policy does
            assert set(figures["by_type"]) <= {"where", "where_id", "return", "unshipped"}
    assert summary["ppo"]["steps"] >= 1 and set(summary["targets"]) >= {"no_leaked_observations"}
    rates = summary["sft"]["copy_rates"]  # teacher-forced per kind of turn: does the warm start read?
    assert set(rates) <= {"first_call", "call_after_observation", "answer"} and "answer" in rates
    assert all(0.0 <= r["rate"] <= 1.0 and r["turns"] >= 1 for r in rates.values())
    assert list(summary["stages_seconds"]) == [
        "data", "index", "models", "expert", "sft", "eval sft", "ppo", "eval ppo", "audit", "report",
    ]  # fmt: skip
    assert summary["customers"]["test"] > 0 and summary["questions"]["test"] == 12
    assert summary["audit"]["checks"]["permission_denied"] in ("pass", "warn", "fail", "skipped")
    assert summary["manifest"]["index_fingerprint"] and summary["peak_rss_mb"] > 100


def test_the_smoke_demo_folder_reads_back(smoke_run: Path) -> None:
    from searchrl.run.layout import read_layout

    layout = read_layout(smoke_run)
    assert [e.file for e in layout.evaluations] == [
        "eval/sft-dev.json", "eval/sft-test.json", "eval/ppo-dev.json", "eval/ppo-test.json",
    ]  # fmt: skip
    for evaluation in layout.evaluations:
        data = json.loads((smoke_run / evaluation.file).read_text())
        assert all(key in data and key in data["ci95"] for key in TASK_FIGURES)
    for rel in ("report.html", "audit.json", "data/store.json", "sft/expert.jsonl.gz", "ppo/metrics.jsonl"):
        assert (smoke_run / rel).exists(), rel
    audit = json.loads((smoke_run / "audit.json").read_text())
    assert "permission_denied" in {c["name"] for c in audit["checks"]}


def test_a_support_yaml_loads_with_the_demo_s_other_settings(tmp_path: Path) -> None:
    from searchrl.common.config import load_config
    from searchrl.demo.configs import demo_yaml_kind
    from searchrl.demo.support_config import SupportDemoConfig

    path = tmp_path / "support.yaml"
    path.write_text("kind: support\nexpert: {skip_lookup: 0.5}\ntask: {customers: 100}\n")
    cfg = load_config(SupportDemoConfig, path)
    assert demo_yaml_kind(path) == "support" and cfg.expert.skip_lookup == 0.5
    assert cfg.expert.follow_injection == SupportDemoConfig().expert.follow_injection
    assert cfg.task.customers == 100 and cfg.task.train_questions == SupportDemoConfig().task.train_questions
    assert "get_order" in cfg.environment.system_prompt
