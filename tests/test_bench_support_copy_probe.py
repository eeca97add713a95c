"""`benchmarks/support_copy_probe.py`'s own pieces on the support smoke world: the digit-run spans and the probe's
cases (its `task` objective is the library's, tested in test_sft_warm_start.py and test_support_reading.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from support.benchmarks import load_benchmark

from searchrl.demo.stages import StageRunner
from searchrl.demo.support import prepare_support_world
from searchrl.demo.support_config import support_smoke_config
from searchrl.sft.examples import IGNORE_INDEX

bench = load_benchmark("support_copy_probe")


def test_digit_spans_start_two_tokens_before_a_digit_run_and_the_probe_finds_every_call() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = support_smoke_config(out_dir=tmp)
        world = prepare_support_world(cfg, Path(tmp), StageRunner(False))
        digits = bench.digit_ids(world.tokenizer)
        for e in bench.span_examples(world.demos, digits, 20, 0, 512, digit_share=1.0):
            first = next(t for t in e["labels"] if t != IGNORE_INDEX)
            assert first in digits
        cases, demos = bench.id_cases(world, cfg, digits)
        where = [r for s in ("dev", "test") for r in world.rows(s) if r["type"] == "where"]
        assert len(demos) == len(where) and len(cases) == len(where)
        assert all(len(positions) == 5 for _, positions in cases)
