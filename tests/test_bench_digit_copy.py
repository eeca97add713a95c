"""`benchmarks/digit_copy.py`'s pieces: what its toy asks the model to copy, and how a copy is scored."""

from __future__ import annotations

import random
import re

import pytest
import torch
from support.benchmarks import load_benchmark

bench = load_benchmark("digit_copy")
tok = bench.toy_tokenizer()


def test_the_labels_are_the_ids_digits_one_token_each_after_the_call() -> None:
    for distractors, prefix in ((False, 0), (True, 12)):
        ids, labels = bench.example(tok, random.Random(3), prefix_words=prefix, distractors=distractors)
        text = tok.decode(ids)
        oid = re.search(r"Order o-(\d{5})\n", text).group(1)
        assert text.endswith(bench.CALL + oid)  # the id again, right after the call's start
        assert [tok.decode([t]) for t in labels if t != -100] == list(oid)
        assert labels[: len(ids) - 5] == [-100] * (len(ids) - 5)
        assert len(re.findall(r"\d", text)) > 10 if distractors else len(re.findall(r"\d", text)) == 11
        assert len(text.split("[1]")[0].split()) == prefix


def test_held_out_scores_count_whole_ids_and_digits() -> None:
    class Copier(torch.nn.Module):
        """Predicts the next token right except at one chosen position."""

        def __init__(self, ids: torch.Tensor, wrong: tuple[int, int]) -> None:
            super().__init__()
            self.ids, self.wrong = ids, wrong

        def forward(self, input_ids, attention_mask):
            logits = torch.zeros(*input_ids.shape, len(tok))
            nxt = torch.roll(self.ids, -1, dims=1)
            logits.scatter_(2, nxt.unsqueeze(-1), 1.0)
            row, col = self.wrong
            logits[row, col] = 0
            logits[row, col, (nxt[row, col] + 1) % len(tok)] = 2.0
            return type("Out", (), {"logits": logits})()

    test = bench.batch(tok, random.Random(0), 4)
    ids, labels, _ = test
    first_digit = int((labels[1] != -100).nonzero()[0])
    scores = bench.held_out_scores(Copier(ids, (1, first_digit - 1)), test)
    assert scores == pytest.approx({"exact": 0.75, "digit_accuracy": 19 / 20})
