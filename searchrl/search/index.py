"""Build and open index directories, whatever the backend.

Every index directory has a `meta.json`: format version, backend, parameters, document count, the
corpus hash and the fingerprint = sha256(corpus hash + backend + parameters). The fingerprint keys the
search cache and is recorded in each run's manifest, so a result can always be traced to the exact
corpus and ranking function that produced it. `meta.json` is written last (atomically): a directory
without it is an interrupted build, and `load_index` says so instead of serving half an index.

A corpus whose rows carry `acl` keeps it: the index gets `acl.json` (`searchrl.search.acl.AccessControl`),
`meta.json` counts the restricted documents, and the ACLs are part of the corpus hash, so the fingerprint (and
every cache key) changes when who may read a document changes. A corpus without ACLs builds the same files
and fingerprint as before ACLs existed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.common.io import atomic_write_json
from searchrl.search.acl import ACL_FILE
from searchrl.search.base import Backend
from searchrl.search.bm25 import BM25Backend, BM25Params
from searchrl.search.build import StreamSettings, discard_build_state, stream_build
from searchrl.search.cache import CachedBackend
from searchrl.search.chunks import BUILD_DIR, PROGRESS_FILE
from searchrl.search.client import HTTPBackend
from searchrl.search.dense import DenseBackend, DenseParams, resolve_model_path
from searchrl.search.faults import FaultInjectingBackend

INDEX_FORMAT_VERSION = 1
BACKENDS = ("bm25", "dense")
_INDEX_ENTRIES = {"meta.json", "bm25", "docs", "dense.faiss", ACL_FILE, BUILD_DIR}


class IndexFormatError(ValueError):
    """An index directory is missing, incomplete, or was built by an incompatible version."""


def compute_fingerprint(corpus_sha256: str, backend: str, params: dict[str, Any]) -> str:
    payload = json.dumps({"corpus": corpus_sha256, "backend": backend, "params": params}, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def model_id(model_dir: Path) -> str:
    """A cheap identity of a model directory: names and sizes of its files (not their paths on disk)."""
    h = hashlib.sha256()
    for p in sorted(model_dir.rglob("*")):
        if p.is_file():
            h.update(f"{p.relative_to(model_dir)}:{p.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def read_meta(index_dir: str | os.PathLike) -> dict[str, Any]:
    """The index's `meta.json`, or a clear error if the directory is not a finished index."""
    index_dir = Path(index_dir)
    meta_path = index_dir / "meta.json"
    if not index_dir.is_dir():
        raise IndexFormatError(f"{index_dir}: index directory not found (build one with `searchrl index`)")
    if not meta_path.exists():
        raise IndexFormatError(
            f"{index_dir}: no meta.json, so this is not a finished index (an interrupted build?); "
            f"rebuild it with `searchrl index --corpus FILE --out {index_dir}`"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format_version") != INDEX_FORMAT_VERSION:
        raise IndexFormatError(
            f"{index_dir}: index format version {meta.get('format_version')} is not the supported "
            f"{INDEX_FORMAT_VERSION}; rebuild the index"
        )
    return meta


def build_index(
    corpus_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    backend: str = "bm25",
    overwrite: bool = False,
    stream: StreamSettings | None = None,
    **params: Any,
) -> Backend:
    """Index the corpus at `corpus_path` into `out_dir` and return the opened backend.

    bm25 params: k1, b, method, stemmer, stopwords, lower (see `BM25Params`). dense params: model_path,
    batch_size, faiss_index (an existing faiss file to link instead of encoding the corpus), and the
    `DenseParams` fields (encoder "sentence-transformers" or "e5" with its presets, query_prefix,
    passage_prefix, pooling, normalize, max_length, passage_format, index_type "flat", "hnsw", "ivf_flat" or
    "ivf_pq", hnsw_m, hnsw_ef_search, ivf_nlist, pq_m, pq_nbits, nprobe, train_size, rerank).

    The corpus is read and indexed chunk by chunk (`stream`: memory budget, chunk size, progress bar;
    `searchrl.search.build`). An `out_dir` holding an unfinished build of the same corpus and settings is resumed
    from its last finished chunk; `overwrite` starts over.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    out_dir = Path(out_dir)
    _prepare_out_dir(out_dir, overwrite)
    started = time.perf_counter()
    stream = stream or StreamSettings()
    if backend == "bm25":
        bm25_params = BM25Params(**params)
        recorded = bm25_params.to_dict()
        result = stream_build(corpus_path, out_dir, backend, stream, recorded, bm25_params=bm25_params)
    else:
        rest = {k: v for k, v in params.items() if k not in ("model_path", "batch_size", "faiss_index")}
        dense_params = DenseParams.preset(rest.pop("encoder", None) or "sentence-transformers", **rest)
        model_dir = resolve_model_path(params.get("model_path"))
        recorded = {"model": model_dir.name, "model_id": model_id(model_dir), **dense_params.recorded()}
        dense = {
            "params": dense_params,
            "model_dir": model_dir,
            "batch_size": int(params.get("batch_size") or 64),
            "faiss_index": params.get("faiss_index"),
        }
        result = stream_build(corpus_path, out_dir, backend, stream, recorded, dense=dense)
        if params.get("faiss_index"):
            # A linked index is part of what answers: its shape and size enter the fingerprint.
            assert result.faiss_info is not None
            recorded["faiss_index"] = {
                k: result.faiss_info[k] for k in ("class", "d", "ntotal", "size_bytes")
            }
    meta = {
        "format_version": INDEX_FORMAT_VERSION,
        "backend": backend,
        "params": recorded,
        "num_docs": result.num_docs,
        "corpus_sha256": result.corpus_sha256,
        "corpus_path": str(corpus_path),
        "fingerprint": compute_fingerprint(result.corpus_sha256, backend, recorded),
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    if result.resumed_docs:
        meta["resumed_after_docs"] = result.resumed_docs
    if backend == "dense":
        meta["faiss"] = result.faiss_info
    if result.acl.any_restricted:
        meta["acl"] = result.acl.summary()
    atomic_write_json(out_dir / "meta.json", meta)
    discard_build_state(out_dir)
    return load_index(out_dir, model_path=params.get("model_path"))


def _prepare_out_dir(out_dir: Path, overwrite: bool) -> None:
    """An empty `out_dir`, or one holding an unfinished build to resume; `overwrite` clears an index we wrote."""
    if out_dir.exists() and any(out_dir.iterdir()):
        unfinished = (out_dir / BUILD_DIR / PROGRESS_FILE).is_file() and not (out_dir / "meta.json").exists()
        if unfinished and not overwrite:
            return  # resumed by `stream_build`, which checks the corpus and settings are the same
        if not overwrite:
            raise IndexFormatError(
                f"{out_dir}: output directory is not empty; pass overwrite=True (--overwrite)"
            )
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in _INDEX_ENTRIES)
        if foreign:
            # Never delete what we did not write: --overwrite on the wrong directory must be harmless.
            raise IndexFormatError(
                f"{out_dir}: holds files that are not part of an index ({', '.join(foreign[:5])}); "
                f"refusing to overwrite it, choose another --out"
            )
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def load_index(
    index_dir: str | os.PathLike, mmap: bool = True, model_path: str | os.PathLike | None = None
) -> Backend:
    """Open the index in `index_dir` as the backend that built it (`BM25Backend` or `DenseBackend`)."""
    meta = read_meta(index_dir)
    if meta.get("acl") and not (Path(index_dir) / ACL_FILE).is_file():
        # Fail closed: without its ACL file the index would serve restricted documents as public ones.
        raise IndexFormatError(
            f"{index_dir}: meta.json says {meta['acl'].get('restricted_docs')} documents are restricted but "
            f"{ACL_FILE} is missing; rebuild the index with `searchrl index`"
        )
    if meta["backend"] == "bm25":
        return BM25Backend.load(index_dir, BM25Params(**meta["params"]), meta["fingerprint"], mmap=mmap)
    if meta["backend"] == "dense":
        model_dir = resolve_model_path(model_path)
        if model_id(model_dir) != meta["params"]["model_id"]:
            raise IndexFormatError(
                f"{index_dir}: built with model {meta['params']['model']} (id {meta['params']['model_id']}) "
                f"but {model_dir} is a different model; pass the same model path used to build the index"
            )
        return DenseBackend.load(
            index_dir,
            meta["fingerprint"],
            model_path=model_dir,
            mmap=mmap,
            params=DenseParams.from_recorded(meta["params"]),
        )
    raise IndexFormatError(f"{index_dir}: meta.json names unknown backend {meta['backend']!r}")


SERVE_TOKEN_ENV = "SEARCHRL_SERVE_TOKEN"  # what `searchrl serve` reads its token from, and clients too


@dataclass
class SearchConfig:
    """How a run reaches its search engine: a local index or a URL, plus cache and fault injection."""

    index: str | None = field(default=None, metadata={"help": "Local index directory (bm25 or dense)."})
    url: str | None = field(
        default=None, metadata={"help": "Retrieval server URL (instead of a local index)."}
    )
    corpus: str | None = field(
        default=None,
        metadata={"help": "Corpus JSONL to build 'index' from when that folder does not exist yet."},
    )
    index_backend: str = field(
        default="bm25", metadata={"help": "What to build from 'corpus': bm25 or dense."}
    )
    model_path: str | None = field(
        default=None,
        metadata={
            "help": "Dense index: the encoder's local folder it was built with (null: $SEARCHRL_DENSE_MODEL, "
            "else the bundled MiniLM)."
        },
    )
    protocol: str = field(
        default="search_r1", metadata={"help": "Server wire format: search_r1, flashrag, skyrl."}
    )
    token: str | None = field(
        default=None,
        metadata={
            "help": f"Bearer token for the server, if it wants one (null: ${SERVE_TOKEN_ENV}, if set)."
        },
    )
    connect_timeout: float = field(default=2.0, metadata={"help": "Seconds to wait for a connection."})
    read_timeout: float = field(default=30.0, metadata={"help": "Seconds to wait for an answer."})
    max_retries: int = field(default=3, metadata={"help": "Retries of transient failures (never of 4xx)."})
    cache: str | None = field(default=None, metadata={"help": "SQLite cache file; null for no cache."})
    cache_mode: str = field(
        default="read_write", metadata={"help": "off, read_write, or replay (snapshot only)."}
    )
    fault_seed: int = field(default=0, metadata={"help": "Seed of the fault-injection RNG."})
    fault_timeout_rate: float = field(default=0.0, metadata={"help": "Fraction of calls that time out."})
    fault_error_rate: float = field(default=0.0, metadata={"help": "Fraction of calls that fail."})
    fault_drop_rate: float = field(default=0.0, metadata={"help": "Fraction of queries that lose hits."})
    fault_shuffle_rate: float = field(
        default=0.0, metadata={"help": "Fraction of queries with shuffled hits."}
    )
    fault_latency_ms: float = field(default=0.0, metadata={"help": "Latency added to every call, in ms."})


def open_backend(cfg: SearchConfig | str | os.PathLike) -> Backend:
    """The one way to open a search engine: the backend a config (or an index directory) describes.

    Index (built from `corpus` first when the folder is missing) or URL, then faults (if any), then the
    cache on top. The cache sits outside the faults so that a replayed snapshot is fault-free and
    reproducible; faults apply to what the live backend answers.
    """
    if not isinstance(cfg, SearchConfig):
        cfg = SearchConfig(index=str(cfg))
    if bool(cfg.index) == bool(cfg.url) and cfg.cache_mode != "replay":
        raise ValueError("search config needs exactly one of 'index' (a local index dir) or 'url' (a server)")
    backend: Backend | None = None
    if cfg.index:
        backend = _open_or_build_index(cfg)
    elif cfg.url:
        backend = HTTPBackend(
            cfg.url,
            protocol=cfg.protocol,
            connect_timeout=cfg.connect_timeout,
            read_timeout=cfg.read_timeout,
            max_retries=cfg.max_retries,
            token=cfg.token if cfg.token is not None else (os.environ.get(SERVE_TOKEN_ENV) or None),
        )
    rates = (cfg.fault_timeout_rate, cfg.fault_error_rate, cfg.fault_drop_rate, cfg.fault_shuffle_rate)
    if backend is not None and (any(rates) or cfg.fault_latency_ms):
        backend = FaultInjectingBackend(
            backend,
            seed=cfg.fault_seed,
            latency_ms=cfg.fault_latency_ms,
            timeout_rate=cfg.fault_timeout_rate,
            error_rate=cfg.fault_error_rate,
            drop_rate=cfg.fault_drop_rate,
            shuffle_rate=cfg.fault_shuffle_rate,
        )
    if cfg.cache and cfg.cache_mode != "off":
        return CachedBackend(backend, cfg.cache, mode=cfg.cache_mode)
    if backend is None:
        raise ValueError("cache_mode 'replay' needs 'cache' (the snapshot file)")
    return backend


def _open_or_build_index(cfg: SearchConfig) -> Backend:
    assert cfg.index is not None
    if Path(cfg.index).exists() or not cfg.corpus:
        return load_index(cfg.index, model_path=cfg.model_path)
    if not Path(cfg.corpus).is_file():
        raise FileNotFoundError(
            f"{cfg.index}: no index there, and the corpus to build it from ({cfg.corpus}) does not exist; create the "
            "synthetic task with `searchrl data synth --size tiny --out runs/demo/data` (or `searchrl demo`)"
        )
    params = {"model_path": cfg.model_path} if cfg.index_backend == "dense" and cfg.model_path else {}
    return build_index(cfg.corpus, cfg.index, backend=cfg.index_backend, **params)
