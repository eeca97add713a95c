"""searchrl.sft: the SFT warm start.

`expert` runs an expert policy through the real environment and rollout engine (forced turns, with a
noise knob for imperfect demonstrations); `warm_start` trains a policy on those trajectories with TRL's
SFTTrainer, loss on the policy's own tokens only; `commands` is the `searchrl sft` CLI.
"""

from searchrl.sft.expert import NOISE_KINDS, ExpertConfig, ExpertForcing, ExpertPolicy
from searchrl.sft.warm_start import (
    SFTOutcome,
    SFTRunConfig,
    SFTWarmStartConfig,
    dev_tool_call_rate,
    prompt_texts,
    run_sft,
    sft_dataset,
    sft_example,
    warm_start,
)

__all__ = [
    "NOISE_KINDS",
    "ExpertConfig",
    "ExpertForcing",
    "ExpertPolicy",
    "SFTOutcome",
    "SFTRunConfig",
    "SFTWarmStartConfig",
    "dev_tool_call_rate",
    "prompt_texts",
    "run_sft",
    "sft_dataset",
    "sft_example",
    "warm_start",
]
