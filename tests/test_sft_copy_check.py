"""The warm start's copy check (`searchrl.sft.copy_check`): the answer-copy rate counts the demonstrations
whose answer turn the policy reproduces token for token, leaves the random generators alone, and tells a
policy that copies from one that answers every question with one memorised name (issue 25's seed 9)."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutput

from searchrl.common.trajectory import ToolCallRecord, Trajectory
from searchrl.sft.copy_check import answer_copy_rate, reading_copy_rate, turn_copy_rates

VOCAB = 32


def demo(tid: str, answer: list[int]) -> Trajectory:
    """Prompt (mask 0), a tool call (mask 1), an observation holding the answer (mask 0), the answer turn."""
    prompt, call, observation = [1, 2, 3], [4, 5], [6, *answer, 7]
    ids = prompt + call + observation + answer + [8]
    mask = [0] * 3 + [1] * 2 + [0] * len(observation) + [1] * (len(answer) + 1)
    return Trajectory(
        id=tid, question_id=tid, question="q", golds=["x"], input_ids=ids, action_mask=mask,
        logprobs=[0.0] * len(ids), prompt_length=3,
    )  # fmt: skip


class Oracle(torch.nn.Module):
    """Predicts each demonstration's next token (it knows them), except the answer tokens in `wrong`."""

    def __init__(self, demos: list[Trajectory], wrong: set[int] = frozenset()) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.next = {
            tuple(d.input_ids[: i + 1]): d.input_ids[i + 1]
            for d in demos
            for i in range(len(d.input_ids) - 1)
        }
        self.wrong = wrong

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> CausalLMOutput:
        logits = torch.zeros(*input_ids.shape, VOCAB)
        for row in range(input_ids.shape[0]):
            n = int(attention_mask[row].sum())
            for i in range(n):
                token = self.next.get(tuple(input_ids[row, : i + 1].tolist()), 0)
                logits[row, i, 0 if token in self.wrong else token] = 1.0
        return CausalLMOutput(logits=logits)


DEMOS = [demo("a", [20, 21]), demo("b", [22]), demo("c", [23, 24, 25]), demo("d", [26])]


def test_a_policy_that_copies_every_answer_scores_one():
    assert answer_copy_rate(Oracle(DEMOS), DEMOS, batch_size=3) == 1.0


def test_one_wrong_answer_token_fails_that_demonstration_only():
    # 24 is the middle of c's answer: c fails, the others copy (padding of shorter rows never counts).
    assert answer_copy_rate(Oracle(DEMOS, wrong={24}), DEMOS, batch_size=4) == 0.75


def test_a_memorised_answer_scores_zero():
    class SameNameForEveryone(Oracle):
        def forward(self, input_ids, attention_mask):
            out = super().forward(input_ids, attention_mask)
            answer_start = (
                input_ids == 7
            ).nonzero()  # the position after the observation: one memorised name
            for row, col in answer_start.tolist():
                out.logits[row, col] = 0.0
                out.logits[row, col, 30] = 1.0
            return out

    assert answer_copy_rate(SameNameForEveryone(DEMOS), DEMOS) == 0.0


def test_only_the_last_demonstrations_are_read_and_the_generators_are_left_alone():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    model = Oracle(DEMOS, wrong={20})
    model.train()
    assert answer_copy_rate(model, DEMOS, max_examples=3) == 1.0  # a (the one it gets wrong) is not read
    assert answer_copy_rate(model, DEMOS, max_examples=4) == 0.75
    assert torch.equal(torch.get_rng_state(), before)
    assert model.training, "the policy's train/eval mode is restored"


def lookup_demo(tid: str, order_id: int, status: int) -> Trajectory:
    """search (turn 0), an observation naming an order id, get_order(that id) (turn 1), the record, the answer."""
    prompt, search, shown = [1, 2, 3], [4, 5], [6, order_id, 7]
    lookup, record, answer = [9, order_id], [6, status, 7], [status, 8]
    ids = prompt + search + shown + lookup + record + answer
    mask = [0] * 3 + [1] * 2 + [0] * 3 + [1] * 2 + [0] * 3 + [1] * 2
    calls = [ToolCallRecord("search", {"query": "q"}, turn_index=0),
             ToolCallRecord("get_order", {"order_id": str(order_id)}, turn_index=1)]  # fmt: skip
    return Trajectory(
        id=tid, question_id=tid, question="q", golds=["x"], input_ids=ids, action_mask=mask,
        logprobs=[0.0] * len(ids), prompt_length=3, tool_calls=calls,
    )  # fmt: skip


def test_turn_copy_rates_tell_an_id_read_wrong_from_an_answer_read_right():
    """Issue 26's support warm start: answers read, order ids out of search results not: the per-turn rates
    show what the answer-copy rate alone hides, and nothing random is drawn."""
    demos = [lookup_demo("a", 20, 25), lookup_demo("b", 21, 26), lookup_demo("c", 22, 27)]
    before = torch.get_rng_state()
    rates = turn_copy_rates(Oracle(demos, wrong={21}), demos)
    assert rates == {
        "answer": {"rate": 1.0, "turns": 3.0},
        "call_after_observation": {"rate": 2 / 3, "turns": 3.0},  # b's id, 21, is not copied
        "first_call": {"rate": 1.0, "turns": 3.0},
    }
    assert answer_copy_rate(Oracle(demos, wrong={21}), demos) == 1.0  # blind to the id
    assert turn_copy_rates(Oracle(demos, wrong={26}), demos, max_examples=1)["answer"]["rate"] == 1.0
    assert torch.equal(torch.get_rng_state(), before)


def test_the_reading_rate_counts_a_demonstration_only_when_every_turn_after_an_observation_is_reproduced():
    demos = [lookup_demo("a", 20, 25), lookup_demo("b", 21, 26), lookup_demo("c", 22, 27)]
    assert reading_copy_rate(Oracle(demos), demos) == 1.0
    assert reading_copy_rate(Oracle(demos, wrong={21}), demos) == 2 / 3  # b's id: its call, not its answer
    assert reading_copy_rate(Oracle(demos, wrong={27}), demos) == 2 / 3  # c's answer
    only_answer = Trajectory(id="y", question_id="y", question="q", golds=["x"], input_ids=[1, 2, 29, 8],
                             action_mask=[0, 0, 1, 1], logprobs=[0.0] * 4, prompt_length=2)  # fmt: skip
    mixed = [*demos, only_answer]
    assert reading_copy_rate(Oracle(mixed, wrong={21}), mixed) == 2 / 3  # y reads nothing
    with pytest.raises(ValueError, match="after an observation"):
        reading_copy_rate(Oracle([only_answer]), [only_answer])
