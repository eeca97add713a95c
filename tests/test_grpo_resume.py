"""GRPO runs resume: a run killed after a checkpoint and resumed ends where the uninterrupted run ends.

Both runs use the warm-started tiny policy and BM25 world of conftest.py's `grpo_world`.
The killed run dies in `on_step_end` of step 3, after step 3's trajectories and dev evaluation were
written but before its log line and before any checkpoint of step 3: the resume must drop what the killed
run wrote after its step-2 checkpoint and continue the episode count, the clocks and the eval history.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_grpo_trainer import read_metrics
from transformers import TrainerCallback
from worlds import GrpoWorld, grpo_config

from searchrl.common.config import ConfigError
from searchrl.grpo.trainer import build_grpo_trainer
from searchrl.models.io import load_policy

STEPS, SAVE_EVERY, KILL_AT = 4, 2, 3


class Killed(RuntimeError):
    pass


class KillAt(TrainerCallback):
    """Raises in `on_step_end` of step `step`: the process dies mid-run, after our callback's writes."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise Killed(f"killed at step {state.global_step}")


def trainer_for(world: GrpoWorld, out: Path, mode: str, resume: bool = False, **kw: Any) -> Any:
    cfg = grpo_config(
        world.root,
        mode,
        output_dir=str(out),
        max_steps=STEPS,
        save_steps=SAVE_EVERY,
        eval_steps=1,
        eval_on_start=True,
    )
    policy = load_policy(world.policy_dir).train()
    return build_grpo_trainer(
        cfg, policy, world.tokenizer, world.backend, world.train_rows, world.dev_rows, resume=resume, **kw
    )


def parameters(trainer: Any) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def eval_history(run: Path) -> list[dict]:
    files = sorted(run.glob("eval/step-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [json.loads(p.read_text()) for p in files]


def kill_and_resume(world: GrpoWorld, tmp_path: Path, mode: str) -> tuple[Any, Any, Path, Path]:
    torch.manual_seed(0)
    straight = trainer_for(world, tmp_path / "a", mode)
    straight.train()
    torch.manual_seed(0)
    killed = trainer_for(world, tmp_path / "b", mode, callbacks=[KillAt(KILL_AT)])
    with pytest.raises(Killed):
        killed.train()
    run = tmp_path / "b"
    # What the killed run left: checkpoints up to step 2 (step 2, and any earlier best dev evaluation's),
    # step 3's eval and trajectories, log lines to step 2.
    left = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "step-2" in left and not {"step-3", "step-4"} & set(left)
    assert (run / "eval" / "step-3.json").is_file()
    assert (run / "trajectories" / "step-000003.jsonl.gz").is_file()
    assert max(m["step"] for m in read_metrics(run)) == 2
    torch.manual_seed(123)  # the resumed process starts from another global RNG state: TRL restores it
    resumed = trainer_for(world, run, mode, resume=True)
    resumed.train()
    return straight, resumed, tmp_path / "a", run


def assert_same_history(straight_run: Path, resumed_run: Path) -> None:
    a, b = eval_history(straight_run), eval_history(resumed_run)
    assert [e["step"] for e in b] == list(range(STEPS + 1)), "eval steps missing or repeated"
    assert [e["step"] for e in a] == [e["step"] for e in b]
    assert [e["episode"] for e in b] == [8 * s for s in range(STEPS + 1)]
    for key in ("eval/exact_match", "eval/f1", "eval/searches_per_question", "eval/reward"):
        assert [e[key] for e in a] == [e[key] for e in b], key
    # The clocks go on from the checkpoint: never back to zero, never backwards.
    train_s = [e["time/train_s"] for e in b]
    assert train_s == sorted(train_s) and train_s[3] > train_s[2] > 0
    lines = [m for m in read_metrics(resumed_run) if "loss" in m]
    assert [m["step"] for m in lines] == list(range(1, STEPS + 1))
    assert [m["episode"] for m in lines] == [8 * s for s in range(1, STEPS + 1)]
    straight_lines = [m for m in read_metrics(straight_run) if "loss" in m]
    for key in ("reward", "tools/calls", "loss"):
        assert [m[key] for m in lines] == [m[key] for m in straight_lines], key
    steps = sorted(int(p.name[5:11]) for p in (resumed_run / "trajectories").glob("step-*.jsonl.gz"))
    assert steps == list(range(1, STEPS + 1))
    # Checkpoints every 2 steps and at each new best dev evaluation: the same ones, the same best.
    kept = sorted(p.name for p in (resumed_run / "checkpoints").iterdir())
    assert {"step-2", "step-4"} <= set(kept)
    assert kept == sorted(p.name for p in (straight_run / "checkpoints").iterdir())
    best = json.loads((resumed_run / "best_checkpoint.json").read_text())
    assert best == json.loads((straight_run / "best_checkpoint.json").read_text())
    assert best["checkpoint"] in kept and best["metric"] == "eval/reward"
    manifest = json.loads((resumed_run / "manifest.json").read_text())
    assert manifest["resumed_from_step"] == 2


@pytest.mark.parametrize("mode", ["our_rollout", "trl_loop"])
def test_killed_and_resumed_run_matches_the_uninterrupted_run(
    grpo_world: GrpoWorld, tmp_path: Path, mode: str
) -> None:
    straight, resumed, straight_run, resumed_run = kill_and_resume(grpo_world, tmp_path, mode)
    assert resumed.state.global_step == straight.state.global_step == STEPS
    a, b = parameters(straight), parameters(resumed)
    differ = [n for n in a if not torch.equal(a[n], b[n])]
    assert not differ, f"{len(differ)} parameter tensors differ after resume, e.g. {differ[:3]}"
    assert_same_history(straight_run, resumed_run)


def test_resume_refuses_a_changed_group_or_batch_and_old_checkpoints(
    grpo_world: GrpoWorld, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    trainer_for(grpo_world, out, "our_rollout").train()
    cfg = grpo_config(grpo_world.root, "our_rollout", output_dir=str(out), num_generations=2, max_steps=STEPS)
    policy = load_policy(grpo_world.policy_dir)
    args = (policy, grpo_world.tokenizer, grpo_world.backend, grpo_world.train_rows, grpo_world.dev_rows)
    with pytest.raises(ConfigError, match="num_generations: 4 in the checkpointed run, 2 now"):
        build_grpo_trainer(cfg, *args, resume=True)
    cfg = grpo_config(grpo_world.root, "trl_loop", output_dir=str(out), max_steps=STEPS)
    with pytest.raises(ConfigError, match="mode: 'our_rollout' in the checkpointed run, 'trl_loop' now"):
        build_grpo_trainer(cfg, *args, resume=True)
    # A checkpoint without TRL's states (written before resume existed) is refused with what to do.
    import shutil

    for ckpt in (out / "checkpoints").iterdir():
        shutil.rmtree(ckpt / "trl")
    cfg = grpo_config(grpo_world.root, "our_rollout", output_dir=str(out), max_steps=STEPS)
    with pytest.raises(ConfigError, match="cannot be resumed.*Start a fresh run"):
        build_grpo_trainer(cfg, *args, resume=True)


def test_resume_without_a_checkpoint_starts_fresh(grpo_world: GrpoWorld, tmp_path: Path) -> None:
    trainer = trainer_for(grpo_world, tmp_path / "new", "our_rollout", resume=True)
    assert trainer.resume_checkpoint is None and trainer.run_callback.resume_state is None


def test_truncate_keeps_the_history_up_to_the_checkpoint(tmp_path: Path) -> None:
    from searchrl.run.writer import RunDir

    run = RunDir(tmp_path)
    run.metrics.write_text("".join(json.dumps({"step": s}) + "\n" for s in (0, 1, 2, 2, 3)))
    for s in (0, 2, 3, 10):
        (run.eval / f"step-{s}.json").write_text("{}")
    for s in (1, 3):
        (run.trajectories / f"step-{s:06d}.jsonl.gz").write_bytes(b"")
    (run.eval / "test-final.json").write_text("{}")  # not a step file: kept
    (run.checkpoints / "step-3").mkdir()  # incomplete (no trainer_state.json): removed
    run.truncate_after(2)  # the run layer's, shared by PPO and GRPO
    assert [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()] == [0, 1, 2, 2]
    assert sorted(p.name for p in run.eval.iterdir()) == ["step-0.json", "step-2.json", "test-final.json"]
    assert [p.name for p in run.trajectories.iterdir()] == ["step-000001.jsonl.gz"]
    assert not (run.checkpoints / "step-3").exists()
