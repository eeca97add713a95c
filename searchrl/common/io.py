"""Atomic writes and JSONL(.gz) I/O.

Every file a run writes goes through `atomic_write_*`: the bytes land in a temporary file in the same
directory and are renamed over the target, so a killed process leaves either the old file or the new
one, never half of one.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=str) + "\n")


def _open_text(path: Path, mode: str):
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write rows as JSON lines (gzip when the name ends in .gz), atomically."""
    path = Path(path)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    atomic_write_bytes(path, gzip.compress(lines, mtime=0) if path.suffix == ".gz" else lines)


def append_jsonl(path: str | os.PathLike, row: dict) -> None:
    """Append one line and flush it to disk (metrics logs: a crash loses at most the line being written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False, default=float) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Yield rows; a malformed line raises ValueError naming the file and line number.

    A last line without its newline (a write cut short by a kill) is skipped with no error, since
    `append_jsonl` may have been interrupted mid-line.
    """
    path = Path(path)
    with _open_text(path, "r") as f:
        lines = f.readlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines) and not line.endswith("\n"):
                return
            raise ValueError(
                f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be one JSON object"
            ) from e
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
        yield row
