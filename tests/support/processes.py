"""Running searchrl in child processes from tests: the repository root, free ports, waiting for HTTP, the env.

One owner for what the search and hardening helpers each had a copy of (`ROOT`, `free_port`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    """Poll `url` until it answers 200; fail with the process's stderr if it died first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
            raise RuntimeError(f"process exited early (rc {proc.returncode}): {err}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s")


def python_env() -> dict[str, str]:
    """The environment of a child `python -m searchrl...`: this checkout importable, one thread, no token."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    env.pop("SEARCHRL_SERVE_TOKEN", None)
    return env
