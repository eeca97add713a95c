"""What GRPO's pieces share about the batches they work on: one record, made before them and handed to each.

Why: TRL calls our rollout (`rollout_func(prompts, trainer)`) and our reward function with less than they
need. Our environments need each row's `golds` and `id`, but TRL passes the rollout only the prompts;
rebuilding a `trl_loop` rollout as a `Trajectory` needs TRL's token ids, tool mask and sampling logprobs,
which TRL hands no reward function; and the run directory needs the scored training trajectories and the
episode count. `SearchGRPOTrainer` writes what it sees into one `BatchRecord` (`rows` in `training_step`,
`generation` in `_generate`); `RubricReward`, `EngineRollout` and `RunDirCallback` are given the same
record when they are made and read or add to it. None of them knows the trainer, and nothing is wired
after construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from searchrl.common.trajectory import Trajectory


@dataclass(frozen=True)
class Generation:
    """TRL's token-level output of one generation batch (`GRPOTrainer._generate`), one entry per completion."""

    prompt_ids: list[list[int]] = field(metadata={"help": "Each completion's prompt token ids."})
    completion_ids: list[list[int]] = field(
        metadata={"help": "Each completion's token ids after the prompt (actions and tool results)."}
    )
    tool_mask: list[list[int]] | None = field(
        metadata={"help": "TRL's tool mask over the completion ids (0 on tool results); None without tools."}
    )
    logprobs: list[list[float]] | None = field(
        metadata={"help": "The sampling logprobs, when TRL's generation returns them (vLLM); else None."}
    )
    training: bool = field(
        default=True,
        metadata={"help": "Generated for training (the model in train mode), not for TRL's eval."},
    )


@dataclass
class BatchRecord:
    """The current generation batch and the run's counts, shared by the GRPO trainer and its pieces."""

    rows: list[dict[str, Any]] | None = field(
        default=None, metadata={"help": "The generation batch's dataset rows (set by the trainer)."}
    )
    generation: Generation | None = field(
        default=None, metadata={"help": "TRL's token-level output for those rows (set by the trainer)."}
    )
    episodes: int = field(
        default=0, metadata={"help": "Training episodes scored so far (the reward counts; checkpointed)."}
    )
    rollout_calls: int = field(
        default=0,
        metadata={
            "help": "our_rollout's generation batches so far: each batch's sampling seed (checkpointed)."
        },
    )
    trajectories: list[Trajectory] = field(
        default_factory=list,
        metadata={"help": "Scored training trajectories the run directory has not written yet."},
    )

    def take_trajectories(self) -> list[Trajectory]:
        """The scored training trajectories not yet taken, and forget them."""
        out, self.trajectories = self.trajectories, []
        return out
