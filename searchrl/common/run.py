"""The run directory and its manifest: everything needed to reproduce or audit a run.

`runs/<name>/` holds `config.yaml`, `manifest.json`, `metrics.jsonl`, `trajectories/*.jsonl.gz`,
`checkpoints/step-N/`, `eval/*.json` and `report.html`. The manifest records the versions of every
library that shapes the numbers, the git commit, seeds, padding side, generation config, a hash of
the chat template and the search index fingerprint: the facts the seeds say a reproducible RL run
must pin.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from searchrl.common.io import atomic_write_json

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
    extra: dict | None = None,
) -> dict[str, Any]:
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
    if tokenizer is not None:
        manifest["padding_side"] = getattr(tokenizer, "padding_side", None)
        manifest["pad_token_id"] = getattr(tokenizer, "pad_token_id", None)
        manifest["eos_token_id"] = getattr(tokenizer, "eos_token_id", None)
        manifest["chat_template_sha256"] = sha256_text(getattr(tokenizer, "chat_template", None))
    try:
        import torch

        manifest["torch_threads"] = torch.get_num_threads()
        manifest["cuda_available"] = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    manifest.update(extra or {})
    return manifest


class RunDir:
    """Paths of one run directory; creating it creates the folders."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        for sub in ("trajectories", "checkpoints", "eval"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    config = property(lambda self: self.root / "config.yaml")
    manifest = property(lambda self: self.root / "manifest.json")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    report = property(lambda self: self.root / "report.html")
    checkpoints = property(lambda self: self.root / "checkpoints")
    trajectories = property(lambda self: self.root / "trajectories")
    eval = property(lambda self: self.root / "eval")

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_json(self.manifest, manifest)

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"step-{step}"

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint (one whose `trainer_state.json` exists), or None."""
        done = [p for p in self.checkpoints.glob("step-*") if (p / "trainer_state.json").exists()]
        if not done:
            return None
        return max(done, key=lambda p: int(p.name.split("-")[1]))
