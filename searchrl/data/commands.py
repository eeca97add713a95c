"""`searchrl data synth` (write the synthetic task), `searchrl data realqa` (HotpotQA / SQuAD slices),
`searchrl data convert` (searchrl / Search-R1 parquet / FlashRAG JSONL, both ways) and `searchrl data check`
(validate a QA file)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from searchrl.common.config import ConfigError, config_from_dict
from searchrl.data.convert import FORMATS, ConvertError, convert
from searchrl.data.datasets import DatasetError, load_qa
from searchrl.data.synthetic import SIZE_PRESETS, generate
from searchrl.data.synthetic_world import SynthConfig

data_app = typer.Typer(
    help="Datasets: generate the synthetic task, write real HotpotQA/SQuAD questions, convert between searchrl, "
    "Search-R1 and FlashRAG files, check QA files.",
    no_args_is_help=True,
)


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


@data_app.command("realqa")
def realqa(
    out: Annotated[
        Path, typer.Option("--out", help="Directory for corpus.jsonl, train/dev/test.jsonl and meta.json.")
    ],
    source: Annotated[
        str,
        typer.Option("--source", help="hotpotqa, squad or both (each split by its own rule, then joined)."),
    ] = "both",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the split; same seed, same files.")] = 0,
    dev_fraction: Annotated[
        float, typer.Option("--dev-fraction", help="Share of each dataset's questions for dev (whole units).")
    ] = 0.1,
    test_fraction: Annotated[
        float,
        typer.Option("--test-fraction", help="Share of each dataset's questions for test (whole units)."),
    ] = 0.2,
    files: Annotated[
        list[Path] | None,
        typer.Option(
            "--files",
            help="Input file(s) in the official HotpotQA / SQuAD v1.1 JSON; repeat for several (default: the "
            "repository's data/realqa/ slices). With --source both, each file's dataset is told by its shape.",
        ),
    ] = None,
    max_train: Annotated[
        int | None, typer.Option("--max-train", help="At most this many train questions per dataset.")
    ] = None,
    max_dev: Annotated[
        int | None, typer.Option("--max-dev", help="At most this many dev questions per dataset.")
    ] = None,
    max_test: Annotated[
        int | None, typer.Option("--max-test", help="At most this many test questions per dataset.")
    ] = None,
    corpus_format: Annotated[
        str,
        typer.Option(
            "--corpus-format",
            help="searchrl ({id, title, contents}) or search-r1 ({id, contents: '\"Title\"\\ntext'}).",
        ),
    ] = "searchrl",
) -> None:
    """Write real questions over their own Wikipedia paragraphs (HotpotQA distractor, SQuAD v1.1).

    SQuAD is split by article, HotpotQA by question, so no test question is seen in training.
    All splits share the corpus of paragraphs; nothing is downloaded.
    """
    from searchrl.data.realqa import CORPUS_FORMATS, build_realqa  # numpy (the corpus store): not for --help

    if source not in ("hotpotqa", "squad", "both"):
        raise typer.BadParameter(
            f"unknown source {source!r}; choose hotpotqa, squad or both", param_hint="--source"
        )
    if corpus_format not in CORPUS_FORMATS:
        raise typer.BadParameter(
            f"unknown corpus format {corpus_format!r}; choose one of {', '.join(CORPUS_FORMATS)}",
            param_hint="--corpus-format",
        )
    sizes = {"train": max_train, "dev": max_dev, "test": max_test}
    try:
        task = build_realqa(source, files or None, seed, dev_fraction, test_fraction, sizes)
        paths = task.write(out, corpus_format)
    except DatasetError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    except ValueError as e:  # fractions and sizes
        raise typer.BadParameter(str(e)) from e
    counts = task.meta["counts"]
    typer.echo(
        f"wrote {counts['documents']} documents to {paths['corpus']} and questions (train: {counts['train']}, "
        f"dev: {counts['dev']}, test: {counts['test']}) to {out}"
    )
    typer.echo(f"next: searchrl index --corpus {paths['corpus']} --out {out / 'index'}")


@data_app.command("convert")
def convert_command(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="IN [IN ...] OUT: one or more input files, then the output file. Several inputs are merged "
            "(ids prefixed with each file's dataset name).",
            show_default=False,
        ),
    ],
    source: Annotated[
        str,
        typer.Option(
            "--from",
            help="Input format: searchrl (our JSONL: id, question, golds), search-r1 (Search-R1's parquet) or "
            "flashrag (FlashRAG's JSONL: id, question, golden_answers, metadata).",
        ),
    ],
    target: Annotated[
        str, typer.Option("--to", help="Output format: searchrl, search-r1 (.parquet) or flashrag (.jsonl).")
    ],
    data_source: Annotated[
        str | None,
        typer.Option(
            "--data-source",
            help="Dataset name of every row (Search-R1's data_source column, by which its trainer picks the "
            "reward: nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle). Default: the row's own.",
        ),
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            "--split",
            help="extra_info.split written to Search-R1 files (default: the input's name if train/dev/test, "
            "else train).",
        ),
    ] = None,
    prompt_template: Annotated[
        Path | None,
        typer.Option(
            "--prompt-template",
            help="Text file with {question}: the user turn of Search-R1's prompt column (default: searchrl's "
            "wording of the <think>/<search>/<answer> protocol). searchrl itself never reads that column.",
        ),
    ] = None,
    question_mark: Annotated[
        bool,
        typer.Option(
            "--question-mark/--no-question-mark",
            help="End every question with '?' as Search-R1's data processing does (default: keep questions).",
        ),
    ] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Read at most N rows of each input file.", min=1)
    ] = None,
    by_source: Annotated[
        bool,
        typer.Option(
            "--by-source",
            help="OUT is a folder: one OUT/<data_source>/<split>.jsonl per dataset (FlashRAG's layout, what "
            "`searchrl eval --benchmarks` reads); Search-R1's seven sets are named by the split it used.",
        ),
    ] = False,
) -> None:
    """Convert question files between searchrl, Search-R1 (parquet) and FlashRAG (JSONL), both ways.

    Fields a format has no column for travel along, so converting back gives the same rows.

    searchrl data convert --from search-r1 --to searchrl train.parquet data/sr1/train.jsonl

    searchrl data convert --from flashrag --to search-r1 nq/train.jsonl hotpotqa/train.jsonl train.parquet
    """
    if len(paths) < 2:
        raise typer.BadParameter("give at least one input file and then the output file: IN [IN ...] OUT")
    for name, value in (("--from", source), ("--to", target)):
        if value not in FORMATS:
            raise typer.BadParameter(
                f"unknown format {value!r}; choose one of {', '.join(FORMATS)}", param_hint=name
            )
    template = None
    if prompt_template is not None:
        if not prompt_template.is_file():
            raise typer.BadParameter(f"{prompt_template}: file not found", param_hint="--prompt-template")
        template = prompt_template.read_text(encoding="utf-8")
    try:
        result = convert(
            paths[:-1],
            paths[-1],
            source,
            target,
            data_source=data_source,
            split=split,
            prompt_template=template,
            question_mark=question_mark,
            limit=limit,
            by_source=by_source,
        )
    except (ConvertError, DatasetError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    sources = Counter(str(r.get("data_source") or "-") for r in result.rows)
    typer.echo(
        f"wrote {len(result.rows)} questions ({source} -> {target}) to {result.output}; data sources: "
        f"{dict(sorted(sources.items()))}"
    )


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
