"""A run's `manifest.json`: everything needed to reproduce or audit a run, and the config class it names.

The manifest records the versions of every library that shapes the numbers, the git commit, seeds, padding
side, generation config, a hash of the chat template and the search index fingerprint: the facts a
reproducible RL run must pin. It also names the run's trainer (`trainer`, from the trainer's `extra`) and its
config class by dotted path (`config_class`), so the reader reloads `config.yaml` without importing any
trainer (`config_class_at`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from searchrl.run.errors import RunTargetError

TRACKED_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "datasets",
    "peft",
    "tokenizers",
    "bm25s",
    "faiss-cpu",
    "sentence-transformers",
    "numpy",
    "searchrl",
)


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The commit of the searchrl checkout (with `-dirty` when the tree has changes), if it is one."""
    root = Path(cwd) if cwd else Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def build_manifest(
    *,
    seeds: dict[str, int],
    tokenizer: Any = None,
    generation_config: dict | None = None,
    index_fingerprint: str | None = None,
    config: Any = None,
    extra: dict | None = None,
) -> dict[str, Any]:
    """The run's `manifest.json`: versions, commit, seeds, tokenizer facts, and `config`'s class as a dotted
    path (`config_class`), by which `RunReader.config_class` reloads `config.yaml` without knowing the trainers.
    A trainer names itself in `extra` (`{"trainer": "ppo"}`), which the reader takes as the run's kind."""
    manifest: dict[str, Any] = {
        "created_unix": time.time(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": package_versions(),
        "git_commit": git_commit(),
        "seeds": seeds,
        "generation_config": generation_config or {},
        "index_fingerprint": index_fingerprint,
    }
    if config is not None:
        manifest["config_class"] = f"{type(config).__module__}.{type(config).__qualname__}"
    if tokenizer is not None:
        manifest["padding_side"] = getattr(tokenizer, "padding_side", None)
        manifest["pad_token_id"] = getattr(tokenizer, "pad_token_id", None)
        manifest["eos_token_id"] = getattr(tokenizer, "eos_token_id", None)
        manifest["chat_template_sha256"] = sha256_text(getattr(tokenizer, "chat_template", None))
    try:
        import torch  # the thread count shapes CPU results; torch is loaded by every trainer that writes this

        manifest["torch_threads"] = torch.get_num_threads()
        manifest["cuda_available"] = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    manifest.update(extra or {})
    return manifest


def config_class_at(path: str, where: Path | str) -> type:
    """The config dataclass a dotted path (`searchrl.ppo.config.PPOConfig`) names; only searchrl's own."""
    module_name, _, name = str(path).rpartition(".")
    if not module_name.startswith("searchrl."):
        raise RunTargetError(f"{where}: config_class {path!r} is not a searchrl config class")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise RunTargetError(f"{where}: config_class {path!r} cannot be imported ({e})") from e
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise RunTargetError(f"{where}: config_class {path!r} is not a config dataclass")
    return cls
