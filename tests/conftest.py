"""Fixtures that several test modules share, registered once for tests/ so a session scope really is one.

A fixture imported from a helper module into several test modules is a separate fixture in each of them
(pytest registers fixtures per module), so each module would build its own "session" copy. The shared
fixtures therefore live here, and test modules just name them as arguments:

- `world`: the Varnholt world (BM25 index, tokenizer, untrained tiny policy; `worlds.build_varnholt_world`).
- `rollout_world`: the rollout tests' world (the same index, a wider model; `worlds.build_rollout_world`).
- `synthetic_index(seed)`: the synthetic task at toy size and its BM25 index (`worlds.build_synthetic_index`).
- `grpo_world`: a tiny policy warm-started to search the synthetic task (`worlds.build_grpo_world`).
- `toy_index_dir`, `toy_bm25`, `toy_server`: the search tests' toy corpus (`support.search.TOY_DOCS`)
  indexed with BM25, and served by a real `searchrl.search.server` process.
- `smollm2_import`, `smollm2_dir`: the real-model import (`support/smollm2.py`: 20-35 s and 1.3 GB).

The expensive part of each world is built once per session. What tests change is not shared: each module
gets its own copy of the tokenizer and policy (TRL's GRPOTrainer sets a response template on the
tokenizer it is given; trainers update the weights they are given), and the GRPO world gives each module
its own root, where its runs write. The search indexes are only read, so every module shares one; each
module starts its own toy server. A module whose world differs defines its own fixture and says why.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.search import TOY_SERVER_TOKEN, ServerProcess, write_corpus
from support.smollm2 import smollm2_dir, smollm2_import  # noqa: F401
from worlds import (
    GrpoWorld,
    SyntheticIndex,
    build_grpo_world,
    build_rollout_world,
    build_synthetic_index,
    build_varnholt_world,
)

from searchrl.search.index import build_index, load_index


@pytest.fixture(scope="session")
def varnholt_world_once(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_varnholt_world(tmp_path_factory.mktemp("varnholt"))


@pytest.fixture(scope="module")
def world(varnholt_world_once: dict[str, Any]) -> dict[str, Any]:
    """The Varnholt world: `backend` (shared), `tok` and `policy` (this module's copies), `root`."""
    once = varnholt_world_once
    return {**once, "tok": copy.deepcopy(once["tok"]), "policy": copy.deepcopy(once["policy"])}


@pytest.fixture(scope="session")
def rollout_world_once(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_rollout_world(tmp_path_factory.mktemp("rollout_world"))


@pytest.fixture(scope="module")
def rollout_world(rollout_world_once: dict[str, Any]) -> dict[str, Any]:
    """The rollout tests' world: `backend` (shared), `tok` and `model` (this module's copies)."""
    once = rollout_world_once
    return {**once, "tok": copy.deepcopy(once["tok"]), "model": copy.deepcopy(once["model"])}


@pytest.fixture(scope="session")
def synthetic_index(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], SyntheticIndex]:
    """`synthetic_index(seed)`: the synthetic task ("tiny" preset) of `seed` and its BM25 index, built once
    per seed; each call gets its own copy of the task (rows are dicts a test may change)."""
    built: dict[int, SyntheticIndex] = {}

    def get(seed: int) -> SyntheticIndex:
        if seed not in built:
            built[seed] = build_synthetic_index(tmp_path_factory.mktemp(f"synthetic_{seed}"), seed)
        return dataclasses.replace(built[seed], task=copy.deepcopy(built[seed].task))

    return get


@pytest.fixture(scope="session")
def grpo_world_once(
    tmp_path_factory: pytest.TempPathFactory, synthetic_index: Callable[[int], SyntheticIndex]
) -> GrpoWorld:
    return build_grpo_world(tmp_path_factory.mktemp("grpo_world"), synthetic_index(0))


@pytest.fixture(scope="module")
def grpo_world(grpo_world_once: GrpoWorld, tmp_path_factory: pytest.TempPathFactory) -> GrpoWorld:
    """The GRPO world with this module's root (runs write under it) and its own tokenizer copy.

    `policy_dir` is shared: tests load the warm-started policy from it and never write there.
    """
    return dataclasses.replace(
        grpo_world_once,
        root=tmp_path_factory.mktemp("grpo_runs"),
        tokenizer=copy.deepcopy(grpo_world_once.tokenizer),
    )


@pytest.fixture(scope="session")
def toy_index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The search tests' toy corpus (`support.search.TOY_DOCS`) indexed with BM25."""
    d = tmp_path_factory.mktemp("toy_index")
    build_index(write_corpus(d / "corpus.jsonl"), d / "index")
    return d / "index"


@pytest.fixture(scope="session")
def toy_bm25(toy_index_dir: Path) -> Any:
    """The toy index opened as a `BM25Backend` (what `build_index` returns)."""
    return load_index(toy_index_dir)


@pytest.fixture(scope="module")
def toy_server(toy_index_dir: Path) -> Iterator[ServerProcess]:
    """`python -m searchrl.search.server` over the toy index, bearer token `TOY_SERVER_TOKEN`.

    One process per module: the service and fuzz tests load it hard, and none should see another's traffic.
    """
    with ServerProcess(toy_index_dir, token=TOY_SERVER_TOKEN) as server:
        yield server
