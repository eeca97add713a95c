"""`searchrl export`: a run's checkpoint as a plain Hugging Face model folder (LoRA merged).

The logic lives in `searchrl.run.export` (and `searchrl.run.adapter` for LoRA checkpoints); this file only maps
options onto it. It sits in the run room because it reads a run: its checkpoints, recorded paths and manifest.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from searchrl.run.errors import RunTargetError


class ExportDType(StrEnum):
    keep = "keep"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


def export_command(
    run: Annotated[
        Path,
        typer.Argument(help="A run directory (PPO or GRPO) or a demo directory, with checkpoints/step-N/."),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Folder to write: config.json, model.safetensors, generation_config.json, the tokenizer and "
            "export_manifest.json (AutoModelForCausalLM.from_pretrained loads it).",
        ),
    ],
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="Which checkpoint: latest (default), step-N or N.")
    ] = "latest",
    dtype: Annotated[
        ExportDType,
        typer.Option(
            "--dtype", help="Weights' dtype: keep (the checkpoint's, float32), float32, bfloat16, float16."
        ),
    ] = ExportDType.keep,
    base_model: Annotated[
        Path | None,
        typer.Option(
            "--base-model",
            help="LoRA checkpoints: the base model folder to merge the adapter into (default: the adapter's "
            "base_model_name_or_path, else the run's policy_model_path).",
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace --out if it holds an earlier export.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify",
            help="Load the written folder back and compare its logits with the model (default on; it needs memory "
            "for a second copy of the model).",
        ),
    ] = True,
) -> None:
    """Export a checkpoint's policy as a plain Hugging Face model folder (a LoRA adapter merged into its base)."""
    from searchrl.run.export import ExportError, export_checkpoint  # torch, transformers: not for --help

    try:
        result = export_checkpoint(
            run,
            out,
            checkpoint=checkpoint,
            dtype=dtype.value,
            base_model=base_model,
            overwrite=overwrite,
            verify=verify,
        )
    except (ExportError, RunTargetError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    m = result.manifest
    merged = f", LoRA merged into {m['base_model']}" if m["lora_merged"] else ""
    check = (
        f"; reloaded logits within {m['check']['max_abs_logit_diff']:.2g}" if m["check"]["verified"] else ""
    )
    typer.echo(
        f"wrote {result.out} ({m['checkpoint']}, {m['parameters'] / 1e6:.1f}M parameters, {m['dtype']}{merged})"
        f"{check}"
    )


def register(app: typer.Typer) -> None:
    app.command(
        "export", help="Export a run's checkpoint as a plain Hugging Face model folder (LoRA merged)."
    )(export_command)
