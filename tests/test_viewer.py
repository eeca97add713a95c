"""The trajectory viewer end to end: real runs, `searchrl view` as a real process, headless Chromium.

Two targets are built here. A tiny PPO run (2 steps, forced search-then-answer turns, `save_trajectories`
on), so the viewer reads files the trainer really wrote: per-token advantages/KL/values, reward
breakdowns, tool calls. And the real smoke demo (`smoke_config` + `run_demo`), whose directory offers the
PPO run's training steps and the SFT and PPO hidden-test evaluations as trajectory sources. Chromium
(Debian's package) is driven over the Chrome DevTools Protocol with a tiny stdlib WebSocket client: the
list page must render (a non-blank screenshot: pixel variance), list every trajectory, a real mouse click
on a row must lead to the trajectory page with its tokens carrying the action / observation / prompt
classes and the score token marked, and on the demo a keyboard choice in the source picker must switch the
list to the SFT policy's hidden-test evaluation.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest
from PIL import Image
from support.forced_ppo import build_world, make_trainer
from support.processes import ROOT, free_port, python_env, wait_http
from support.sample_runs import build_smoke_demo

from searchrl.common.trajectory import read_trajectories
from searchrl.run.errors import RunTargetError
from searchrl.viewer.server import check_run_dir

HTTP = httpx.Client(timeout=60.0)  # a loaded 2-core CI machine is slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("viewer_run")
    world = build_world(root)
    make_trainer(world, root / "run", steps=2).train()
    return root / "run"


def _serve(target: Path):
    """`searchrl view TARGET` as a real process; yields its URL and stops it afterwards."""
    port = free_port()
    cmd = [sys.executable, "-m", "searchrl.cli", "view", str(target), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=python_env(), stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", proc, timeout=180)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def viewer(run_dir):
    yield from _serve(run_dir)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    return build_smoke_demo(tmp_path_factory.mktemp("viewer_demo"))


@pytest.fixture(scope="module")
def demo_viewer(demo_dir):
    yield from _serve(demo_dir)


# -------------------------------------------------------------------------------------------------
# The JSON API over the files the trainer wrote
# -------------------------------------------------------------------------------------------------


def test_trainer_saves_per_token_advantages_kl_and_values(run_dir):
    trajs = read_trajectories(sorted((run_dir / "trajectories").glob("*.jsonl.gz"))[0])
    for t in trajs:
        for name in ("advantages", "kl", "values"):
            assert len(t.metadata[name]) == len(t.input_ids)
            # Zero wherever the policy did not sample (observations, prompt, glue).
            assert all(v == 0.0 for v, m in zip(t.metadata[name], t.action_mask, strict=True) if not m)
    assert any(v != 0.0 for t in trajs for v in t.metadata["advantages"])


def test_list_filters_by_step_reward_correctness_and_termination(viewer, run_dir):
    everything = HTTP.get(viewer + "/api/trajectories").json()
    assert everything["total"] == 8  # 2 steps x 4 episodes
    by_step = HTTP.get(viewer + "/api/trajectories", params={"step": 2}).json()
    assert by_step["total"] == 4 and {r["step"] for r in by_step["rows"]} == {2}
    right = HTTP.get(viewer + "/api/trajectories", params={"correct": "yes"}).json()["rows"]
    wrong = HTTP.get(viewer + "/api/trajectories", params={"correct": "no"}).json()["rows"]
    # SearchThenAnswer answers the gold on even rows and "unknown" on odd ones.
    assert len(right) == 4 and len(wrong) == 4
    assert all(r["answer"] in r["golds"] for r in right) and all(r["answer"] == "unknown" for r in wrong)
    cut = min(r["reward"] for r in right)
    high = HTTP.get(viewer + "/api/trajectories", params={"min_reward": cut}).json()["rows"]
    assert {r["key"] for r in high} >= {r["key"] for r in right}
    assert all(r["reward"] >= cut for r in high)
    low = HTTP.get(viewer + "/api/trajectories", params={"max_reward": cut - 1e-6}).json()["rows"]
    assert all(r["reward"] < cut for r in low) and len(low) + len(high) == 8
    answered = HTTP.get(viewer + "/api/trajectories", params={"termination": "answered"}).json()
    assert answered["total"] == 8
    assert HTTP.get(viewer + "/api/trajectories", params={"termination": "max_turns"}).json()["total"] == 0


def test_bad_filters_and_unknown_keys_get_clear_4xx(viewer):
    r = HTTP.get(viewer + "/api/trajectories", params={"correct": "maybe"})
    assert r.status_code == 422 and "'yes' or 'no'" in r.json()["error"]
    r = HTTP.get(viewer + "/api/trajectories", params={"termination": "exploded"})
    assert r.status_code == 422 and "answered" in r.json()["error"]
    r = HTTP.get(viewer + "/api/trajectories/99-99")
    assert r.status_code == 404 and "STEP-INDEX" in r.json()["error"]
    assert HTTP.get(viewer + "/static/../../etc/passwd").status_code == 404


def test_trajectory_detail_tokens_kinds_score_and_tool_calls(viewer, run_dir):
    detail = HTTP.get(viewer + "/api/trajectories/1-0").json()
    traj = read_trajectories(run_dir / "trajectories" / "step-000001.jsonl.gz")[0]
    tokens = detail["tokens"]
    assert [t["id"] for t in tokens] == traj.input_ids
    assert [t["kind"] == "action" for t in tokens] == [bool(m) for m in traj.action_mask]
    assert {t["kind"] for t in tokens} >= {"prompt", "action", "observation", "glue"}
    # Observation tokens are exactly the document text; the tool-message template around it is glue.
    observed = "".join(t["text"] for t in tokens if t["kind"] == "observation")
    assert observed == "".join(traj.observations)
    glue = "".join(t["text"] for t in tokens if t["kind"] == "glue")
    assert "<tool_response>" in glue and "<|im_start|>" in glue
    # Decoded one id at a time with the checkpoint's tokenizer, the pieces rebuild the action text.
    actions = "".join(t["text"] for t in tokens if t["kind"] == "action")
    assert "<tool_call>" in actions and "<answer>" in actions
    assert (
        detail["score_index"] == traj.last_action_index and tokens[detail["score_index"]]["kind"] == "action"
    )
    assert [t["advantage"] for t in tokens] == pytest.approx(traj.metadata["advantages"])
    assert [t["kl"] for t in tokens] == pytest.approx(traj.metadata["kl"])
    assert detail["reward"] == pytest.approx(traj.reward)
    assert detail["reward_breakdown"].keys() == traj.reward_breakdown.keys()
    call = detail["tool_calls"][0]
    assert call["name"] == "search" and call["status"] == "ok" and call["latency_ms"] > 0
    assert call["arguments"]["query"] == traj.tool_calls[0].arguments["query"]


def test_view_command_refuses_what_it_cannot_show_and_says_what_it_can(tmp_path, run_dir):
    with pytest.raises(RunTargetError, match="not a run, a demo or a trajectories file"):
        check_run_dir(tmp_path)  # an empty folder
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.yaml").write_text("seed: 1\n")  # a run folder, but nothing to show
    with pytest.raises(RunTargetError, match="has no trajectories.*save_trajectories"):
        check_run_dir(started)
    with pytest.raises(RunTargetError, match="the trajectories/ folder of"):
        check_run_dir(run_dir / "trajectories")
    out = subprocess.run(
        [sys.executable, "-m", "searchrl.cli", "view", str(tmp_path / "nope")],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "no such file or directory" in out.stderr
    assert "a demo directory" in out.stderr and "trajectories file" in out.stderr


def test_one_trajectories_file_is_a_target_of_its_own(run_dir):
    from fastapi.testclient import TestClient

    from searchrl.viewer.server import create_app

    path = run_dir / "trajectories" / "step-000002.jsonl.gz"
    client = TestClient(create_app(path))
    summary = client.get("/api/summary").json()
    assert summary["kind"] == "trajectories" and [s["id"] for s in summary["sources"]] == ["step-000002"]
    assert summary["num_trajectories"] == 4 and summary["steps"] == [2]
    assert summary["tokenizer"] == "checkpoints/step-2/policy"  # the run around the file
    assert [r["key"] for r in client.get("/api/trajectories").json()["rows"]] == ["2-0", "2-1", "2-2", "2-3"]
    bad = client.get("/api/trajectories", params={"source": "train"})
    assert bad.status_code == 422 and "use one of step-000002" in bad.json()["error"]


def test_demo_directory_offers_training_and_both_hidden_test_evaluations(demo_viewer, demo_dir):
    summary = HTTP.get(demo_viewer + "/api/summary").json()
    assert summary["kind"] == "demo" and summary["trainer"] == "ppo"
    assert [s["id"] for s in summary["sources"]] == ["train", "sft-test", "ppo-test"]
    assert summary["source"]["id"] == "train" and summary["steps"] == [1, 2]
    for name in ("sft-test", "ppo-test"):
        trajs = read_trajectories(demo_dir / "eval" / f"{name}.trajectories.jsonl.gz")
        listed = HTTP.get(demo_viewer + "/api/trajectories", params={"source": name}).json()
        assert listed["total"] == len(trajs) == 16
        assert [r["id"] for r in listed["rows"]] == [t.id for t in trajs]
        assert all(r["step"] is None and r["source"] == name for r in listed["rows"])
        assert HTTP.get(demo_viewer + "/api/summary", params={"source": name}).json()["steps"] == []
    detail = HTTP.get(demo_viewer + "/api/trajectories/3", params={"source": "ppo-test"}).json()
    assert [t["id"] for t in detail["tokens"]] == read_trajectories(
        demo_dir / "eval" / "ppo-test.trajectories.jsonl.gz"
    )[3].input_ids
    assert detail["has_ppo_values"] is False  # an evaluation: no advantages, KL or values
    unknown = HTTP.get(demo_viewer + "/api/trajectories", params={"source": "dev"})
    assert unknown.status_code == 422 and "train, sft-test, ppo-test" in unknown.json()["error"]


# -------------------------------------------------------------------------------------------------
# Headless Chromium over the DevTools Protocol (a minimal RFC 6455 client: no extra packages)
# -------------------------------------------------------------------------------------------------


class DevTools:
    """One CDP page session over a raw WebSocket (text frames, client-side masking)."""

    def __init__(self, ws_url: str) -> None:
        u = urlparse(ws_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0], head
        self.next_id = 0

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("DevTools socket closed")
            buf += chunk
        return buf

    def _recv_message(self) -> dict:
        payload = b""
        while True:
            b0, b1 = self._recv_exact(2)
            length = b1 & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._recv_exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._recv_exact(8))[0]
            payload += self._recv_exact(length)
            if b0 & 0x80:  # FIN: the last fragment
                return json.loads(payload)

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        data = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (
            bytes([0x80 | n])
            if n < 126
            else bytes([0x80 | 126]) + struct.pack(">H", n)
            if n < 65536
            else bytes([0x80 | 127]) + struct.pack(">Q", n)
        )
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        while True:
            msg = self._recv_message()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expression: str):
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {expression}")

    def screenshot(self) -> np.ndarray:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        return np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)

    def click_at(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def chromium(tmp_path):
    assert CHROMIUM, (
        "Debian's chromium is needed: apt-get install chromium chromium-driver "
        "(make test runs tools/ensure_chromium.sh, which installs them when it can)"
    )
    port = free_port()
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--remote-debugging-port={port}",
        "--window-size=1280,900",
        "about:blank",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        pages = []
        while time.monotonic() < deadline and not pages:
            try:
                pages = [
                    p
                    for p in httpx.get(f"http://127.0.0.1:{port}/json", timeout=2).json()
                    if p["type"] == "page"
                ]
            except (httpx.HTTPError, ValueError):
                time.sleep(0.2)
        assert pages, "chromium did not open its DevTools endpoint"
        tools = DevTools(pages[0]["webSocketDebuggerUrl"])
        tools.call("Page.enable")
        tools.call("Runtime.enable")
        yield tools
        tools.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_headless_chromium_renders_the_list_and_clicks_through_to_a_trajectory(viewer, chromium, tmp_path):
    chromium.call("Page.navigate", url=viewer + "/")
    chromium.wait_for(
        "document.body && document.body.dataset.ready === '1' && !!document.querySelector('#traj-table')"
    )
    assert chromium.js("document.querySelectorAll('tr.traj-row').length") == 8
    assert chromium.js("document.querySelector('#error') === null")
    pixels = chromium.screenshot()
    Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / "list.png")
    assert pixels.shape[0] > 500 and pixels.std() > 10.0, "the page rendered blank"
    # A real mouse click on the first row's link (DevTools input events, not a JS .click()).
    box = chromium.js(
        "(() => { const r = document.querySelector('tr.traj-row a.traj-link').getBoundingClientRect();"
        " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
    )
    key = chromium.js("document.querySelector('tr.traj-row').dataset.key")
    chromium.click_at(*box)
    chromium.wait_for(
        "location.hash.startsWith('#/t/') && document.body.dataset.ready === '1' && !!document.querySelector('#tokens')"
    )
    assert chromium.js("location.hash") == f"#/t/{key}"
    counts = chromium.js(
        "Object.fromEntries(['prompt','action','observation'].map(k => [k, document.querySelectorAll('#tokens .tok-' + k).length]))"
    )
    detail = HTTP.get(viewer + f"/api/trajectories/{key}").json()
    expected = {k: sum(t["kind"] == k for t in detail["tokens"]) for k in ("prompt", "action", "observation")}
    assert counts == expected and all(n > 0 for n in counts.values())
    assert chromium.js("document.querySelectorAll('#tokens .score-token').length") == 1
    assert chromium.js("document.querySelector('#tokens .score-token').dataset.i") == str(
        detail["score_index"]
    )
    assert chromium.js("document.querySelectorAll('#tool-calls tr.tool-call').length") == len(
        detail["tool_calls"]
    )
    # The advantage heat map recolours the action tokens.
    before = chromium.js("getComputedStyle(document.querySelector('#tokens .tok-action')).backgroundColor")
    chromium.js("document.querySelector('#modes button[data-mode=advantage]').click()")
    chromium.wait_for("document.querySelector('#tokens').dataset.mode === 'advantage'")
    colours = chromium.js(
        "[...new Set([...document.querySelectorAll('#tokens .tok-action')].map(e => e.style.background))]"
    )
    assert len(colours) > 1 and before not in colours
    pixels = chromium.screenshot()
    assert pixels.std() > 10.0


@pytest.mark.slow
def test_headless_chromium_opens_the_demo_and_chooses_the_hidden_test_evaluation(
    demo_viewer, demo_dir, chromium, tmp_path
):
    ready = "document.body && document.body.dataset.ready === '1' && !!document.querySelector('#traj-table')"
    chromium.call("Page.navigate", url=demo_viewer + "/")
    chromium.wait_for(ready)
    assert chromium.js("document.getElementById('run-name').textContent").endswith("(demo)")
    options = chromium.js(
        "[...document.querySelectorAll('#source option')].map(o => [o.value, o.textContent])"
    )
    assert [o[0] for o in options] == ["train", "sft-test", "ppo-test"]
    assert options[1][1].startswith("SFT policy · hidden test split")
    assert chromium.js("document.querySelectorAll('tr.traj-row').length") == 16  # PPO training: 2 steps x 8
    assert chromium.js(
        "[...new Set([...document.querySelectorAll('tr.traj-row')].map(r => r.dataset.source))]"
    ) == ["train"]
    # Choose the SFT policy's hidden-test evaluation with the keyboard, as a person would.
    chromium.js("document.querySelector('#source').focus()")
    for kind in ("keyDown", "keyUp"):
        chromium.call(
            "Input.dispatchKeyEvent", type=kind, key="ArrowDown", code="ArrowDown", windowsVirtualKeyCode=40
        )
    chromium.wait_for(f"location.hash === '#/?source=sft-test' && {ready}")
    assert chromium.js("document.querySelector('#source').value") == "sft-test"
    assert chromium.js("document.querySelector('#source-title').textContent").startswith("SFT policy")
    trajs = read_trajectories(demo_dir / "eval" / "sft-test.trajectories.jsonl.gz")
    ids = chromium.js("[...document.querySelectorAll('tr.traj-row a.traj-link')].map(a => a.textContent)")
    assert ids == [t.id for t in trajs]
    assert chromium.js(
        "[...new Set([...document.querySelectorAll('tr.traj-row')].map(r => r.dataset.source))]"
    ) == ["sft-test"]
    assert chromium.js("document.querySelector('select[name=step]') === null")  # an evaluation has no steps
    pixels = chromium.screenshot()
    Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / "demo-sft-test.png")
    assert pixels.std() > 10.0, "the page rendered blank"
    # A real click on the fourth row opens that evaluation trajectory, decoded with the run's tokenizer.
    box = chromium.js(
        "(() => { const r = document.querySelectorAll('tr.traj-row a.traj-link')[3].getBoundingClientRect();"
        " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
    )
    chromium.click_at(*box)
    chromium.wait_for(
        "location.hash.startsWith('#/t/') && document.body.dataset.ready === '1' && !!document.querySelector('#tokens')"
    )
    assert chromium.js("location.hash") == "#/t/3?source=sft-test"
    detail = HTTP.get(demo_viewer + "/api/trajectories/3", params={"source": "sft-test"}).json()
    assert detail["id"] == trajs[3].id and [t["id"] for t in detail["tokens"]] == trajs[3].input_ids
    assert chromium.js("document.querySelectorAll('#tokens .tok').length") == len(trajs[3].input_ids)
    counts = chromium.js(
        "Object.fromEntries(['prompt','action'].map(k => [k, document.querySelectorAll('#tokens .tok-' + k).length]))"
    )
    assert counts == {k: sum(t["kind"] == k for t in detail["tokens"]) for k in ("prompt", "action")}
    assert chromium.js("document.querySelector('#overview h2').textContent") == f"Trajectory {trajs[3].id}"
    # Back to the list: still the SFT evaluation.
    chromium.js("document.querySelector('#back').click()")
    chromium.wait_for(f"location.hash === '#/?source=sft-test' && {ready}")
    assert chromium.js("document.querySelectorAll('tr.traj-row').length") == 16
