"""`searchrl view RUN`: serve the trajectory viewer over a run directory on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from searchrl.viewer.server import RunDirError, check_run_dir


def view_command(
    run: Annotated[Path, typer.Argument(help="Run directory (a training run's output_dir).")],
    host: Annotated[
        str, typer.Option("--host", help="Bind address; 127.0.0.1 (default) keeps the page local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port of the page.")] = 8765,
) -> None:
    """Browse a run's trajectories: filter them, then read one token by token with its advantages and KL."""
    try:
        check_run_dir(run)
    except RunDirError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    from searchrl.viewer.server import serve

    typer.echo(f"searchrl viewer: http://{host}:{port}/  (run {run}; Ctrl-C to stop)")
    serve(run, host=host, port=port)


def register(app: typer.Typer) -> None:
    app.command("view", help="Serve the trajectory viewer for a run directory (local web page).")(
        view_command
    )
