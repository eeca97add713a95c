"""BM25 built chunk by chunk: the same index files `BM25Backend.build` writes, in bounded memory, resumable.

What: `BM25ChunkIndexer.add_chunk` tokenises one chunk of documents with bm25s' tokenizer (its vocabulary carried
over from chunk to chunk, stems only; the terms each chunk added are saved beside it) and writes the chunk's (term, document,
term frequency) triples sorted by term; `BM25ChunkIndexer.finish` then reads the document frequencies and lengths of all chunks, computes
the scores with bm25s' own idf and term-frequency functions, and writes bm25s' CSC matrix (`data`, `indices`,
`indptr`), vocabulary and parameters a range of terms at a time, so `bm25s.BM25.load(mmap=True)` opens it.

Why: bm25s builds its matrix from the whole corpus' token ids in memory (about 40 bytes per token on the way:
over 60 GB for wiki-18). Here memory holds one chunk's tokens, then one range of terms' postings
(`memory_mb`); the postings of the finished chunks sit on disk until the merge. The arithmetic is bm25s' own,
element for element (float64 term-frequency part, float32 idf, one cast to float32), and the vocabulary grows in
the order bm25s' tokenizer gives it, so the matrix equals `BM25Backend.build`'s bit for bit
(`tests/test_search_streaming.py`), whatever the chunk size.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import bm25s
import numpy as np
from bm25s import scoring

from searchrl.search.bm25 import BM25Params, drop_word_caches, index_text, make_tokenizer
from searchrl.search.chunks import BuildState
from searchrl.search.corpus import Document

VOCAB_NAME = "vocab.tokenizer.json"  # what `BM25Backend.load` reads, beside bm25s' own files
_NONOCCURRENCE_METHODS = ("bm25l", "bm25+")
IDF_BLOCK = 1 << 16  # terms whose idf is computed per Python list (a list of every term id: 36 B a term)


def _vocab_name(index: int) -> str:
    return f"vocab-added-{index:05d}.json"


class BM25ChunkIndexer:
    """Stage 1 (`add_chunk`, once per chunk) and stage 2 (`finish`) of a streamed BM25 build."""

    # Postings scored per pass of the merge: from `memory_mb` (~64 bytes each with temporaries) unless set.
    postings_per_pass: int | None = None

    def __init__(self, state: BuildState, params: BM25Params, memory_mb: int):
        self.state = state
        self.params = params
        self.memory_mb = memory_mb
        self.tokenizer = make_tokenizer(params)
        # The vocabulary proper: stems -> ids with a stemmer, words -> ids without. With a stemmer the word dicts
        # are caches (`drop_word_caches`), emptied after every chunk: only stems grow with the corpus.
        self.vocab_name = "stem_to_sid" if self.tokenizer.stemmer is not None else "word_to_id"
        vocab = getattr(self.tokenizer, self.vocab_name)
        for i in range(len(state.chunks)):  # a resumed build: the vocabulary as it stood after the last chunk
            vocab.update(json.loads((state.directory / _vocab_name(i)).read_text())[self.vocab_name])
        if "" in vocab and self.vocab_name == "stem_to_sid":  # the cache entries a finished chunk leaves
            self.tokenizer.word_to_id[""], self.tokenizer.word_to_stem[""] = vocab[""], ""

    def add_chunk(self, index: int, start: int, docs: list[Document]) -> None:
        """Tokenise chunk `index` (documents `start`..) and write its postings, sorted by (term, document)."""
        size_before = len(getattr(self.tokenizer, self.vocab_name))
        ids = self.tokenizer.tokenize(
            [index_text(d) for d in docs], update_vocab=True, return_as="ids", show_progress=False
        )
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        local = np.repeat(np.arange(len(ids), dtype=np.int64), lengths)
        keys, tf = np.unique((flat << 32) | local, return_counts=True)  # sorted by term, then document
        path = self.state.chunk_path
        np.save(path(index, "terms.npy"), (keys >> 32).astype(np.int32))
        np.save(path(index, "docs.npy"), ((keys & 0xFFFFFFFF) + start).astype(np.int32))
        np.save(path(index, "tf.npy"), tf.astype(np.int32))
        np.save(path(index, "lengths.npy"), lengths.astype(np.int32))
        self._save_vocab_added(index, size_before)
        drop_word_caches(self.tokenizer)

    def _save_vocab_added(self, index: int, size_before: int) -> None:
        """Write the vocabulary entries chunk `index` added (the vocabulary only grows, in insertion order), so a
        resumed build replays them in order: O(new terms) per chunk, not the whole vocabulary each time."""
        vocab = getattr(self.tokenizer, self.vocab_name)
        added = {self.vocab_name: dict(itertools.islice(vocab.items(), size_before, None))}
        (self.state.directory / _vocab_name(index)).write_text(json.dumps(added, ensure_ascii=False))

    def finish(self, out_dir: str | os.PathLike) -> None:
        """Stage 2: write `out_dir/bm25/` (bm25s' files and the tokenizer's vocabulary) from the chunks."""
        out = Path(out_dir) / "bm25"
        out.mkdir(parents=True, exist_ok=True)
        vocab = self.tokenizer.get_vocab_dict()
        n_vocab, n_docs = len(vocab), self.state.docs_done
        df, total_len = self._frequencies(n_vocab)
        avg_len = np.float64(total_len) / n_docs  # what numpy's mean of the lengths gives, exactly
        idf_fn = scoring._select_idf_scorer(self.params.method)
        idf = np.zeros(n_vocab, dtype=np.float32)
        for block in range(0, n_vocab, IDF_BLOCK):  # bm25s' own scalar function, term by term
            for term in (block + np.flatnonzero(df[block : block + IDF_BLOCK])).tolist():
                idf[term] = idf_fn(int(df[term]), N=n_docs)
        nonoccurrence = None
        if self.params.method in _NONOCCURRENCE_METHODS:
            nonoccurrence = scoring._build_nonoccurrence_array(
                doc_frequencies={t: int(d) for t, d in enumerate(df.tolist())},
                n_docs=n_docs,
                compute_idf_fn=idf_fn,
                calculate_tfc_fn=scoring._select_tfc_scorer(self.params.method),
                l_d=avg_len,
                l_avg=avg_len,
                k1=self.params.k1,
                b=self.params.b,
                delta=0.5,
            )
        indptr = np.zeros(n_vocab + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        self._write_matrix(out, indptr, idf, nonoccurrence, avg_len)
        retriever = bm25s.BM25(k1=self.params.k1, b=self.params.b, method=self.params.method, backend="numba")
        retriever.vocab_dict = vocab
        retriever.nonoccurrence_array = nonoccurrence
        retriever.scores = {
            "data": np.zeros(0, np.float32),
            "indices": np.zeros(0, np.int32),
            "indptr": indptr,
        }
        retriever.scores["num_docs"] = n_docs
        # bm25s writes its vocabulary and parameters (and placeholder arrays), then the real arrays replace them.
        retriever.save(str(out), show_progress=False)
        for name in ("data", "indices"):
            os.replace(out / f"{name}.csc.index.npy.part", out / f"{name}.csc.index.npy")
        self.tokenizer.save_vocab(str(out))

    def _frequencies(self, n_vocab: int) -> tuple[np.ndarray, int]:
        """Document frequency of every term and the corpus' total length, over all chunks."""
        df = np.zeros(n_vocab, dtype=np.int64)
        total = 0
        for i in range(len(self.state.chunks)):
            df += np.bincount(
                np.load(self.state.chunk_path(i, "terms.npy"), mmap_mode="r"), minlength=n_vocab
            )
            total += int(np.load(self.state.chunk_path(i, "lengths.npy")).sum())
        return df, total

    def _write_matrix(
        self, out: Path, indptr: np.ndarray, idf: np.ndarray, nonoccurrence: np.ndarray | None, avg_len: float
    ) -> None:
        """Append the matrix' columns a range of terms at a time (each range's postings fit `memory_mb`)."""
        nnz = int(indptr[-1])
        budget = self.postings_per_pass or max(1 << 16, self.memory_mb * (1 << 20) // 64)
        cuts = [
            0,
            *np.searchsorted(indptr, np.arange(budget, nnz, budget), side="right").tolist(),
            len(indptr) - 1,
        ]
        bounds = sorted(set(cuts))
        with (
            open(out / "data.csc.index.npy.part", "wb") as f_data,
            open(out / "indices.csc.index.npy.part", "wb") as f_idx,
        ):
            np.lib.format.write_array_header_1_0(f_data, _header(np.float32, nnz))
            np.lib.format.write_array_header_1_0(f_idx, _header(np.int32, nnz))
            for t0, t1 in itertools.pairwise(bounds):
                data, docs = self._term_range(t0, t1, indptr, idf, nonoccurrence, avg_len)
                data.tofile(f_data)
                docs.tofile(f_idx)

    def _term_range(
        self, t0: int, t1: int, indptr: np.ndarray, idf: np.ndarray, nonoccurrence: np.ndarray | None, avg_len
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scores and documents of terms t0..t1-1, in CSC order (by term, then document)."""
        base, size = int(indptr[t0]), int(indptr[t1] - indptr[t0])
        data = np.empty(size, dtype=np.float32)
        docs = np.empty(size, dtype=np.int32)
        heads = indptr[t0:t1] - base  # next free slot of each term in this range
        tfc_fn = scoring._select_tfc_scorer(self.params.method)
        start = 0
        for i, chunk in enumerate(self.state.chunks):
            terms = np.load(self.state.chunk_path(i, "terms.npy"), mmap_mode="r")
            lo, hi = np.searchsorted(terms, [t0, t1]).tolist()
            if hi > lo:
                ts = np.asarray(terms[lo:hi], dtype=np.int64)
                ds = np.load(self.state.chunk_path(i, "docs.npy"), mmap_mode="r")[lo:hi]
                tf = np.load(self.state.chunk_path(i, "tf.npy"), mmap_mode="r")[lo:hi].astype(np.float32)
                lengths = np.load(self.state.chunk_path(i, "lengths.npy"))
                l_d = lengths[np.asarray(ds, dtype=np.int64) - start].astype(np.int64)
                k1, b = self.params.k1, self.params.b
                scores = idf[ts] * tfc_fn(tf_array=tf, l_d=l_d, l_avg=avg_len, k1=k1, b=b, delta=0.5)
                if nonoccurrence is not None:
                    scores -= nonoccurrence[ts]
                within = np.arange(len(ts)) - np.searchsorted(ts, ts, side="left")
                slots = heads[ts - t0] + within
                data[slots] = scores
                docs[slots] = ds
                heads += np.bincount(ts - t0, minlength=t1 - t0)
            start += chunk["docs"]
            del terms
        return data, docs


def _header(dtype: type, n: int) -> dict:
    return {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (n,)}
