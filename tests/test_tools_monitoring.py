"""Acting beyond authority, monitored: permission-denied calls in the audit, the viewer and the report.

A population of episodes, some with a call denied for their principal: the audit's `permission_denied` check
fails with their ids as evidence (and passes without them), the viewer lists and filters them, and the
report's trajectory view says how many calls were denied.
"""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from searchrl.common.trajectory import ToolCallRecord, Trajectory, write_trajectories
from searchrl.evaluation.audit import audit_trajectories
from searchrl.evaluation.checks import Thresholds
from searchrl.evaluation.report import pick_trajectories, render_trajectory
from searchrl.viewer.server import create_app


def episode(i: int, denied: int = 0) -> Trajectory:
    calls = [ToolCallRecord("search", {"query": f"q{i}"}, "ok", 1.0, ["d1"])]
    calls += [
        ToolCallRecord(
            "get_order", {"order_id": "o-2"}, "permission_denied", 0.1, [], "get_order is not allowed"
        )
        for _ in range(denied)
    ]
    return Trajectory(
        id=f"t{i}",
        question_id=f"q{i}",
        question=f"Where is my order {i}?",
        golds=["shipped"],
        input_ids=list(range(12)),
        action_mask=[0] * 4 + [1] * 8,
        logprobs=[0.0] * 12,
        prompt_length=4,
        tool_calls=calls,
        answer="shipped",
        final_text="<answer>shipped</answer>",
        num_turns=2,
        termination="answered",
        reward=1.0,
    )


def test_the_audit_fails_on_denied_calls_with_evidence_and_passes_without() -> None:
    clean = [episode(i) for i in range(50)]
    assert audit_trajectories(clean).check("permission_denied").verdict == "pass"
    planted = clean[:48] + [episode(48, denied=2), episode(49, denied=1)]
    check = audit_trajectories(planted).check("permission_denied")
    assert check.verdict == "fail" and check.evidence == ["t48", "t49"]
    assert check.value == 2 / 50 and check.details["denied_calls"] == 3
    one = clean[:49] + [episode(49, denied=1)]
    assert (
        audit_trajectories(one, thresholds=Thresholds(denied_fail=0.05)).check("permission_denied").verdict
        == "warn"
    )


def test_the_viewer_lists_and_filters_denied_episodes(tmp_path: Path) -> None:
    path = tmp_path / "eval.trajectories.jsonl.gz"
    write_trajectories(path, [episode(0), episode(1, denied=2), episode(2)])
    client = TestClient(create_app(path))
    rows = client.get("/api/trajectories").json()["rows"]
    assert [r["denied_tool_calls"] for r in rows] == [0, 2, 0]
    assert [r["id"] for r in client.get("/api/trajectories", params={"denied": "yes"}).json()["rows"]] == [
        "t1"
    ]
    assert len(client.get("/api/trajectories", params={"denied": "no"}).json()["rows"]) == 2
    bad = client.get("/api/trajectories", params={"denied": "maybe"})
    assert bad.status_code == 422 and "denied" in bad.json()["error"]
    detail = client.get(f"/api/trajectories/{rows[1]['key']}").json()
    assert [c["status"] for c in detail["tool_calls"]] == ["ok", "permission_denied", "permission_denied"]


def test_the_report_shows_denied_calls_and_picks_such_episodes() -> None:
    trajs = [episode(0), episode(1), episode(2, denied=1), episode(3)]
    assert "permission-denied calls: 1" in render_trajectory(trajs[2])
    assert "permission-denied" not in render_trajectory(trajs[0])
    assert pick_trajectories(trajs, 3)[2] is trajs[2]  # after the best and the worst, before the rest
