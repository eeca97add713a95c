"""A corpus read in chunks, and the resumable state of a build that writes an index chunk by chunk.

What: `read_chunks` yields the corpus' documents `chunk_docs` at a time (JSONL, JSONL.gz, or parquet read batch by
batch), skipping the documents a resumed build already holds; `DocStoreWriter` appends each chunk to the
document store's blobs; `BuildState` is the build's progress file (`.build/progress.json`, written atomically
after each chunk) that says which chunks are done, so a killed `searchrl index` started again goes on from the
last finished chunk; `finish_documents` checks the whole corpus once the chunks are in (duplicate ids, emptiness)
and computes `corpus_hash` and the ACLs exactly as the one-shot reader does.

Why: wiki-18 is 21M passages and 14 GB of text; a build that holds it in memory needs more than the machine has,
and one that dies at hour three must not start again from zero. Memory stays bounded by the chunk size (the
document store is written straight to disk; ids are checked for duplicates through an 8-byte hash per document,
168 MB for 21M documents), and what a chunk wrote is kept once its progress entry is on disk.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.common.io import atomic_write_json
from searchrl.search.acl import AccessControl
from searchrl.search.corpus import _FIELDS, CorpusError, DocStore, Document, corpus_hash, document_from_row

BUILD_DIR = ".build"
PROGRESS_FILE = "progress.json"


def _json_rows(path: Path, skip: int) -> Iterator[tuple[int, object]]:
    """(line number, parsed row) of a JSONL file; the first `skip` non-empty lines are passed over unparsed."""
    opener = gzip.open if path.name.endswith(".gz") else open
    seen = 0
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            seen += 1
            if seen <= skip:
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None


def _parquet_rows(path: Path, skip: int, batch_rows: int) -> Iterator[tuple[int, object]]:
    """(row number, row) of a parquet file, read `batch_rows` rows at a time (never the whole table)."""
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
        if row + batch.num_rows <= skip:
            row += batch.num_rows
            continue
        for record in batch.to_pylist():
            row += 1
            if row > skip:
                yield row, record


def read_chunks(path: str | os.PathLike, chunk_docs: int, skip_docs: int = 0) -> Iterator[list[Document]]:
    """The corpus' documents in file order, `chunk_docs` per list, after the first `skip_docs` documents."""
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"{path}: corpus file not found")
    is_parquet = path.suffix == ".parquet"
    rows = (
        _parquet_rows(path, skip_docs, min(chunk_docs, 65536)) if is_parquet else _json_rows(path, skip_docs)
    )
    unit = "row " if is_parquet else ""
    chunk: list[Document] = []
    for lineno, row in rows:
        chunk.append(document_from_row(row, f"{path}:{unit}{lineno}"))
        if len(chunk) == chunk_docs:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def corpus_identity(path: str | os.PathLike) -> dict[str, Any]:
    """What a resumed build checks it is reading the same file: its resolved path, size and mtime."""
    if not Path(path).is_file():
        raise CorpusError(f"{path}: corpus file not found")
    st = Path(path).stat()
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@dataclass
class BuildState:
    """A build's progress: its settings and, per finished chunk, the documents it held and the store's sizes.

    `settings` must match exactly for a build to resume (same corpus file, backend, parameters and chunk size);
    `chunks[i]` is `{"docs": n, "blob_sizes": {field: bytes}}` after chunk i."""

    directory: Path
    settings: dict[str, Any]
    chunks: list[dict[str, Any]]

    @property
    def docs_done(self) -> int:
        return sum(c["docs"] for c in self.chunks)

    @classmethod
    def open(cls, out_dir: str | os.PathLike, settings: dict[str, Any]) -> BuildState:
        """The progress of an unfinished build with these `settings` in `out_dir`, or a fresh one."""
        directory = Path(out_dir) / BUILD_DIR
        path = directory / PROGRESS_FILE
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("settings") != settings:
                raise CorpusError(
                    f"{out_dir}: holds an unfinished build with other settings or another corpus file "
                    f"({_settings_diff(saved.get('settings') or {}, settings)}); pass --overwrite to start over"
                )
            return cls(directory, settings, list(saved["chunks"]))
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory, settings, [])

    def chunk_path(self, index: int, name: str) -> Path:
        return self.directory / f"chunk-{index:05d}.{name}"

    def commit_chunk(self, docs: int, blob_sizes: dict[str, int]) -> None:
        """Record one more finished chunk (atomically: a kill leaves the previous progress file)."""
        self.chunks.append({"docs": docs, "blob_sizes": blob_sizes})
        atomic_write_json(self.directory / PROGRESS_FILE, {"settings": self.settings, "chunks": self.chunks})


def _settings_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} then, {new.get(k)!r} now" for k in keys[:3])


def _id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


class DocStoreWriter:
    """Appends chunks of documents to a `DocStore` directory (three blobs; offsets kept per chunk).

    Opened on a resumed build, it cuts each blob back to the size the last finished chunk recorded, so bytes a
    killed chunk had appended are dropped."""

    def __init__(self, directory: Path, state: BuildState):
        self.directory = directory
        self.state = state
        directory.mkdir(parents=True, exist_ok=True)
        sizes = state.chunks[-1]["blob_sizes"] if state.chunks else dict.fromkeys(_FIELDS, 0)
        for field in _FIELDS:
            blob = directory / f"{field}.bin"
            with open(blob, "ab") as f:
                f.truncate(sizes[field])
        self.sizes = dict(sizes)

    def append(self, index: int, docs: list[Document]) -> None:
        """Append `docs` (chunk `index`): blobs, per-chunk offsets, id hashes and ACLs beside the chunk."""
        columns = {
            "ids": [d.id for d in docs],
            "titles": [d.title for d in docs],
            "texts": [d.text for d in docs],
        }
        lengths = {}
        for field, values in columns.items():
            encoded = [v.encode("utf-8") for v in values]
            lengths[field] = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
            with open(self.directory / f"{field}.bin", "ab") as f:
                f.write(b"".join(encoded))
            self.sizes[field] += int(lengths[field].sum())
        hashes = np.fromiter((_id_hash(d.id) for d in docs), dtype=np.uint64, count=len(docs))
        np.savez(self.state.chunk_path(index, "docs.npz"), hashes=hashes, **{f: lengths[f] for f in _FIELDS})
        acls = {str(i): list(d.acl) for i, d in enumerate(docs) if d.acl is not None}
        self.state.chunk_path(index, "acl.json").write_text(json.dumps(acls, ensure_ascii=False))

    def finish(self) -> None:
        """Write each field's offsets file from the chunks' lengths (streamed: never all lengths at once)."""
        for field in _FIELDS:
            n = self.state.docs_done
            out = np.lib.format.open_memmap(self.directory / f"{field}.offsets.npy", "w+", np.int64, (n + 1,))
            out[0], pos, total = 0, 1, 0
            for i in range(len(self.state.chunks)):
                lengths = np.load(self.state.chunk_path(i, "docs.npz"))[field]
                out[pos : pos + len(lengths)] = total + np.cumsum(lengths)
                total += int(lengths.sum())
                pos += len(lengths)
            out.flush()
            del out


def finish_documents(
    corpus: str | os.PathLike, docs_dir: Path, state: BuildState
) -> tuple[str, AccessControl]:
    """After the last chunk: refuse an empty corpus or duplicate ids, then (corpus hash, ACLs) of the whole
    corpus, equal to `corpus_hash(load_corpus(corpus))` and `AccessControl.from_acls` of the one-shot build."""
    n = state.docs_done
    if n == 0:
        raise CorpusError(f"{corpus}: the corpus has no documents")
    store = DocStore(docs_dir, memory_limit_bytes=0)
    _check_unique_ids(corpus, store, state)
    restricted: list[int] = []
    readers: dict[str, list[int]] = {}
    acl_of: dict[int, tuple[str, ...]] = {}
    start = 0
    for i, chunk in enumerate(state.chunks):
        for local, acl in json.loads(state.chunk_path(i, "acl.json").read_text()).items():
            position = start + int(local)
            restricted.append(position)
            acl_of[position] = tuple(acl)
            for principal in acl:
                readers.setdefault(principal, []).append(position)
        start += chunk["docs"]
    docs = (Document(store.doc_id(i), store.title(i), store.text(i), acl_of.get(i)) for i in range(n))
    return corpus_hash(docs), AccessControl(n, restricted, readers)


def _check_unique_ids(corpus: str | os.PathLike, store: DocStore, state: BuildState) -> None:
    hashes = np.concatenate(
        [np.load(state.chunk_path(i, "docs.npz"))["hashes"] for i in range(len(state.chunks))]
    )
    # Two arrays of 8 bytes a passage at most (wiki-18: 340 MB): the sorted copy finds the repeated hashes, then
    # only the rows that carry one are grouped by hash and their ids compared within the group (two ids can
    # share a hash: a group is not one id).
    ordered = np.sort(hashes)
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    del ordered
    rows = np.flatnonzero(np.isin(hashes, repeated))
    rows = rows[np.argsort(hashes[rows], kind="stable")]  # by hash, then by row
    starts = np.flatnonzero(np.r_[True, hashes[rows][1:] != hashes[rows][:-1]])
    for group in np.split(rows, starts[1:]):
        first_row: dict[str, int] = {}
        for row in group.tolist():
            doc_id = store.doc_id(row)
            if doc_id in first_row:
                raise CorpusError(
                    f"{corpus}: duplicate document id {doc_id!r} (rows {first_row[doc_id] + 1} and {row + 1}); "
                    "ids must be unique"
                )
            first_row[doc_id] = row
