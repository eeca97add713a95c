"""Corpus loading and the on-disk document store shared by every local index.

Two row formats are accepted, so a user can bring either their own corpus or the wiki-18 dump that
Search-R1 and FlashRAG publish:

* ours: ``{"id", "title", "contents"}`` where ``contents`` is the body text;
* Search-R1 / FlashRAG: ``{"id", "contents"}`` where ``contents`` is ``"Title"\\ntext`` (a quoted title
  on the first line).

Either may carry ``acl``, the principal ids allowed to read the document (`searchrl.search.acl`; no ``acl``:
public). Files may be ``.jsonl``, ``.jsonl.gz`` or ``.parquet``. Every error names the file, the line and what is
wrong, because a corpus of millions of rows is otherwise impossible to debug.

`DocStore` keeps ids, titles and texts as three UTF-8 blobs with offset arrays, opened with mmap, so a
loaded index does not hold the corpus as millions of Python strings and a hit costs one slice + decode.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.search.acl import PrincipalError, parse_acl


class CorpusError(ValueError):
    """A corpus file is missing, malformed, or has a row without the fields we need."""


@dataclass(frozen=True)
class Document:
    """One corpus passage: a unique id, its title (may be empty), its body text, and who may read it
    (`acl`: the principal ids, sorted; None: public; empty: no one)."""

    id: str
    title: str
    text: str
    acl: tuple[str, ...] | None = None


def split_search_r1_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1's ``"Title"\\ntext`` into (title, text).

    The first line is the title, with one pair of surrounding double quotes removed when present; a
    value without a newline has no title (all of it is text).
    """
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    title = head.strip()
    if len(title) >= 2 and title.startswith('"') and title.endswith('"'):
        title = title[1:-1]
    return title, rest


def join_search_r1_contents(title: str, text: str) -> str:
    """The inverse of `split_search_r1_contents`: Search-R1's ``"Title"\\ntext`` form."""
    return f'"{title}"\n{text}'


def document_from_row(row: object, where: str) -> Document:
    """Turn one parsed row into a Document, or raise CorpusError naming `where` and the problem."""
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object per line, got {type(row).__name__}")
    if "id" not in row or row["id"] is None:
        raise CorpusError(f"{where}: missing field 'id' (every corpus row needs a unique 'id')")
    body_key = "contents" if "contents" in row else ("text" if "text" in row else None)
    if body_key is None:
        raise CorpusError(
            f"{where}: missing field 'contents' (rows need 'contents', either the body text with a "
            f"separate 'title', or Search-R1's '\"Title\"\\ntext')"
        )
    body = row[body_key]
    if not isinstance(body, str):
        raise CorpusError(f"{where}: field '{body_key}' must be a string, got {type(body).__name__}")
    doc_id = str(row["id"])
    try:
        acl = parse_acl(row.get("acl"), where)
    except PrincipalError as e:
        raise CorpusError(str(e)) from None
    if "title" in row and row["title"] is not None:
        if not isinstance(row["title"], str):
            raise CorpusError(f"{where}: field 'title' must be a string, got {type(row['title']).__name__}")
        return Document(doc_id, row["title"], body, acl)
    title, text = split_search_r1_contents(body)
    return Document(doc_id, title, text, acl)


def _iter_json_lines(path: Path) -> Iterator[tuple[int, object]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None


def _iter_parquet_rows(path: Path) -> Iterator[tuple[int, object]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    yield from enumerate(table.to_pylist(), start=1)


def iter_documents(path: str | os.PathLike) -> Iterator[Document]:
    """Yield the corpus' documents in file order; errors name the file and line (row for parquet)."""
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"{path}: corpus file not found")
    rows = _iter_parquet_rows(path) if path.suffix == ".parquet" else _iter_json_lines(path)
    unit = "row " if path.suffix == ".parquet" else ""
    for lineno, row in rows:
        yield document_from_row(row, f"{path}:{unit}{lineno}")


def load_corpus(path: str | os.PathLike) -> list[Document]:
    """Read a whole corpus; duplicate ids and an empty file are errors."""
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for doc in iter_documents(path):
        if doc.id in seen:
            raise CorpusError(
                f"{path}: duplicate document id {doc.id!r} (rows {seen[doc.id]} and {len(docs) + 1}); ids must be unique"
            )
        seen[doc.id] = len(docs) + 1
        docs.append(doc)
    if not docs:
        raise CorpusError(f"{path}: the corpus has no documents")
    return docs


def corpus_hash(docs: Iterable[Document]) -> str:
    """sha256 over the documents' (id, title, text) and ACLs, independent of file format and compression.

    A document's acl enters the hash only when it has one, so a corpus without ACLs hashes (and its index
    fingerprints) as before ACLs existed, and changing who may read a document changes the fingerprint."""
    h = hashlib.sha256()
    for d in docs:
        for part in (d.id, d.title, d.text):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
        if d.acl is not None:
            b = json.dumps(["acl", list(d.acl)], ensure_ascii=False).encode("utf-8")
            h.update(b"\xffacl")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


_FIELDS = ("ids", "titles", "texts")
DOCS_IN_MEMORY_ENV = "SEARCHRL_DOCS_IN_MEMORY_MB"


def docs_memory_limit() -> int:
    """Bytes of text up to which an opened index decodes its documents into memory ($SEARCHRL_DOCS_IN_MEMORY_MB,
    default 1024 MB); a larger store stays mmap'd, shared by every server worker through the page cache."""
    value = os.environ.get(DOCS_IN_MEMORY_ENV)
    return (1 << 30) if not value else int(float(value) * (1 << 20))


class DocStore:
    """Documents by integer position, stored as UTF-8 blobs + offsets (written once by `DocStore.write`).

    A store up to `memory_limit_bytes` of text is decoded into numpy object arrays at load, so a batch
    of hits is three fancy-indexing operations; a larger one (wiki-18 is ~14 GB of text) stays on disk,
    mmap'd, and each hit costs a slice and a decode instead of resident memory.
    """

    def __init__(self, directory: str | os.PathLike, memory_limit_bytes: int = 1 << 30):
        directory = Path(directory)
        self._blobs: dict[str, np.ndarray] = {}
        for field in _FIELDS:
            blob_path = directory / f"{field}.bin"
            # np.memmap refuses empty files; an all-empty field (no titles) is a zero-length array.
            if blob_path.stat().st_size == 0:
                self._blobs[field] = np.zeros(0, dtype=np.uint8)
            else:
                self._blobs[field] = np.memmap(blob_path, dtype=np.uint8, mode="r")
        total = sum(len(b) for b in self._blobs.values())
        self.in_memory = total <= memory_limit_bytes
        # Offsets of a store held in memory as Python lists: indexing a list is several times cheaper than a
        # numpy scalar read. A store left on disk keeps them mmap'd too: as lists, wiki-18's 3 x 21M offsets
        # would take 2 GB of private memory in every server worker.
        self._off: dict[str, Any] = {}
        for field in _FIELDS:
            offsets = np.load(directory / f"{field}.offsets.npy", mmap_mode="r")
            self._off[field] = offsets.tolist() if self.in_memory else offsets
        self._n = len(self._off["ids"]) - 1
        self._raw = {f: memoryview(self._blobs[f]) for f in _FIELDS}
        self._arrays: dict[str, np.ndarray] = {}
        if self.in_memory:
            for field in _FIELDS:
                arr = np.empty(self._n, dtype=object)
                arr[:] = [self._decode(field, i) for i in range(self._n)]
                self._arrays[field] = arr

    def __len__(self) -> int:
        return self._n

    def _get(self, field: str, i: int) -> str:
        if self._arrays:
            return self._arrays[field][i]
        return self._decode(field, i)

    def _decode(self, field: str, i: int) -> str:
        off = self._off[field]
        return str(self._raw[field][int(off[i]) : int(off[i + 1])], "utf-8")

    def doc_id(self, i: int) -> str:
        return self._get("ids", i)

    def title(self, i: int) -> str:
        return self._get("titles", i)

    def text(self, i: int) -> str:
        return self._get("texts", i)

    def get(self, i: int) -> Document:
        return Document(self.doc_id(i), self.title(i), self.text(i))

    def columns(self, positions: np.ndarray) -> tuple[list, list, list]:
        """(ids, titles, texts) for an array of positions, as nested lists of the same shape."""
        if self._arrays:
            return tuple(self._arrays[f][positions].tolist() for f in _FIELDS)  # type: ignore[return-value]
        flat = np.asarray(positions).tolist()

        def fetch(field: str, rows):
            return [fetch(field, r) for r in rows] if isinstance(rows, list) else self._get(field, rows)

        return tuple(fetch(f, flat) for f in _FIELDS)  # type: ignore[return-value]

    @staticmethod
    def write(directory: str | os.PathLike, docs: list[Document]) -> None:
        """Write the three blobs and their offsets into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        columns = {
            "ids": [d.id for d in docs],
            "titles": [d.title for d in docs],
            "texts": [d.text for d in docs],
        }
        for field, values in columns.items():
            encoded = [v.encode("utf-8") for v in values]
            offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
            np.cumsum([len(b) for b in encoded], out=offsets[1:])
            (directory / f"{field}.bin").write_bytes(b"".join(encoded))
            np.save(directory / f"{field}.offsets.npy", offsets)
