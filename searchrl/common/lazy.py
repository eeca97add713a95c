"""Package attributes imported on first use (PEP 562), so that importing a light submodule loads no heavy one.

What: `lazy_attributes(package, exports)` returns the `__getattr__` a package's `__init__` assigns; `exports`
maps each public name to the module that defines it. Why: `searchrl.ppo`, `searchrl.rollout`, `searchrl.sft`
and `searchrl.models` re-export names whose modules import torch, transformers or TRL, while the CLI's
`--help` and the run reader import only their light neighbours (tests/test_cli_startup.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module-level `__getattr__` of `package`: a name in `exports` is imported from its module when
    first asked for; any other name is an AttributeError, as for a plain module."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
