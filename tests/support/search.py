"""The search tests' toy corpus, and the search server run as a real process (two ways).

conftest.py indexes the toy corpus once (`toy_index_dir`, `toy_bm25`) and serves it (`toy_server`, a
`ServerProcess`). `ServerProcess` starts on a free port in its own process group and is killed with every
worker it started; `SearchServer` (the hardening and viewer tests) keeps its port, so a test can kill it
and start it again where clients expect it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from support.processes import ROOT, free_port, python_env, wait_http

TOY_DOCS = [
    {
        "id": "p1",
        "title": "Varnel Oskar",
        "contents": "Varnel Oskar was born in Tirrow and works for Quell Systems.",
    },
    {"id": "p2", "title": "Mira Dassen", "contents": "Mira Dassen directed the film Glass Harbor in Tirrow."},
    {"id": "c1", "contents": '"Tirrow"\nTirrow is the capital of Veland, a city of bridges and rivers.'},
    {"id": "o1", "title": "Quell Systems", "contents": "Quell Systems was founded in Brask by Ana Quell."},
    {
        "id": "w1",
        "title": "Glass Harbor",
        "contents": "Glass Harbor is a film about running rivers and harbors.",
    },
    {"id": "x1", "title": "", "contents": "A distractor about bridges, rivers and the weather in Brask."},
    {"id": "x2", "title": "Runner", "contents": "The runner runs; running is what runners do."},
    {"id": "x3", "title": "Empty words", "contents": "the and of a"},
]


# The bearer token of conftest.py's `toy_server` (the toy index served by a real process).
TOY_SERVER_TOKEN = "s3cret-token"


def write_corpus(path: Path, rows: list[dict] = TOY_DOCS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class ServerProcess:
    """`python -m searchrl.search.server` on a free 127.0.0.1 port, waited for via GET /health."""

    def __init__(self, index_dir: Path, token: str | None = None, extra: list[str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "searchrl.search.server",
            "--index",
            str(index_dir),
            "--port",
            str(self.port),
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("SEARCHRL_SERVE_TOKEN", None)
        if token:
            env["SEARCHRL_SERVE_TOKEN"] = token  # not on argv, as a real deployment would do
        # Its own session: `stop` kills the whole group, uvicorn's worker processes included.
        self.proc = subprocess.Popen(
            cmd + (extra or []), cwd=ROOT, env=env, stderr=subprocess.PIPE, start_new_session=True
        )
        self._wait_healthy()

    def _wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not become healthy in time")

    def stop(self) -> None:
        """SIGKILL the server and every worker it started (a crash, as the fault tests need)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class SearchServer:
    """`python -m searchrl.search.server` on a fixed 127.0.0.1 port, so it can be killed and restarted."""

    def __init__(self, index_dir: Path, port: int | None = None, token: str | None = None) -> None:
        self.index_dir = index_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.proc: subprocess.Popen | None = None

    def start(self) -> SearchServer:
        env = python_env()
        if self.token:
            env["SEARCHRL_SERVE_TOKEN"] = self.token
        cmd = [sys.executable, "-m", "searchrl.search.server", "--index", str(self.index_dir)]
        self.proc = subprocess.Popen(
            cmd + ["--port", str(self.port)], cwd=ROOT, env=env, stderr=subprocess.PIPE
        )
        wait_http(self.url + "/health", self.proc, timeout=120)
        return self

    def kill(self) -> None:
        """SIGKILL, no clean shutdown: what a crashed or OOM-killed search host looks like."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> SearchServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.kill()
