"""A script of `benchmarks/` loaded as a module, for the tests that check its pieces without running it whole."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support.processes import ROOT

BENCH = ROOT / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """`benchmarks/<name>.py` as the module `_exp_<name>` (the scripts import their shared `_experiment_common`
    from beside them, and dataclasses look their module up in `sys.modules` while the script loads)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"_exp_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
