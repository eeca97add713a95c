"""BM25 over bm25s with its numba scorer: the default, CPU-only, offline search backend.

The whole batch is tokenised in one call and scored in one `retrieve` call, and hits are built from
plain lists, so the wrapper costs little on top of raw bm25s (the benchmark holds it to >= 0.9 of raw
bm25s throughput). Defaults are k1=0.9, b=0.4 with the Lucene BM25 variant: the values Pyserini and
therefore Search-R1's BM25 retriever use, so scores are comparable with what users already run.

An index is a directory: bm25s' sparse matrix (`bm25/`, loaded with mmap so a large index opens in
well under a second), the tokenizer's vocabulary, the `DocStore` with titles and texts, and `acl.json` when
some documents are restricted (`searchrl.search.acl`).

ACLs: a query made for a principal is scored with bm25s' `weight_mask` (1 for each document the principal
may read, 0 for the others), so a document it may not read scores 0 and never enters the top-k cut: the k
hits are the best k readable documents. One `retrieve` call per distinct principal in the batch; an index
without restricted documents scores exactly as before (no mask). Scores use corpus-wide statistics (idf,
average length), as Elasticsearch's document-level security does: a hidden document's words shift the
scores slightly, its id, title and text never leave the backend.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import bm25s
import numpy as np
import Stemmer
from bm25s.tokenization import Tokenizer

from searchrl.search.acl import AccessControl, check_principals, group_by_principal
from searchrl.search.base import Hit, make_hit
from searchrl.search.corpus import DocStore, Document, docs_memory_limit

BM25_METHODS = ("robertson", "lucene", "atire", "bm25l", "bm25+")


def _enable_numba_cache() -> None:
    """Turn on numba's on-disk cache for bm25s' JIT functions.

    bm25s compiles its scorer on first use without `cache=True`, which costs ~5-10 s in *every*
    process (each server worker, each test). `Dispatcher.enable_caching()` is numba's public switch
    for exactly this; with it, later processes load the compiled code in well under a second. The
    cache lives in numba's usual place (next to bm25s, else the user cache dir, or $NUMBA_CACHE_DIR).
    """
    try:
        from bm25s.numba import retrieve_utils, selection
        from numba.core.registry import CPUDispatcher
    except ImportError:  # numba missing: bm25s itself will say so when the numba backend is used
        return
    for module in (retrieve_utils, selection):
        for obj in vars(module).values():
            if isinstance(obj, CPUDispatcher):
                obj.enable_caching()


_enable_numba_cache()


@dataclass(frozen=True)
class BM25Params:
    """Everything that changes BM25's ranking; it all goes into the index fingerprint."""

    k1: float = field(
        default=0.9, metadata={"help": "BM25 term-frequency saturation (Pyserini/Search-R1: 0.9)."}
    )
    b: float = field(
        default=0.4, metadata={"help": "BM25 length normalisation in [0, 1] (Pyserini/Search-R1: 0.4)."}
    )
    method: str = field(default="lucene", metadata={"help": f"BM25 variant: {', '.join(BM25_METHODS)}."})
    stemmer: str | None = field(
        default="english", metadata={"help": "PyStemmer language (e.g. english), or null for no stemming."}
    )
    stopwords: str | None = field(
        default="en", metadata={"help": "Stop-word list ('en'), or null to keep every word."}
    )
    lower: bool = field(default=True, metadata={"help": "Lower-case text before tokenising."})

    def __post_init__(self) -> None:
        if self.method not in BM25_METHODS:
            raise ValueError(
                f"BM25 method {self.method!r} is unknown; choose one of {', '.join(BM25_METHODS)}"
            )
        if not self.k1 >= 0:
            raise ValueError(f"BM25 k1 must be >= 0, got {self.k1}")
        if not 0 <= self.b <= 1:
            raise ValueError(f"BM25 b must be in [0, 1], got {self.b}")

    def to_dict(self) -> dict:
        return asdict(self)


def make_tokenizer(params: BM25Params) -> Tokenizer:
    """bm25s' tokenizer with the stemmer (PyStemmer) and stop-word list the params ask for."""
    stemmer = None
    if params.stemmer:
        try:
            stemmer = Stemmer.Stemmer(params.stemmer)
        except KeyError:
            raise ValueError(
                f"unknown stemmer language {params.stemmer!r}; PyStemmer knows {', '.join(Stemmer.algorithms())}"
            ) from None
    return Tokenizer(lower=params.lower, stopwords=params.stopwords or None, stemmer=stemmer)


def index_text(doc: Document) -> str:
    """What BM25 indexes for a document: its title and body."""
    # The title is indexed with the body: entity names often appear only in the title.
    return f"{doc.title}\n{doc.text}" if doc.title else doc.text


def slim_query_vocab(retriever: bm25s.BM25, tokenizer: Tokenizer) -> None:
    """Keep one copy of the vocabulary, the tokenizer's, with every query's token ids the same.

    bm25s would hold it four times over as Python dicts and a set, ~650 bytes per term in every server worker
    (wiki-18 has millions of terms): its `vocab_dict` (term -> id, read only for string queries; we pass ids;
    `BM25Backend.load` does not even read it) and `unique_token_ids_set` (the ids 0..n-1: a `range` answers `in`
    the same), and the tokenizer's `word_to_id` and `word_to_stem` caches (`drop_word_caches`). The empty
    word's id is kept where it is read ("no token at all")."""
    vocab = tokenizer.get_vocab_dict()  # what bm25s' vocab.index.json holds: both are written from it
    retriever.unique_token_ids_set = known_token_ids(vocab)
    empty = vocab.get("")
    retriever.vocab_dict = {} if empty is None else {"": empty}
    drop_word_caches(tokenizer)
    release_freed_memory()


def known_token_ids(vocab: dict[str, int]) -> range | set[int]:
    """The ids of `vocab` as bm25s' `unique_token_ids_set`: a `range` when they are 0..n-1 (every index bm25s'
    tokenizer builds: it numbers terms as it meets them), else the set. Checked with an array of 8 bytes a term,
    not a set of Python ints (~70 bytes a term)."""
    ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))
    n = len(ids)
    if n == 0 or (ids.min() >= 0 and ids.max() < n and np.bincount(ids, minlength=n).min() == 1):
        return range(n)
    return set(ids.tolist())


def drop_word_caches(tokenizer: Tokenizer) -> None:
    """Empty a stemming tokenizer's `word_to_id` and `word_to_stem` (keeping the empty word's entry), leaving
    `stem_to_sid`, the vocabulary itself.

    With a stemmer a word's id is always `stem_to_sid[stem(word)]`, so the two word dicts are caches: they hold
    every surface form ever seen, two thirds of the vocabulary's memory (wiki-18 has millions of forms). The
    empty word's entry stays because bm25s gives "" a fresh id when `word_to_id` lacks it. Without a stemmer
    `word_to_id` is the vocabulary: nothing is dropped."""
    if tokenizer.stemmer is None:
        return
    empty = tokenizer.word_to_id.get("")
    tokenizer.word_to_id = {} if empty is None else {"": empty}
    tokenizer.word_to_stem = {} if empty is None else {"": ""}


def release_freed_memory() -> None:
    """Hand the heap pages freed above back to the OS (glibc's `malloc_trim`; elsewhere nothing). Without it the
    dropped dicts' pages stay in the worker's RSS: at 335k terms 90 MB of the 150 MB they took."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class BM25Backend:
    """A `Backend` answering from a bm25s index directory."""

    # A handful of queries take well under a millisecond: the server may run them on its event loop.
    fast_inline = True

    def __init__(
        self,
        retriever: bm25s.BM25,
        tokenizer: Tokenizer,
        docs: DocStore,
        params: BM25Params,
        fingerprint: str,
        n_threads: int = 1,
        acl: AccessControl | None = None,
    ):
        self._retriever = retriever
        self._tokenizer = tokenizer
        self._docs = docs
        self.params = params
        self._fingerprint = fingerprint
        self.n_threads = n_threads
        self._n_docs = len(docs)
        # The id bm25s gives to "no token at all"; a query made only of it matches nothing.
        self._empty_id = tokenizer.word_to_id.get("")
        self.acl = acl if acl is not None and acl.any_restricted else None

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def __len__(self) -> int:
        return self._n_docs

    @classmethod
    def build(cls, docs: list[Document], out_dir: str | os.PathLike, params: BM25Params) -> None:
        """Tokenise and index `docs`, and write the index files into `out_dir`."""
        out_dir = Path(out_dir)
        tokenizer = make_tokenizer(params)
        corpus_ids = tokenizer.tokenize([index_text(d) for d in docs], return_as="ids", show_progress=False)
        retriever = bm25s.BM25(k1=params.k1, b=params.b, method=params.method, backend="numba")
        retriever.index((corpus_ids, tokenizer.get_vocab_dict()), show_progress=False)
        retriever.save(str(out_dir / "bm25"))
        drop_word_caches(
            tokenizer
        )  # searching refills them from the stems; the streamed build writes the same
        tokenizer.save_vocab(str(out_dir / "bm25"))
        DocStore.write(out_dir / "docs", docs)

    @classmethod
    def load(
        cls, index_dir: str | os.PathLike, params: BM25Params, fingerprint: str, mmap: bool = True
    ) -> BM25Backend:
        index_dir = Path(index_dir)
        # bm25s' own vocabulary copy (vocab.index.json) is not read: the tokenizer's is the same mapping, and at
        # wiki-18's millions of terms a second dict would double the worker's peak while it loads.
        retriever = bm25s.BM25.load(str(index_dir / "bm25"), mmap=mmap, load_vocab=False)
        # Saved params record the backend used to build; retrieval must use the numba scorer.
        retriever.backend = "numba"
        tokenizer = make_tokenizer(params)
        tokenizer.load_vocab(str(index_dir / "bm25"))
        slim_query_vocab(retriever, tokenizer)
        docs = DocStore(index_dir / "docs", memory_limit_bytes=docs_memory_limit())
        acl = AccessControl.load(index_dir, len(docs))
        return cls(retriever, tokenizer, docs, params, fingerprint, acl=acl)

    def warm_up(self) -> None:
        """Score one term so numba compiles the scorer now (seconds) rather than on a live query."""
        n_terms = len(self._retriever.scores["indptr"]) - 1
        term = next((t for t in range(min(n_terms, 2)) if t != self._empty_id), None)
        if term is not None:
            self._score([[term]], [0], 1, None, [[]])

    def tokenize(self, queries: list[str]) -> list[list[int]]:
        """Token ids of each query in the index's vocabulary (unknown words dropped)."""
        return self._tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)

    def search(
        self, queries: list[str], k: int, principals: Sequence[str | None] | None = None
    ) -> list[list[Hit]]:
        """The best `k` documents for each query that its principal may read (None: public only)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        owners = check_principals(principals, len(queries))
        token_ids = self.tokenize(queries)
        # Queries with no known token would only match empty documents; answer them with no hits
        # and keep them out of the scorer.
        live = [i for i, ids in enumerate(token_ids) if ids and ids != [self._empty_id]]
        results: list[list[Hit]] = [[] for _ in queries]
        if not live:
            return results
        if self.acl is None:
            self._score(token_ids, live, k, None, results)
            return results
        for principal, positions in group_by_principal([owners[i] for i in live]).items():
            mask = self.acl.readable(principal)
            weights = None if mask is None else mask.astype(np.float32)
            self._score(token_ids, [live[p] for p in positions], k, weights, results)
        return results

    def _score(
        self,
        token_ids: list[list[int]],
        live: list[int],
        k: int,
        weight_mask: np.ndarray | None,
        results: list[list[Hit]],
    ) -> None:
        """Score the `live` queries in one `retrieve` call (masked by `weight_mask`) into `results`."""
        k_eff = min(k, self._n_docs)
        live_ids = token_ids if len(live) == len(token_ids) else [token_ids[i] for i in live]
        extra = {} if weight_mask is None else {"weight_mask": weight_mask}
        doc_idx, scores = self._retriever.retrieve(
            live_ids, k=k_eff, return_as="tuple", show_progress=False, n_threads=self.n_threads, **extra
        )
        # Rows are sorted best first; a zero score means no query term occurs in the document (or the
        # principal may not read it: masked to 0), so each row keeps only its positive prefix.
        n_positive = (scores > 0).sum(axis=1).tolist()
        ids, titles, texts = self._docs.columns(doc_idx)
        score_rows = scores.tolist()
        for row, qi in enumerate(live):
            n = n_positive[row]
            results[qi] = list(
                map(make_hit, ids[row][:n], score_rows[row][:n], titles[row][:n], texts[row][:n])
            )
