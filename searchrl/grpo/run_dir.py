"""The run directory of a GRPO run, written through the run layer PPO uses, and resuming from it.

Why: a GRPO run must be read, compared, evaluated and resumed like a PPO run (`searchrl report`, `view`,
`eval --run`, the demo's side-by-side), so it writes the same layout through `searchrl.run.writer`
(`Cadence`, `BestCheckpoint`, `RunDir`) instead of transformers' own `checkpoint-N/` folders:
`metrics.jsonl` (with `episode` and the clocks), `eval/step-N.json` from the dev loop every trainer shares,
`trajectories/step-N.jsonl.gz`, `samples.jsonl`, `best_checkpoint.json` and `checkpoints/step-N/` (`policy/`,
TRL's optimizer/scheduler/RNG/trainer state in `trl/`, our `trainer_state.json`), pruned by
`save_total_limit`. `RunDirCallback` is the transformers callback that writes it, from what the trainer's
`BatchRecord` holds (episodes, trajectories, the rollout's batch count) and the `model` transformers hands
every event; a checkpoint's trainer part (weights, TRL's resume state) comes from the function the trainer
gives it when it makes it. `resume_state` finds the checkpoint a resumed run continues from and refuses one
it cannot continue.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate.utils import extract_model_from_parallel
from transformers import TrainerCallback

from searchrl.common.clock import TrainingClock
from searchrl.common.config import ConfigError, load_config
from searchrl.common.io import atomic_write_json, atomic_write_text
from searchrl.grpo.config import GRPORunConfig
from searchrl.grpo.record import BatchRecord
from searchrl.run.writer import BestCheckpoint, Cadence, RunDir

# TRL's names for what PPO logs under the stability kit's names (both are kept in metrics.jsonl).


class RunDirCallback(TrainerCallback):
    """Writes the run directory through the run layer (`searchrl.run.writer`), on the same cadence as PPO.

    TRL's logs go to `metrics.jsonl` with `step`, `episode` and the clocks (`Cadence`: every
    `logging_steps`, and always a step that evaluated or ended the run); the dev evaluation runs every
    `eval_steps` and at the last step (`eval/step-N.json`); checkpoints every `save_steps`, at the end and
    on each new best `best_metric` (`BestCheckpoint`, never pruned; `save_total_limit` prunes the rest);
    each step's trajectories, and text samples `num_sample_generations` times over the run.

    `time/train_s` is wall-clock time minus the time spent in evaluation: the x axis of the side-by-side
    plots, so a trainer is not charged for how often it was evaluated.

    A resumed run (`resume_state`, our `trainer_state.json` of the checkpoint) keeps the run directory's
    history up to the checkpoint's step and drops what the killed run wrote after it (metrics lines,
    eval files, trajectory files), so no step is missing or written twice; `episode`, the best checkpoint
    and both clocks continue from the checkpoint's values.

    Args:
        record: the trainer's `BatchRecord` (episodes, the scored trajectories, the rollout's batch count).
        tokenizer: the policy's tokenizer (text samples).
        evaluate: model -> dev metrics (`evaluate_during_training` on the dev rows), or None.
        save_trainer_state: writes the trainer's part of a checkpoint into a folder (`policy/`, `trl/`).
        resume_state: our `trainer_state.json` of the checkpoint a resumed run continues from, or None.
    """

    def __init__(
        self,
        cfg: GRPORunConfig,
        run: RunDir,
        record: BatchRecord,
        tokenizer: Any,
        evaluate: Callable[[Any], dict[str, float]] | None,
        save_trainer_state: Callable[[Path], None],
        resume_state: dict[str, Any] | None = None,
    ):
        self.cfg = cfg
        self.run = run
        self.record = record
        self.tokenizer = tokenizer
        self.evaluate = evaluate
        self.save_trainer_state = save_trainer_state
        self.resume_state = resume_state
        self.cadence = Cadence.of(cfg, cfg.num_steps)
        self.best = BestCheckpoint(run, cfg.best_metric)
        self.best_pending = False  # this step's evaluation is a new best: record its checkpoint when saved
        self.training_clock = TrainingClock()
        self.pending_eval: dict[str, float] = {}
        self.last_saved_step = -1

    # -- clocks -----------------------------------------------------------------------------------
    def clock(self) -> dict[str, float]:
        return self.training_clock.reading()

    def _evaluate(self, step: int, model: Any) -> None:
        """The dev evaluation of `model` (transformers' event argument: the trainer's model, unwrapped here)."""
        if self.evaluate is None:
            return
        model = extract_model_from_parallel(model)
        was_training = model.training
        with self.training_clock.evaluating() as clock:
            results = self.evaluate(model)
        model.train(was_training)
        self.run.write_eval(step, {"episode": self.record.episodes, **clock, **results})
        self.pending_eval.update(results)
        self.best_pending = self.best.improves(step, results) or self.best_pending

    # -- events -----------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.resume_state is not None:
            self._continue(self.resume_state)
            return
        self.training_clock = TrainingClock()
        self.training_clock.start()
        # A fresh run: no lines from an earlier run in the same directory.
        atomic_write_text(self.run.metrics, "")
        if self.cfg.eval_on_start:
            self._evaluate(0, model)
            self.run.log_metrics({"step": 0, "episode": 0, **self.clock(), **self.pending_eval})
            self.pending_eval = {}
            if self.best_pending:  # the starting policy itself may stay the best of the run
                self.save_checkpoint(0)

    def _continue(self, saved: dict[str, Any]) -> None:
        """Resume: the history up to the checkpoint stays, the killed run's later steps go, clocks go on."""
        step = int(saved["global_step"])
        self.run.truncate_after(step)
        eval_s = float(saved.get("eval_s", 0.0))
        self.training_clock = TrainingClock(float(saved.get("elapsed_s", 0.0)) - eval_s, eval_s)
        self.training_clock.start()
        self.best.restore(saved.get("best"))
        self.last_saved_step = step

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        step = int(state.global_step)
        trajs = self.record.take_trajectories()
        if self.cfg.save_trajectories and trajs:
            for t in trajs:
                t.metadata["step"] = step
            self.run.write_step_trajectories(step, trajs)
        if trajs and self.cadence.should_sample(step):
            self.run.write_samples(step, trajs, self.tokenizer)
        if self.cadence.should_evaluate(step):
            self._evaluate(step, model)
        # Set here, acted on by transformers right after this event: the log line first, then the checkpoint
        # (SearchGRPOTrainer._save_checkpoint), so a checkpoint never lacks its own step in metrics.jsonl.
        if self.cadence.should_log(step, self.pending_eval):
            control.should_log = True
        if self.cadence.should_save(step) or self.best_pending:
            control.should_save = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        numbers = {k: v for k, v in (logs or {}).items() if isinstance(v, int | float)}
        line = {"step": int(state.global_step), "episode": self.record.episodes, **self.clock(), **numbers}
        line.update(self.pending_eval)
        self.pending_eval = {}
        self.run.log_metrics(line)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if self.last_saved_step != step:
            self.save_checkpoint(step)

    # -- checkpoints: a temporary folder renamed into place, `trainer_state.json` marks completion ---
    def save_checkpoint(self, step: int) -> Path:
        """`step-N/policy` (weights + tokenizer) and `step-N/trl` (TRL's optimizer, scheduler, RNG and trainer
        state, what `resume_from_checkpoint` reads), both from the trainer (`save_trainer_state`), and our
        `step-N/trainer_state.json` last; then the best is named and old checkpoints pruned
        (`save_total_limit`, never the newest or the best). The trainer's `_save_checkpoint` calls it too."""
        final = self.run.write_checkpoint(step, lambda folder: self._fill_checkpoint(folder, step))
        if self.best_pending:
            self.best_pending = False
            self.best.record(final)
        self.run.prune_checkpoints(self.cfg.save_total_limit, {final, self.best.checkpoint})
        self.last_saved_step = step
        return final

    def _fill_checkpoint(self, folder: Path, step: int) -> None:
        self.save_trainer_state(folder)
        clock = self.clock()
        atomic_write_json(
            folder / "trainer_state.json",
            {
                "global_step": step,
                "episode": self.record.episodes,
                "trainer": "grpo",
                "mode": self.cfg.mode,
                **clock,
                "elapsed_s": clock["time/elapsed_s"],
                "eval_s": self.training_clock.eval_seconds,
                "rollout_calls": self.record.rollout_calls,  # our_rollout's; 0 in trl_loop
                "best": self.best.best,
            },
        )


# Settings a resumed run must share with the run that wrote the checkpoint: they fix the data order, the
# groups and the batch arithmetic the saved optimizer, scheduler and RNG states belong to.
RESUME_INVARIANTS = (
    "mode",
    "seed",
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_iterations",
    "protocol",
)


def resume_state(cfg: GRPORunConfig, run: RunDir) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint of `run` and our saved state, or None when there is none yet.

    Refuses (ConfigError, saying what to do) a checkpoint written before GRPO runs could resume (no
    `trl/` folder) and a config whose `RESUME_INVARIANTS` differ from the checkpointed run's. The budget
    (`max_steps`, `total_episodes`), evaluation and saving settings may change.
    """
    checkpoint = run.latest_checkpoint()
    if checkpoint is None:
        return None
    saved = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    if saved.get("trainer") != "grpo":
        raise ConfigError(
            f"{checkpoint}: not a GRPO checkpoint (trainer {saved.get('trainer')!r}); resume it with its own command"
        )
    if not (checkpoint / "trl" / "trainer_state.json").is_file():
        raise ConfigError(
            f"{checkpoint}: no trl/ folder (optimizer, scheduler and RNG states), so it cannot be resumed; it was "
            "written before GRPO runs could resume. Start a fresh run (another output_dir, or drop --resume)."
        )
    if run.config.is_file():
        before = load_config(GRPORunConfig, run.config)
        changed = [
            f"{name}: {getattr(before, name)!r} in the checkpointed run, {getattr(cfg, name)!r} now"
            for name in RESUME_INVARIANTS
            if getattr(before, name) != getattr(cfg, name)
        ]
        if changed:
            raise ConfigError(
                f"resume {run.root}: "
                + "; ".join(changed)
                + ". Resume with the run's own settings (only the "
                "budget, evaluation and saving may change), or start a new output_dir."
            )
    return checkpoint, saved
