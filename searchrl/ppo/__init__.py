"""searchrl.ppo: PPO over multi-turn search trajectories in TRL's component design.

The math lives in small modules that the trainer calls on `(batch, T)` tensors: `kl` (estimators,
controllers), `advantages` (reward placement, GAE over action tokens, whitening) and `losses`
(clipped policy and value losses); `config` holds `PPOConfig`. `PPOTrainer` is imported lazily from
`searchrl.ppo.trainer` so that using the math does not import transformers.
"""

from __future__ import annotations

from typing import Any

from searchrl.ppo.advantages import (
    apply_missing_eos_penalty,
    compute_gae,
    last_action_index,
    masked_explained_variance,
    masked_mean,
    masked_var,
    masked_whiten,
    place_rewards,
)
from searchrl.ppo.config import PPOConfig
from searchrl.ppo.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty,
    make_kl_controller,
    per_sequence_kl,
    sequence_kl,
)
from searchrl.ppo.losses import entropy_from_logits, policy_loss, value_loss

__all__ = [
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "PPOConfig",
    "PPOTrainer",
    "apply_missing_eos_penalty",
    "compute_gae",
    "entropy_from_logits",
    "kl_penalty",
    "last_action_index",
    "make_kl_controller",
    "masked_explained_variance",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "per_sequence_kl",
    "place_rewards",
    "policy_loss",
    "sequence_kl",
    "value_loss",
]


def __getattr__(name: str) -> Any:
    # The trainer pulls in transformers and accelerate (seconds to import); load it only when asked for.
    if name == "PPOTrainer":
        from searchrl.ppo.trainer import PPOTrainer

        return PPOTrainer
    raise AttributeError(f"module 'searchrl.ppo' has no attribute {name!r}")
