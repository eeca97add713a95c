"""Two CPU processes (gloo) run PPOTrainer: `torchrun --nproc_per_node 2` (CPU, under a minute).

On CPU `accelerate launch --num_processes 2 --cpu` only starts several processes through mpirun (its
"simple launcher" otherwise runs one), so the test uses torchrun; the trainer's `Accelerator` reads
the same RANK / WORLD_SIZE / MASTER_* variables either way and picks gloo on CPU. The parent test writes
a worker script, launches it on two processes, and checks what the ranks dumped and what the run
directory holds:

* after every step the policy and critic weights are bit-identical on both ranks, and they moved;
* the ranks rolled out different questions, together exactly the step's global batch;
* the KL coefficient, the metrics and the whitening inputs agree across ranks;
* metrics.jsonl has one line per step (logged once), with global episode counts, and each step's
  trajectory file holds both ranks' episodes.

The reward is the learnable `LikedTokens` stand-in from test_ppo_trainer.py, so advantages are not zero
and the weights really change.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import copy, hashlib, json, os, sys
from pathlib import Path

import torch
from transformers import TrainerCallback
from test_ppo_trainer import QA, LikedTokens, env_factory, make_args
from worlds import build_varnholt_world

from searchrl.ppo.trainer import PPOTrainer

out = Path(sys.argv[1])
rank = int(os.environ["RANK"])
torch.set_num_threads(1)
torch.manual_seed(0)  # the same initial weights on both ranks (DDP would broadcast rank 0's anyway)
world_dir = out / f"world-rank{rank}"
world_dir.mkdir(parents=True)
world = build_varnholt_world(world_dir)
args = make_args(
    out,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    num_mini_batches=1,
    total_episodes=16,
    max_new_tokens_per_turn=4,
    max_episode_tokens=40,
    learning_rate=1e-2,
    save_trajectories=True,
    kl_target=1.0,
)
rows = [dict(q, id=f"{q['id']}-{k}") for k in range(2) for q in QA]


def weights_hash(trainer) -> str:
    h = hashlib.sha256()
    for name, p in sorted(trainer.model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Record(TrainerCallback):
    def __init__(self):
        self.hashes, self.logs = [], []

    def on_step_end(self, args, state, control, **kw):
        self.hashes.append(weights_hash(trainer))

    def on_log(self, args, state, control, logs=None, **kw):
        self.logs.append(logs)


record = Record()
peft_config = None
if os.environ.get("WORKER_LORA") == "1":
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
trainer = PPOTrainer(
    args, world["tok"], copy.deepcopy(world["policy"]), None, None, rows,
    reward_funcs=LikedTokens(), environment=env_factory(world), callbacks=[record],
    peft_config=peft_config,
)
initial = weights_hash(trainer)
seen = []
original_rollout = trainer.rollout
def recording_rollout(rows, seed, temperature=None):
    seen.append({"ids": [r["id"] for r in rows], "seed": seed})
    return original_rollout(rows, seed, temperature)
trainer.rollout = recording_rollout
trainer.train()
dump = {
    "rank": rank, "world_size": trainer.world_size, "batch_size": args.batch_size,
    "local_batch_size": args.local_batch_size, "initial": initial, "hashes": record.hashes,
    "logs": record.logs, "seen": seen, "kl_coef": trainer.kl_ctl.value,
    "is_peft": trainer.is_peft, "has_ref_copy": trainer.ref_model is not None,
}
(out / f"rank{rank}.json").write_text(json.dumps(dump))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two_ranks(tmp_path: Path, worker_body: str, **env_extra: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(worker_body)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
        **env_extra,
    }
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(script),
        str(tmp_path / "out"),
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_two_process_ppo_keeps_ranks_in_sync_on_different_prompts(tmp_path):
    proc = launch_two_ranks(tmp_path, WORKER)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = tmp_path / "out"
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["batch_size"] == 8 and r0["local_batch_size"] == 4
    n_steps = len(r0["hashes"])
    assert n_steps == 2 == len(r1["hashes"])

    # Gradients synchronised: identical weights on both ranks after every step, and they really moved.
    assert r0["initial"] == r1["initial"]
    assert r0["hashes"] == r1["hashes"]
    assert len({r0["initial"], *r0["hashes"]}) == n_steps + 1

    # Rollouts sharded: per step, disjoint questions whose union is the step's global batch (all 8 ids).
    for a, b in zip(r0["seen"], r1["seen"], strict=True):
        assert len(a["ids"]) == len(b["ids"]) == 4
        assert not set(a["ids"]) & set(b["ids"])
        assert len(set(a["ids"]) | set(b["ids"])) == 8
        assert a["seed"] != b["seed"]  # each rank samples with its own seed

    # Statistics reduced: the KL controller and every logged metric agree across ranks.
    assert r0["kl_coef"] == r1["kl_coef"]
    for m0, m1 in zip(r0["logs"], r1["logs"], strict=True):
        assert m0 == m1

    # Logged once: one metrics line per step, episode counts over both ranks.
    lines = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert [m["episode"] for m in lines] == [8, 16]
    assert lines[0]["objective/scores"] == r0["logs"][0]["objective/scores"]

    # One trajectory file per step with both ranks' episodes; the final checkpoint written once.
    for step in (1, 2):
        path = out / "run" / "trajectories" / f"step-{step:06d}.jsonl.gz"
        with gzip.open(path, "rt") as f:
            trajs = [json.loads(line) for line in f]
        assert len(trajs) == 8
        assert sorted(t["metadata"]["rank"] for t in trajs) == [0] * 4 + [1] * 4
    assert (out / "run" / "checkpoints" / "step-2" / "trainer_state.json").exists()


def test_two_process_lora_ppo_keeps_the_adapters_in_sync(tmp_path):
    # LoRA through peft_config: the reference is the policy with its adapter disabled (no frozen copy),
    # only the adapters and the critic train, and DDP keeps them identical across ranks.
    proc = launch_two_ranks(tmp_path, WORKER, WORKER_LORA="1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = tmp_path / "out"
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["is_peft"] and not r0["has_ref_copy"]
    assert r0["hashes"] == r1["hashes"]
    assert len({r0["initial"], *r0["hashes"]}) == 3
    assert (out / "run" / "checkpoints" / "step-2" / "policy" / "adapter_model.safetensors").exists()


def test_shipped_accelerate_configs_parse_with_the_documented_engines():
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    want = {
        "multi_cpu": (DistributedType.MULTI_CPU, None),
        "multi_gpu": (DistributedType.MULTI_GPU, None),
        "deepspeed_zero2": (DistributedType.DEEPSPEED, 2),
        "deepspeed_zero3": (DistributedType.DEEPSPEED, 3),
    }
    shipped = sorted(p.stem for p in (ROOT / "configs" / "accelerate").glob("*.yaml"))
    assert shipped == sorted(want)
    for name, (engine, stage) in want.items():
        cfg = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{name}.yaml"))
        assert cfg.distributed_type == engine, name
        assert (cfg.deepspeed_config or {}).get("zero_stage") == stage, name
