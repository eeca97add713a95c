"""searchrl.sft: the SFT warm start.

`expert` runs an expert policy through the real environment and rollout engine (forced turns, with a
noise knob for imperfect demonstrations); `warm_start` trains a policy on those trajectories with TRL's
SFTTrainer, loss on the policy's own tokens only; `commands` is the `searchrl sft` CLI.

Names are imported lazily, so that importing `searchrl.sft.commands` (the CLI) loads no torch. The
function `warm_start` is imported from `searchrl.sft.warm_start` (the package attribute of that name is
the module).
"""

from __future__ import annotations

from searchrl.common.lazy import lazy_attributes

_EXPORTS = {
    **dict.fromkeys(("NOISE_KINDS", "ExpertConfig", "ExpertForcing", "ExpertPolicy"), "searchrl.sft.expert"),
    **dict.fromkeys(
        (
            "SFTOutcome",
            "SFTRunConfig",
            "SFTWarmStartConfig",
            "dev_tool_call_rate",
            "prompt_texts",
            "run_sft",
            "sft_dataset",
            "sft_example",
        ),
        "searchrl.sft.warm_start",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)
