"""Reliability: full tiny PPO runs through search faults, a killed search server, and a kill -9 of training.

1. 20% of backend calls fail or time out (4 steps x 2 episodes x 2 searches) (`FaultInjectingBackend`: 10% errors, 10% timeouts that hang
   3 s against a 0.5 s deadline): the run completes, every failed call is an observation and a counted
   metric (metrics == trajectories, exactly), and no call outlives its deadline.
2. A real `searchrl.search.server` process is SIGKILLed after step 1 and restarted after step 2 (HTTP
   backend): step 2's searches all fail as counted `unavailable`/`circuit_open` observations, step 3
   searches normally again, and nothing hangs.
3. A training subprocess is SIGKILLed mid-run, then resumed with `train(resume=True)`: every metrics
   line and trajectory file written before the kill still parses and is unchanged, the newest
   checkpoint loads, and training continues from it to the end with one metrics line per step.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.forced_ppo import build_world, make_trainer, read_metrics, timed
from support.processes import ROOT, python_env
from support.search import SearchServer
from transformers import TrainerCallback

from searchrl.common.trajectory import read_trajectories
from searchrl.search.client import HTTPBackend
from searchrl.search.faults import FaultInjectingBackend

pytestmark = pytest.mark.slow
FAILED = ("timeout", "unavailable", "error", "circuit_open")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("faults_world"))


def all_trajectories(run_dir: Path):
    return [t for f in sorted((run_dir / "trajectories").glob("*.jsonl.gz")) for t in read_trajectories(f)]


class FaultsWithBothKindsFirst(FaultInjectingBackend):
    """Seeded 20% faults, but the first two calls are a timeout and an error.

    A few batched calls at 10% + 10% may draw no timeout at all; the test's claims (timeouts cut at the
    deadline, errors counted) need at least one of each whatever the policy's call pattern is.
    """

    def _draw_call_faults(self, n: int):
        delay_ms, fault, per_query = super()._draw_call_faults(n)
        forced = {1: "timeout", 2: "error"}.get(self.counters["calls"])
        return delay_ms, forced or fault, per_query


def test_ppo_run_with_20_percent_search_faults_completes_and_counts_every_failure(world, tmp_path):
    faults = FaultsWithBothKindsFirst(world.backend, seed=5, timeout_rate=0.1, error_rate=0.1, timeout_s=3.0)
    deadline_s = 0.5
    trainer = make_trainer(
        world,
        tmp_path / "run",
        backend=faults,
        steps=4,
        batch_size=2,
        searches=2,
        save_steps=1000,
        env_cfg={"search_timeout_s": deadline_s, "max_retries": 0, "breaker_failures": 1000},
    )
    _, wall = timed(trainer.train)
    metrics = read_metrics(tmp_path / "run")
    trajs = all_trajectories(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and len(trajs) == 8

    injected = faults.counters["timeouts"] + faults.counters["errors"]
    assert faults.counters["timeouts"] >= 1 and faults.counters["errors"] >= 1, faults.counters
    records = [c for t in trajs for c in t.tool_calls]
    failed = [c for c in records if c.status != "ok"]
    # Each injected fault fails the whole batched call: every row that searched in it.
    assert len(failed) >= injected
    for status in ("timeout", "unavailable"):
        logged = sum(m[f"tools/failures/{status}"] for m in metrics)
        assert logged == sum(c.status == status for c in records) > 0
    assert sum(m["tools/failures"] for m in metrics) == len(failed)
    assert sum(m["tools/calls"] for m in metrics) == len(records) == 16
    # Every failure became an observation the policy reads (the episode went on and answered).
    assert all(t.termination == "answered" for t in trajs)
    for t in trajs:
        for c in t.tool_calls:
            if c.status != "ok":
                assert c.error and any(c.status in obs or "search" in obs.lower() for obs in t.observations)
    # The injected timeouts hang 3 s; the deadline cut each of them at 0.5 s (slack for a loaded CPU).
    timeouts = [c.latency_ms for c in records if c.status == "timeout"]
    assert timeouts and max(timeouts) < (deadline_s + 1.5) * 1000
    assert wall < 600


class KillAndRestart(TrainerCallback):
    """Kill the search server after step 1, bring it back (same port) after step 2."""

    def __init__(self, server: SearchServer) -> None:
        self.server = server

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.server.kill()
        elif state.global_step == 2:
            self.server.start()
        return control


def test_ppo_run_survives_the_search_server_killed_and_restarted(world, tmp_path):
    with SearchServer(world.index_dir) as server:
        backend = HTTPBackend(
            server.url, connect_timeout=0.5, read_timeout=5.0, max_retries=1, backoff_base=0.05
        )
        trainer = make_trainer(
            world,
            tmp_path / "run",
            backend=backend,
            steps=3,
            save_steps=1000,
            callbacks=[KillAndRestart(server)],
            env_cfg={
                "search_timeout_s": 8.0,
                "max_retries": 0,
                "breaker_failures": 2,
                "breaker_reset_s": 0.2,
            },
        )
        _, wall = timed(trainer.train)
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    down = metrics[1]
    assert metrics[0]["tools/failures"] == 0 and metrics[2]["tools/failures"] == 0
    assert down["tools/failures"] == down["tools/calls"] == 4
    assert down["tools/failures/unavailable"] + down["tools/failures/circuit_open"] == 4
    step2 = read_trajectories(tmp_path / "run" / "trajectories" / "step-000002.jsonl.gz")
    assert all(c.status in FAILED and c.error for t in step2 for c in t.tool_calls)
    assert all(t.termination == "answered" for t in step2)
    assert wall < 600


TRAIN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from support.forced_ppo import TinyWorld, make_trainer
from searchrl.data.synthetic import generate, preset_config
from searchrl.models.io import load_tokenizer
from searchrl.search.index import load_index

root = Path({root!r})
task = generate(preset_config("tiny", seed=0))
world = TinyWorld(root, task, load_index(root / "index"), load_tokenizer(str(root / "tok")), root / "index", root / "corpus.jsonl")
trainer = make_trainer(world, root / "run", steps={steps}, batch_size=2, save_steps=1)
resume = sys.argv[1:] == ["--resume"]
if resume:
    print("resuming from", trainer.run.latest_checkpoint().name, flush=True)
trainer.train(resume=resume)
print("done at step", trainer.global_step, flush=True)
"""


def test_kill_9_during_training_then_resume_loses_nothing(world, tmp_path):
    steps = 6
    world.tok.save_pretrained(str(world.root / "tok"))
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT.format(tests=str(ROOT / "tests"), root=str(world.root), steps=steps))
    run = world.root / "run"
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=python_env(), stderr=subprocess.PIPE)
    # Kill -9 as soon as the step-2 checkpoint is complete: mid-way through step 3.
    deadline = time.monotonic() + 400
    while not (run / "checkpoints" / "step-2" / "trainer_state.json").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "training never reached step 2"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # Nothing written before the kill is corrupted.
    before_lines = (run / "metrics.jsonl").read_text().splitlines()
    before = [json.loads(line) for line in before_lines]  # every line parses
    assert [m["step"] for m in before][:2] == [1, 2]
    saved = {f.name: f.read_bytes() for f in (run / "trajectories").glob("*.jsonl.gz")}
    for f in (run / "trajectories").glob("*.jsonl.gz"):
        assert read_trajectories(f)  # gzip + JSON intact
    state = json.loads((run / "checkpoints" / "step-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    killed_at = max(m["step"] for m in before)
    assert killed_at < steps

    out = subprocess.run(
        [sys.executable, str(script), "--resume"],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    resumed_from = int(out.stdout.split("resuming from step-")[1].split()[0])
    assert resumed_from >= 2 and f"done at step {steps}" in out.stdout
    after_lines = (run / "metrics.jsonl").read_text().splitlines()
    after = [json.loads(line) for line in after_lines]
    assert [m["step"] for m in after] == list(range(1, steps + 1))  # no gap, no duplicate
    # The lines up to the checkpoint are exactly the ones written before the kill.
    assert after_lines[:resumed_from] == before_lines[:resumed_from]
    for name, blob in saved.items():
        step = int(name.split("-")[1].split(".")[0])
        if step <= resumed_from:
            assert (run / "trajectories" / name).read_bytes() == blob
    assert sorted(int(f.name[5:11]) for f in (run / "trajectories").glob("*.jsonl.gz")) == list(
        range(1, steps + 1)
    )
    assert (run / "checkpoints" / f"step-{steps}" / "trainer_state.json").exists()
