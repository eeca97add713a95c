"""SFT examples from trajectories: the ids exactly as the rollout wrote them, labels on the policy's own tokens.

`sft_example` labels every action token (-100 elsewhere: the prompt, observations and the chat template's
glue carry no loss); `first_turn_example` and `answer_turn_example` cut a trajectory to one of the warm
start's curriculum phases (`searchrl.sft.warm_start`, module docstring); `sft_dataset` builds a
`datasets.Dataset` of them. `span_copy_example` / `copy_pretraining_dataset` are the phase before them:
copying a span of the context again, cued by its first tokens (what a pretrained model can already do).
Kept apart from the trainer so that what reads a demonstration the same way (the copy check,
`searchrl.sft.copy_check`) needs no trainer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from datasets import Dataset, concatenate_datasets

from searchrl.common.trajectory import Trajectory

IGNORE_INDEX = -100
# A span-copy example gives the first SPAN_CUE tokens of its span and trains at least two more.
SPAN_CUE = 2
MIN_SPAN = SPAN_CUE + 2


def sft_example(traj: Trajectory, max_length: int | None = None) -> dict[str, list[int]]:
    """One pre-tokenised example: the trajectory's ids, labels only on action tokens (-100 elsewhere)."""
    traj.validate()
    ids = [int(i) for i in traj.input_ids]
    labels = [tok if m else IGNORE_INDEX for tok, m in zip(ids, traj.action_mask, strict=True)]
    if max_length is not None and len(ids) > max_length:
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "labels": labels}


def action_turns(action_mask: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of action tokens, in order: the policy's turns."""
    turns: list[tuple[int, int]] = []
    for i, m in enumerate(action_mask):
        if m and (i == 0 or not action_mask[i - 1]):
            turns.append((i, i + 1))
        elif m:
            turns[-1] = (turns[-1][0], i + 1)
    return turns


def first_turn_example(traj: Trajectory) -> dict[str, list[int]]:
    """The trajectory cut after its first action turn: prompt + first action, labels on that turn only."""
    example = sft_example(traj)
    turns = action_turns(traj.action_mask)
    if not turns:
        return example
    end = turns[0][1]
    return {"input_ids": example["input_ids"][:end], "labels": example["labels"][:end]}


def answer_turn_example(traj: Trajectory, max_length: int | None = None) -> dict[str, list[int]]:
    """The trajectory up to the end of its last action turn, labels on that turn only (the answer)."""
    example = sft_example(traj, max_length)
    turns = action_turns(traj.action_mask[: len(example["input_ids"])])
    if not turns:
        return example
    start, end = turns[-1]
    labels = [IGNORE_INDEX] * start + example["labels"][start:end]
    return {"input_ids": example["input_ids"][:end], "labels": labels}


def sft_dataset(
    trajectories: Sequence[Trajectory],
    max_length: int | None = None,
    first_turn_only: bool = False,
    answer_turn_only: bool = False,
) -> Dataset:
    """A `datasets.Dataset` of `sft_example`s (or `first_turn_example`s, or `answer_turn_example`s);
    trajectories without a trainable token are refused."""
    if first_turn_only and answer_turn_only:
        raise ValueError("first_turn_only and answer_turn_only exclude each other: choose one")
    examples = []
    for traj in trajectories:
        if first_turn_only:
            example = first_turn_example(traj)
        elif answer_turn_only:
            example = answer_turn_example(traj, max_length)
        else:
            example = sft_example(traj, max_length)
        if all(label == IGNORE_INDEX for label in example["labels"]):
            raise ValueError(
                f"trajectory {traj.id} has no action token within max_length={max_length}: nothing to train; "
                "raise max_length or drop the trajectory"
            )
        examples.append(example)
    if not examples:
        raise ValueError("warm start needs at least one trajectory; generate demonstrations first")
    return Dataset.from_list(examples)


def span_copy_example(
    ids: Sequence[int], rng: random.Random, window: int = 128, max_span: int = 16, cue: int = SPAN_CUE
) -> dict[str, list[int]]:
    """A window of `ids`, then a span of that window again: labels on the span after its first `cue` tokens.

    The span (`cue` + 2 to `max_span` tokens, from anywhere in the window) can only be continued by finding
    where its cue stood and reading on from there: the induction circuit that copying an order id or a
    date out of an observation needs, and that a model trained from scratch does not have.
    """
    if min(len(ids), window) < cue + 2:
        raise ValueError(
            f"a span-copy example needs at least {cue + 2} tokens and a window as long, got {len(ids)} tokens "
            f"and a window of {window}"
        )
    start = rng.randrange(0, max(1, len(ids) - window + 1))
    context = [int(i) for i in ids[start : start + window]]
    length = rng.randint(cue + 2, max(cue + 2, min(max_span, len(context))))
    at = rng.randrange(0, len(context) - length + 1)
    span = context[at : at + length]
    return {"input_ids": context + span, "labels": [IGNORE_INDEX] * (len(context) + cue) + span[cue:]}


def copy_pretraining_dataset(
    trajectories: Sequence[Trajectory],
    num_examples: int,
    seed: int = 0,
    window: int = 128,
    task_examples: Sequence[dict[str, list[int]]] = (),
    task_share: float = 0.0,
) -> Dataset:
    """`num_examples` span-copy examples over windows of the trajectories' tokens (prompts, actions and
    observations alike), drawn with `seed`; each is, with probability `task_share`, one of `task_examples`
    instead (the task's own copies, e.g. an order id read out of a search result into a call)."""
    usable = [t for t in trajectories if len(t.input_ids) >= MIN_SPAN]
    if not usable:
        raise ValueError(
            f"copy pretraining needs trajectories of at least {MIN_SPAN} tokens; generate demonstrations first"
        )
    if task_share > 0 and not task_examples:
        raise ValueError(f"task_share={task_share} needs task_examples to draw from")
    rng = random.Random(seed)
    examples = []
    for _ in range(num_examples):
        if task_share > 0 and rng.random() < task_share:
            examples.append(copy_tokens(rng.choice(task_examples)))
        else:
            examples.append(span_copy_example(rng.choice(usable).input_ids, rng, window))
    return Dataset.from_list(examples)


def copy_tokens(example: dict[str, Any]) -> dict[str, list[int]]:
    """A copy example's tokens and labels, what a trainer sees (its `group`, the gate's, left behind)."""
    return {"input_ids": list(example["input_ids"]), "labels": list(example["labels"])}


def with_copy_examples(
    dataset: Dataset, copy_examples: Sequence[dict[str, list[int]]], share: float, seed: int = 0
) -> Dataset:
    """`dataset` with the task's copy examples added, drawn with `seed`, so that they are `share` of the result:
    a later phase keeps practising the copy the span-copy phase formed (else it fades under the rest)."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"share must be in [0, 1), got {share}")
    if share == 0.0:
        return dataset
    if not copy_examples:
        raise ValueError(f"share={share} needs copy examples to draw from")
    rng = random.Random(seed)
    added = [
        copy_tokens(rng.choice(copy_examples))
        for _ in range(replayed_size(len(dataset), share) - len(dataset))
    ]
    return concatenate_datasets([dataset, Dataset.from_list(added, features=dataset.features)])


def replayed_size(num_examples: int, share: float) -> int:
    """How many examples `with_copy_examples` returns for `num_examples` and `share`."""
    return num_examples + round(share / (1.0 - share) * num_examples)
