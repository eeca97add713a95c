"""The run reader on hand-built run and demo folders: rollbacks counted once by every reader, demo layouts.

A collapse-guard rollback (`ppo/guard.py`) logs the failed step's line with `guard/rollback`, goes back to the
last good checkpoint and redoes the steps after it, so `metrics.jsonl` holds some steps twice. `RunReader`
is the one reader of that file: `metrics()` keeps each step once, as redone, and the audit, the report and
the viewer, which read through it, count each step once too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from searchrl.common.trajectory import Span, Trajectory
from searchrl.run.errors import RunTargetError
from searchrl.run.layout import DemoEvaluation, DemoLayout, Stage, SubRun, read_layout, write_layout
from searchrl.run.reader import RunReader, kept_metrics
from searchrl.run.writer import (
    EVAL_TRAJECTORIES_SUFFIX,
    RunDir,
    eval_trajectories_path,
    step_name,
    step_of,
    with_metric_aliases,
    write_evaluation,
)

# (step, training score, KL, dev EM or None) as logged, in order: step 4 collapsed (its score leapt, its KL
# exploded), the guard rolled back to step 2's checkpoint, and steps 3 and 4 were redone, then step 5.
FIRST_TRY = [(1, 0.10, 0.01, None), (2, 0.20, 0.02, 0.50), (3, 0.90, 4.00, None), (4, 0.95, 9.00, 0.10)]
REDONE = [(3, 0.25, 0.03, None), (4, 0.30, 0.04, 0.60), (5, 0.35, 0.05, None)]


def _traj(tag: str, step: int, i: int) -> Trajectory:
    return Trajectory(
        id=f"{tag}-{step}-{i}",
        question_id=f"q{i}",
        question=f"Question {i}?",
        golds=["x"],
        input_ids=[1, 2, 3, 4],
        action_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -0.5],
        prompt_length=2,
        spans=[Span("prompt", 0, 2, "p"), Span("action", 2, 4, "a")],
        answer="x",
        termination="answered",
        reward=0.5,
        metadata={"step": step},
    )


def _line(step: int, score: float, kl: float, em: float | None) -> dict:
    line = {"step": step, "episode": 2 * step, "objective/scores": score, "objective/kl": kl, "kl_coef": 0.1}
    return {**line, "eval/exact_match": em} if em is not None else line


def rolled_back_run(root: Path) -> Path:
    """A PPO run directory written as the trainer and its guard write one (through `RunDir`)."""
    run = RunDir(root)
    (root / "manifest.json").write_text(json.dumps({"trainer": "ppo"}))
    for step, score, kl, em in FIRST_TRY:
        run.write_step_trajectories(step, [_traj("first", step, i) for i in range(2)])
        line = _line(step, score, kl, em)
        if step == 4:  # the guard fired: the failed step's line says so, then the run goes back to step 2
            line.update({"guard/rollback": 1.0, "guard/rolled_back_to_step": 2.0, "guard/failed_step": 4.0,
                         "guard/reason": "KL to reference 9 > 5"})  # fmt: skip
        run.log_metrics(line)
    for step, score, kl, em in REDONE:
        run.write_step_trajectories(step, [_traj("redone", step, i) for i in range(2)])
        run.log_metrics(_line(step, score, kl, em))
    return root


def test_the_reader_keeps_each_step_once_as_redone(tmp_path):
    reader = RunReader(rolled_back_run(tmp_path / "run"))
    assert [m["step"] for m in reader.metric_lines()] == [1, 2, 3, 4, 3, 4, 5]  # as written
    kept = reader.metrics()
    assert [m["step"] for m in kept] == [1, 2, 3, 4, 5]
    assert [m["objective/scores"] for m in kept] == [0.10, 0.20, 0.25, 0.30, 0.35]
    assert not any("guard/rollback" in m for m in kept)
    (rollback,) = reader.rollbacks()
    assert rollback["guard/failed_step"] == 4.0 and rollback["guard/reason"].startswith("KL")
    # A rollback line without `rolled_back_to_step` undoes its own step only; lines without a step stay.
    lines = [{"step": 1}, {"step": 2}, {"step": 2, "guard/rollback": 1.0}, {"step": 2, "x": 1}, {"note": 1}]
    assert kept_metrics(lines) == [{"step": 1}, {"step": 2, "x": 1}, {"note": 1}]


def test_audit_report_and_viewer_count_a_rolled_back_step_once(tmp_path):
    from fastapi.testclient import TestClient

    from searchrl.evaluation.audit import audit_run, eval_history
    from searchrl.evaluation.report import write_report
    from searchrl.viewer.server import create_app

    run = rolled_back_run(tmp_path / "run")

    history = eval_history(run)
    assert [(p.step, p.exact_match) for p in history] == [(2, 0.5), (4, 0.6)]
    assert history[1].train_reward == pytest.approx((0.20 + 0.25 + 0.30) / 3)  # the redone steps' scores
    series = audit_run(run).check("reward_vs_heldout").details["series"]
    assert [p["step"] for p in series] == [2, 4]

    page = write_report(run, out=tmp_path / "report.html").read_text()
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", page)]
    i = cells.index("objective/kl")
    assert cells[i + 1 : i + 3] == [
        f"mean {(0.01 + 0.02 + 0.03 + 0.04 + 0.05) / 5:.4g} over 5 steps",
        "last 0.05 (step 5)",
    ]
    assert cells[cells.index("dev exact match (eval/exact_match)") + 1] == "0.600 at step 4"
    assert "5 logged steps" in page

    client = TestClient(create_app(run))
    summary = client.get("/api/summary").json()
    assert summary["steps"] == [1, 2, 3, 4, 5] and summary["num_trajectories"] == 10
    rows = client.get("/api/trajectories").json()["rows"]
    assert sorted(r["id"] for r in rows if r["step"] in (3, 4)) == [
        "redone-3-0", "redone-3-1", "redone-4-0", "redone-4-1"
    ]  # fmt: skip


# -- the writer's names ---------------------------------------------------------------------------------------


def test_one_function_makes_and_one_reads_a_step_name():
    assert step_name(12) == "step-12" and step_name(12, 6) == "step-000012"
    for name, step in (("step-12", 12), ("step-000012.jsonl.gz", 12), ("test-step-2.json", 2),
                       ("step-3.trajectories.jsonl.gz", 3), ("latest", None), ("mystep-3", None),
                       ("step-x.json", None)):  # fmt: skip
        assert step_of(name) == step, name
    assert step_of(Path("runs/a/checkpoints/step-7")) == 7


def test_an_evaluation_is_written_with_its_trajectories_beside_it_under_one_suffix(tmp_path):
    path = write_evaluation(tmp_path / "eval" / "sft-test.json", {"n": 1}, [_traj("e", 0, 0)])
    assert json.loads(path.read_text()) == {"n": 1}
    assert eval_trajectories_path(path) == tmp_path / "eval" / f"sft-test{EVAL_TRAJECTORIES_SUFFIX}"
    assert eval_trajectories_path(path).is_file()
    write_evaluation(tmp_path / "eval" / "closed.json", {"n": 2})  # no trajectories: none written
    assert not eval_trajectories_path(tmp_path / "eval" / "closed.json").exists()


def test_grpo_metric_names_get_ppo_names_once_when_written(tmp_path):
    line = with_metric_aliases({"step": 1, "reward": 0.5, "kl": 0.1, "entropy": 2.0, "objective/kl": 0.2})
    assert line["objective/scores"] == 0.5 and line["objective/entropy_per_token"] == 2.0
    assert line["objective/kl"] == 0.2  # a name PPO already logged is never overwritten
    run = RunDir(tmp_path / "run")
    run.log_metrics({"step": 1, "reward": 0.5})
    assert RunReader(run.root).metrics() == [{"step": 1, "reward": 0.5, "objective/scores": 0.5}]


# -- demo layouts -----------------------------------------------------------------------------------------------


def _layout() -> DemoLayout:
    return DemoLayout(
        sub_runs=(SubRun("train/a", "Trainer A"), SubRun("b", "Trainer B")),
        stages=(Stage("warm", "Warm policy"), Stage("a", "A policy")),
        evaluations=(
            DemoEvaluation("results/warm.json", "Warm policy · held out", "warm", "test"),
            DemoEvaluation("results/a.json", "A policy · held out", "a", "test"),
            DemoEvaluation("results/missing.json", "never written", "a", "dev"),
        ),
        initial_policy="start",
        data="questions",
        index="search",
    )


def test_a_demo_is_read_by_the_layout_it_wrote(tmp_path):
    demo = tmp_path / "my-demo"
    layout = _layout()
    write_layout(demo, layout)
    assert read_layout(demo) == layout
    assert json.loads((demo / "summary.json").read_text())["layout"] == layout.to_dict()  # JSON round trip
    assert RunReader(demo).root is None and RunReader(demo).sub_runs() == {}  # started: no run yet
    write_layout(demo, layout, {"a": {"test": {"exact_match": 0.5}}})  # the end: figures and the layout
    assert read_layout(demo) == layout
    main = rolled_back_run(demo / "train" / "a")
    RunDir(demo / "b").log_metrics({"step": 1})
    (demo / "start").mkdir()
    (demo / "start" / "config.json").write_text("{}")
    (demo / "questions").mkdir()
    (demo / "questions" / "test.jsonl").write_text("")
    (demo / "search").mkdir()
    write_evaluation(demo / "results" / "warm.json", {"split": "test", "n": 2}, [_traj("w", 0, 0)])
    write_evaluation(demo / "results" / "a.json", {"split": "test", "n": 2})

    reader = RunReader(demo)
    assert (reader.kind, reader.root, reader.demo_root, reader.trainer) == ("demo", main, demo, "ppo")
    assert reader.sub_runs() == {"Trainer A": main, "Trainer B": demo / "b"}
    assert reader.initial_policy() == demo / "start" and reader.index_dir == demo / "search"
    assert reader.split_file("test") == demo / "questions" / "test.jsonl"
    assert reader.summary() == {"a": {"test": {"exact_match": 0.5}}}  # the figures, not the layout
    evals = [(e.name, e.label, e.stage, e.trajectories is not None) for e in reader.eval_files()]
    assert evals == [
        ("warm.json", "Warm policy · held out", "warm", True),
        ("a.json", "A policy · held out", "a", False),
    ]
    sources = [(s.id, s.kind) for s in reader.trajectory_sources()]
    assert sources == [("train", "training"), ("warm", "evaluation"), ("train:b", "training")]
    inner = RunReader(main)  # the main run knows its demo from the layout
    assert inner.demo_root == demo and [e.name for e in inner.eval_files()] == ["warm.json", "a.json"]
    assert RunReader(demo / "b").demo_root is None


def test_a_demo_folder_without_a_layout_was_written_by_an_older_searchrl(tmp_path):
    old = tmp_path / "old-demo"
    RunDir(old / "ppo").log_metrics({"step": 1})
    (old / "summary.json").write_text(json.dumps({"sft": {"test": {"exact_match": 0.5}}}))
    (old / "demo_config.yaml").write_text("seed: 0\n")
    with pytest.raises(RunTargetError, match="written by an older searchrl.*Rerun the demo"):
        RunReader(old)
    assert RunReader(old / "ppo").kind == "ppo"  # its run is still a run
    (old / "summary.json").write_text(json.dumps({"layout": {"stages": []}}))
    with pytest.raises(RunTargetError, match="'layout' cannot be read"):
        RunReader(old)
