"""`benchmarks/support_copy_probe.py`'s examples: what each copy objective labels, on the support smoke world."""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

from support.benchmarks import load_benchmark

from searchrl.demo.stages import StageRunner
from searchrl.demo.support import prepare_support_world
from searchrl.demo.support_config import support_smoke_config
from searchrl.sft.examples import IGNORE_INDEX

bench = load_benchmark("support_copy_probe")


@functools.cache
def smoke_world():
    tmp = tempfile.mkdtemp(prefix="searchrl-copy-probe-")
    cfg = support_smoke_config(out_dir=tmp)
    return cfg, prepare_support_world(cfg, Path(tmp), StageRunner(False))


def test_task_examples_label_the_digits_of_the_id_the_search_result_shows() -> None:
    cfg, world = smoke_world()
    tok, digits = world.tokenizer, bench.digit_ids(world.tokenizer)
    examples = bench.task_examples(world.demos, tok, digits, 40, 0, 512)
    task = [e for e in examples if e["labels"][-1] == IGNORE_INDEX]  # a span copy labels its last token
    assert 8 <= len(task) <= 32  # about half
    for e in task:
        labelled = [t for t in e["labels"] if t != IGNORE_INDEX]
        text = tok.decode(e["input_ids"])
        shown = re.findall(r"Order o-(\d+)\n", text)[0]  # the first result's id
        assert "".join(tok.decode([t]) for t in labelled) == shown
        assert '"name": "get_order"' in text.split("<tool_response>")[-1]  # the call after the result


def test_digit_spans_start_two_tokens_before_a_digit_run_and_the_probe_finds_every_call() -> None:
    cfg, world = smoke_world()
    digits = bench.digit_ids(world.tokenizer)
    for e in bench.span_examples(world.demos, digits, 20, 0, 512, digit_share=1.0):
        first = next(t for t in e["labels"] if t != IGNORE_INDEX)
        assert first in digits
    cases, demos = bench.id_cases(world, cfg, digits)
    where = [r for s in ("dev", "test") for r in world.rows(s) if r["type"] == "where"]
    assert len(demos) == len(where) and len(cases) == len(where)
    assert all(len(positions) == 5 for _, positions in cases)
