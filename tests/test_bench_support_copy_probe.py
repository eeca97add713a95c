"""`benchmarks/support_copy_probe.py`'s own pieces on the support smoke world: the digit-run spans and the probe's
cases (its `task` objective is the library's, tested in test_sft_warm_start.py and test_support_reading.py)."""

from __future__ import annotations

import dataclasses
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
        # The names split (one digit a token), where an order id is five digit tokens (the default's reading
        # split writes it in two-digit tokens).
        cfg = dataclasses.replace(support_smoke_config(out_dir=tmp), tokenizer_split="names")
        world = prepare_support_world(cfg, Path(tmp), StageRunner(False))
        digits = bench.digit_ids(world.tokenizer)
        for e in bench.span_examples(world.demos, digits, 20, 0, 512, digit_share=1.0):
            first = next(t for t in e["labels"] if t != IGNORE_INDEX)
            assert first in digits
        cases, demos = bench.id_cases(world, cfg, digits)
        where = [r for s in ("dev", "test") for r in world.rows(s) if r["type"] == "where"]
        assert len(demos) == len(where) and len(cases) == len(where)
        assert all(len(positions) == 5 for _, positions in cases)


def test_shuffled_spans_copy_a_permuted_window_and_mix_in_reading_examples() -> None:
    from searchrl.sft.examples import copy_tokens
    from searchrl.sft.support_expert import reading_examples

    with tempfile.TemporaryDirectory() as tmp:
        world = prepare_support_world(support_smoke_config(out_dir=tmp), Path(tmp), StageRunner(False))
    reading = [copy_tokens(e) for e in reading_examples(world.tokenizer, world.demos, ["order_id", "answer"])]
    examples = bench.shuffled_span_examples(world.demos, 200, 0, 64, reading, task_share=0.25)
    from_reading = [e for e in examples if e in reading]
    assert 20 <= len(from_reading) <= 80  # about a quarter
    for e in (e for e in examples if e not in reading):
        labelled = [i for i, t in enumerate(e["labels"]) if t != IGNORE_INDEX]
        context = e["input_ids"][: labelled[0] - 2]
        assert len(context) <= 64 and e["input_ids"][labelled[0] - 2 :] == _span_in(context, e)


def _span_in(context: list[int], example: dict) -> list[int]:
    """The copied span (cue included) as it stands in the context: the example's tail must occur there."""
    tail = example["input_ids"][len(context) :]
    for at in range(len(context) - len(tail) + 1):
        if context[at : at + len(tail)] == tail:
            return tail
    raise AssertionError("the span is not a stretch of its context")


def test_exact_share_needs_every_labelled_token_right() -> None:
    import torch

    class Oracle:  # greedy choice at p-1 is the token at p: every copy right
        def __init__(self, shift: int) -> None:
            self.shift = shift

        def __call__(self, input_ids: torch.Tensor) -> object:
            ids = input_ids[0]
            target = torch.roll(ids, -self.shift)
            logits = torch.nn.functional.one_hot(target, num_classes=int(ids.max()) + 1).float()
            return type("Out", (), {"logits": logits[None]})()

    examples = [{"input_ids": [5, 6, 7, 8], "labels": [IGNORE_INDEX, IGNORE_INDEX, 7, 8]}]
    assert bench.exact_share(Oracle(1), examples) == 1.0
    assert bench.exact_share(Oracle(0), examples) == 0.0
