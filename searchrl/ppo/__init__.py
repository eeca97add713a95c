"""searchrl.ppo: PPO over multi-turn search trajectories in TRL's component design.

The math lives in small modules that the trainer calls on `(batch, T)` tensors: `kl` (estimators,
controllers), `advantages` (reward placement, GAE over action tokens, whitening), `losses`
(clipped policy and value losses) and `rollout_is` (importance weights for a sampler that disagrees with
the trainer); `config` holds `PPOConfig`. Names are imported lazily: reading a
`PPOConfig` (the CLI, the run reader) imports no torch, and using the math imports no transformers.
"""

from __future__ import annotations

from searchrl.common.lazy import lazy_attributes

_EXPORTS = {
    "PPOConfig": "searchrl.ppo.config",
    "KL_ESTIMATORS": "searchrl.ppo.config",
    "ROLLOUT_IS_MODES": "searchrl.ppo.config",
    "apply_missing_eos_penalty": "searchrl.ppo.advantages",
    "compute_gae": "searchrl.ppo.advantages",
    "last_action_index": "searchrl.ppo.advantages",
    "masked_explained_variance": "searchrl.ppo.advantages",
    "masked_mean": "searchrl.ppo.advantages",
    "masked_var": "searchrl.ppo.advantages",
    "masked_whiten": "searchrl.ppo.advantages",
    "place_rewards": "searchrl.ppo.advantages",
    "AdaptiveKLController": "searchrl.ppo.kl",
    "FixedKLController": "searchrl.ppo.kl",
    "kl_penalty": "searchrl.ppo.kl",
    "make_kl_controller": "searchrl.ppo.kl",
    "per_sequence_kl": "searchrl.ppo.kl",
    "sequence_kl": "searchrl.ppo.kl",
    "entropy_from_logits": "searchrl.ppo.losses",
    "policy_loss": "searchrl.ppo.losses",
    "value_loss": "searchrl.ppo.losses",
    "RolloutIS": "searchrl.ppo.rollout_is",
    "rollout_is_weights": "searchrl.ppo.rollout_is",
    "PPOTrainer": "searchrl.ppo.trainer",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)
