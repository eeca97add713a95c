"""`benchmarks/bench_scale.py`'s pieces: the never-seen words of `--new-words` and the bytes-per-term slope."""

from __future__ import annotations

import json
import re
from pathlib import Path

from support.benchmarks import load_benchmark

bench = load_benchmark("bench_scale")


def test_fresh_words_are_distinct_whole_tokens_and_never_generator_words() -> None:
    words = [bench.fresh_word(i) for i in range(30_000)]
    assert len(set(words)) == len(words)
    assert all(re.fullmatch(r"qx[a-z]+", w) for w in words)  # one BM25 token each


def test_new_words_add_that_many_never_seen_words_to_every_passage(tmp_path: Path) -> None:
    bench.generate_corpus(tmp_path / "c.jsonl", 40, bench.REALQA, new_words=5)
    rows = [json.loads(line)["contents"].split() for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    fresh = [[w for w in words if w.startswith("qx")] for words in rows]  # no real or Zipf-tail word does
    assert [len(f) for f in fresh] == [5] * 40 and len({w for f in fresh for w in f}) == 200
    assert all(80 <= len(words) - 5 <= 120 for words in rows)


def test_per_term_is_the_slope_over_runs_of_one_size() -> None:
    def run(size: int, terms: int, build_mb: float, serve_mb: float, new_words: int) -> dict:
        bm25 = {"vocab_terms": terms, "build_peak_anon_mb": build_mb, "serve": {"rss_anon_mb": serve_mb}}
        return {"size": size, "new_words_per_passage": new_words, "bm25": bm25}

    runs = [run(300_000, 400_000, 500.0, 170.0, 0), run(300_000, 5_400_000, 1500.0, 770.0, 16)]
    runs.append(run(1_000_000, 410_000, 1100.0, 176.0, 0))  # alone at its size: no slope
    slopes = bench.per_term(runs)
    assert slopes == {
        "BM25 build peak anonymous RSS at 300000 passages (B per term)": round(1000 * 2**20 / 5_000_000, 1),
        "serving worker private RSS at 300000 passages (B per term)": round(600 * 2**20 / 5_000_000, 1),
    }
