"""`searchrl view TARGET`: serve the trajectory viewer over a run, a demo or a trajectories file on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def view_command(
    run: Annotated[
        Path,
        typer.Argument(
            help="A run directory (PPO or GRPO output_dir), a demo directory (runs/demo: its PPO training and "
            "the SFT / PPO hidden-test evaluations), or one trajectories file (*.jsonl.gz, *.jsonl)."
        ),
    ],
    host: Annotated[
        str, typer.Option("--host", help="Bind address; 127.0.0.1 (default) keeps the page local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port of the page.")] = 8765,
) -> None:
    """Browse trajectories: pick a source (training, an evaluation), filter, then read one token by token."""
    from searchrl.run.errors import RunTargetError
    from searchrl.viewer.server import check_run_dir, serve  # fastapi: not for --help

    try:
        reader = check_run_dir(run)
    except RunTargetError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None

    sources = ", ".join(s.id for s in reader.trajectory_sources())
    typer.echo(
        f"searchrl viewer: http://{host}:{port}/  ({reader.describe()}; sources: {sources}; Ctrl-C to stop)"
    )
    serve(run, host=host, port=port)


def register(app: typer.Typer) -> None:
    app.command(
        "view", help="Serve the trajectory viewer for a run, a demo or a trajectories file (local web page)."
    )(view_command)
