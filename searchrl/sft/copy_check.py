"""Did the warm start learn to copy? The share of demonstrations whose answer turn the policy reproduces.

What: `answer_copy_rate(policy, trajectories)` feeds each demonstration up to its answer turn (teacher
forcing: the expert's own tokens, never the policy's samples) and counts the demonstrations where the
policy's most likely next token is the expert's at every token of the answer turn. No sampling and no
gradient: it draws nothing from any random generator, so running it leaves a seeded run unchanged.

Why: on the synthetic demo the answer is a name copied out of an observation, and a tiny model trained from
scratch either forms that copy or it does not. Issue 25's seed 9 did not: its SFT ended at loss 0.24 (the
other nine seeds 0.02-0.04) answering every question of a kind with one memorised name ("Bralgis Company"
for every employer), test exact match 0.00, and PPO, with no answer reward anywhere in its batches, had
nothing to learn from. On its demonstrations the rate is 0.00; on seeds 0-8 it is 0.91-0.996 (256
demonstrations each). The demo measures it after SFT (`summary.json`'s `sft.answer_copy_rate`) and says
loudly when the warm start did not learn to copy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import PreTrainedModel, TrainerCallback

from searchrl.common.trajectory import Trajectory
from searchrl.sft.examples import IGNORE_INDEX, action_turns, answer_turn_example, sft_example

logger = logging.getLogger("searchrl.sft")

# Below this the warm start has not learned to copy (seed 9: 0.00; seeds 0-8: 0.91 and above).
MIN_ANSWER_COPY_RATE = 0.5

# What the copy gate measures: the answer turn (`answer_copy_rate`), or every turn after an observation
# (`reading_copy_rate`: also the calls whose arguments come from a result, e.g. an order id).
COPY_GATE_TURNS = ("answer", "reading")


def answer_copy_rate(
    policy: PreTrainedModel,
    trajectories: Sequence[Trajectory],
    max_examples: int = 256,
    batch_size: int = 16,
) -> float:
    """The share of the last `max_examples` demonstrations whose whole answer turn (the last action turn,
    its closing tokens included) is the policy's greedy choice at every token, given the expert's context."""
    examples = [answer_turn_example(t) for t in list(trajectories)[-max_examples:]]
    if not examples:
        raise ValueError("answer_copy_rate needs at least one demonstration")
    return labelled_copy_rate(policy, examples, batch_size)


@torch.no_grad()
def labelled_copy_rate(
    policy: PreTrainedModel, examples: Sequence[dict[str, list[int]]], batch_size: int = 16
) -> float:
    """The share of `examples` (pre-tokenised `input_ids` / `labels`) whose every labelled token is the policy's
    greedy choice, teacher-forced: an answer turn, or a task's copy example (an order id, a status)."""
    if not examples:
        raise ValueError("labelled_copy_rate needs at least one example")
    device = next(policy.parameters()).device
    copied = 0
    with _evaluating(policy):
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            width = max(len(e["input_ids"]) for e in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            labels = torch.full((len(chunk), width), IGNORE_INDEX, dtype=torch.long)
            attention = torch.zeros(len(chunk), width, dtype=torch.long)
            for row, example in enumerate(chunk):  # right padding: positions stay those of the rollout
                n = len(example["input_ids"])
                ids[row, :n] = torch.tensor(example["input_ids"])
                labels[row, :n] = torch.tensor(example["labels"])
                attention[row, :n] = 1
            logits = policy(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
            predicted = logits[:, :-1].argmax(-1).cpu()
            target = labels[:, 1:]
            scored = target != IGNORE_INDEX
            wrong = (predicted != target) & scored
            copied += int((~wrong.any(dim=1) & scored.any(dim=1)).sum())
    return copied / len(examples)


def _turns_reproduced(
    policy: PreTrainedModel, trajectories: Sequence[Trajectory]
) -> Iterator[list[tuple[str, bool]]]:
    """Per demonstration, teacher-forced: (kind, reproduced) of each action turn (`_turn_kind`), where
    reproduced means every token of the turn is the policy's greedy choice given the expert's context."""
    device = next(policy.parameters()).device
    for traj in trajectories:
        ids = sft_example(traj)["input_ids"]
        batch = torch.tensor([ids], device=device)
        predicted = (
            policy(input_ids=batch, attention_mask=torch.ones_like(batch)).logits[0, :-1].argmax(-1).cpu()
        )
        target = torch.tensor(ids[1:])
        calls = {record.turn_index for record in traj.tool_calls}
        yield [
            (
                _turn_kind(index, calls),
                bool((predicted[start - 1 : end - 1] == target[start - 1 : end - 1]).all()),
            )
            for index, (start, end) in enumerate(action_turns(traj.action_mask[: len(ids)]))
        ]


@torch.no_grad()
def turn_copy_rates(
    policy: PreTrainedModel, trajectories: Sequence[Trajectory], max_examples: int = 256
) -> dict[str, dict[str, float]]:
    """Teacher-forced, per kind of action turn, over the last `max_examples` demonstrations: the share of turns
    whose every token is the policy's greedy choice given the expert's context, and how many turns were
    scored. Kinds: `first_call` (a tool call before any observation: its arguments come from the question),
    `call_after_observation` (a tool call after one: e.g. an order id read out of a search result) and
    `answer` (a turn without a tool call). The answer-copy rate says whether answers are read; a task whose
    calls also read observations (issue 26's support demo) needs the second figure too. Draws no random number.
    """
    right: dict[str, int] = {}
    total: dict[str, int] = {}
    with _evaluating(policy):
        for turns in _turns_reproduced(policy, list(trajectories)[-max_examples:]):
            for kind, reproduced in turns:
                total[kind] = total.get(kind, 0) + 1
                right[kind] = right.get(kind, 0) + int(reproduced)
    return {kind: {"rate": right[kind] / total[kind], "turns": float(total[kind])} for kind in sorted(total)}


@torch.no_grad()
def reading_copy_rate(
    policy: PreTrainedModel, trajectories: Sequence[Trajectory], max_examples: int = 256
) -> float:
    """Of the last `max_examples` demonstrations that read an observation, the share whose every turn after
    the first (a call whose arguments come from a result, the answer) the policy reproduces token for token,
    teacher-forced. Stricter than the answer-copy rate: the copy gate's `reading` mode."""
    with _evaluating(policy):
        reading = [turns[1:] for turns in _turns_reproduced(policy, list(trajectories)[-max_examples:])]
    reading = [after for after in reading if after]  # a demonstration without an observation reads nothing
    if not reading:
        raise ValueError("reading_copy_rate needs a demonstration with a turn after an observation")
    return sum(all(ok for _, ok in after) for after in reading) / len(reading)


@contextmanager
def _evaluating(policy: PreTrainedModel) -> Iterator[None]:
    was_training = policy.training
    policy.eval()
    try:
        yield
    finally:
        policy.train(was_training)


def _turn_kind(index: int, call_turns: set[int]) -> str:
    if index not in call_turns:
        return "answer"
    return "first_call" if index == 0 else "call_after_observation"


def warn_if_not_copying(rate: float, threshold: float = MIN_ANSWER_COPY_RATE) -> bool:
    """Log a warning that names the consequence and the remedy when `rate` is below `threshold`; True then."""
    if rate >= threshold:
        return False
    logger.warning(
        "the SFT warm start did not learn to copy answers out of observations: it reproduces %.2f of the "
        "demonstrations' answer turns (below %.2f). PPO will find no answer reward to learn from. Train the "
        "warm start longer (sft.max_steps) or with another seed before PPO; docs/demo.md, 'Seeds'.",
        rate, threshold,
    )  # fmt: skip
    return True


class CopyGate(TrainerCallback):
    """The copy gate of the warm start's whole-demonstration phase (`SFTWarmStartConfig.copy_gate`).

    At `at_step`, the step where warmup_stable_decay would start to decay the learning rate, it measures the
    answer-copy rate on the last demonstrations. At or above `rate` nothing happens: the phase goes on as it
    would without the gate (the measurement draws no random number, so a seeded run is the same run). Below
    it, the phase stops there and `run_sft` goes on at the stable learning rate until the policy copies (or
    the budget is spent), then decays: copying forms after a number of stable steps that differs by seed, and
    a decayed learning rate is too small to form it (issue 25's seed 9: no answer copied after 750 stable
    steps, nor after 300 more from its decayed end).
    """

    def __init__(
        self, trajectories: Sequence[Trajectory], at_step: int, rate: float, turns: str = "answer"
    ) -> None:
        if turns not in COPY_GATE_TURNS:
            raise ValueError(f"turns: one of {COPY_GATE_TURNS}, got {turns!r}")
        self.trajectories = trajectories
        self.at_step = at_step
        self.rate = rate
        self.turns = turns
        self.history: list[dict[str, float]] = []  # {"step": whole-phase step, self.key: r}

    @property
    def key(self) -> str:
        """The rate's name in `history`: answer_copy_rate or reading_copy_rate."""
        return f"{self.turns}_copy_rate"

    @property
    def passed(self) -> bool:
        return bool(self.history) and self.history[-1][self.key] >= self.rate

    @property
    def stopped_early(self) -> bool:
        """The gate was measured and failed: `run_sft` must extend the stable phase, then decay."""
        return bool(self.history) and not self.passed

    def measure(self, policy: Any, step: int) -> float:
        measure = answer_copy_rate if self.turns == "answer" else reading_copy_rate
        rate = measure(policy, self.trajectories)
        self.history.append({"step": float(step), self.key: rate})
        logger.info("copy gate at whole-phase step %d: %s %.3f (gate %.2f)", step, self.key, rate, self.rate)
        return rate

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        measured_now = state.global_step == self.at_step and not self.history
        if measured_now and self.measure(model, state.global_step) < self.rate:
            control.should_training_stop = True
