"""Corpus loading: both row formats, every error names file + line, hashing, and the DocStore."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchrl.search.corpus import (
    CorpusError,
    DocStore,
    Document,
    corpus_hash,
    join_search_r1_contents,
    load_corpus,
    split_search_r1_contents,
)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_both_row_formats(tmp_path):
    p = _write(
        tmp_path / "c.jsonl",
        [
            json.dumps({"id": 1, "title": "Ours", "contents": "body text"}),
            json.dumps({"id": "sr", "contents": '"Wiki Title"\nfirst line\nsecond line'}),
            json.dumps({"id": "bare", "contents": "no title line"}),
        ],
    )
    docs = load_corpus(p)
    assert docs == [
        Document("1", "Ours", "body text"),
        Document("sr", "Wiki Title", "first line\nsecond line"),
        Document("bare", "", "no title line"),
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"title": "t", "contents": "x"}', "missing field 'id'"),
        ('{"id": "a", "title": "t"}', "missing field 'contents'"),
        ('{"id": "a", "contents": 5}', "'contents' must be a string"),
        ('{"id": "a", "title": 3, "contents": "x"}', "'title' must be a string"),
        ('{"id": "a", "contents": "x"', "invalid JSON"),
        ('["a", "b"]', "expected a JSON object"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, line, expected):
    p = _write(tmp_path / "bad.jsonl", [json.dumps({"id": "ok", "contents": "fine"}), line])
    with pytest.raises(CorpusError) as e:
        load_corpus(p)
    assert f"{p}:2" in str(e.value)
    assert expected in str(e.value)


def test_duplicate_ids_missing_file_and_empty_corpus(tmp_path):
    dup = _write(tmp_path / "dup.jsonl", ['{"id": "a", "contents": "x"}', '{"id": "a", "contents": "y"}'])
    with pytest.raises(CorpusError, match="duplicate document id 'a'"):
        load_corpus(dup)
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path / "nope.jsonl")
    empty = _write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(CorpusError, match="no documents"):
        load_corpus(empty)


def test_gzip_and_parquet_load_the_same_documents_with_the_same_hash(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": f"d{i}", "title": f"T{i}", "contents": f"text {i} é"} for i in range(5)]
    plain = _write(tmp_path / "c.jsonl", [json.dumps(r) for r in rows])
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    a, b, c = load_corpus(plain), load_corpus(gz), load_corpus(parquet)
    assert a == b == c
    assert corpus_hash(a) == corpus_hash(b) == corpus_hash(c)
    changed = [*a[:-1], Document(a[-1].id, a[-1].title, a[-1].text + "!")]
    assert corpus_hash(changed) != corpus_hash(a)


@given(title=st.text().filter(lambda t: "\n" not in t), text=st.text())
def test_search_r1_contents_round_trip(title, text):
    assert split_search_r1_contents(join_search_r1_contents(title, text)) == (title, text)


_docs = st.lists(
    st.builds(Document, st.text(min_size=1, max_size=8), st.text(max_size=10), st.text(max_size=40)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(docs=_docs, in_memory=st.booleans())
def test_docstore_round_trip(tmp_path_factory, docs, in_memory):
    d = tmp_path_factory.mktemp("store")
    DocStore.write(d, docs)
    store = DocStore(d, memory_limit_bytes=1 << 30 if in_memory else 0)
    assert store.in_memory is in_memory
    assert len(store) == len(docs)
    assert [store.get(i) for i in range(len(docs))] == docs
    import numpy as np

    positions = np.array([[i, 0] for i in range(len(docs))])
    ids, titles, texts = store.columns(positions)
    assert ids == [[docs[i].id, docs[0].id] for i in range(len(docs))]
    assert texts[-1][0] == docs[-1].text
