"""`searchrl grpo`: GRPO through TRL 1.16's GRPOTrainer on our environment, rewards and run directory.

The command is a thin shell over `searchrl.grpo.trainer.run_grpo`: it loads a `GRPORunConfig` from
YAML, applies `--mode`, `--output-dir`, `--max-steps` and any `--set field=value` overrides (values
parsed as YAML), trains and prints the run directory. `--resume` continues a killed run from the newest
checkpoint in its output directory (or starts fresh when there is none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from searchrl.common.config import ConfigError, load_config
from searchrl.grpo.config import GRPO_MODES, GRPORunConfig


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["beta=0.04", "mode=trl_loop"]` -> `{"beta": 0.04, "mode": "trl_loop"}` (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: write FIELD=VALUE, e.g. --set beta=0.04")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {pair!r}: the value is not valid YAML: {e}") from e
    return out


def build_config(
    path: Path,
    mode: str | None = None,
    output_dir: str | None = None,
    max_steps: int | None = None,
    pairs: list[str] | None = None,
) -> GRPORunConfig:
    """The run's config: the YAML file, then `--set` pairs, then the named options (later ones win)."""
    overrides = parse_overrides(pairs or [])
    for key, value in (("mode", mode), ("output_dir", output_dir), ("max_steps", max_steps)):
        if value is not None:
            overrides[key] = value
    if max_steps is not None:
        overrides["total_episodes"] = None  # an episode budget would override the explicit step count
    return load_config(GRPORunConfig, path, overrides)


def grpo(
    config: Annotated[
        Path, typer.Option("--config", help="GRPORunConfig YAML, e.g. configs/grpo_tiny.yaml.")
    ],
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode",
            help=f"One of {', '.join(GRPO_MODES)}: TRL's own tool loop, or our batched engine as rollout_func "
            "(default: the config's mode).",
        ),
    ] = None,
    output_dir: Annotated[
        str | None, typer.Option("--output-dir", help="Run directory (default: the config's output_dir).")
    ] = None,
    max_steps: Annotated[
        int | None,
        typer.Option(
            "--max-steps", help="Optimizer steps; replaces the config's max_steps and total_episodes budget."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override any config field: --set FIELD=VALUE (repeatable; YAML values)."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue from the newest checkpoint in the output directory (optimizer, scheduler, RNG, data "
            "position, episode count, clocks, eval history); start fresh if there is none.",
        ),
    ] = False,
) -> None:
    """Train a search agent with GRPO (TRL 1.16) on the same task, rewards and budgets as PPO."""
    from searchrl.grpo.trainer import run_grpo

    try:
        cfg = build_config(config, mode=mode, output_dir=output_dir, max_steps=max_steps, pairs=set_ or [])
        run_dir = run_grpo(cfg, resume=resume)
    except (ConfigError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=2) from e
    typer.echo(str(run_dir))


def register(app: typer.Typer) -> None:
    app.command("grpo", help="GRPO through TRL's GRPOTrainer: --mode trl_loop | our_rollout.")(grpo)
