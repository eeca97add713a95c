"""The learned reward model: trained on preference pairs with its own loss, frozen during PPO.

Training (`train_reward_model`): TRL 1.16's `RewardTrainer` on pairs, a sequence-classification model
with `num_labels=1` (the tiny Qwen2 scorer by default, any local model otherwise), Bradley-Terry loss
`-logsigmoid(r_chosen - r_rejected - margin)` plus the optional centering term; pairwise accuracy on
held-out pairs is reported, and the model is saved with `save_pretrained`.

Pairs (`build_preference_pairs`) come from trajectories of the same question: chosen = answered, exactly
correct and supported by a retrieved cited document; rejected = wrong, unsupported (or uncited,
fabricated) or malformed. Each side is the whole trajectory's token ids, observations included, which is
exactly what the frozen scorer reads during PPO. An optional margin is the rule-reward difference.

A user's own preference dataset is accepted too (`prompt`/`chosen`/`rejected` or `chosen`/`rejected`,
as text or as conversations; or pre-tokenised `chosen_ids`/`rejected_ids`). A dataset that carries scores
instead of text pairs, or lacks a column, is refused by `check_preference_dataset` with a message that
says what the trainer needs and how to convert.

Scoring (`FrozenRewardModel`): reads the whole trajectory and returns the logit at the last real token,
under `no_grad`, with every parameter's `requires_grad` off: PPO's gradient never reaches it (the seeds: a
reward model "updates with its own loss, and in online PPO is frozen and only gives scores").
"""

from __future__ import annotations

import itertools
import os
import random
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from searchrl.common.config import ConfigError, help_text
from searchrl.common.io import read_jsonl
from searchrl.common.trl_args import ScheduleSection, cpu_safe_trainer_kwargs
from searchrl.models.io import save_model_dir
from searchrl.rewards.citation import citation_status
from searchrl.rewards.combine import default_rubric
from searchrl.rewards.qa import exact_match
from searchrl.rewards.scoring import sequence_scores
from searchrl.rewards.shaping import FormatReward


class FrozenRewardModel:
    """A frozen scorer over token ids; call it with a right-padded batch."""

    def __init__(self, model: nn.Module, batch_size: int = 16):
        self.model = model
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.batch_size = batch_size

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        out = []
        for i in range(0, input_ids.shape[0], self.batch_size):
            ids = input_ids[i : i + self.batch_size].to(device)
            mask = attention_mask[i : i + self.batch_size].to(device)
            out.append(sequence_scores(self.model, ids, mask).float().cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def score_ids(self, sequences: Sequence[Sequence[int]], pad_id: int = 0) -> torch.Tensor:
        """Scores of unpadded id lists (right-padded here; the mask comes from the lengths)."""
        ids, mask = right_pad(sequences, pad_id)
        return self.score(ids, mask)


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) of right-padded `sequences`; the mask comes from lengths."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for r, seq in enumerate(sequences):
        ids[r, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
        mask[r, : len(seq)] = 1
    return ids, mask


# -- the loss --------------------------------------------------------------------------------------


def bradley_terry_loss(
    rewards_chosen: torch.Tensor,
    rewards_rejected: torch.Tensor,
    margin: torch.Tensor | float | None = None,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    """The pairwise loss exactly as TRL 1.16's `RewardTrainer.compute_loss` computes it.

    `-mean(logsigmoid(r_c - r_r - margin))`, plus `coef * mean((r_c + r_r)^2)` when a centering
    coefficient is set (Eisenstein et al. 2023; it pulls the scores' sum to zero, so it is 0 when
    r_c = -r_r). With r_c = r_r and no margin the loss is log 2; it increases with the margin.
    """
    diff = rewards_chosen - rewards_rejected
    if margin is not None:
        diff = diff - margin
    loss = -nn.functional.logsigmoid(diff).mean()
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * torch.mean((rewards_chosen + rewards_rejected) ** 2)
    return loss


# -- preference pairs from trajectories --------------------------------------------------------------


@dataclass
class PreferencePair:
    """Two trajectories of one question: the better (`chosen`) and the worse (`rejected`), as token ids."""

    question_id: str
    chosen_ids: list[int]
    rejected_ids: list[int]
    margin: float = 0.0
    rejected_reason: str = ""
    chosen_id: str = ""
    rejected_id: str = ""

    def to_row(self, with_margin: bool) -> dict[str, Any]:
        row: dict[str, Any] = {"chosen_ids": self.chosen_ids, "rejected_ids": self.rejected_ids}
        if with_margin:
            row["margin"] = float(self.margin)
        return row


def judge_trajectory(traj: Any) -> str:
    """'chosen' if the trajectory is answered, exactly correct and supported; else why it is rejected.

    Reasons: 'malformed' (no well-formed final answer), 'wrong' (not an exact match), 'unsupported'
    (the citations are missing, fabricated or do not contain the answer).
    """
    if traj.answer is None or FormatReward(ok=1.0, fail=0.0)(traj) < 1.0:
        return "malformed"
    if exact_match(traj.answer, list(traj.golds)) < 1.0:
        return "wrong"
    if citation_status(traj) != "supported":
        return "unsupported"
    return "chosen"


def build_preference_pairs(
    trajectories: Iterable[Any],
    rule_reward: Callable[[Any], float] | None = None,
    with_margin: bool = False,
    max_pairs_per_question: int | None = None,
    seed: int = 0,
) -> list[PreferencePair]:
    """Chosen x rejected pairs within each question (see `judge_trajectory`).

    With `with_margin`, a pair's margin is `max(0, rule(chosen) - rule(rejected))` under `rule_reward`
    (the default rubric when none is given), so clearly better answers are pushed further apart.
    `max_pairs_per_question` caps the pairs of one question (a seeded sample), so questions with many
    samples do not dominate.
    """
    if with_margin and rule_reward is None:
        rule_reward = _total_of(default_rubric())
    groups: dict[str, list[Any]] = {}
    for traj in trajectories:
        groups.setdefault(str(traj.question_id), []).append(traj)
    rng = random.Random(seed)
    pairs: list[PreferencePair] = []
    for question_id in sorted(groups):
        judged = [(t, judge_trajectory(t)) for t in groups[question_id]]
        chosen = [t for t, verdict in judged if verdict == "chosen"]
        rejected = [(t, verdict) for t, verdict in judged if verdict != "chosen"]
        combos = list(itertools.product(chosen, rejected))
        if max_pairs_per_question is not None and len(combos) > max_pairs_per_question:
            combos = rng.sample(combos, max_pairs_per_question)
        for good, (bad, reason) in combos:
            margin = max(0.0, float(rule_reward(good)) - float(rule_reward(bad))) if with_margin else 0.0
            pairs.append(
                PreferencePair(
                    question_id=question_id,
                    chosen_ids=[int(i) for i in good.input_ids],
                    rejected_ids=[int(i) for i in bad.input_ids],
                    margin=margin,
                    rejected_reason=reason,
                    chosen_id=str(good.id),
                    rejected_id=str(bad.id),
                )
            )
    return pairs


def _total_of(rubric: Any) -> Callable[[Any], float]:
    # `Rubric.evaluate` leaves the trajectory untouched (score() would overwrite its reward fields).
    return lambda traj: float(rubric.evaluate(traj)[0])


def split_pairs(
    pairs: Sequence[PreferencePair], eval_fraction: float, seed: int = 0
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, held-out) split by question, so no question's trajectories appear on both sides."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    questions = sorted({p.question_id for p in pairs})
    random.Random(seed).shuffle(questions)
    n_eval = round(len(questions) * eval_fraction)
    held = set(questions[:n_eval])
    return [p for p in pairs if p.question_id not in held], [p for p in pairs if p.question_id in held]


def pairs_dataset(pairs: Sequence[PreferencePair], with_margin: bool = False) -> Any:
    """A `datasets.Dataset` of pre-tokenised pairs (`chosen_ids`, `rejected_ids`, optional `margin`)."""
    from datasets import Dataset

    if not pairs:
        raise ValueError(
            "no preference pairs: every question needs at least one chosen (correct, supported) and one "
            "rejected (wrong, unsupported or malformed) trajectory; sample more per question or add noise"
        )
    return Dataset.from_list([p.to_row(with_margin) for p in pairs])


# -- user datasets -------------------------------------------------------------------------------

_SCORE_COLUMNS = (
    "score",
    "scores",
    "rating",
    "ratings",
    "reward",
    "rewards",
    "label",
    "labels",
    "preference",
    "chosen_score",
    "rejected_score",
    "chosen_rating",
    "rejected_rating",
    "score_chosen",
    "score_rejected",
)

_CONVERT_HINT = (
    "RewardTrainer needs a pair of texts per row, not a score: columns 'chosen' and 'rejected' (strings, or "
    "lists of {'role', 'content'} messages), optionally 'prompt' (shared by both) and a float 'margin'. "
    "To convert a scored dataset, group the responses of each prompt and emit one row per (higher-scored, "
    "lower-scored) pair: {'prompt': p, 'chosen': better, 'rejected': worse} (the score difference may go "
    "to 'margin')."
)


def _is_text_or_conversation(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value)


def check_preference_dataset(dataset: Any, name: str = "dataset") -> None:
    """Refuse datasets RewardTrainer cannot learn from, saying what it needs and how to convert.

    Accepted: `chosen`/`rejected` (text or conversations, optional `prompt`, optional numeric `margin`),
    or pre-tokenised `chosen_ids`/`rejected_ids`.
    """
    columns = list(getattr(dataset, "column_names", None) or [])
    if not columns:
        raise ValueError(f"{name}: empty or unreadable preference dataset. {_CONVERT_HINT}")
    if "chosen_ids" in columns and "rejected_ids" in columns:
        return
    missing = [c for c in ("chosen", "rejected") if c not in columns]
    scores = [c for c in columns if c.lower() in _SCORE_COLUMNS]
    if missing:
        what = f"it has score column(s) {scores} instead of text pairs" if scores else "it lacks them"
        raise ValueError(
            f"{name}: column(s) {missing} are missing ({what}; columns: {columns}). {_CONVERT_HINT}"
        )
    if scores:
        raise ValueError(
            f"{name}: it carries score column(s) {scores}; a score per row is not a preference. {_CONVERT_HINT} "
            "If the pairs are already right, drop the score columns (or rename a score gap to 'margin')."
        )
    if len(dataset) == 0:
        raise ValueError(f"{name}: no rows. {_CONVERT_HINT}")
    first = dataset[0]
    for column in ("prompt", "chosen", "rejected"):
        if column in columns and not _is_text_or_conversation(first[column]):
            raise ValueError(
                f"{name}: column {column!r} holds {type(first[column]).__name__} values (row 0: "
                f"{str(first[column])[:60]!r}); it must hold text or a list of chat messages. {_CONVERT_HINT}"
            )
    if "margin" in columns and not isinstance(first["margin"], int | float):
        raise ValueError(f"{name}: 'margin' must be a number per row, got {type(first['margin']).__name__}")


def load_preference_dataset(path: str | Path) -> Any:
    """A preference dataset from a local JSONL/JSON/parquet file or a `save_to_disk` directory, checked."""
    from datasets import Dataset, load_from_disk

    path = Path(path)
    if path.is_dir():
        dataset = load_from_disk(str(path))
    elif path.suffix == ".parquet":
        dataset = Dataset.from_parquet(str(path))
    elif path.name.endswith((".jsonl", ".json", ".jsonl.gz")):
        rows = list(read_jsonl(path)) if path.name.endswith((".jsonl", ".jsonl.gz")) else None
        dataset = Dataset.from_list(rows) if rows is not None else Dataset.from_json(str(path))
    else:
        raise ValueError(
            f"{path}: unsupported preference file; give a .jsonl, .json, .parquet file or a datasets directory"
        )
    check_preference_dataset(dataset, name=str(path))
    return dataset


# -- training ------------------------------------------------------------------------------------


@dataclass
class RewardModelConfig(ScheduleSection):
    """Settings of reward-model training: its schedule (`ScheduleSection`), then TRL `RewardConfig`'s own."""

    per_device_eval_batch_size: int = field(default=16, metadata=help_text("Pairs per evaluation batch."))
    max_length: int | None = field(
        default=2048, metadata=help_text("Pairs with a side longer than this are dropped (TRL filters).")
    )
    center_rewards_coefficient: float | None = field(
        default=None, metadata=help_text("Weight of mean((r_c + r_r)^2); TRL recommends 0.01; None = off.")
    )
    use_margin: bool = field(
        default=False,
        metadata=help_text("Use the rule-reward difference as the BT margin (trajectory pairs)."),
    )
    eval_fraction: float = field(
        default=0.2, metadata=help_text("Share of questions held out to report pairwise accuracy.")
    )

    def check(self) -> None:
        """Its own fields (the schedule's are checked first: `check_sections`)."""
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction: must be in [0, 1), got {self.eval_fraction}")
        if self.per_device_eval_batch_size < 1:
            raise ConfigError(
                f"per_device_eval_batch_size: must be >= 1, got {self.per_device_eval_batch_size}"
            )


@dataclass
class RewardModelOutcome:
    """A trained reward model with its training losses and metrics (accuracy on held-out pairs)."""

    model: Any
    losses: list[float]
    metrics: dict[str, float]


def _reward_config(config: RewardModelConfig, output_dir: str) -> Any:
    from trl import RewardConfig

    return RewardConfig(
        output_dir=output_dir,
        **config.training_arguments(),
        per_device_eval_batch_size=config.per_device_eval_batch_size,
        max_length=config.max_length,
        center_rewards_coefficient=config.center_rewards_coefficient,
        eval_strategy="no",
        **cpu_safe_trainer_kwargs(),
    )


def make_reward_trainer(
    model: Any,
    tokenizer: Any,
    train_dataset: Any,
    eval_dataset: Any | None = None,
    config: RewardModelConfig | None = None,
    output_dir: str | None = None,
    callbacks: list[Any] | None = None,
) -> Any:
    """A TRL `RewardTrainer` over checked datasets, with the CPU-safe settings of `RewardModelConfig`."""
    from trl import RewardTrainer

    config = config or RewardModelConfig()
    check_preference_dataset(train_dataset, "train dataset")
    if eval_dataset is not None:
        check_preference_dataset(eval_dataset, "eval dataset")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if getattr(model.config, "num_labels", None) != 1:
        raise ValueError(
            f"the reward model must have num_labels=1 (one score per sequence), got {model.config.num_labels}; "
            "build it with searchrl.models.tiny.build_value_model or load it with num_labels=1"
        )
    from transformers import PrinterCallback

    trainer = RewardTrainer(
        model=model,
        args=_reward_config(
            config, output_dir or config.output_dir or tempfile.mkdtemp(prefix="searchrl-rm-")
        ),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # no log dicts on stdout; the CLI prints one JSON there
    return trainer


def train_reward_model(
    model: Any,
    tokenizer: Any,
    train_dataset: Any,
    eval_dataset: Any | None = None,
    config: RewardModelConfig | None = None,
) -> RewardModelOutcome:
    """Train `model` with RewardTrainer; held-out pairwise accuracy is `metrics['eval_accuracy']`."""
    from transformers import TrainerCallback

    losses: list[float] = []

    class _Losses(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    config = config or RewardModelConfig()
    with tempfile.TemporaryDirectory(prefix="searchrl-rm-") as scratch:
        trainer = make_reward_trainer(
            model, tokenizer, train_dataset, eval_dataset, config, config.output_dir or scratch, [_Losses()]
        )
        result = trainer.train()
        metrics = {k: float(v) for k, v in result.metrics.items() if isinstance(v, int | float)}
        if eval_dataset is not None:
            metrics.update({k: float(v) for k, v in trainer.evaluate().items() if isinstance(v, int | float)})
    trained = trainer.model
    trained.eval()
    return RewardModelOutcome(model=trained, losses=losses, metrics=metrics)


def pairwise_accuracy(model: nn.Module, pairs: Sequence[PreferencePair], batch_size: int = 16) -> float:
    """Share of pairs the frozen scorer ranks right (chosen > rejected), through the PPO scoring path."""
    if not pairs:
        raise ValueError("pairwise_accuracy needs at least one pair")
    was_grad = [p.requires_grad for p in model.parameters()]
    scorer = FrozenRewardModel(model, batch_size=batch_size)
    pad = int(getattr(model.config, "pad_token_id", 0) or 0)
    try:
        chosen = scorer.score_ids([p.chosen_ids for p in pairs], pad)
        rejected = scorer.score_ids([p.rejected_ids for p in pairs], pad)
    finally:
        for p, flag in zip(model.parameters(), was_grad, strict=True):
            p.requires_grad_(flag)
    return int((chosen > rejected).sum()) / len(pairs)


def evaluate_reward_model(
    model: Any, tokenizer: Any, dataset: Any, config: RewardModelConfig | None = None
) -> dict[str, float]:
    """TRL's evaluation metrics (`eval_loss`, `eval_accuracy`, `eval_margin`, ...) of `model` on `dataset`."""
    config = config or RewardModelConfig()
    with tempfile.TemporaryDirectory(prefix="searchrl-rm-eval-") as scratch:
        trainer = make_reward_trainer(model, tokenizer, dataset, dataset, config, scratch)
        return {k: float(v) for k, v in trainer.evaluate().items() if isinstance(v, int | float)}


def save_reward_model(model: Any, tokenizer: Any, out_dir: str | Path) -> Path:
    """`save_pretrained` of the model and its tokenizer (loadable by `models.io.load_value_model`)."""
    return save_model_dir(model, tokenizer, out_dir)
