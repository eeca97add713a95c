"""`searchrl --help` and every `searchrl <command> --help` load no heavy library, so they print at once.

Registering a command needs only its options and help texts; torch, transformers, trl, bm25s, fastapi and
the like are imported inside the commands, when they run. The check runs in a fresh interpreter (this test
process has imported them long ago) and reads `sys.modules`; it measures no time (machines are noisy).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HEAVY = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "bm25s",
    "numba",
    "faiss",
    "sentence_transformers",
    "matplotlib",
    "fastapi",
    "uvicorn",
    "vllm",
    "wandb",
    "trackio",
)

SCRIPT = """
import json, sys
import typer
from typer.testing import CliRunner
import searchrl.cli

heavy = sys.argv[1].split(",")
loaded_after_import = [m for m in heavy if m in sys.modules]
runner = CliRunner()
helps = {}

def walk(command, path):
    result = runner.invoke(searchrl.cli.app, [*path, "--help"], terminal_width=200)
    helps[" ".join(path)] = [result.exit_code, result.output]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        walk(sub, [*path, name])

walk(typer.main.get_command(searchrl.cli.app), [])
print(json.dumps({
    "after_import": loaded_after_import,
    "after_help": [m for m in heavy if m in sys.modules],
    "helps": helps,
}))
"""


@pytest.fixture(scope="module")
def startup() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(HEAVY)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_importing_the_cli_loads_no_heavy_library(startup):
    assert startup["after_import"] == [], "import these inside the commands that use them"


def test_every_commands_help_renders_without_a_heavy_library(startup):
    helps = startup["helps"]
    # The walk reached every room's commands, sub-apps included.
    for command in (
        "",
        "train",
        "grpo",
        "sft",
        "demo",
        "eval",
        "audit",
        "report",
        "view",
        "index",
        "search",
        "serve",
        "export",
        "data synth",
        "reward-model train",
        "models import-gguf",
    ):
        assert command in helps, f"`searchrl {command} --help` was not rendered"
    for command, (exit_code, output) in helps.items():
        assert exit_code == 0 and "Usage: searchrl" in output, f"searchrl {command} --help:\n{output}"
    assert startup["after_help"] == [], "rendering --help loaded these; import them inside the commands"


@pytest.mark.parametrize("package", ["searchrl.ppo", "searchrl.sft", "searchrl.models", "searchrl.rollout"])
def test_lazy_package_names_resolve(package):
    """The packages load their names when first used; each name must exist where the package says it is."""
    module = importlib.import_module(package)
    assert module.__all__
    for name in module.__all__:
        assert getattr(module, name) is getattr(importlib.import_module(module._EXPORTS[name]), name)
    with pytest.raises(AttributeError, match="no attribute 'missing_name'"):
        module.missing_name  # noqa: B018
