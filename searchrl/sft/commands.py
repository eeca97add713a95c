"""`searchrl sft` (expert demonstrations -> SFT warm start) and `searchrl reward-model train|eval`.

Thin wrappers: the logic lives in `searchrl.sft.expert`, `searchrl.sft.warm_start` and
`searchrl.rewards.reward_model`; these commands read files, call them and write the results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from searchrl.common.config import ConfigError, load_config
from searchrl.common.io import atomic_write_json, read_jsonl
from searchrl.common.trajectory import read_trajectories
from searchrl.data.datasets import DatasetError, load_qa

reward_model_app = typer.Typer(
    help="The learned reward model: train on preference pairs (TRL RewardTrainer), evaluate pairwise accuracy.",
    no_args_is_help=True,
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _load_qa_rows(data: Path, split: str, limit: int | None) -> list[dict[str, Any]]:
    path = data / f"{split}.jsonl"
    if not path.exists():
        _fail(f"{path} not found; --data must be a directory written by `searchrl data synth`")
    try:
        return load_qa(path, limit=limit)
    except DatasetError as e:
        _fail(str(e))
    return []


def _load_corpus_rows(data: Path) -> list[dict[str, Any]]:
    path = data / "corpus.jsonl"
    return list(read_jsonl(path)) if path.exists() else []


def _sft_command(
    data: Annotated[
        Path, typer.Option("--data", help="Synthetic task directory (corpus.jsonl, train.jsonl).")
    ],
    index: Annotated[Path, typer.Option("--index", help="Index directory built by `searchrl index`.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory: model/, demonstrations, metrics.")],
    config: Annotated[
        Path | None,
        typer.Option("--config", help="YAML of SFTRunConfig (expert, train, environment, model sections)."),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option("--model", help="Local causal-LM directory to tune; default: build the tiny model."),
    ] = None,
    noise: Annotated[
        float | None, typer.Option("--noise", help="Share of imperfect demonstrations in [0, 1] (overrides).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Use only the first N training questions.")
    ] = None,
    max_steps: Annotated[
        int | None,
        typer.Option("--max-steps", help="Optimizer steps (overrides the config's train section)."),
    ] = None,
) -> None:
    """Warm-start a policy: the expert solves training questions in the real environment, then SFT on them."""
    # torch, transformers, trl and datasets: loaded when a command runs, not for --help.
    from searchrl.sft.pipeline import SFTRunConfig, run_warm_start_pipeline

    overrides: dict[str, Any] = {}
    if noise is not None:
        overrides["expert.noise"] = noise
    if max_steps is not None:
        overrides["train.max_steps"] = max_steps
    try:
        cfg = load_config(SFTRunConfig, config, overrides)
    except ConfigError as e:
        _fail(str(e))
        return
    if not index.exists():
        _fail(f"--index {index} does not exist; build it with `searchrl index`")
    rows = _load_qa_rows(data, cfg.split, limit or cfg.limit)
    try:
        summary = run_warm_start_pipeline(
            rows=rows,
            corpus_rows=_load_corpus_rows(data),
            index_dir=index,
            out_dir=out,
            config=cfg,
            model_path=model,
            dev_rows=_load_qa_rows(data, "dev", cfg.eval_questions) if (data / "dev.jsonl").exists() else [],
        )
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
        return
    typer.echo(json.dumps(summary, indent=2))


def _read_trajectory_files(paths: list[Path]) -> list[Any]:
    out: list[Any] = []
    for path in paths:
        if not path.exists():
            _fail(f"{path}: trajectory file not found")
        out.extend(read_trajectories(path))
    return out


def _rm_datasets(
    pairs: Path | None, trajectories: list[Path] | None, cfg: Any
) -> tuple[Any, Any | None, int]:
    """(train, held-out, number of pairs) from a user preference file or from trajectories."""
    from searchrl.rewards.reward_model import (  # torch and datasets, as in `sft`
        build_preference_pairs,
        load_preference_dataset,
        pairs_dataset,
        split_pairs,
    )

    if (pairs is None) == (not trajectories):
        _fail("give exactly one of --pairs (a preference dataset) or --trajectories (trajectory JSONL files)")
    if pairs is not None:
        dataset = load_preference_dataset(pairs)
        if cfg.eval_fraction > 0 and len(dataset) >= 2:
            split = dataset.train_test_split(test_size=cfg.eval_fraction, seed=cfg.seed)
            return split["train"], split["test"], len(dataset)
        return dataset, None, len(dataset)
    built = build_preference_pairs(_read_trajectory_files(trajectories or []), with_margin=cfg.use_margin)
    train, held = split_pairs(built, cfg.eval_fraction, cfg.seed)
    return (
        pairs_dataset(train, cfg.use_margin),
        pairs_dataset(held, cfg.use_margin) if held else None,
        len(built),
    )


@reward_model_app.command("train")
def rm_train(
    out: Annotated[
        Path, typer.Option("--out", help="Directory for the saved reward model and metrics.json.")
    ],
    pairs: Annotated[
        Path | None,
        typer.Option(
            "--pairs", help="Preference dataset (.jsonl/.json/.parquet/dir): prompt/chosen/rejected."
        ),
    ] = None,
    trajectories: Annotated[
        list[Path] | None,
        typer.Option("--trajectories", help="Trajectory JSONL(.gz) files; pairs are built per question."),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model", help="Local sequence-classification (or any) model dir; default: tiny scorer."
        ),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer", help="Local tokenizer dir (default: the --model dir); needed for the tiny model."
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="YAML of RewardModelConfig fields.")] = None,
) -> None:
    """Train a reward model with TRL's RewardTrainer and report pairwise accuracy on held-out pairs."""
    # torch, transformers and trl, as in `sft`.
    from searchrl.models.io import load_tokenizer, load_value_model
    from searchrl.models.tiny import TinyModelConfig, build_value_model
    from searchrl.rewards.reward_model import (
        RewardModelConfig,
        save_reward_model,
        train_reward_model,
    )

    try:
        cfg = load_config(RewardModelConfig, config)
    except ConfigError as e:
        _fail(str(e))
        return
    tok_dir = tokenizer or model
    if tok_dir is None:
        _fail("pass --tokenizer DIR (e.g. the SFT output's model/ directory) or --model DIR")
        return
    try:
        tok = load_tokenizer(tok_dir)
        train, held, n_pairs = _rm_datasets(pairs, trajectories, cfg)
        rm = load_value_model(model) if model is not None else build_value_model(tok, TinyModelConfig())
        rm.train()
        outcome = train_reward_model(rm, tok, train, held, cfg)
    except (ValueError, FileNotFoundError, OSError) as e:
        _fail(str(e))
        return
    save_reward_model(outcome.model, tok, out)
    metrics = {"pairs": n_pairs, "held_out_pairs": 0 if held is None else len(held), **outcome.metrics}
    atomic_write_json(out / "metrics.json", metrics)
    typer.echo(json.dumps(metrics, indent=2))


@reward_model_app.command("eval")
def rm_eval(
    model: Annotated[
        Path, typer.Option("--model", help="Saved reward model directory (with its tokenizer).")
    ],
    pairs: Annotated[
        Path | None, typer.Option("--pairs", help="Preference dataset (.jsonl/.json/.parquet/dir).")
    ] = None,
    trajectories: Annotated[
        list[Path] | None,
        typer.Option("--trajectories", help="Trajectory JSONL(.gz) files to build pairs from."),
    ] = None,
) -> None:
    """Pairwise accuracy (chosen scored above rejected) and TRL's eval metrics of a saved reward model."""
    # torch, transformers and trl, as in `sft`.
    from searchrl.models.io import load_tokenizer, load_value_model
    from searchrl.rewards.reward_model import (
        RewardModelConfig,
        build_preference_pairs,
        evaluate_reward_model,
        load_preference_dataset,
        pairs_dataset,
        pairwise_accuracy,
    )

    if (pairs is None) == (not trajectories):
        _fail("give exactly one of --pairs or --trajectories")
    try:
        tok = load_tokenizer(model)
        rm = load_value_model(model)
        if pairs is not None:
            metrics = evaluate_reward_model(rm, tok, load_preference_dataset(pairs), RewardModelConfig())
        else:
            built = build_preference_pairs(_read_trajectory_files(trajectories or []))
            metrics = evaluate_reward_model(rm, tok, pairs_dataset(built), RewardModelConfig())
            metrics["frozen_scorer_accuracy"] = pairwise_accuracy(rm, built)
    except (ValueError, FileNotFoundError, OSError) as e:
        _fail(str(e))
        return
    typer.echo(json.dumps(metrics, indent=2))


def register(app: typer.Typer) -> None:
    """Add `sft` and the `reward-model` sub-app to the searchrl CLI."""
    app.command("sft")(_sft_command)
    app.add_typer(reward_model_app, name="reward-model")
