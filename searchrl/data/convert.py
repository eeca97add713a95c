"""Convert question files between searchrl's rows, Search-R1's parquet and FlashRAG's JSONL, both ways.

What: three formats of one thing, a question with its gold answers.

- `searchrl`: our JSONL rows, `{"id", "question", "golds", ...}` (any other field is kept; see
  `searchrl.data.datasets`).
- `flashrag`: FlashRAG's JSONL rows, `{"id", "question", "golden_answers", "metadata"?}`, the files
  Search-R1 builds its data from (`<dataset>/<split>.jsonl`).
- `search-r1`: Search-R1's processed parquet rows, as its verl trainer reads them: `data_source`, `prompt`
  (a chat list, `[{"role": "user", "content": ...}]`), `ability`, `reward_model` (`{"style": "rule",
  "ground_truth": {"target": [...]}}`) and `extra_info` (`{"split", "index"}`), plus the `id`, `question`
  and `golden_answers` columns its files also carry (its processing maps FlashRAG rows and keeps their
  columns).

Why: the published Search-R1 training file (NQ + HotpotQA train) and its seven evaluation sets come in
these shapes, and a searchrl run must read exactly those questions for its numbers to compare; in the other
direction, questions prepared here can be trained on with Search-R1's own trainer.

Nothing is lost on the way through another format (tested both ways):

- fields that FlashRAG rows have no column for travel in `metadata["searchrl"]`; the FlashRAG reader lifts
  them back, and keeps any other `metadata` as the row's `metadata` field;
- in parquet the same fields travel as one JSON string column, `metadata`, since parquet needs one type per
  column and our rows' extra fields differ from row to row;
- Search-R1 rows keep their `prompt`, `ability`, `extra_info` and original `id` in a `search_r1` field, so
  a Search-R1 file written back out is the file that came in.

Ids. Search-R1's merged files concatenate datasets whose ids restart at `train_0`, so ids read from a
Search-R1 parquet are `<data_source>-<id>` (unique again; an id that already starts so is kept); the original
id is kept and written back.
When several input files are merged, every row's id is prefixed the same way with its dataset name (its
`data_source`, else the name of the folder it came from, FlashRAG's `<dataset>/<split>.jsonl` layout).

Questions are stripped of surrounding white space (as `load_qa` does); `question_mark=True` also ends each
question with "?" (what Search-R1's data processing does). The `prompt` column written for Search-R1 is our
own instruction around the question (the tag protocol: `<think>`, `<search>`, `<information>`,
`<answer>`), or any template with `{question}` you pass; searchrl itself builds its prompt from
`question` and the run config, never from this column.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.common.io import write_jsonl
from searchrl.data.benchmarks import BENCHMARKS
from searchrl.data.datasets import DatasetError, jsonl_rows, load_qa, normalize_qa_row

FORMATS: tuple[str, ...] = ("searchrl", "search-r1", "flashrag")
# The dataset names Search-R1's reward routing knows (its qa_em scorer); other names need its code changed.
SEARCH_R1_DATA_SOURCES: tuple[str, ...] = (
    "nq",
    "triviaqa",
    "popqa",
    "hotpotqa",
    "2wikimultihopqa",
    "musique",
    "bamboogle",
)
SEARCH_R1_ABILITY = "fact-reasoning"
# Our wording of the tag protocol, for the `prompt` column of Search-R1 files (Search-R1's trainer reads it).
DEFAULT_PROMPT_TEMPLATE = (
    "Answer the question below. Whenever you receive new information, reason about it inside <think> and "
    "</think>. If you need facts you do not have, write a search query between <search> and </search>; the "
    "results come back between <information> and </information>. Search as often as you need. When you can "
    "answer, write only the answer between <answer> and </answer>, for example <answer> Paris </answer>.\n"
    "Question: {question}\n"
)
_SPLIT_NAMES = ("train", "dev", "test", "validation")
# What our rows carry that is not "extra": the QA core, and defaults `load_qa` fills in.
_CORE = ("id", "question", "golds")
_CARRY = "search_r1"  # Search-R1 columns we do not use, kept so a round trip gives the same file


class ConvertError(DatasetError):
    """A conversion cannot be done as asked; the message says which file or option and what to change."""


@dataclass
class ConvertResult:
    """What `convert` did: the rows read, from where, and the file written."""

    rows: list[dict[str, Any]]
    inputs: list[Path]
    output: Path
    source_format: str
    target_format: str


# -- reading -------------------------------------------------------------------------------------


def _check_format(fmt: str, option: str) -> str:
    if fmt not in FORMATS:
        raise ConvertError(f"{option} {fmt!r}: unknown format; choose one of {', '.join(FORMATS)}")
    return fmt


def _extras(row: dict[str, Any]) -> dict[str, Any]:
    """A row's fields beyond the QA core, without `load_qa`'s empty defaults and without carried columns."""
    out = {k: v for k, v in row.items() if k not in _CORE and k not in ("metadata", _CARRY)}
    if out.get("hops") is None:
        out.pop("hops", None)
    if out.get("supporting_doc_ids") in ([], None):
        out.pop("supporting_doc_ids", None)
    return out


def _finish_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    """Our schema for a row whose extras were lifted: validated by `normalize_qa_row`, defaults filled."""
    return normalize_qa_row(row, where, default_id=str(row.get("id", "")))


def read_flashrag(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """FlashRAG JSONL rows (`id`, `question`, `golden_answers`, optional `metadata`) as our rows.

    `metadata["searchrl"]` (written by `write_flashrag`) is lifted back into the row; any other `metadata`
    stays the row's `metadata` field. Errors name the file, the line and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise ConvertError(
            f"{path}: file not found; pass a FlashRAG .jsonl file (id, question, golden_answers)"
        )
    rows: list[dict[str, Any]] = []
    for where, raw in jsonl_rows(path, ConvertError):
        if not isinstance(raw, dict):
            raise ConvertError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        if "golden_answers" not in raw:
            raise ConvertError(
                f"{where}: missing field 'golden_answers'; a FlashRAG row needs question and golden_answers "
                "(for searchrl rows with 'golds' use --from searchrl)"
            )
        row = {k: v for k, v in raw.items() if k not in ("metadata", "golden_answers")}
        row["golds"] = raw["golden_answers"]
        if "metadata" in raw:
            meta = raw["metadata"]
            if not isinstance(meta, dict):
                raise ConvertError(f"{where}: field 'metadata' must be an object, got {type(meta).__name__}")
            ours = meta.get("searchrl")
            if ours is not None and not isinstance(ours, dict):
                raise ConvertError(f"{where}: field 'metadata.searchrl' must be an object of row fields")
            rest = {k: v for k, v in meta.items() if k != "searchrl"}
            for key, value in (ours or {}).items():
                row.setdefault(key, value)
            if rest or ours is None:
                row["metadata"] = rest
        if row.get("id") is None:
            row["id"] = f"{path.stem}-{len(rows):06d}"
        rows.append(_finish_row(row, where))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise ConvertError(f"{path}: no rows; a FlashRAG file has one JSON object per line")
    return rows


def _question_from_prompt(prompt: Any) -> str | None:
    """The question inside a Search-R1 chat prompt: the text after the last 'Question:' of the last user
    turn, else that whole turn (for files without a `question` column)."""
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if not isinstance(prompt, list):
        return None
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        return None
    text = users[-1]
    marker = text.rfind("Question:")
    return (text[marker + len("Question:") :] if marker >= 0 else text).strip() or None


def read_search_r1(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Search-R1 parquet rows as our rows; golds from `reward_model.ground_truth.target` (what its reward
    scores against), the question from `question` (or from the prompt when the file has no such column).

    Ids become `<data_source>-<id>` (see the module docstring); `prompt`, `ability`, `extra_info` and the
    original `id` travel in the row's `search_r1` field, `metadata` (a JSON string or an object) is lifted.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"{path}: file not found; pass a Search-R1 .parquet file (e.g. train.parquet)")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types; all mean "not a parquet file we can read"
        raise ConvertError(f"{path}: cannot read as parquet: {e}") from e
    columns = set(table.column_names)
    if "reward_model" not in columns and "golden_answers" not in columns:
        raise ConvertError(
            f"{path}: no 'reward_model' (nor 'golden_answers') column, so this is not a Search-R1 file; it has "
            f"{sorted(columns)}"
        )
    rows: list[dict[str, Any]] = []
    for index, raw in enumerate(table.to_pylist()):
        where = f"{path}: row {index + 1}"
        rows.append(_row_from_search_r1(raw, where, index))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise ConvertError(f"{path}: no rows")
    _require_unique(rows, str(path))
    return rows


def _row_from_search_r1(raw: dict[str, Any], where: str, position: int) -> dict[str, Any]:
    source = raw.get("data_source")
    if not isinstance(source, str) or not source:
        raise ConvertError(f"{where}: missing field 'data_source' (the dataset name, e.g. nq)")
    target = ((raw.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    golds = target if target is not None else raw.get("golden_answers")
    if golds is None:
        raise ConvertError(f"{where}: missing field 'reward_model.ground_truth.target' (the gold answers)")
    question = raw.get("question")
    if question is None:
        question = _question_from_prompt(raw.get("prompt"))
    if question is None:
        raise ConvertError(f"{where}: no 'question' column and no user turn in 'prompt' to read it from")
    extra_info = raw.get("extra_info") or {}
    raw_id = raw.get("id")
    if raw_id is None:
        raw_id = f"{extra_info.get('split', 'row')}_{extra_info.get('index', position)}"
    carry = {"id": raw_id}
    for key in ("prompt", "ability", "extra_info"):
        if key in raw:
            carry[key] = raw[key]
    # Prefixed with the dataset (ids restart per dataset in merged files), unless they already are.
    our_id = str(raw_id) if str(raw_id).startswith(f"{source}-") else f"{source}-{raw_id}"
    row: dict[str, Any] = {"id": our_id, "question": question, "golds": golds}
    row["data_source"] = source
    meta = raw.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError as e:
            raise ConvertError(f"{where}: field 'metadata' is a string but not JSON ({e.msg})") from e
    if isinstance(meta, dict):
        ours = meta.get("searchrl")
        rest = {k: v for k, v in meta.items() if k != "searchrl"}
        for key, value in (ours if isinstance(ours, dict) else {}).items():
            row.setdefault(key, value)
        if rest:
            row["metadata"] = rest
    row[_CARRY] = carry
    return _finish_row(row, where)


def read_rows(path: str | Path, fmt: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of `path` read as `fmt` (searchrl, search-r1, flashrag), in searchrl's schema."""
    _check_format(fmt, "--from")
    if fmt == "flashrag":
        return read_flashrag(path, limit)
    if fmt == "search-r1":
        return read_search_r1(path, limit)
    return load_qa(path, limit=limit)


# -- writing -------------------------------------------------------------------------------------


def search_r1_question(question: str) -> str:
    """Search-R1's question rule: strip white space, end with a question mark."""
    question = question.strip()
    return question if question.endswith("?") else question + "?"


def write_searchrl(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Our JSONL (`.jsonl` or `.jsonl.gz`), one row per line, written atomically."""
    path = Path(path)
    _require_suffix(path, (".jsonl", ".jsonl.gz"), "searchrl")
    write_jsonl(path, rows)
    return path


def flashrag_row(row: dict[str, Any]) -> dict[str, Any]:
    """One row in FlashRAG's shape; our extra fields go to `metadata["searchrl"]`."""
    out: dict[str, Any] = {"id": row["id"], "question": row["question"], "golden_answers": list(row["golds"])}
    extras = _extras(row)
    if "metadata" in row or extras:
        meta = dict(row.get("metadata") or {})
        if extras:
            meta["searchrl"] = extras
        out["metadata"] = meta
    return out


def write_flashrag(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """FlashRAG JSONL (`id`, `question`, `golden_answers`, `metadata`), written atomically."""
    path = Path(path)
    _require_suffix(path, (".jsonl", ".jsonl.gz"), "flashrag")
    write_jsonl(path, [flashrag_row(r) for r in rows])
    return path


def search_r1_row(
    row: dict[str, Any],
    position: int,
    data_source: str | None,
    split: str,
    prompt_template: str,
) -> dict[str, Any]:
    """One row in Search-R1's parquet shape (see the module docstring); carried columns win over defaults."""
    carry = row.get(_CARRY) or {}
    source = data_source or row.get("data_source")
    if not source:
        raise ConvertError(
            f"row {row['id']!r}: no data_source; pass --data-source NAME (Search-R1 routes its reward by this "
            f"name: {', '.join(SEARCH_R1_DATA_SOURCES)})"
        )
    extras = _extras(row)
    extras.pop("data_source", None)
    meta = dict(row.get("metadata") or {})
    if extras:
        meta["searchrl"] = extras
    prompt = carry.get("prompt")
    if prompt is None:
        prompt = [{"role": "user", "content": prompt_template.format(question=row["question"])}]
    return {
        "id": str(carry.get("id", row["id"])),
        "question": row["question"],
        "golden_answers": list(row["golds"]),
        "data_source": source,
        "prompt": prompt,
        "ability": carry.get("ability", SEARCH_R1_ABILITY),
        "reward_model": {"style": "rule", "ground_truth": {"target": list(row["golds"])}},
        "extra_info": carry.get("extra_info", {"split": split, "index": position}),
        "metadata": json.dumps(meta, ensure_ascii=False, sort_keys=True) if meta else None,
    }


def write_search_r1(
    rows: Sequence[dict[str, Any]],
    path: str | Path,
    data_source: str | None = None,
    split: str = "train",
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
) -> Path:
    """A Search-R1 parquet file (atomically: written beside, then renamed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    _require_suffix(path, (".parquet",), "search-r1")
    if "{question}" not in prompt_template:
        raise ConvertError(
            "the prompt template has no '{question}' placeholder; put it where the question goes"
        )
    records = [search_r1_row(r, i, data_source, split, prompt_template) for i, r in enumerate(rows)]
    if all(r["metadata"] is None for r in records):
        for r in records:  # no row has extra fields: no column for them (Search-R1's own files have none)
            del r["metadata"]
    table = pa.Table.from_pylist(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_rows(
    rows: Sequence[dict[str, Any]],
    path: str | Path,
    fmt: str,
    data_source: str | None = None,
    split: str = "train",
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
) -> Path:
    """Write our rows to `path` as `fmt` (searchrl, search-r1, flashrag)."""
    _check_format(fmt, "--to")
    if fmt == "flashrag":
        return write_flashrag(rows, path)
    if fmt == "search-r1":
        return write_search_r1(rows, path, data_source, split, prompt_template)
    return write_searchrl(rows, path)


def _require_suffix(path: Path, suffixes: tuple[str, ...], fmt: str) -> None:
    if not path.name.lower().endswith(suffixes):
        raise ConvertError(f"{path}: a {fmt} file must end in {' or '.join(suffixes)}")


def _require_unique(rows: Sequence[dict[str, Any]], where: str) -> None:
    counts = Counter(r["id"] for r in rows)
    repeated = sorted(i for i, n in counts.items() if n > 1)
    if repeated:
        raise ConvertError(
            f"{where}: question ids repeat ({repeated[:5]}); ids must be unique (when merging files whose ids "
            "restart, each file's rows get their dataset name as a prefix)"
        )


def _dataset_name(row: dict[str, Any], path: Path) -> str:
    return str(row.get("data_source") or path.parent.name or path.stem)


def _split_of(path: Path) -> str | None:
    stem = path.name.split(".")[0].lower()
    return stem if stem in _SPLIT_NAMES else None


def convert(
    inputs: Sequence[str | Path],
    output: str | Path,
    source_format: str,
    target_format: str,
    data_source: str | None = None,
    split: str | None = None,
    prompt_template: str | None = None,
    question_mark: bool = False,
    limit: int | None = None,
    by_source: bool = False,
) -> ConvertResult:
    """Read `inputs` as `source_format`, write them to `output` as `target_format`.

    `by_source=True` makes `output` a folder with one file per dataset, `<output>/<data_source>/<split>.jsonl`
    (`.parquet` for search-r1), FlashRAG's layout, which `searchrl eval --benchmarks` reads. For Search-R1's
    seven evaluation sets the file is named by the split Search-R1 took the questions from (test for NQ,
    TriviaQA, PopQA, Bamboogle; dev for HotpotQA, 2WikiMultiHopQA, Musique), whatever `extra_info.split`
    says (its merged test file says "test" for all); other datasets use `split` or the input's name.

    Several inputs are merged in order; each row then gets its dataset name (`data_source`, else the folder
    it came from) as `data_source` and as an id prefix, so ids that restart per dataset stay unique.
    `data_source` sets every row's dataset name (Search-R1 routes rewards by it). `split` is what
    Search-R1's `extra_info.split` says (default: the input file's name when it is train/dev/test, else
    train). `prompt_template` (with `{question}`) is the Search-R1 prompt column's text (default: ours).
    `question_mark` applies Search-R1's question rule (strip, end with "?"). `limit` reads at most that many
    rows per input file.
    """
    _check_format(source_format, "--from")
    _check_format(target_format, "--to")
    paths = [Path(p) for p in inputs]
    if not paths:
        raise ConvertError("no input file; pass at least one IN file before OUT")
    output = Path(output)
    if output.resolve() in {p.resolve() for p in paths}:
        raise ConvertError(f"{output}: the output is also an input; write to another file")
    rows: list[dict[str, Any]] = []
    for path in paths:
        part = read_rows(path, source_format, limit=limit)
        for row in part:
            if data_source:
                row["data_source"] = data_source
            if len(paths) > 1:
                name = _dataset_name(row, path)
                row.setdefault("data_source", name)
                if not str(row["id"]).startswith(f"{name}-"):
                    row["id"] = f"{name}-{row['id']}"
            if question_mark:
                row["question"] = search_r1_question(row["question"])
        rows += part
    _require_unique(rows, ", ".join(str(p) for p in paths))
    default_split = split or _split_of(paths[0]) or "train"
    template = prompt_template or DEFAULT_PROMPT_TEMPLATE
    if by_source:
        _write_by_source(rows, output, target_format, split, default_split, template)
        return ConvertResult(rows, paths, output, source_format, target_format)
    written = write_rows(
        rows, output, target_format, data_source=data_source, split=default_split, prompt_template=template
    )
    return ConvertResult(rows, paths, written, source_format, target_format)


def _write_by_source(
    rows: Sequence[dict[str, Any]],
    output: Path,
    target_format: str,
    split: str | None,
    default_split: str,
    template: str,
) -> list[Path]:
    if output.suffix in (".jsonl", ".parquet", ".gz", ".json"):
        raise ConvertError(f"{output}: with --by-source the output is a folder (one sub-folder per dataset)")
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        source = row.get("data_source")
        if not source:
            raise ConvertError(
                f"row {row['id']!r}: no data_source, so --by-source cannot tell its dataset; pass --data-source NAME"
            )
        groups.setdefault(str(source), []).append(row)
    paper_split = {b.name: b.search_r1_split for b in BENCHMARKS}
    suffix = ".parquet" if target_format == "search-r1" else ".jsonl"
    written = []
    for source, part in groups.items():
        name = split or paper_split.get(source) or default_split
        written.append(
            write_rows(
                part, output / source / f"{name}{suffix}", target_format, split=name, prompt_template=template
            )
        )
    return written
