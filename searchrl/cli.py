"""The `searchrl` command line: one typer app; each room registers its own commands.

Commands live beside the code they drive (`searchrl/<room>/commands.py`, each with a
`register(app)` function) so this file stays a table of contents, not a second copy of the logic.
"""

from __future__ import annotations

import importlib

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


@app.callback()
def _root() -> None:
    """searchrl: agent-aware PPO for search agents. Every command takes --help."""


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
