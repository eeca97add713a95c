"""SFT warm start: expert trajectories -> TRL 1.16 `SFTTrainer`, trained on the policy's own tokens only.

What: `warm_start(policy, tokenizer, trajectories, config)` fine-tunes `policy` on demonstrations and
returns it. Each trajectory becomes one pre-tokenised example: `input_ids` are the trajectory's ids
exactly (never re-tokenised from text), `labels` copy them where `action_mask` is 1 and are -100
elsewhere, so the prompt, every observation and the chat-template glue around tool results carry no
loss, while each action turn, its closing EOS included, is trained.

Why pre-tokenised: the rollout's ids are the contract PPO relies on (token in, token out). Letting the
trainer render conversations again could drift from them (tool-call JSON, glue), and `assistant_only_loss`
needs `{% generation %}` markers that the stock template lacks. With `skip_prepare_dataset` TRL's own
collator pads `input_ids`/`labels` and builds the attention mask; nothing else touches the labels.

The curriculum (`first_turn_steps > 0`): a tiny model trained from scratch has to discover how to copy a
name from its context (an induction circuit) before it can learn anything else here, and whole episodes
(~200 tokens, a few copied tokens each) teach that slowly. So the warm start first trains on first turns
alone (prompt + the tool call that copies the question's name: ~80 tokens, a batch of 64), then on the
whole demonstrations. Measured on the demo's task (docs/demo.md): the first-turn phase turns on
copying within ~300 steps, after which reading answers out of observations follows.

Span copying first (`copy_pretrain_steps > 0`): a pretrained LM arrives able to continue a span it saw
earlier in its context (induction heads); the tiny model does not, and learns to copy from the question by
position instead, which does not carry to observations of varying length (the support demo: an order id read
out of a search result, a date out of an order record). So the warm start can begin with span-copy examples
built from the demonstrations' own tokens (`searchrl.sft.examples.span_copy_example`). Measured on the support
demo (docs/support.md): with it the warm start answers more questions than without at the same later steps.

The copy gate (`copy_gate > 0`, `searchrl.sft.copy_check.CopyGate`): copying an answer out of an observation forms
after a number of stable-rate steps that differs by seed, and a decayed rate does not finish it. Where the decay
would start, the answer-copy rate (or, with `copy_gate_turns: reading`, the reading rate) is measured; below
the gate the stable phase goes on in chunks until it is reached (or the budget is spent), then the planned decay
runs. A policy that passes trains exactly as without it. The span-copy phase has a gate of its own
(`copy_pretrain_gate`, on the task's copy examples): on the support demo the copies of an order id and a status formed
from scratch after 600-800 steps on one draw of examples and not within 800 on another (docs/support.md), so a
fixed number of steps either wastes time or stops before they form.

CPU: TRL configs default to bf16, which fails on a CPU-only box, so `bf16` is ours (default False; True is
an autocast, weights stay float32), `use_cpu` when no accelerator is present, no gradient checkpointing
(slower, and pointless for a tiny model).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PrinterCallback, TrainerCallback

from searchrl.common.config import ConfigError, help_text
from searchrl.common.trajectory import Trajectory
from searchrl.common.trl_args import ScheduleSection, cpu_safe_trainer_kwargs
from searchrl.models.forward_patches import remove_trainer_forward_patches
from searchrl.sft.copy_check import COPY_GATE_TURNS, CopyGate, labelled_copy_rate
from searchrl.sft.examples import (
    IGNORE_INDEX,
    MIN_SPAN,
    copy_pretraining_dataset,
    replayed_size,
    sft_dataset,
    with_copy_examples,
)

logger = logging.getLogger("searchrl.sft")
# About this many copy examples are held out for the span-copy phase's gate (per group its share, rounded up).
GATE_EXAMPLES = 256


@dataclass
class SFTWarmStartConfig(ScheduleSection):
    """Settings of the SFT warm start: its schedule (`ScheduleSection`), then SFT's own (TRL `SFTConfig`)."""

    # SFT's default schedule is cosine, and it also knows warmup_stable_decay (with decay_ratio).
    lr_scheduler_type: str = field(
        default="cosine",
        metadata=help_text(
            "transformers scheduler name: cosine, linear, constant, warmup_stable_decay (constant after the "
            "warm-up, then decay_ratio of the steps decaying to 5%), ..."
        ),
    )
    decay_ratio: float = field(
        default=0.2, metadata=help_text("Share of the steps that decay, with warmup_stable_decay.")
    )
    max_grad_norm: float = field(default=1.0, metadata=help_text("Gradient clipping norm."))
    max_length: int = field(
        default=2048,
        metadata=help_text("Longest example in tokens; longer trajectories are cut at the end (keep_start)."),
    )
    num_threads: int = field(
        default=0, metadata=help_text("torch CPU threads while training; 0 leaves torch's setting alone.")
    )
    copy_pretrain_steps: int = field(
        default=0,
        metadata=help_text(
            "Before the curriculum: optimizer steps of span copying (a window of a demonstration's tokens, "
            "then a span of it again cued by its first two tokens, labels on the rest), so that a model "
            "trained from scratch can copy out of an observation before it learns the task; 0 = none."
        ),
    )
    copy_pretrain_batch_size: int = field(
        default=64, metadata=help_text("Examples per optimizer step of the span-copy phase.")
    )
    copy_pretrain_window: int = field(
        default=128, metadata=help_text("Tokens of a demonstration each span-copy example copies from.")
    )
    copy_pretrain_learning_rate: float = field(
        default=0.0,
        metadata=help_text(
            "Learning rate of the span-copy phase; 0 keeps learning_rate. The support demo's tiny policy learned "
            "to copy an order id at 1e-3 and not in 450 steps at 3e-3 (docs/support.md)."
        ),
    )
    copy_pretrain_task_share: float = field(
        default=0.0,
        metadata=help_text(
            "Share of the span-copy phase's examples drawn from the copy examples the task gives run_sft "
            "(`copy_examples`: the support demo's are its expert's reading examples, an order id out of a "
            "search result, labels on the id only); 0 = spans only."
        ),
    )
    copy_replay_share: float = field(
        default=0.0,
        metadata=help_text(
            "Share of every later phase's examples (first-turn, answer-turn, whole demonstrations) drawn from "
            "the task's copy examples, so that the copy the span-copy phase formed is kept while the task is "
            "learned; 0 = none. In [0, 1); needs copy_examples like copy_pretrain_task_share."
        ),
    )
    copy_pretrain_gate: float = field(
        default=0.0,
        metadata=help_text(
            "After the span-copy phase's steps: the share of held-out task copy examples (about 256, an equal "
            "share of each group, never trained on: an order id into a call, a status into the answer, ...) whose "
            "every labelled token the policy reproduces, teacher-forced (sft/copy_check.py's labelled_copy_rate), "
            "to reach in every group the examples name (their `group`: answer/where, answer/unshipped, ...) "
            "before the later phases. Below it the phase goes on, copy_gate_chunk steps at a time with a "
            "new draw of its examples, until it is reached or copy_pretrain_gate_max_steps more were spent: "
            "copies form from scratch after a number of steps that depends on the draw (docs/support.md). 0 = no gate."
        ),
    )
    copy_pretrain_gate_max_steps: int = field(
        default=1000, metadata=help_text("Most span-copy steps the copy-phase gate may add.")
    )
    copy_pretrain_gate_focus: float = field(
        default=0.0,
        metadata=help_text(
            "In a chunk the copy-phase gate adds: the share of its task copy examples drawn from the groups "
            "still below the gate (the rest from all of them, so the groups that passed keep practising). "
            "0 = every group in proportion to its size, as in the phase's own steps. In [0, 1]."
        ),
    )
    first_turn_steps: int = field(
        default=0,
        metadata=help_text(
            "Curriculum: optimizer steps on first turns alone (the prompt and the first action, a short "
            "example) before the whole demonstrations; 0 = none. See the module docstring."
        ),
    )
    first_turn_batch_size: int = field(
        default=64, metadata=help_text("Examples per optimizer step of the first-turn curriculum.")
    )
    answer_turn_steps: int = field(
        default=0,
        metadata=help_text(
            "Curriculum, after the first-turn phase: optimizer steps on whole contexts with labels on the "
            "answer turn only (copying the answer out of an observation); 0 = none."
        ),
    )
    answer_turn_batch_size: int = field(
        default=32, metadata=help_text("Examples per optimizer step of the answer-turn curriculum.")
    )
    copy_gate: float = field(
        default=0.0,
        metadata=help_text(
            "With warmup_stable_decay: the copy rate (copy_gate_turns; answer: the share of the last 256 "
            "demonstrations whose answer turn the policy reproduces, sft/copy_check.py) to reach before the "
            "learning rate decays. "
            "Below it, training goes on at the stable rate in copy_gate_chunk steps until it is reached or "
            "copy_gate_max_steps more were spent, then decays. 0 = no gate."
        ),
    )
    copy_gate_turns: str = field(
        default="answer",
        metadata=help_text(
            "What the copy gate measures: answer (the answer turn) or reading (every turn after an "
            "observation, also a call whose arguments come from a result, e.g. an order id: "
            "sft/copy_check.py's reading_copy_rate)."
        ),
    )
    copy_gate_chunk: int = field(
        default=250, metadata=help_text("Stable-rate steps between two measurements of the copy gate.")
    )
    copy_gate_max_steps: int = field(
        default=1000, metadata=help_text("Most stable-rate steps the copy gate may add.")
    )
    trl_loss: bool = field(
        default=True,
        metadata=help_text(
            "TRL's own loss (a chunked log-prob kernel plus token statistics). False: a plain causal-LM "
            "loss (LM head in float32 at the labelled positions): the same loss and gradients on a batch "
            "(tested) and about 40% faster per CPU step. The demo uses it, with enough steps at the stable "
            "learning rate for the copy circuit to form (docs/demo.md: the recipe)."
        ),
    )
    bf16: bool = field(
        default=False,
        metadata=help_text(
            "bfloat16 autocast (weights stay float32); about 1.3x faster on CPUs with AVX-512 BF16."
        ),
    )

    def needs_copy_examples(self) -> bool:
        """Whether `run_sft` uses the task's copy examples (the span-copy phase's share and gate, the replay)."""
        copy_phase = self.copy_pretrain_steps > 0 and (
            self.copy_pretrain_task_share > 0 or self.copy_pretrain_gate > 0
        )
        return copy_phase or self.copy_replay_share > 0

    def check(self) -> None:
        """Its own fields (the schedule's are checked first: `check_sections`)."""
        if self.max_length < 8:
            raise ConfigError(f"max_length: must be >= 8 tokens, got {self.max_length}")
        if not 0.0 < self.decay_ratio <= 1.0:
            raise ConfigError(f"decay_ratio: must be in (0, 1], got {self.decay_ratio}")
        if (
            self.copy_pretrain_steps < 0
            or self.copy_pretrain_batch_size < 1
            or self.copy_pretrain_window < MIN_SPAN
        ):
            raise ConfigError(
                "copy_pretrain_steps must be >= 0, copy_pretrain_batch_size >= 1 and copy_pretrain_window >= "
                f"{MIN_SPAN}"
            )
        if not 0.0 <= self.copy_pretrain_gate <= 1.0 or self.copy_pretrain_gate_max_steps < 0:
            raise ConfigError(
                "copy_pretrain_gate must be in [0, 1] and copy_pretrain_gate_max_steps >= 0, got "
                f"{self.copy_pretrain_gate} and {self.copy_pretrain_gate_max_steps}"
            )
        if not 0.0 <= self.copy_pretrain_gate_focus <= 1.0:
            raise ConfigError(
                f"copy_pretrain_gate_focus: a share of a chunk's copy examples in [0, 1], got "
                f"{self.copy_pretrain_gate_focus}"
            )
        if self.copy_pretrain_gate > 0 and self.copy_pretrain_steps == 0:
            raise ConfigError(
                "copy_pretrain_gate gates the span-copy phase: set copy_pretrain_steps > 0 or the gate to 0"
            )
        if not 0.0 <= self.copy_replay_share < 1.0:
            raise ConfigError(f"copy_replay_share: a share in [0, 1), got {self.copy_replay_share}")
        if self.copy_pretrain_learning_rate < 0 or not 0.0 <= self.copy_pretrain_task_share <= 1.0:
            raise ConfigError(
                "copy_pretrain_learning_rate must be >= 0 (0: learning_rate) and copy_pretrain_task_share in "
                f"[0, 1], got {self.copy_pretrain_learning_rate} and {self.copy_pretrain_task_share}"
            )
        if self.first_turn_steps < 0 or self.first_turn_batch_size < 1:
            raise ConfigError("first_turn_steps must be >= 0 and first_turn_batch_size >= 1")
        if self.answer_turn_steps < 0 or self.answer_turn_batch_size < 1:
            raise ConfigError("answer_turn_steps must be >= 0 and answer_turn_batch_size >= 1")
        if not 0.0 <= self.copy_gate <= 1.0:
            raise ConfigError(f"copy_gate: a share of demonstrations in [0, 1], got {self.copy_gate}")
        if self.copy_gate > 0 and self.lr_scheduler_type != "warmup_stable_decay":
            raise ConfigError(
                f"copy_gate needs lr_scheduler_type warmup_stable_decay (it acts where the decay starts), got "
                f"{self.lr_scheduler_type!r}: set the scheduler or copy_gate: 0"
            )
        if self.copy_gate_turns not in COPY_GATE_TURNS:
            raise ConfigError(
                f"copy_gate_turns: one of {list(COPY_GATE_TURNS)}, got {self.copy_gate_turns!r}"
            )
        if self.copy_gate_chunk < 1 or self.copy_gate_max_steps < 0:
            raise ConfigError("copy_gate_chunk must be >= 1 and copy_gate_max_steps >= 0")


@dataclass
class SFTOutcome:
    """What a warm start produced: the tuned policy, the logged losses and the trainer's final metrics."""

    policy: PreTrainedModel
    losses: list[float]
    metrics: dict[str, float]
    num_examples: int  # of the whole-demonstration phase, replayed copy examples included
    trained_tokens: int
    # The copy gates' measurements: the span-copy phase's (`copy_pretrain_gate`: {"copy_phase_step",
    # "copy_example_rate"}) first, then the whole phase's (`CopyGate.history`: whole-phase step and the rate it
    # measures, `answer_copy_rate`, or `reading_copy_rate` with copy_gate_turns: reading).
    copy_gate: list[dict[str, float]] = field(default_factory=list)


class _LossRecorder(TrainerCallback):
    """Collects the training loss at every logging step."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
            logger.info("sft step %d: loss %.4f", state.global_step, float(logs["loss"]))


def _steps_of(config: SFTWarmStartConfig, num_examples: int) -> int:
    if config.max_steps > 0:
        return config.max_steps
    per_epoch = math.ceil(
        num_examples / (config.per_device_train_batch_size * config.gradient_accumulation_steps)
    )
    return max(1, math.ceil(per_epoch * config.num_train_epochs))


def _decay_steps(config: SFTWarmStartConfig, num_examples: int) -> int:
    """The steps warmup_stable_decay spends decaying (the last `decay_ratio` of the phase)."""
    return max(1, round(config.decay_ratio * _steps_of(config, num_examples)))


def sft_total_steps(config: SFTWarmStartConfig, num_examples: int) -> int:
    """The optimizer steps `run_sft` takes on `num_examples` demonstrations: the curriculum's phases
    (`copy_pretrain_steps`, `first_turn_steps`, `answer_turn_steps`) and the whole-demonstration phase (a
    progress bar's total)."""
    curriculum = config.copy_pretrain_steps + config.first_turn_steps + config.answer_turn_steps
    return _steps_of(config, replayed_size(num_examples, config.copy_replay_share)) + curriculum


def _sft_config(config: SFTWarmStartConfig, output_dir: str, num_examples: int = 0) -> Any:
    from trl import SFTConfig  # TRL's trainer modules (and the report_to integrations): ~1 s, at training

    scheduler_kwargs: dict[str, Any] = {}
    if config.lr_scheduler_type == "warmup_stable_decay":
        decay = _decay_steps(config, num_examples)
        scheduler_kwargs = {"num_decay_steps": decay, "min_lr_ratio": 0.05, "decay_type": "linear"}
    return SFTConfig(
        output_dir=output_dir,
        **config.training_arguments(),
        lr_scheduler_kwargs=scheduler_kwargs,
        max_grad_norm=config.max_grad_norm,
        # Our examples are already ids + labels: no re-tokenising, no truncation, no label rebuilding.
        dataset_kwargs={"skip_prepare_dataset": True},
        max_length=None,
        packing=False,
        padding_free=False,
        **{**cpu_safe_trainer_kwargs(), "bf16": config.bf16},
    )


def _plain_loss_trainer_class() -> type:
    from trl import SFTTrainer  # ~1 s, as above

    class PlainLossSFTTrainer(SFTTrainer):
        """TRL's SFTTrainer with a plain causal-LM loss whose LM head runs in float32.

        `trl_loss=False` selects it. TRL 1.16 scores every position through a chunked, tiled log-prob kernel
        and its token statistics (measured on the demo: about 40% of a CPU step for the tiny model). This
        loss is the same cross-entropy over the labelled positions (summed over the batch's labelled
        tokens, divided by their number), projected through the LM head only at those positions, in
        float32 even under bf16 autocast, as TRL's kernel accumulates in float32 (transformers' own loss
        under autocast rounds the logits to bfloat16 first). TRL's per-token statistics (entropy, token
        accuracy) are not logged. On one batch it matches TRL's loss and gradients (tested). Earlier demo runs
        with it ended worse only because their schedule began to decay before the copy circuit had formed
        (about 300-400 whole-demonstration steps at the stable rate; docs/demo.md: the recipe).
        """

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs["labels"][:, 1:]
            hidden = model.base_model(
                input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"), use_cache=False
            ).last_hidden_state[:, :-1]
            scored = labels != IGNORE_INDEX
            head = model.get_output_embeddings()
            with torch.autocast(device_type=hidden.device.type, enabled=False):
                logits = hidden[scored].float() @ head.weight.float().T
                if head.bias is not None:
                    logits = logits + head.bias.float()
                total = torch.nn.functional.cross_entropy(logits, labels[scored], reduction="sum")
            count = num_items_in_batch if num_items_in_batch is not None else scored.sum()
            loss = total / count
            return (loss, {"loss": loss}) if return_outputs else loss

    return PlainLossSFTTrainer


def make_sft_trainer(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    config: SFTWarmStartConfig,
    output_dir: str,
    callbacks: list[Any] | None = None,
) -> Any:
    """TRL's SFTTrainer over a pre-tokenised dataset (`sft_dataset`), CPU-safe settings."""
    from trl import SFTTrainer  # ~1 s, as above

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL trainers ping the hub otherwise
    trainer_class = SFTTrainer if config.trl_loss else _plain_loss_trainer_class()
    trainer = trainer_class(
        model=policy,
        args=_sft_config(config, output_dir, len(dataset)),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    # Log lines go to the `searchrl` logger, not as dicts on stdout (the CLI prints one JSON summary there).
    trainer.remove_callback(PrinterCallback)
    return trainer


def _curriculum_phase(config: SFTWarmStartConfig, steps: int, batch_size: int) -> SFTWarmStartConfig:
    return dataclasses.replace(
        config,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=1,
        lr_scheduler_type="constant_with_warmup",
        copy_gate=0.0,  # the gate belongs to the whole-demonstration phase
    )


def run_sft(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trajectories: Sequence[Trajectory],
    config: SFTWarmStartConfig | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    copy_examples: Sequence[dict[str, Any]] = (),
) -> SFTOutcome:
    """Fine-tune `policy` in place on `trajectories` with TRL's SFTTrainer; see the module docstring.

    `callbacks` (transformers `TrainerCallback`s) join every phase's trainer; `state.global_step` restarts
    at 0 in each phase. `copy_examples` (pre-tokenised `input_ids` / `labels`, and a `group` the copy-phase gate
    measures apart: `searchrl.sft.support_expert.copy_group`) are the task's own copy examples,
    `copy_pretrain_task_share` of the span-copy phase.
    """
    config = config or SFTWarmStartConfig()
    if config.needs_copy_examples() and not copy_examples:
        raise ValueError(
            f"copy_pretrain_task_share={config.copy_pretrain_task_share} and copy_pretrain_gate="
            f"{config.copy_pretrain_gate} (with copy_pretrain_steps={config.copy_pretrain_steps}) and "
            f"copy_replay_share={config.copy_replay_share} use the task's copy examples "
            "(run_sft(copy_examples=...)); give them or set those to 0"
        )

    copy_examples, gate_examples = _held_out_for_gate(copy_examples, config)

    def replayed(data: Dataset) -> Dataset:  # the task's copies kept in a later phase
        return with_copy_examples(data, copy_examples, config.copy_replay_share, config.seed)

    dataset = replayed(sft_dataset(trajectories, config.max_length))
    # The curriculum's phases come first: each a few steps at a constant learning rate after warm-up.
    phases = []
    if config.copy_pretrain_steps > 0:  # span copying first: the circuit every later phase reads with
        copying = _copy_phase(config, config.copy_pretrain_steps, config.seed)
        phases.append((copying, _copy_phase_data(trajectories, copying, copy_examples, config)))
    if config.first_turn_steps > 0:  # short examples, a big batch: copying the question's name into a query
        first = _curriculum_phase(config, config.first_turn_steps, config.first_turn_batch_size)
        phases.append((first, replayed(sft_dataset(trajectories, first_turn_only=True))))
    if config.answer_turn_steps > 0:
        # Whole contexts but labels on the answer turn only, where the first answer word must be found by
        # what precedes it in an observation ("... employee of" -> "Venir"), not by induction.
        answer = _curriculum_phase(config, config.answer_turn_steps, config.answer_turn_batch_size)
        phases.append((answer, replayed(sft_dataset(trajectories, config.max_length, answer_turn_only=True))))
    phases.append((config, dataset))
    threads = torch.get_num_threads()
    if config.num_threads > 0:
        torch.set_num_threads(config.num_threads)
    recorder = _LossRecorder()
    metrics: dict[str, float] = {}
    gate = None
    copy_phase_gate: list[dict[str, float]] = []
    if config.copy_gate > 0:  # measured where the decay would start (`searchrl.sft.copy_check.CopyGate`)
        stable_steps = _steps_of(config, len(dataset)) - _decay_steps(config, len(dataset))
        gate = CopyGate(trajectories, stable_steps, config.copy_gate, config.copy_gate_turns)
    policy.train()
    try:
        for i, (phase_config, phase_data) in enumerate(phases):
            whole = i == len(phases) - 1
            extra = [gate] if whole and gate is not None else []
            policy = _train_phase(policy, tokenizer, phase_data, phase_config, [recorder, *callbacks, *extra],
                                  metrics)  # fmt: skip
            if i == 0 and gate_examples:  # phase 0 is the span-copy phase whenever its gate is on (`check`)
                policy = _copy_until_reproduced(policy, tokenizer, trajectories, copy_examples, gate_examples,
                                                config, [recorder, *callbacks], metrics, copy_phase_gate)  # fmt: skip
        if gate is not None and gate.stopped_early:
            policy = _extend_until_copying(policy, tokenizer, dataset, config, gate, [recorder, *callbacks],
                                           metrics)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
        # TRL's fused LM head and accelerate's bf16 autocast stay on `policy.forward` after training; without
        # this the returned policy would run in bfloat16 from now on, and a deep copy of it (a PPO reference)
        # would run the live policy (`searchrl.models.forward_patches`).
        remove_trainer_forward_patches(policy)
    policy.eval()
    trained_tokens = sum(sum(1 for x in ex if x != IGNORE_INDEX) for ex in dataset["labels"])
    return SFTOutcome(
        policy=policy,
        losses=recorder.losses,
        metrics=metrics,
        num_examples=len(dataset),
        trained_tokens=trained_tokens,
        copy_gate=copy_phase_gate + (gate.history if gate is not None else []),
    )


def _train_phase(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: Dataset,
    config: SFTWarmStartConfig,
    callbacks: list[TrainerCallback],
    metrics: dict[str, float],
) -> PreTrainedModel:
    """One trainer over `data`; its final metrics join `metrics` (runtimes add up, the rest is the last's)."""
    with tempfile.TemporaryDirectory(prefix="searchrl-sft-") as scratch:
        trainer = make_sft_trainer(policy, tokenizer, data, config, config.output_dir or scratch, callbacks)
        result = trainer.train()
    for key, value in result.metrics.items():
        if isinstance(value, int | float):
            metrics[key] = metrics.get(key, 0.0) + float(value) if key.endswith("runtime") else float(value)
    return trainer.model


def _copy_phase(config: SFTWarmStartConfig, steps: int, seed: int) -> SFTWarmStartConfig:
    """The span-copy phase's settings: `steps` at copy_pretrain_learning_rate (or learning_rate), its batch."""
    copying = _curriculum_phase(config, steps, config.copy_pretrain_batch_size)
    lr = config.copy_pretrain_learning_rate or config.learning_rate
    return dataclasses.replace(copying, learning_rate=lr, seed=seed)


def _copy_phase_data(
    trajectories: Sequence[Trajectory],
    phase: SFTWarmStartConfig,
    copy_examples: Sequence[dict[str, list[int]]],
    config: SFTWarmStartConfig,
) -> Dataset:
    num = phase.max_steps * config.copy_pretrain_batch_size
    return copy_pretraining_dataset(trajectories, num, phase.seed, config.copy_pretrain_window, copy_examples,
                                    config.copy_pretrain_task_share)  # fmt: skip


def _held_out_for_gate(
    copy_examples: Sequence[dict[str, Any]], config: SFTWarmStartConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """With `copy_pretrain_gate`: (the copy examples to train on, about GATE_EXAMPLES held out for the gate: an
    equal share, GATE_EXAMPLES / groups rounded up, from each `group` the examples name, every `stride`-th of it,
    so spread over the group); else (all of them, none). Held out because the phase reproduces its own examples long
    before it reads new ones (the support demo, seed 0, step 800: its last 256 examples 1.00, held-out customers'
    ids 0.29 and statuses 0.16). Per group because a small group can stay at 0 under a passed mean (seed 0: the
    unshipped items, 11% of the examples, 0.05 after SFT with the gate's mean passed)."""
    if config.copy_pretrain_gate <= 0:
        return list(copy_examples), []
    if len(copy_examples) < 2:
        raise ValueError(
            "copy_pretrain_gate holds copy examples out to measure: give at least 2 copy examples"
        )
    groups = _indices_by_group(copy_examples)
    per_group = -(-GATE_EXAMPLES // len(groups))  # ceil
    held: set[int] = set()
    for members in groups.values():
        if len(members) < 2:
            continue  # a group of one is trained on, not measured
        stride = max(2, -(-len(members) // per_group))  # ceil: at most per_group held out, half at most
        held.update(members[::stride])
    if not held:
        raise ValueError("copy_pretrain_gate: no group of copy examples has 2 or more to hold one out")
    train = [e for i, e in enumerate(copy_examples) if i not in held]
    return train, [copy_examples[i] for i in sorted(held)]


def focused_on(
    examples: Sequence[dict[str, Any]], groups: set[str], focus: float, seed: int
) -> list[dict[str, Any]]:
    """As many examples as `examples`, drawn with `seed`: each with probability `focus` from the members of
    `groups` (the copy-phase gate's groups still below it), else from all; `examples` itself when `focus` is 0
    or no member is in `groups`. The gated chunks' draw: practice where the copy has not formed (seed 0's
    unshipped items stayed at 0.17-0.36 over 400 steps at their share of 11%) without dropping the rest."""
    lagging = [e for e in examples if _group_of(e) in groups]
    if focus <= 0 or not lagging:
        return list(examples)
    rng = random.Random(seed)
    return [rng.choice(lagging) if rng.random() < focus else rng.choice(examples) for _ in examples]


def _gate_rates(policy: PreTrainedModel, gate_examples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """`labelled_copy_rate` per group of the held-out copy examples (one group "" when they name none)."""
    groups = _indices_by_group(gate_examples)
    return {g: labelled_copy_rate(policy, [gate_examples[i] for i in groups[g]]) for g in sorted(groups)}


def _group_of(example: dict[str, Any]) -> str:
    """The copy example's `group` (`searchrl.sft.support_expert.copy_group`), "" when it names none."""
    return str(example.get("group", ""))


def _indices_by_group(examples: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """The examples' positions per group, in order: what the gate holds out and measures apart."""
    groups: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        groups.setdefault(_group_of(example), []).append(i)
    return groups


def _copy_until_reproduced(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trajectories: Sequence[Trajectory],
    copy_examples: Sequence[dict[str, list[int]]],
    gate_examples: Sequence[dict[str, Any]],
    config: SFTWarmStartConfig,
    callbacks: list[TrainerCallback],
    metrics: dict[str, float],
    history: list[dict[str, float]],
) -> PreTrainedModel:
    """The span-copy phase's gate (`copy_pretrain_gate`): measured after the phase's steps, then after every
    `copy_gate_chunk` more (a new draw of examples each, the same rate), until the policy reads what its
    demonstrations read out of observations or `copy_pretrain_gate_max_steps` are spent. Measured on held-out task
    copy examples (`_held_out_for_gate`), what the phase trains (labels on the copied span only: a whole turn's
    tags come later, so the demonstrations' reading rate would stay near 0 here), per group: the lowest group's
    rate is the one compared with the gate. Measurements go to `history` (`copy_example_rate`, the lowest, and
    `copy_example_rate/<group>` when there are several)."""
    step, extra = config.copy_pretrain_steps, 0
    while True:
        rates = _gate_rates(policy, gate_examples)
        lowest = min(rates, key=rates.__getitem__)
        rate = rates[lowest]  # every group must reach the gate
        by_group = {f"copy_example_rate/{g}": r for g, r in rates.items() if g} if len(rates) > 1 else {}
        history.append({"copy_phase_step": float(step), "copy_example_rate": rate, **by_group})
        logger.info("copy-phase gate at step %d: copy examples reproduced %s (lowest %.3f%s; gate %.2f)", step,
                    ", ".join(f"{g or 'all'} {r:.3f}" for g, r in rates.items()), rate,
                    f", {lowest}" if lowest else "", config.copy_pretrain_gate)  # fmt: skip
        if rate >= config.copy_pretrain_gate or extra >= config.copy_pretrain_gate_max_steps:
            return policy
        steps = min(config.copy_gate_chunk, config.copy_pretrain_gate_max_steps - extra)
        # Another draw each chunk (the phase's seed would replay the same batches).
        chunk = _copy_phase(config, steps, config.seed + 1 + len(history))
        lagging = {g for g, r in rates.items() if r < config.copy_pretrain_gate}
        drawn = focused_on(copy_examples, lagging, config.copy_pretrain_gate_focus, chunk.seed)
        policy = _train_phase(policy, tokenizer, _copy_phase_data(trajectories, chunk, drawn, config),
                              chunk, callbacks, metrics)  # fmt: skip
        extra, step = extra + steps, step + steps


def _extend_until_copying(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    config: SFTWarmStartConfig,
    gate: CopyGate,
    callbacks: list[TrainerCallback],
    metrics: dict[str, float],
) -> PreTrainedModel:
    """The copy gate failed where the decay would start: more stable-rate steps, `copy_gate_chunk` at a time,
    until the policy copies or `copy_gate_max_steps` are spent; then the decay the schedule had planned."""
    step, extra, chunk_index = gate.at_step, 0, 0
    while not gate.passed and extra < config.copy_gate_max_steps:
        steps = min(config.copy_gate_chunk, config.copy_gate_max_steps - extra)
        # A new data order per chunk (the same seed would replay the same batches); no gate inside a chunk.
        stable = dataclasses.replace(config, max_steps=steps, lr_scheduler_type="constant_with_warmup",
                                     seed=config.seed + 1 + chunk_index, copy_gate=0.0)  # fmt: skip
        policy = _train_phase(policy, tokenizer, dataset, stable, callbacks, metrics)
        extra, step, chunk_index = extra + steps, step + steps, chunk_index + 1
        gate.measure(policy, step)
    decay_steps = _decay_steps(config, len(dataset))
    decay = dataclasses.replace(config, max_steps=decay_steps, warmup_ratio=0.0, decay_ratio=1.0,
                                seed=config.seed + 1 + chunk_index, copy_gate=0.0)  # fmt: skip
    policy = _train_phase(policy, tokenizer, dataset, decay, callbacks, metrics)
    gate.measure(policy, step + decay_steps)
    return policy


def warm_start(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trajectories: Sequence[Trajectory],
    config: SFTWarmStartConfig | None = None,
) -> PreTrainedModel:
    """SFT `policy` on expert `trajectories` (observation and prompt tokens masked); returns the policy."""
    return run_sft(policy, tokenizer, trajectories, config).policy
