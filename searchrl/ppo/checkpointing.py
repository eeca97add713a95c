"""PPO checkpoints: when they are written, what `RUN/checkpoints/step-N/` holds, and resuming from one.

A checkpoint holds everything a resumed run needs to continue as if it had never stopped: `policy/`
(weights + tokenizer; with PEFT the adapter only), `value/` (the critic) or `value_head.pt`,
`optim_rng.pt` (optimizer, scheduler, Python/NumPy/torch RNG states), `value_replay.pt` (the critic's
replayed batches, `value_replay_steps`) and `trainer_state.json` (step,
episode, data position, KL controller, collapse guard, rollbacks, learning-rate scale, best dev
evaluation, clocks), written last. The run layer (`RunDir.write_checkpoint`) writes it into a temporary
folder and renames it into place, and prunes old ones (`save_total_limit`) except the protected ones: the
newest, the collapse guard's rollback targets and the best dev checkpoint (`BestCheckpoint`).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from searchrl.common.config import save_config
from searchrl.common.io import atomic_write_json
from searchrl.models.io import save_model_dir
from searchrl.ppo.modeling import load_adapter_weights, load_weights
from searchrl.run.manifest import build_manifest


def start_or_resume(trainer: Any, resume: bool) -> None:
    """Before the first step. `resume`: continue from the newest complete checkpoint and drop what the killed
    run wrote after it (a run resumed at step 0 starts over, its step-0 evaluation included). A run at step 0
    writes `config.yaml` and `manifest.json`, and under the collapse guard a step-0 checkpoint to roll back to.
    """
    if resume:
        checkpoint = trainer.run.latest_checkpoint()
        if checkpoint is not None:
            trainer.load_checkpoint(checkpoint)
        if trainer.is_main:
            trainer.run.truncate_after(trainer.global_step if trainer.global_step > 0 else -1)
    if trainer.global_step == 0 and trainer.is_main:
        args = trainer.args
        save_config(args, trainer.run.config)
        extra = {
            "trainer": "ppo",
            "value_mode": args.value_mode,
            "kl_controller": type(trainer.kl_ctl).__name__,
        }
        manifest = build_manifest(
            seeds={"seed": args.seed},
            tokenizer=trainer.tokenizer,
            generation_config=asdict(trainer.generation_config),
            config=args,
            extra=extra,
        )
        trainer.run.write_manifest(manifest)
    if trainer.global_step == 0 and trainer.args.collapse_guard:
        trainer.last_good_checkpoint = trainer.save_checkpoint()


def save_after_step(trainer: Any, metrics: dict[str, Any], rollback: bool = False) -> None:
    """Every `save_steps` steps, and on a new best dev evaluation (at step 0: the starting policy, in the
    guard's step-0 checkpoint when there is one). Under the guard a regular checkpoint waits for the next
    step's metrics before it becomes the rollback target (`unverified_checkpoint`)."""
    step = trainer.global_step
    improved = not rollback and trainer.best.improves(step, metrics)
    regular = not rollback and step > 0 and trainer.cadence.should_save(step)
    if not (regular or improved):
        return
    existing = trainer.run.checkpoint_dir(step)
    reuse = step == 0 and (existing / "trainer_state.json").exists()
    saved = existing if reuse else trainer.save_checkpoint()
    if improved:
        trainer.best.record(saved, write=trainer.is_main)
    if regular and trainer.args.collapse_guard:
        trainer.unverified_checkpoint = saved
    elif regular:
        trainer.last_good_checkpoint = saved


def save_checkpoint(trainer: Any) -> Path:
    """Written by the main process; every rank waits until it is complete, then may read it."""
    final = trainer.run.checkpoint_dir(trainer.global_step)
    if trainer.is_main:
        trainer.run.write_checkpoint(trainer.global_step, lambda folder: fill_checkpoint(trainer, folder))
        # `save_total_limit`, never deleting the newest one, the guard's rollback targets or the best.
        protected = {
            final,
            trainer.last_good_checkpoint,
            trainer.unverified_checkpoint,
            trainer.best.checkpoint,
        }
        trainer.run.prune_checkpoints(trainer.args.save_total_limit, protected)
    trainer.accelerator.wait_for_everyone()
    return final


def fill_checkpoint(trainer: Any, folder: Path) -> None:
    """Everything above into `folder`, `trainer_state.json` last."""
    model = trainer.accelerator.unwrap_model(trainer.wrapped_model)  # the plain PolicyAndValue, not DDP
    save_model_dir(model.policy, trainer.tokenizer, folder / "policy")  # with PEFT: the adapter only
    if model.value_mode == "separate":
        save_model_dir(model.value_model, None, folder / "value")
    else:
        torch.save(model.value_head.state_dict(), folder / "value_head.pt")
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    optim = {"optimizer": trainer.optimizer.state_dict(), "scheduler": trainer.lr_scheduler.state_dict()}
    torch.save({**optim, "rng": rng}, folder / "optim_rng.pt")
    if len(trainer.value_replay):
        torch.save(trainer.value_replay.state_dict(), folder / "value_replay.pt")
    state = {
        "global_step": trainer.global_step,
        "episode": trainer.episode,
        "data_epoch": trainer.data_epoch,
        "data_offset": trainer.data_offset,
        "kl_controller": trainer.kl_ctl.state_dict(),
        "guard": trainer.guard.state_dict(),
        "last_metrics": trainer.last_metrics,
        "rollbacks": trainer.rollbacks,
        "learning": trainer.learning.state_dict(),
        "lr_scale": trainer.lr_scale,
        "best": trainer.best.best,
        **trainer.training_clock.reading(),
        "time/eval_s": trainer.training_clock.eval_seconds,
    }
    atomic_write_json(folder / "trainer_state.json", state)


def load_checkpoint(trainer: Any, path: str | Path, restore_clock: bool = True) -> None:
    """Restore everything a checkpoint holds. `restore_clock=False` (the collapse guard's rollback) keeps the
    training clock running on (the failed steps took real time) and the best evaluation found so far."""
    path = Path(path)
    state = json.loads((path / "trainer_state.json").read_text())
    if trainer.is_peft:
        load_adapter_weights(trainer.policy, path / "policy")
    else:
        load_weights(trainer.policy, path / "policy")
    if trainer.model.value_mode == "separate":
        load_weights(trainer.model.value_model, path / "value")
    else:
        trainer.model.value_head.load_state_dict(torch.load(path / "value_head.pt"))
    blob = torch.load(path / "optim_rng.pt", weights_only=False)
    trainer.optimizer.load_state_dict(blob["optimizer"])
    trainer.lr_scheduler.load_state_dict(blob["scheduler"])
    replay = path / "value_replay.pt"
    trainer.value_replay.load_state_dict(torch.load(replay, weights_only=False) if replay.is_file() else None)
    random.setstate(blob["rng"]["python"])
    np.random.set_state(blob["rng"]["numpy"])
    torch.set_rng_state(blob["rng"]["torch"])
    trainer.global_step = state["global_step"]
    trainer.episode = state["episode"]
    trainer.data_epoch = state["data_epoch"]
    trainer.data_offset = state["data_offset"]
    trainer.kl_ctl.load_state_dict(state["kl_controller"])
    trainer.guard.load_state_dict(state.get("guard", {}))
    trainer.last_metrics = state.get("last_metrics", {})
    trainer.rollbacks = int(state.get("rollbacks", 0))
    trainer.learning.load_state_dict(state.get("learning"))
    trainer.lr_scale = float(state.get("lr_scale", 1.0))
    if restore_clock:
        trainer.best.restore(state.get("best"))
        trainer.training_clock.restore(state.get("time/train_s", 0.0), state.get("time/eval_s", 0.0))
    trainer.last_good_checkpoint = path
