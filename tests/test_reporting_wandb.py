"""`report_to: [wandb]`: PPO's and GRPO's metrics reach Weights & Biases through transformers' WandbCallback, offline.

`WANDB_MODE=offline` makes wandb write its run to `WANDB_DIR/wandb/offline-run-*/run-*.wandb` (what `wandb
sync` uploads later) and talk to no server. wandb 0.31 ships no reader for that file, so the test reads it
with the format it has: a LevelDB-style log (7-byte header ":W&B" + magic + version, 32 KiB blocks, records
of checksum/length/type split across blocks) whose payloads are wandb's protobuf `Record`s. Every numeric line
of metrics.jsonl must be in the history at its step, under transformers' `train/` prefix. GRPO's loggers are
TRL's own (`report_to` and `run_name` go through `GRPORunConfig.to_trl_args`): every figure TRL logged at a step
(what metrics.jsonl holds besides our step, episode and clocks) is in the history at that step.

`report_to: [trackio]` goes through transformers' TrackioCallback into trackio's local store: one SQLite file
per project, `TRACKIO_DIR/<project>.db` (searchrl's project is "searchrl"), no server and no Space. The test
reads that file with sqlite3 and refuses any socket connection or name lookup off this machine during the run.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import socket
import sqlite3
import struct
import sys
import time

import pytest
from test_ppo_trainer import QA, make_trainer

from searchrl.grpo.config import GRPORunConfig
from searchrl.grpo.trainer import build_grpo_trainer
from searchrl.rewards.combine import default_rubric

BLOCK = 32768
HEADER = 7


def read_wandb_history(path) -> list[dict]:
    """The history records of an offline .wandb file, as {key: value} dicts in write order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} does not start with wandb's header"
    payloads, partial, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a record header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:  # FULL
            payloads.append(chunk)
        elif kind == 2:  # FIRST
            partial = chunk
        elif kind == 3:  # MIDDLE
            partial += chunk
        elif kind == 4:  # LAST
            payloads.append(partial + chunk)
        elif kind == 0 and length == 0:  # zero padding to the block's end
            pos += (BLOCK - pos % BLOCK) % BLOCK
    history = []
    for payload in payloads:
        record = pb.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            history.append(
                {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            )
    return history


def read_wandb_history_when_written(path, rows: int, timeout_s: float = 60.0) -> list[dict]:
    """`read_wandb_history` once the file holds at least `rows` step logs (rows with train/loss or train/lr).

    wandb's writer is a service process: `wandb.finish()` can return before it has flushed the run's records
    (measured: 1 run in 8 read a 7-byte file, header only, right after finish), so the test waits for them.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        history = read_wandb_history(path)
        if sum("train/loss" in h or "train/lr" in h for h in history) >= rows or time.monotonic() > deadline:
            return history
        time.sleep(0.2)


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """wandb in offline mode writing under tmp_path/wb; set up afresh, so an earlier test's run dir is not reused."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_PROJECT", "searchrl-tests")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    wandb.teardown()  # wandb keeps its settings per process: read the variables above again
    yield wandb
    wandb.teardown()


def test_ppo_metrics_reach_wandb_offline_at_their_steps(world, tmp_path, offline_wandb):
    wandb = offline_wandb
    trainer = make_trainer(world, tmp_path, total_episodes=8, report_to=["wandb"])
    try:
        trainer.train()
    finally:
        wandb.finish()  # transformers' callback leaves the run open until the process exits
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    history = read_wandb_history_when_written(run_file, rows=2)
    by_step = {h["train/global_step"]: h for h in history if "train/global_step" in h}
    assert sorted(by_step) == [1, 2]
    for row in rows:
        logged = by_step[row["step"]]
        numeric = {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}
        for key in ("objective/kl", "objective/scores", "loss/policy_avg", "kl_coef", "lr", "episode"):
            assert key in numeric, key
        for key, value in numeric.items():
            assert logged[f"train/{key}"] == pytest.approx(value, rel=1e-6, abs=1e-12), key


def test_grpo_metrics_reach_wandb_offline_at_their_steps(world, tmp_path, offline_wandb):
    wandb = offline_wandb
    cfg = GRPORunConfig(
        output_dir=str(tmp_path / "grpo"),
        report_to=["wandb"],
        seed=3,
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_turns=2,
        max_tool_calls=1,
        max_new_tokens_per_turn=8,
        max_episode_tokens=40,
        max_observation_tokens=16,
        tool_schema_in_prompt=False,
        temperature=1.0,
        learning_rate=1e-3,
        eval_steps=0,
        save_trajectories=False,
    )
    assert (cfg.to_trl_args().report_to, cfg.to_trl_args().run_name) == (["wandb"], "grpo")
    trainer = build_grpo_trainer(
        cfg, copy.deepcopy(world["policy"]), world["tok"], world["backend"], QA, None, default_rubric()
    )
    try:
        trainer.train()
    finally:
        wandb.finish()
    rows = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    history = read_wandb_history_when_written(run_file, rows=2)
    # TRL also writes its own profiling timers to wandb (at any step); the step logs are the rows with a loss.
    steps = [h for h in history if "train/loss" in h]
    by_step = {h["train/global_step"]: h for h in steps}
    assert sorted(by_step) == [h["train/global_step"] for h in steps] == [1, 2]
    # Written by our run-directory callback, not logged by TRL: the step, the episode count, and PPO's names for
    # what TRL logs under its own (the run writer's METRIC_ALIASES: TRL's `entropy` is also
    # `objective/entropy_per_token` in metrics.jsonl).
    from searchrl.run.writer import METRIC_ALIASES

    ours = ("step", "episode", *METRIC_ALIASES.values())
    for row in rows:
        logged = by_step[row["step"]]
        numeric = {
            k: v
            for k, v in row.items()
            if isinstance(v, int | float) and k not in ours and not k.startswith("time/")
        }
        for key in ("loss", "learning_rate", "reward", "tools/calls", "reward/total"):
            assert key in numeric, key
        for key, value in numeric.items():
            assert logged[f"train/{key}"] == pytest.approx(value, rel=1e-6, abs=1e-12), key


def test_grpo_reports_to_no_logger_by_default_and_names_its_run():
    args = GRPORunConfig().to_trl_args()
    assert (args.report_to, args.run_name) == ([], "grpo")  # transformers' "none": no logger
    args = GRPORunConfig(report_to=["tensorboard"], run_name="r1").to_trl_args()
    assert (args.report_to, args.run_name) == (["tensorboard"], "r1")


def _is_local(address) -> bool:
    if isinstance(address, str | bytes):  # AF_UNIX
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def test_ppo_metrics_reach_trackio_local_store_offline(world, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    for var in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID"):
        monkeypatch.delenv(var, raising=False)
    # trackio reads TRACKIO_DIR when it is imported: drop any copy an earlier test imported.
    for name in [m for m in sys.modules if m == "trackio" or m.startswith("trackio.")]:
        monkeypatch.delitem(sys.modules, name)
    off_machine = []
    real_connect, real_connect_ex, real_getaddrinfo = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.getaddrinfo,
    )

    def connect(sock, address):
        if not _is_local(address):
            off_machine.append(address)
            raise OSError(f"test: no network ({address!r})")
        return real_connect(sock, address)

    def connect_ex(sock, address):
        if not _is_local(address):
            off_machine.append(address)
            return 101  # ENETUNREACH
        return real_connect_ex(sock, address)

    def getaddrinfo(host, *args, **kw):
        if not _is_local((host.decode() if isinstance(host, bytes) else host or "",)):
            off_machine.append(host)
            raise socket.gaierror(f"test: no network ({host!r})")
        return real_getaddrinfo(host, *args, **kw)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    trainer = make_trainer(
        world,
        tmp_path,
        total_episodes=8,
        report_to=["trackio"],
        eval_on_start=True,
        eval_steps=2,
        num_eval_questions=2,
        eval_dataset=QA,
    )
    trainer.train()  # on_train_end: trackio.finish() flushes the run to the database
    import trackio.utils

    assert tmp_path / "trackio" == trackio.utils.TRACKIO_DIR
    assert off_machine == []
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    db = tmp_path / "trackio" / "searchrl.db"
    assert db.exists(), sorted(str(p) for p in tmp_path.rglob("*.db"))
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id").fetchall()
    assert {name for name, _, _ in stored} == {"run"}  # the run's name: the output_dir's name
    by_step = {}
    for _, _, metrics in stored:
        logged = json.loads(metrics)
        by_step[logged["train/global_step"]] = logged
    assert sorted(by_step) == [0, 1, 2]
    for row in rows:
        logged = by_step[row["step"]]
        numeric = {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}
        if row["step"]:
            for key in ("objective/kl", "objective/scores", "loss/policy_avg", "kl_coef", "lr", "episode"):
                assert key in numeric, key
        assert "eval/exact_match" in numeric or row["step"] == 1
        for key, value in numeric.items():
            assert logged[f"train/{key}"] == pytest.approx(value, rel=1e-6, abs=1e-12), key
