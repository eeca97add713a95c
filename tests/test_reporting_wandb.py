"""`report_to: [wandb]`: PPO's metrics reach Weights & Biases through transformers' WandbCallback, offline.

`WANDB_MODE=offline` makes wandb write its run to `WANDB_DIR/wandb/offline-run-*/run-*.wandb` (what `wandb
sync` uploads later) and talk to no server. wandb 0.31 ships no reader for that file, so the test reads it
with the format it has: a LevelDB-style log (7-byte header ":W&B" + magic + version, 32 KiB blocks, records
of checksum/length/type split across blocks) whose payloads are wandb's protobuf `Record`s. Every numeric line
of metrics.jsonl must be in the history at its step, under transformers' `train/` prefix.

trackio is not tested: it cannot be installed beside this lock file (trackio 0.43.0 requires pillow < 13 and
the lock has pillow 13.0.0; pip backtracks to trackio 0.0.6, which pulls gradio 3.18). See docs/search_r1.md.
"""

from __future__ import annotations

import json
import struct

import pytest
from test_ppo_trainer import build_world, make_trainer

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


def test_ppo_metrics_reach_wandb_offline_at_their_steps(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_PROJECT", "searchrl-tests")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    (tmp_path / "world").mkdir()
    world = build_world(tmp_path / "world")
    trainer = make_trainer(world, tmp_path, total_episodes=8, report_to=["wandb"])
    try:
        trainer.train()
    finally:
        wandb.finish()  # transformers' callback leaves the run open until the process exits
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    history = read_wandb_history(run_file)
    by_step = {h["train/global_step"]: h for h in history if "train/global_step" in h}
    assert sorted(by_step) == [1, 2]
    for row in rows:
        logged = by_step[row["step"]]
        numeric = {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}
        for key in ("objective/kl", "objective/scores", "loss/policy_avg", "kl_coef", "lr", "episode"):
            assert key in numeric, key
        for key, value in numeric.items():
            assert logged[f"train/{key}"] == pytest.approx(value, rel=1e-6, abs=1e-12), key
