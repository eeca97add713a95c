"""`searchrl index` streamed: a corpus of any size indexed chunk by chunk, in bounded memory, resumable.

What: `stream_build` reads the corpus `chunk_docs` passages at a time (`chunks.read_chunks`), appends each chunk
to the document store and hands it to the backend's stage 1 (BM25: tokens and postings, `bm25_build`; dense: the
chunk's passage vectors, or nothing when an existing faiss index is linked), records the chunk as done, and after
the last one runs stage 2 (BM25: the scored CSC matrix, a range of terms at a time; dense: the faiss index, an IVF
one trained on a sample, filled chunk by chunk) and the whole-corpus checks (duplicate ids, corpus hash, ACLs).
A progress bar shows passages/s and the time left.

Why: so that wiki-18's 21M passages index on one machine with peak memory set by `memory_mb`, not by the corpus;
so that a build killed at hour three goes on from its last finished chunk when started again (the same command;
`--overwrite` starts over); and so that a small corpus (one chunk) gives exactly the files it always did.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.common.config import help_text
from searchrl.search.acl import AccessControl
from searchrl.search.chunks import BuildState, DocStoreWriter, corpus_identity, finish_documents, read_chunks
from searchrl.search.corpus import Document

BM25_BYTES_PER_DOC = (
    8 << 10
)  # a passage while tokenising: its text, token lists and postings (measured ~5 KB)
DENSE_BYTES_PER_DOC = (
    16 << 10
)  # a passage while encoding: its text, the encoder's batch activations, its vector


@dataclass(frozen=True)
class StreamSettings:
    """How a corpus is read and indexed: the memory budget, the chunk size, and whether to show progress."""

    memory_mb: int = field(
        default=2048,
        metadata=help_text(
            "Memory budget of a build, in MB: it sets the chunk size (a quarter of it) and the BM25 merge buffer. "
            "The BM25 vocabulary and a flat dense index come on top (see docs/search.md, 'At wiki-18 scale')."
        ),
    )
    chunk_docs: int = field(
        default=0, metadata=help_text("Passages per chunk (0: from memory_mb); a resumed build must keep it.")
    )
    progress: bool = field(default=False, metadata=help_text("Show a progress bar (passages/s, time left)."))

    def __post_init__(self) -> None:
        if self.memory_mb < 64 or self.chunk_docs < 0:
            raise ValueError(
                f"memory_mb must be >= 64 (got {self.memory_mb}) and chunk_docs >= 0 ({self.chunk_docs})"
            )

    def chunk_size(self, backend: str) -> int:
        per_doc = BM25_BYTES_PER_DOC if backend == "bm25" else DENSE_BYTES_PER_DOC
        return self.chunk_docs or max(1000, self.memory_mb * (1 << 20) // 4 // per_doc)


@dataclass
class BuildResult:
    """What the build found: the corpus hash, its ACLs, the document count and (dense) the faiss index."""

    corpus_sha256: str
    acl: AccessControl
    num_docs: int
    faiss_info: dict[str, Any] | None
    resumed_docs: int


class DenseChunkEncoder:
    """Stage 1 of a dense build: each chunk's passage vectors (`.vecs.npy`); stage 2 builds the faiss index."""

    def __init__(self, state: BuildState, params, model_dir: Path, batch_size: int, faiss_index: str | None):
        from searchrl.search.dense import open_encoder  # torch and sentence-transformers: when building

        self.state = state
        self.params = params
        self.batch_size = batch_size
        self.faiss_index = faiss_index
        self.encoder = open_encoder(model_dir, params)

    def add_chunk(self, index: int, start: int, docs: list[Document]) -> None:
        from searchrl.search.dense import encode, passage_text

        if self.faiss_index:  # a linked index already holds the vectors
            return
        texts = [passage_text(d, self.params) for d in docs]
        vecs = encode(self.encoder, texts, batch_size=self.batch_size, normalize=self.params.normalize)
        np.save(self.state.chunk_path(index, "vecs.npy"), vecs)

    def finish(self, out_dir: Path) -> dict[str, Any]:
        import faiss

        from searchrl.search.dense import (
            FAISS_FILE,
            VECTORS_FILE,
            describe_faiss,
            link_faiss_index,
            new_faiss_index,
            train_size,
        )
        from searchrl.search.faiss_build import fill_index, write_vectors

        if self.faiss_index:
            return link_faiss_index(
                self.faiss_index, out_dir, self.state.docs_done, self.encoder, self.params
            )
        files = [self.state.chunk_path(i, "vecs.npy") for i in range(len(self.state.chunks))]
        dim = int(np.load(files[0], mmap_mode="r").shape[1])
        index = new_faiss_index(dim, self.params, self.state.docs_done)
        fill_index(index, files, train_size(self.params, index))
        faiss.write_index(index, str(out_dir / FAISS_FILE))
        if self.params.rerank:
            write_vectors(files, out_dir / VECTORS_FILE)
        return describe_faiss(index)


def _count_rows(path: Path) -> int | None:
    """Rows of a corpus file, cheaply (parquet metadata; newlines of a plain JSONL); None for .gz."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if path.name.endswith(".gz"):
        return None
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


class _Progress:
    """A rich progress bar on stderr (passages, passages/s, time left), or nothing."""

    def __init__(self, enabled: bool, total: int | None, done: int):
        self.bar = None
        self.started, self.done0 = time.perf_counter(), done
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} passages/s"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.task = self.bar.add_task("indexing", total=total, completed=done, rate="-")
        self.bar.start()

    def advance(self, n: int, done: int) -> None:
        if self.bar is not None:
            rate = (done - self.done0) / max(time.perf_counter() - self.started, 1e-9)
            self.bar.update(self.task, advance=n, rate=f"{rate:,.0f}")

    def phase(self, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def stream_build(
    corpus: str | os.PathLike,
    out_dir: str | os.PathLike,
    backend: str,
    settings: StreamSettings,
    recorded_params: dict[str, Any],
    bm25_params=None,
    dense: dict[str, Any] | None = None,
) -> BuildResult:
    """Index `corpus` into `out_dir` chunk by chunk (resuming an unfinished build with the same settings).

    `recorded_params` are what the index records (they key the resume check); BM25 takes `bm25_params`, dense
    `dense` = {"params", "model_dir", "batch_size", "faiss_index"}. The caller writes `meta.json`, then calls
    `discard_build_state`."""
    out_dir = Path(out_dir)
    chunk_docs = settings.chunk_size(backend)
    identity = {"corpus": corpus_identity(corpus), "backend": backend, "params": recorded_params}
    state = BuildState.open(out_dir, {**identity, "chunk_docs": chunk_docs})
    resumed = state.docs_done
    if backend == "bm25":
        from searchrl.search.bm25_build import BM25ChunkIndexer  # bm25s and numba: when building

        stage: Any = BM25ChunkIndexer(state, bm25_params, settings.memory_mb)
    else:
        assert dense is not None
        stage = DenseChunkEncoder(
            state, dense["params"], dense["model_dir"], dense["batch_size"], dense["faiss_index"]
        )
    writer = DocStoreWriter(out_dir / "docs", state)
    progress = _Progress(settings.progress, _count_rows(Path(corpus)) if settings.progress else None, resumed)
    try:
        for docs in read_chunks(corpus, chunk_docs, skip_docs=resumed):
            index = len(state.chunks)
            stage.add_chunk(index, state.docs_done, docs)
            writer.append(index, docs)
            state.commit_chunk(len(docs), dict(writer.sizes))
            progress.advance(len(docs), state.docs_done)
        progress.phase("checking ids, hashing")
        writer.finish()
        sha, acl = finish_documents(corpus, out_dir / "docs", state)
        if acl.any_restricted:
            acl.write(out_dir)  # before the backend's files, so a backend never loads without its ACLs
        progress.phase("writing the index")
        info = stage.finish(out_dir)
    finally:
        progress.close()
    return BuildResult(sha, acl, state.docs_done, info if backend == "dense" else None, resumed)


def discard_build_state(out_dir: str | os.PathLike) -> None:
    """Remove the chunks of a finished build (after its meta.json is written)."""
    from searchrl.search.chunks import BUILD_DIR

    shutil.rmtree(Path(out_dir) / BUILD_DIR, ignore_errors=True)
