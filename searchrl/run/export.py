"""`searchrl export`: a run's checkpoint as a plain Hugging Face model folder that any tool loads.

What: the policy of `RUN/checkpoints/step-N/policy` (PPO or GRPO) written to `--out` as
`config.json` + `model.safetensors` (+ `generation_config.json`) + the tokenizer files with the chat template,
so `transformers.AutoModelForCausalLM.from_pretrained(out)` and `AutoTokenizer.from_pretrained(out)` load it
with no searchrl and no PEFT installed, and vLLM or TGI can serve it. A LoRA checkpoint holds only the adapter:
it is loaded onto its base model (the adapter's `base_model_name_or_path`, else the run's
`policy_model_path`, else `--base-model`) and merged with peft's `merge_and_unload`, so the folder holds
ordinary weights. `export_manifest.json` records the run, the checkpoint, the base model, whether an adapter
was merged, the dtype and the logit check.

Why a check: a merge that silently dropped the adapter, or a dtype cast that broke the weights, gives a folder
that loads fine and answers differently. After writing, the folder is loaded back with `from_pretrained` and
its logits on a probe text are compared with the model that was written (the merged model in memory); the
largest difference is recorded and above `tolerance` the export fails. The critic (`value/`) is not exported:
it is a training-time part.

Writes go to a temporary folder beside `--out`, renamed into place at the end, so a failed export leaves no
half-written model behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from searchrl.common.io import atomic_write_json
from searchrl.models.io import staged_model_dir, write_model_files
from searchrl.run.adapter import adapter_base_dir, load_adapter_policy, recorded_base
from searchrl.run.reader import RunReader

MANIFEST_NAME = "export_manifest.json"
DTYPES: dict[str, torch.dtype | None] = {
    "keep": None,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
PROBE_TEXT = "Which river flows through the capital city? Search, then answer."


class ExportError(ValueError):
    """An export cannot be done as asked; the message names the folder or option and what to change."""


@dataclass
class ExportResult:
    """What `export_checkpoint` wrote and how well the written folder reproduces the model."""

    out: Path
    manifest: dict[str, Any]


def _base_model_dir(policy_dir: Path, raw_config: dict[str, Any], base_model: str | Path | None) -> Path:
    """Where an adapter's base model is: `base_model`, else the adapter's own record, else the run's start
    (a relative record is resolved as `searchrl.run.adapter.adapter_base_dir` says)."""
    if base_model is not None:
        path = Path(base_model)
        if not (path / "config.json").is_file():
            raise ExportError(f"--base-model {path}: not a model folder (no config.json)")
        return path
    try:
        return adapter_base_dir(policy_dir, [raw_config.get("policy_model_path")])
    except FileNotFoundError:
        raise ExportError(
            f"{policy_dir} holds a LoRA adapter, and its base model is not on this machine (adapter_config.json "
            f"names {recorded_base(policy_dir)!r}, the run's policy_model_path is "
            f"{raw_config.get('policy_model_path')!r}); pass --base-model DIR, the folder of the model the run "
            "started from"
        ) from None


def _load_merged(policy_dir: Path, base_dir: Path | None) -> tuple[Any, bool]:
    if base_dir is None:
        return AutoModelForCausalLM.from_pretrained(
            policy_dir, local_files_only=True, dtype=torch.float32
        ), False
    return load_adapter_policy(policy_dir, base_dir), True


def _probe_logits(model: Any, tokenizer: Any) -> torch.Tensor:
    ids = tokenizer(PROBE_TEXT, return_tensors="pt")["input_ids"][:, :32]
    with torch.inference_mode():
        return model(input_ids=ids.to(model.device)).logits.float().cpu()


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise ExportError(
                f"--out {out}: exists and is not empty; choose another folder or pass --overwrite"
            )
        if not (out / MANIFEST_NAME).is_file():
            # Never delete what we did not write: --overwrite on the wrong folder must be harmless.
            raise ExportError(
                f"--out {out}: has no {MANIFEST_NAME}, so it is not an earlier export; refusing to replace it"
            )


def export_checkpoint(
    run_dir: str | Path,
    out: str | Path,
    checkpoint: str = "latest",
    dtype: str = "keep",
    base_model: str | Path | None = None,
    overwrite: bool = False,
    verify: bool = True,
    tolerance: float | None = None,
) -> ExportResult:
    """Write checkpoint `checkpoint` (`latest`, `step-N` or `N`) of `run_dir` to `out` as a plain HF model.

    `dtype`: keep (the checkpoint's float32), float32, bfloat16 or float16. `verify` loads the folder back and
    compares logits with the written model (`tolerance` default: 1e-4 in float32, 5e-2 in 16-bit dtypes).
    """
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    started = time.perf_counter()
    out = Path(out)
    _prepare_out(out, overwrite)
    reader = RunReader(run_dir)
    root = reader.require_run("searchrl export")
    try:
        policy_dir, name = reader.checkpoint_policy(str(checkpoint))
    except FileNotFoundError as e:
        raise ExportError(str(e)) from None
    is_adapter = (policy_dir / "adapter_config.json").is_file()
    base_dir = _base_model_dir(policy_dir, reader.raw_config, base_model) if is_adapter else None
    tok_dir = policy_dir if (policy_dir / "tokenizer_config.json").is_file() else reader.tokenizer_dir()
    if tok_dir is None:
        raise ExportError(
            f"{policy_dir}: no tokenizer here and the run names none; save one with the checkpoint"
        )
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    model, merged = _load_merged(policy_dir, base_dir)
    target = DTYPES[dtype]
    if target is not None:
        model = model.to(target)
    model.eval()
    with staged_model_dir(out) as staged:  # a failed check below leaves nothing at --out
        write_model_files(model, tokenizer, staged)
        check = _verify(staged, model, tokenizer, tolerance) if verify else {"verified": False}
        manifest = {
            "run": str(root),
            "trainer": reader.trainer,
            "checkpoint": name,
            "source": str(policy_dir),
            "lora_merged": merged,
            "base_model": None if base_dir is None else str(base_dir),
            "dtype": str(model.dtype).replace("torch.", ""),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "architecture": (model.config.architectures or [type(model).__name__])[0],
            "check": check,
            "seconds": round(time.perf_counter() - started, 3),
        }
        atomic_write_json(staged / MANIFEST_NAME, manifest)
    return ExportResult(out, manifest)


def _verify(folder: Path, model: Any, tokenizer: Any, tolerance: float | None) -> dict[str, Any]:
    """The written `folder` loaded back: its logits on the probe text against `model`'s (ExportError above
    the tolerance)."""
    reloaded = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=model.dtype).eval()
    diff = float((_probe_logits(reloaded, tokenizer) - _probe_logits(model, tokenizer)).abs().max())
    limit = tolerance if tolerance is not None else (1e-4 if model.dtype == torch.float32 else 5e-2)
    if not diff <= limit:
        raise ExportError(
            f"the written folder's logits differ from the model by {diff:.3g} (> {limit:g}); nothing was written "
            "to --out. Try --dtype keep, or report this with the checkpoint"
        )
    return {"verified": True, "probe": PROBE_TEXT, "max_abs_logit_diff": diff, "tolerance": limit}
