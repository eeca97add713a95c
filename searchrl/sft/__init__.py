"""searchrl.sft: the SFT warm start.

`expert` runs an expert policy through the real environment and rollout engine (forced turns, with a
noise knob for imperfect demonstrations); `warm_start` trains a policy on those trajectories with TRL's
SFTTrainer, loss on the policy's own tokens only (the examples: `examples`), and `copy_check` says whether
it learned to copy answers; `pipeline` is the whole warm start `commands` (the `searchrl sft` CLI) runs.

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
            "SFTWarmStartConfig",
            "run_sft",
        ),
        "searchrl.sft.warm_start",
    ),
    **dict.fromkeys(("SFTRunConfig", "dev_tool_call_rate", "prompt_texts"), "searchrl.sft.pipeline"),
    **dict.fromkeys(("IGNORE_INDEX", "sft_dataset", "sft_example"), "searchrl.sft.examples"),
    **dict.fromkeys(("answer_copy_rate",), "searchrl.sft.copy_check"),
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)
