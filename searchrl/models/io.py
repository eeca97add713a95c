"""Model directories on disk: every model searchrl loads is loaded here, every model it writes written here.

Loading: `load_policy`, `load_value_model` and `load_tokenizer` take any local model directory (the tiny
model's, a real Qwen or SmolLM2 checkpoint, a run's checkpoint policy), never the hub; the tokenizer pads on
the left and must have a pad token distinct from EOS.

Saving: `save_model_dir(model, tokenizer, path)` writes a model (anything with `save_pretrained`: a transformers
model, a PEFT adapter, a value model) and its tokenizer into a temporary sibling folder of `path`, then renames
that folder to `path`. `staged_model_dir(path)` is the same publication step for a writer that adds files of
its own before the folder appears (the GGUF import's manifest, the export's verification and manifest);
`write_model_files` is what both put in the folder.

Why: a save killed halfway (Ctrl-C, out of memory, a job's time limit) used to leave a folder with a config and
half a safetensors file, which the next run loads or fails on in confusing ways. A rename is atomic on one file
system, so `path` holds either the complete old model, the complete new one, or (only between the two renames
that replace an existing folder) nothing. A killed save leaves at most a hidden `.NAME.saving-*` sibling.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

STAGING_MARK = ".saving-"


# torch and transformers are imported by the loaders when they load: `searchrl models --help` imports this
# module (through the GGUF import's saving) and must stay light.


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local directory (never the hub) with left padding and a pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    _keep_saved_pre_tokenizer(tok, Path(path) / "tokenizer.json")
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        raise ValueError(f"tokenizer at {path} has no pad token; set one distinct from EOS and save it again")
    if tok.pad_token_id == tok.eos_token_id:
        raise ValueError(
            f"tokenizer at {path}: pad token equals EOS ({tok.eos_token!r}); masks would hide real EOS tokens. "
            "Set a distinct pad token (Qwen2.5 uses <|endoftext|>)."
        )
    return tok


def _keep_saved_pre_tokenizer(tok: PreTrainedTokenizerBase, saved_file: Path) -> None:
    """Give `tok` back the pre-tokenizer its tokenizer.json was saved with, where loading replaced it.

    Why: with a Qwen2 config.json beside it, transformers 5 loads a tokenizer as Qwen2Tokenizer and rebuilds
    the pre-tokenizer from Qwen's own split regex, not the saved one. A tokenizer trained with another split
    (the tiny model's) then reads text into other ids than it was trained on: the support demo's " 27" became
    " ", "2", "7" after a reload. Text must encode to the same ids before and after a save.
    """
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or not saved_file.is_file():
        return
    from tokenizers import Tokenizer

    wanted = Tokenizer.from_file(str(saved_file)).pre_tokenizer
    loaded = backend.pre_tokenizer
    if wanted is not None and (loaded is None or loaded.__getstate__() != wanted.__getstate__()):
        backend.pre_tokenizer = wanted


def load_policy(path: str | Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """Load any causal LM from a local directory (tiny or a real Qwen), in eval mode (float32 unless `dtype`)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if dtype is None else dtype
    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype).eval()


def load_value_model(path: str | Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """Load a sequence-classification (value/reward) model from a local directory (float32 unless `dtype`)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    dtype = torch.float32 if dtype is None else dtype
    return AutoModelForSequenceClassification.from_pretrained(
        str(path), local_files_only=True, dtype=dtype, num_labels=1
    ).eval()


def write_model_files(model: Any, tokenizer: Any | None, folder: str | Path) -> None:
    """`model.save_pretrained(folder)` and, when given, `tokenizer.save_pretrained(folder)` (not atomic: write
    into a folder from `staged_model_dir`, or call `save_model_dir`)."""
    model.save_pretrained(str(folder))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


@contextlib.contextmanager
def staged_model_dir(path: str | Path) -> Iterator[Path]:
    """A fresh folder beside `path` to write into; renamed to `path` when the block ends without an error
    (an existing folder at `path` is replaced), removed when it raises. Yields the staging folder."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.with_name(f".{final.name}{STAGING_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    staging.mkdir()  # the user's umask, like any folder they write (mkdtemp would make it private)
    try:
        yield staging
        _publish(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _publish(staging: Path, final: Path) -> None:
    """Rename `staging` to `final`; an existing `final` is moved aside first and removed after the rename."""
    if not final.exists():
        os.replace(staging, final)
        return
    old = final.with_name(f".{final.name}.replaced-{os.getpid()}-{secrets.token_hex(4)}")
    os.replace(final, old)
    try:
        os.replace(staging, final)
    except BaseException:
        os.replace(old, final)  # the new model could not take its place: the old one stays
        raise
    shutil.rmtree(old, ignore_errors=True)


def save_model_dir(model: Any, tokenizer: Any | None, path: str | Path) -> Path:
    """Write `model` (and `tokenizer`, when given) to the folder `path` atomically; returns `path`.

    The files are those of `save_pretrained`; a folder already at `path` is replaced as a whole (not merged)."""
    with staged_model_dir(path) as staging:
        write_model_files(model, tokenizer, staging)
    return Path(path)
