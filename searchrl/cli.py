"""The `searchrl` command line: one typer app; each room registers its own commands.

Commands live beside the code they drive (`searchrl/<room>/commands.py`, each with a
`register(app)` function) so this file stays a table of contents, not a second copy of the logic.
"""

from __future__ import annotations

import importlib
import logging
import sys

import typer

app = typer.Typer(
    name="searchrl",
    help="Train LLM agents that call a search engine: PPO (TRL's component design), GRPO, rewards, evaluation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# Each module defines `register(app: typer.Typer) -> None`. Keep one line per room.
COMMAND_MODULES: list[str] = [
    "searchrl.search.commands",
    "searchrl.data.commands",
    "searchrl.evaluation.commands",
    "searchrl.viewer.commands",
    "searchrl.grpo.commands",
    "searchrl.ppo.commands",
    "searchrl.demo.commands",
    "searchrl.sft.commands",
    "searchrl.models.commands",
    "searchrl.run.commands",
]


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str) -> None:
    """Send the `searchrl` loggers' records at `level` and above to stderr, one timestamped line each.

    Without it only warnings reach a user (Python's last-resort handler); `info` adds what long stages decide on
    the way (SFT losses, the copy gates' measurements, PPO's model set-up), which a run otherwise keeps to itself.
    """
    if level not in LOG_LEVELS:
        raise typer.BadParameter(f"{level!r} is not one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    logger = logging.getLogger("searchrl")
    logger.setLevel(level.upper())
    if not any(isinstance(h, _CurrentStderrHandler) for h in logger.handlers):
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes, not the stream of the first call: the app may run
    several times in one process (tests' CliRunner swaps stderr, then closes it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # not setStream: it flushes the old stream, which may be closed
        super().emit(record)


@app.callback()
def _root(
    log_level: str = typer.Option(
        "warning",
        "--log-level",
        help=f"Which of searchrl's log records reach stderr: {', '.join(LOG_LEVELS)}. `info` shows what long "
        "stages decide on the way (SFT losses, the copy gates' measurements).",
    ),
) -> None:
    """searchrl: agent-aware PPO for search agents. Every command takes --help."""
    configure_logging(log_level)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
