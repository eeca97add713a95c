"""A LoRA checkpoint (a PEFT adapter folder) as a plain policy: find its base model, load both, merge.

What: a PPO run trained with a `peft_config` (the real loop's `ppo/`) saves only the adapter in
`RUN/checkpoints/step-N/policy/`; its `adapter_config.json` names the base model by
`base_model_name_or_path`. `adapter_base_dir` finds that folder on this machine and `load_adapter_policy`
loads the base, puts the adapter on it and merges them (ordinary weights: faster to decode, and what
`searchrl export` writes).

Why the recorded path is not trusted as it is: it is whatever path the policy was loaded from, often
relative to the directory training ran in (`runs/demo-real/sft/policy` from the repository root), so from
any other working directory it names nothing and transformers would try the hub. A relative path is tried
against the working directory, then against every folder above the adapter (the checkpoint, the run, the
demo, the folder the run was started from, ...), then the caller's fallbacks (the run's starting policy).
Nothing is downloaded: a path that is no local model folder is reported with what was tried.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from searchrl.run.reader import recorded_path_candidates

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_dir(path: str | Path) -> bool:
    """True when `path` holds a PEFT adapter (`adapter_config.json`) rather than a whole model."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def recorded_base(adapter_dir: str | Path) -> str | None:
    """The adapter's `base_model_name_or_path`, as written (None when it records none)."""
    config = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    value = config.get("base_model_name_or_path")
    return str(value) if value else None


def adapter_base_dir(adapter_dir: str | Path, fallbacks: Iterable[str | Path | None] = ()) -> Path:
    """The local model folder the adapter in `adapter_dir` was trained on.

    Tries the adapter's `base_model_name_or_path`, then each of `fallbacks` (e.g. the run's starting policy),
    each resolved as `searchrl.run.reader.recorded_path_candidates` says (the run layer's rule); the first folder with a `config.json` wins. FileNotFoundError
    names what was recorded and tried when none is found.
    """
    adapter_dir = Path(adapter_dir)
    recorded = [recorded_base(adapter_dir), *fallbacks]
    tried: list[str] = []
    for path in recorded:
        if not path:
            continue
        for candidate in recorded_path_candidates(path, adapter_dir):
            if (candidate / "config.json").is_file():
                return candidate
            tried.append(str(candidate))
    raise FileNotFoundError(
        f"{adapter_dir} holds a LoRA adapter whose base model is not on this machine: adapter_config.json names "
        f"{recorded[0]!r}; tried {tried[:6] or 'nothing'}. Put the base model (for a demo run, its sft/policy) "
        "back where the run can find it, or merge the adapter with `searchrl export --base-model DIR` and "
        "evaluate that folder with --model"
    )


def load_adapter_policy(
    adapter_dir: str | Path, base_dir: str | Path, dtype: torch.dtype = torch.float32
) -> Any:
    """The base model at `base_dir` with the adapter of `adapter_dir` merged into its weights, in eval mode."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), local_files_only=True, dtype=dtype)
    merged = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=False).merge_and_unload()
    return merged.eval()
