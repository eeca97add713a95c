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
    # PPO minus SFT, paired by test question: the mean is the two stages' difference, inside its interval.
    paired = summary["ppo_minus_sft"]["test"]
    assert set(paired) == set(TASK_FIGURES)
    for key in TASK_FIGURES:
        low, high = paired[key]["ci95"]
        assert paired[key]["n"] == 12 and low <= paired[key]["mean"] <= high
        assert paired[key]["mean"] == pytest.approx(summary["ppo"]["test"][key] - summary["sft"]["test"][key])
    rates = summary["sft"]["copy_rates"]  # teacher-forced per kind of turn: does the warm start read?
    assert set(rates) <= {"first_call", "call_after_observation", "answer"} and "answer" in rates
    assert all(0.0 <= r["rate"] <= 1.0 and r["turns"] >= 1 for r in rates.values())
    # The copy phase's gate (out of reach in the smoke config): measured after its 2 steps and after 2 more.
    gate = [g for g in summary["sft"]["copy_gate"] if "copy_phase_step" in g]
    assert [g["copy_phase_step"] for g in gate] == [2.0, 4.0]
    assert all(0.0 <= g["copy_example_rate"] < 1.0 for g in gate)
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


def test_the_default_is_the_recipe_docs_support_measured() -> None:
    """`searchrl demo --task support` runs the recipe docs/support.md measured on seeds 0 and 1 (the reading
    split, the reading examples' gated copy phase and replay, every phase at 1e-3; PPO at 1e-4 for 2,560
    episodes with F1 partial credit and a denied call costing 1.0): a change to it must change the docs' table."""
    from searchrl.demo.support_config import SupportDemoConfig

    cfg = SupportDemoConfig()
    assert cfg.tokenizer_split == "reading" and cfg.reading_kinds == ["order_id", "answer", "query"]
    assert (cfg.answer_f1_weight, cfg.permission_denied_penalty) == (0.5, 1.0)
    sft = cfg.sft
    assert (sft.learning_rate, sft.copy_pretrain_steps, sft.copy_pretrain_learning_rate) == (1e-3, 800, 1e-3)
    assert (sft.copy_pretrain_task_share, sft.copy_replay_share) == (1.0, 0.4) and sft.needs_copy_examples()
    assert (sft.copy_pretrain_gate, sft.copy_pretrain_gate_max_steps, sft.copy_gate_chunk) == (0.85, 800, 200)
    assert (sft.first_turn_steps, sft.max_steps, sft.copy_gate) == (300, 400, 0.0)
    assert (cfg.ppo.total_episodes, cfg.ppo.learning_rate) == (2560, 1e-4)
    sft.check()


def test_reuse_warm_start_reruns_ppo_on_the_same_support_warm_start(smoke_run: Path, tmp_path: Path) -> None:
    """`searchrl demo --task support --reuse-warm-start`: the expert and SFT stages are read back (not rerun),
    the warm start's files stay as they were, its evaluations come out the same, and PPO trains afresh from it
    to the same weights as the first run."""
    import shutil

    from support.reuse import assert_one_ppo_run_to_the_same_weights, ppo_weights

    out = tmp_path / "run"
    shutil.copytree(smoke_run, out)
    before = json.loads((out / "summary.json").read_text())
    sft_bytes = (out / "sft" / "policy" / "model.safetensors").read_bytes()
    first_ppo = ppo_weights(out)
    cmd = [sys.executable, "-m", "searchrl.cli", "demo", "--config", str(out / "demo_config.yaml"), "--quiet",
           "--out", str(out), "--reuse-warm-start"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "running every stage" not in proc.stderr
    summary = json.loads((out / "summary.json").read_text())

    assert summary["warm_start"]["reused"] is True and before["warm_start"] == {"reused": False}
    assert "sft" not in summary["stages_seconds"]
    assert summary["warm_start"]["stages_seconds_when_trained"]["sft"] == before["stages_seconds"]["sft"]
    assert (out / "sft" / "policy" / "model.safetensors").read_bytes() == sft_bytes
    assert summary["num_demonstrations"] == before["num_demonstrations"]
    assert summary["demonstrations_by_kind"] == before["demonstrations_by_kind"]
    for key in ("final_loss", "copy_rates", "copy_gate"):
        assert summary["sft"][key] == before["sft"][key], key
    for split in ("dev", "test"):
        for key in TASK_FIGURES:
            assert summary["sft"][split][key] == before["sft"][split][key], (split, key)
    assert_one_ppo_run_to_the_same_weights(out, first_ppo)


def test_support_reuse_refuses_a_warm_start_trained_otherwise_or_cut_short(
    smoke_run: Path, tmp_path: Path
) -> None:
    import dataclasses
    import shutil

    from searchrl.common.config import load_config
    from searchrl.demo.support_config import SupportDemoConfig
    from searchrl.demo.support_reuse import find_support_warm_start

    cfg = load_config(SupportDemoConfig, smoke_run / "demo_config.yaml")
    ppo_only = dataclasses.replace(cfg, num_threads=1, permission_denied_penalty=1.0, answer_f1_weight=0.5,
                                   ppo=dataclasses.replace(cfg.ppo, learning_rate=1e-4))  # fmt: skip
    same, why = find_support_warm_start(ppo_only, smoke_run)
    assert same is not None and why == ""
    recorded = json.loads((smoke_run / "summary.json").read_text())["sft"]
    assert same.copy_rates == recorded["copy_rates"] and same.final_loss == recorded["final_loss"]
    lazier = dataclasses.replace(cfg, expert=dataclasses.replace(cfg.expert, skip_lookup=0.1))
    found, why = find_support_warm_start(lazier, smoke_run)
    assert found is None and why.endswith("trained its warm start with other settings: expert")
    cut = tmp_path / "cut"
    shutil.copytree(smoke_run, cut)
    demos = cut / "sft" / "expert.jsonl.gz"
    demos.write_bytes(demos.read_bytes()[:-40])  # a run stopped while writing its demonstrations
    found, why = find_support_warm_start(cfg, cut)
    assert found is None and "not a complete gzip file" in why
    found, why = find_support_warm_start(cfg, tmp_path / "nowhere")
    assert found is None and "no finished warm start" in why


def test_a_run_stopped_after_sft_keeps_what_sft_measured_for_reuse(smoke_run: Path, tmp_path: Path) -> None:
    """SFT's facts (final loss, copy gate, copy rates, the warm stages' seconds) are written beside the policy
    when SFT ends (`sft/warm_start.json`), so a run that stopped in PPO, before its summary, keeps them and
    `--reuse-warm-start` reads them back (a seed-0 run that the collapse guard stopped in PPO had lost them)."""
    import shutil

    from searchrl.common.config import load_config
    from searchrl.demo.support_config import SupportDemoConfig
    from searchrl.demo.support_reuse import WARM_START_FACTS, find_support_warm_start

    finished = json.loads((smoke_run / "summary.json").read_text())
    facts = json.loads((smoke_run / WARM_START_FACTS).read_text())
    for key in ("final_loss", "copy_rates", "copy_gate"):
        assert facts[key] == finished["sft"][key], key
    assert facts["stages_seconds"]["sft"] == finished["stages_seconds"]["sft"]
    assert "eval sft" not in facts["stages_seconds"]  # written when SFT ended, before any evaluation
    stopped = tmp_path / "stopped"
    shutil.copytree(smoke_run, stopped)
    (stopped / "summary.json").unlink()  # stopped in PPO: no summary yet
    cfg = load_config(SupportDemoConfig, smoke_run / "demo_config.yaml")
    found, why = find_support_warm_start(cfg, stopped)
    assert found is not None and why == ""
    assert (
        found.copy_rates == finished["sft"]["copy_rates"]
        and found.final_loss == finished["sft"]["final_loss"]
    )
    assert found.stages_seconds["sft"] == finished["stages_seconds"]["sft"]
