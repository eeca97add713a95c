"""Load question-answer files into searchrl's row schema, from our JSONL or the formats others publish.

searchrl's QA row is `{"id", "question", "golds", "hops", "supporting_doc_ids"}` (plus any extra fields the
file carries, such as `answer_type`, and `principal`: the user the episode acts for, a principal id as
`searchrl.search.acl` defines it, checked here). Users arrive with other shapes, so `load_qa` also reads

- FlashRAG / Search-R1 raw rows: `question` + `golden_answers` (a list), optionally `id`;
- rows with `answers` (a list) or `answer` (a string or a list) instead of `golds`;
- Search-R1's processed parquet, where the golds sit in `reward_model.ground_truth.target`;

from `.jsonl` / `.jsonl.gz` (read line by line, so errors name the line) or from `.json` / `.parquet`
through HF `datasets` (local files only; nothing is downloaded). A row that lacks a field gets an error
that names the file, the line (or row) and the field, and says what every row needs.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from searchrl.search.acl import principal_problem

# Where golds may live, in order of preference; a dotted name reaches into nested dicts.
GOLD_FIELDS = ("golds", "golden_answers", "answers", "answer", "reward_model.ground_truth.target")
ROW_NEEDS = "each row needs question and golds (or golden_answers, answers, answer)"


class DatasetError(ValueError):
    """A QA file is unreadable or a row is wrong; the message names the file, the line and the field."""


def _lookup(row: dict[str, Any], dotted: str) -> Any:
    node: Any = row
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _as_str_list(value: Any) -> list[str] | None:
    """A gold value as a list of strings; None if it is not one (numpy arrays from parquet included)."""
    if isinstance(value, str):
        return [value]
    if hasattr(value, "tolist") and not isinstance(value, list | tuple):
        value = value.tolist()
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _golds(row: dict[str, Any], where: str) -> list[str]:
    for name in GOLD_FIELDS:
        value = _lookup(row, name)
        if value is None:
            continue
        golds = _as_str_list(value)
        if golds is None:
            raise DatasetError(
                f"{where}: field {name!r} must be a string or a list of strings, got {value!r}"
            )
        golds = [g for g in golds if g.strip()]
        if not golds:
            raise DatasetError(
                f"{where}: field {name!r} has no non-empty answer; give at least one gold answer"
            )
        return golds
    raise DatasetError(f"{where}: missing field 'golds'; {ROW_NEEDS}")


def normalize_qa_row(row: Any, where: str, default_id: str) -> dict[str, Any]:
    """One row in searchrl's schema, or a DatasetError saying where and what is wrong."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}; {ROW_NEEDS}")
    question = row.get("question")
    if question is None:
        raise DatasetError(f"{where}: missing field 'question'; {ROW_NEEDS}")
    if not isinstance(question, str) or not question.strip():
        raise DatasetError(f"{where}: field 'question' must be a non-empty string, got {question!r}")
    out = {k: v for k, v in row.items() if k not in GOLD_FIELDS and k != "reward_model"}
    out["id"] = str(row["id"]) if row.get("id") is not None else default_id
    out["question"] = question.strip()
    out["golds"] = _golds(row, where)
    hops = row.get("hops")
    if hops is not None and (isinstance(hops, bool) or not isinstance(hops, int) or hops < 1):
        raise DatasetError(f"{where}: field 'hops' must be a positive integer, got {hops!r}")
    out["hops"] = hops
    supporting = row.get("supporting_doc_ids", [])
    supporting = _as_str_list(supporting) if supporting != [] else []
    if supporting is None:
        raise DatasetError(f"{where}: field 'supporting_doc_ids' must be a list of document ids")
    out["supporting_doc_ids"] = supporting
    problem = None if row.get("principal") is None else principal_problem(row["principal"])
    if problem is not None:
        raise DatasetError(f"{where}: field 'principal': {problem}")
    return out


def jsonl_rows(path: Path, error: type[DatasetError] = DatasetError) -> Iterator[tuple[str, Any]]:
    """`(where, value)` for each non-blank line of a `.jsonl` / `.jsonl.gz` file, `where` naming the file and
    line; a line that is not JSON raises `error` (a DatasetError) saying so."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}: line {lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                raise error(
                    f"{path}: line {lineno}: not valid JSON ({e.msg}); one JSON object per line"
                ) from e


def _hf_rows(path: Path, kind: str) -> Iterator[tuple[str, Any]]:
    import datasets  # heavy import, only for these formats

    try:
        ds = (
            datasets.Dataset.from_parquet(str(path))
            if kind == "parquet"
            else datasets.Dataset.from_json(str(path))
        )
    except Exception as e:  # datasets raises many types; all mean "this file is not readable as {kind}"
        raise DatasetError(f"{path}: cannot read as {kind} with HF datasets: {e}") from e
    for index, row in enumerate(ds):
        yield f"{path}: row {index + 1}", row


def _file_kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".json"):
        return "json"
    raise DatasetError(f"{path}: unknown file type; use .jsonl, .jsonl.gz, .json or .parquet")


def load_qa(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Read a QA file into searchrl rows (see the module docstring for the accepted shapes)."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: file not found")
    kind = _file_kind(path)
    rows_iter = jsonl_rows(path) if kind == "jsonl" else _hf_rows(path, kind)
    rows: list[dict[str, Any]] = []
    for where, raw in rows_iter:
        rows.append(normalize_qa_row(raw, where, default_id=f"{path.stem.split('.')[0]}-{len(rows):06d}"))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise DatasetError(f"{path}: no rows; {ROW_NEEDS}")
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        repeated = sorted(i for i, n in Counter(ids).items() if n > 1)[:5]
        raise DatasetError(f"{path}: question ids must be unique, repeated: {repeated}")
    return rows


def load_split(data_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """`DATA_DIR/{split}.jsonl`, as written by `searchrl data synth`."""
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.exists():
        raise DatasetError(f"{path}: no {split} split here; run `searchrl data synth --out {data_dir}` first")
    return load_qa(path)
