"""`searchrl data synth` (write the synthetic task) and `searchrl data check` (validate a QA file)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from searchrl.common.config import ConfigError, config_from_dict
from searchrl.data.datasets import DatasetError, load_qa
from searchrl.data.synthetic import SIZE_PRESETS, SynthConfig, generate

data_app = typer.Typer(help="Datasets: generate the synthetic task, check QA files.", no_args_is_help=True)


def _synth_config(
    size: str, seed: int | None, config: Path | None, counts: dict[str, int | None]
) -> SynthConfig:
    """Preset, then YAML file, then explicit options: later ones win."""
    if size not in SIZE_PRESETS:
        raise ConfigError(f"--size: unknown size {size!r}; choose one of {list(SIZE_PRESETS)}")
    data: dict[str, Any] = dict(SIZE_PRESETS[size])
    if config is not None:
        if not config.exists():
            raise ConfigError(f"{config}: config file not found")
        loaded = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config}: the top level must be a mapping of SynthConfig field: value")
        data.update(loaded)
    if seed is not None:
        data["seed"] = seed
    data.update({k: v for k, v in counts.items() if v is not None})
    return config_from_dict(SynthConfig, data, str(config or "SynthConfig"))


@data_app.command("synth")
def synth(
    out: Annotated[Path, typer.Option("--out", help="Directory for corpus.jsonl and train/dev/test.jsonl.")],
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", help="Random seed (default: the config's seed, else 0); same seed, same files."
        ),
    ] = None,
    size: Annotated[
        str,
        typer.Option("--size", help=f"Size preset: one of {', '.join(SIZE_PRESETS)} (tiny is for tests)."),
    ] = "default",
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML file of SynthConfig fields (overrides the preset).")
    ] = None,
    train_questions: Annotated[
        int | None, typer.Option(help="Train questions (overrides preset and config).")
    ] = None,
    dev_questions: Annotated[
        int | None, typer.Option(help="Dev questions (overrides preset and config).")
    ] = None,
    test_questions: Annotated[
        int | None, typer.Option(help="Test questions (overrides preset and config).")
    ] = None,
) -> None:
    """Generate the offline, verifiable synthetic task (invented world, corpus, single- and two-hop questions)."""
    counts = {
        "train_questions": train_questions,
        "dev_questions": dev_questions,
        "test_questions": test_questions,
    }
    try:
        task = generate(_synth_config(size, seed, config, counts))
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from e
    paths = task.write(out)
    sizes = ", ".join(f"{s}: {len(rows)}" for s, rows in task.splits.items())
    typer.echo(f"wrote {len(task.corpus)} documents to {paths['corpus']} and questions ({sizes}) to {out}")


@data_app.command("check")
def check(
    path: Annotated[Path, typer.Argument(help="QA file: .jsonl, .jsonl.gz, .json or .parquet.")],
) -> None:
    """Load a QA file as training would and print what it holds; a bad row exits 1 with file, line and field."""
    try:
        rows = load_qa(path)
    except DatasetError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    hops = Counter(str(r["hops"]) for r in rows)
    typer.echo(f"{path}: {len(rows)} questions; hops: {dict(sorted(hops.items()))}")
    typer.echo(f"first: {rows[0]['question']!r} -> {rows[0]['golds']}")


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
