"""What the demos' `--reuse-warm-start` tests check of the PPO run that followed a reused warm start."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def ppo_weights(out: Path) -> dict[Path, dict[str, torch.Tensor]]:
    """Every safetensors file under `out/ppo`, by its path relative to `out`."""
    return {p.relative_to(out): load_file(p) for p in (out / "ppo").rglob("*.safetensors")}


def assert_one_ppo_run_to_the_same_weights(out: Path, first: dict[Path, dict[str, torch.Tensor]]) -> None:
    """`out/ppo` holds one run (its metrics' steps once each, not two runs appended) that trained to the
    weights `first` (`ppo_weights` of the run that trained the warm start)."""
    metrics = [json.loads(line) for line in (out / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == sorted({m["step"] for m in metrics})
    again = ppo_weights(out)
    assert again.keys() == first.keys() and again
    for rel, tensors in again.items():
        for name, tensor in tensors.items():
            assert torch.allclose(tensor, first[rel][name], atol=1e-5), (rel, name)
