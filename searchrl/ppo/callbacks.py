"""`transformers.TrainerCallback`s for `PPOTrainer`: the `report_to` integrations plus the user's own.

PPOTrainer is not a `transformers.Trainer`, yet users pass the same callbacks (and `report_to:
[tensorboard, wandb, trackio]`) as to TRL's trainers. `TrainerCallbacks` builds the `TrainingArguments`,
`TrainerState` and `TrainerControl` those callbacks read, and fires the events PPO has: `on_train_begin`,
`on_log`, `on_evaluate`, `on_save`, `on_step_end`, `on_train_end`. Integrations report from the main
process only, as in transformers. `progress_bar` is the console's view of the same steps (transformers'
`ProgressCallback` role): a rich bar on the main process, off with `progress_bar: false`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class TrainerCallbacks:
    """The callback handler of one PPO run; `fire(event, trainer, **kwargs)` after each event."""

    def __init__(self, args: Any, tokenizer: Any, callbacks: list[Any] | None) -> None:
        from transformers import TrainerControl, TrainerState, TrainingArguments
        from transformers.integrations import get_reporting_integration_callbacks
        from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

        report_to = [r for r in args.report_to if r != "none"]
        self.hf_args = TrainingArguments(
            output_dir=str(args.output_dir),
            report_to=report_to or "none",
            use_cpu=not torch.cuda.is_available() or args.use_cpu,
            seed=args.seed,
            logging_steps=args.logging_steps,
            run_name=args.run_name or Path(args.output_dir).name,
            project="searchrl",  # trackio's project (transformers' default: "huggingface")
        )
        self.state = TrainerState()
        self.control = TrainerControl()
        integrations = get_reporting_integration_callbacks(report_to) if report_to else []
        self.handler = CallbackHandler(
            [DefaultFlowCallback, *integrations, *(callbacks or [])], None, tokenizer, None, None
        )

    def fire(self, event: str, trainer: Any, **kwargs: Any) -> None:
        self.state.global_step = trainer.global_step
        self.state.max_steps = trainer.num_total_batches
        self.state.is_world_process_zero = self.state.is_local_process_zero = trainer.is_main
        self.handler.model = trainer.policy
        self.handler.optimizer, self.handler.lr_scheduler = trainer.optimizer, trainer.lr_scheduler
        if event == "on_log":
            logs = {k: v for k, v in kwargs["logs"].items() if isinstance(v, int | float)}
            self.state.log_history.append(logs)
            kwargs = {"logs": logs}
        self.control = getattr(self.handler, event)(self.hf_args, self.state, self.control, **kwargs)


@contextlib.contextmanager
def progress_bar(total: int, completed: int, enabled: bool) -> Iterator[Any]:
    """`update(step, info)` moves a "PPO" bar of `total` steps to `step` with `info` beside it."""
    columns = (TextColumn("[bold]PPO"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
               TextColumn("{task.fields[info]}"))  # fmt: skip
    with Progress(*columns, disable=not enabled) as progress:
        task = progress.add_task("ppo", total=total, completed=completed, info="")

        def update(step: int, info: str) -> None:
            progress.update(task, completed=step, info=info)

        yield update
