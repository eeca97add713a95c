"""The HotpotQA and SQuAD files of a real-question run: the repository's shipped slices, or files given.

Two small slices ship in the repository's `data/realqa/` (CC BY-SA 4.0, see the README there), in their
official formats, so nothing is fetched at run time. `load_sources` reads the slices, or the files given
(each file's dataset told by its top level), parses each with `searchrl.data.realqa_formats` and merges
the files of one dataset; an unreadable file fails with `DatasetError` giving the line and column.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from searchrl.data.datasets import DatasetError
from searchrl.data.realqa_formats import (
    HOTPOT_NEEDS,
    SOURCES,
    SQUAD_NEEDS,
    RealQASource,
    detect_format,
    hotpotqa_from_items,
    squad_from_object,
    top_kind,
)

# The repository's data/realqa/, next to the package when searchrl runs from its checkout.
REALQA_DIR = Path(__file__).resolve().parents[2] / "data" / "realqa"
SHIPPED_FILES: dict[str, str] = {
    "hotpotqa": "hotpot_dev_distractor_v1-first53.json",
    "squad": "squad-v1.1-dev-20articles.json",
}


def _read_json(path: Path) -> tuple[Any, str]:
    """The parsed file and the sha256 of its bytes; unreadable files fail with line and column."""
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{path}: not UTF-8 text (bad byte at offset {e.start}); expected a JSON file"
        ) from e
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(
            f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}; "
            f"expected the official HotpotQA or SQuAD v1.1 JSON file"
        ) from e
    return obj, hashlib.sha256(raw).hexdigest()


def load_hotpotqa(path: str | Path) -> RealQASource:
    """Read a HotpotQA file (official JSON list; distractor or gold-paragraph setting)."""
    return _source_of_file("hotpotqa", Path(path))


def load_squad(path: str | Path) -> RealQASource:
    """Read a SQuAD v1.1 file (official JSON; v2.0 files load too, but unanswerable questions fail)."""
    return _source_of_file("squad", Path(path))


# -- several files, default files ------------------------------------------------------------------------


def _source_of_file(kind: str, path: Path, read: tuple[Any, str] | None = None) -> RealQASource:
    """One file parsed as `kind` ('hotpotqa' or 'squad'), with its name and sha256; `read` is what
    `_read_json(path)` returned, when the caller has read it already."""
    obj, sha = read if read is not None else _read_json(path)
    parse = hotpotqa_from_items if kind == "hotpotqa" else squad_from_object
    parsed = parse(obj, str(path))
    return RealQASource(
        kind, parsed.documents, parsed.questions, [{"name": path.name, "sha256": sha}], parsed.paragraph_slots
    )


def shipped_file(source: str) -> Path:
    """The repository's slice for `source`, or a DatasetError saying to pass the file explicitly."""
    if source not in SHIPPED_FILES:
        raise DatasetError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    path = REALQA_DIR / SHIPPED_FILES[source]
    if not path.is_file():
        raise DatasetError(
            f"{path}: the shipped {source} slice is not here (searchrl is installed outside its repository, "
            f"which holds data/realqa/); pass the file explicitly (--files PATH, or files=[...])"
        )
    return path


def _merge(source: str, parts: Sequence[RealQASource]) -> RealQASource:
    docs: dict[str, dict[str, str]] = {}
    questions: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for part in parts:
        for d in part.documents:
            docs.setdefault(d["id"], d)
        for row in part.questions:
            where = part.files[0]["name"] if part.files else source
            if row["id"] in seen:
                raise DatasetError(
                    f"{where}: question id {row['id']!r} is also in {seen[row['id']]}; ids must be unique "
                    f"across the files of one run"
                )
            seen[row["id"]] = where
            questions.append(row)
    return RealQASource(
        source,
        [docs[k] for k in sorted(docs)],
        questions,
        [f for p in parts for f in p.files],
        sum(p.paragraph_slots for p in parts),
    )


def load_sources(source: str = "both", files: Iterable[str | Path] | None = None) -> dict[str, RealQASource]:
    """Parse the files for `source` ('hotpotqa', 'squad' or 'both'), keyed by dataset.

    Without `files`, the repository's shipped slices. With `files`, each file's dataset is told by its top
    level (a list is HotpotQA, an object with 'data' is SQuAD); files of one dataset are merged.
    """
    wanted = list(SOURCES) if source == "both" else [source]
    if source != "both" and source not in SOURCES:
        raise DatasetError(f"unknown source {source!r}; choose hotpotqa, squad or both")
    paths = [shipped_file(s) for s in wanted] if files is None else [Path(f) for f in files]
    if not paths:
        raise DatasetError("no input files given")
    parts: dict[str, list[RealQASource]] = {s: [] for s in wanted}
    for path in paths:
        obj, sha = _read_json(path)
        kind = detect_format(obj) if source == "both" else source
        if kind is None:
            raise DatasetError(
                f"{path}: the top level is a JSON {top_kind(obj)}, which is neither HotpotQA (a list of "
                f"questions) nor SQuAD (an object with 'data'); {HOTPOT_NEEDS}; {SQUAD_NEEDS}"
            )
        parts[kind].append(_source_of_file(kind, path, (obj, sha)))
    missing = [s for s in wanted if not parts[s]]
    if missing:
        raise DatasetError(
            f"source {source!r} needs a {' and a '.join(missing)} file too; the files given "
            f"({', '.join(p.name for p in paths)}) hold only {', '.join(s for s in wanted if parts[s])}"
        )
    return {s: _merge(s, parts[s]) for s in wanted}
