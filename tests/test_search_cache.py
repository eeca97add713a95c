"""The SQLite cache: replay with the backend switched off, in-batch de-duplication, key normalisation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchrl.search.base import Hit
from searchrl.search.cache import CachedBackend, CacheMiss, cache_key, normalize_query


class CountingBackend:
    """Wraps a real backend and records every batch it is actually asked."""

    def __init__(self, inner):
        self.inner = inner
        self.batches: list[list[str]] = []

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.batches.append(list(queries))
        return self.inner.search(queries, k)


QUERIES = ["capital of Veland", "rivers", "Glass  Harbor", "Glass Harbor", "rivers", "no such words zzz"]


def test_replay_returns_identical_results_with_the_backend_switched_off(toy_bm25, tmp_path):
    path = tmp_path / "snap.sqlite"
    recorder = CachedBackend(CountingBackend(toy_bm25), path, mode="read_write")
    recorded = recorder.search(QUERIES, 3)
    assert recorded == toy_bm25.search([normalize_query(q) for q in QUERIES], 3)
    recorder.close()
    replay = CachedBackend(None, path, mode="replay")  # no backend at all
    assert replay.fingerprint == toy_bm25.fingerprint
    assert replay.search(QUERIES, 3) == recorded
    assert replay.search(list(reversed(QUERIES)), 3) == list(reversed(recorded))
    with pytest.raises(CacheMiss, match="no result for 1 query at k=3.*'never recorded'"):
        replay.search(["rivers", "never recorded"], 3)
    with pytest.raises(CacheMiss, match="k=5"):
        replay.search(["rivers"], 5)  # k is part of the key


def test_identical_queries_in_a_batch_are_searched_once_and_hits_come_from_the_cache(toy_bm25, tmp_path):
    counting = CountingBackend(toy_bm25)
    cached = CachedBackend(counting, tmp_path / "c.sqlite", mode="read_write")
    first = cached.search(QUERIES, 3)
    assert counting.batches == [["capital of Veland", "rivers", "Glass Harbor", "no such words zzz"]]
    assert first[2] == first[3] and first[1] == first[4]
    again = cached.search(QUERIES + ["Tirrow"], 3)
    assert again[: len(QUERIES)] == first
    assert counting.batches[-1] == ["Tirrow"]  # only the new query reached the backend
    assert cached.stats["backend_queries"] == 5 and cached.stats["deduplicated"] == 4
    # A fresh instance on the same file reads what the first wrote.
    counting2 = CountingBackend(toy_bm25)
    assert CachedBackend(counting2, tmp_path / "c.sqlite").search(["rivers"], 3) == [first[1]]
    assert counting2.batches == []


def test_off_mode_still_deduplicates_and_never_writes(toy_bm25, tmp_path):
    counting = CountingBackend(toy_bm25)
    off = CachedBackend(counting, tmp_path / "off.sqlite", mode="off")
    off.search(["rivers", "rivers "], 2)
    off.search(["rivers"], 2)
    assert counting.batches == [["rivers"], ["rivers"]]
    assert not (tmp_path / "off.sqlite").exists()


def test_replay_is_read_only_and_modes_are_checked(toy_bm25, tmp_path):
    with pytest.raises(FileNotFoundError, match="replay cache not found"):
        CachedBackend(None, tmp_path / "missing.sqlite", mode="replay")
    with pytest.raises(ValueError, match="cache mode 'sometimes' is unknown"):
        CachedBackend(toy_bm25, tmp_path / "x.sqlite", mode="sometimes")
    with pytest.raises(ValueError, match="needs a backend"):
        CachedBackend(None, tmp_path / "x.sqlite", mode="read_write")
    CachedBackend(toy_bm25, tmp_path / "two.sqlite").search(["rivers"], 1)
    # Two fingerprints in one file: replay must be told which one.
    other = CountingBackend(toy_bm25)
    other.__class__ = type("Other", (CountingBackend,), {"fingerprint": property(lambda self: "other-index")})
    CachedBackend(other, tmp_path / "two.sqlite").search(["rivers"], 1)
    with pytest.raises(ValueError, match="several index fingerprints"):
        CachedBackend(None, tmp_path / "two.sqlite", mode="replay")
    assert CachedBackend(None, tmp_path / "two.sqlite", mode="replay", fingerprint="other-index").search(
        ["rivers"], 1
    )


_spaces = st.text(alphabet=" \t\n\u00a0\u3000", max_size=3)


@given(q=st.text(max_size=30))
def test_normalisation_is_idempotent(q):
    assert normalize_query(normalize_query(q)) == normalize_query(q)


@given(
    words=st.lists(st.text(alphabet="abcXYZé1", min_size=1, max_size=6), min_size=1, max_size=5),
    pads=st.lists(_spaces, min_size=6, max_size=6),
)
def test_keys_ignore_white_space_but_not_words_case_k_or_index(words, pads):
    canonical = " ".join(words)
    spaced = pads[0] + "".join(w + (p or " ") for w, p in zip(words, pads[1:] * 2, strict=False)) + pads[-1]
    assert cache_key("fp", spaced, 3) == cache_key("fp", canonical, 3)
    assert cache_key("fp", canonical, 3) != cache_key("fp", canonical, 4)
    assert cache_key("fp", canonical, 3) != cache_key("other", canonical, 3)
    assert cache_key("fp", canonical, 3) != cache_key("fp", canonical + "q", 3)
    if canonical.lower() != canonical:
        assert cache_key("fp", canonical, 3) != cache_key("fp", canonical.lower(), 3)
