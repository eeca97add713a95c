"""`searchrl index`, `searchrl search` and `searchrl serve` from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
from support.processes import ROOT, free_port
from support.search import write_corpus
from typer.testing import CliRunner

from searchrl.cli import app

runner = CliRunner()


def test_index_then_search(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    r = runner.invoke(
        app,
        [
            "index",
            "--corpus",
            str(corpus),
            "--out",
            str(tmp_path / "idx"),
            "--k1",
            "1.2",
            "--stemmer",
            "none",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "indexed 8 documents (bm25)" in r.output
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["params"]["k1"] == 1.2 and meta["params"]["stemmer"] is None
    r = runner.invoke(
        app, ["search", "--index", str(tmp_path / "idx"), "--k", "2", "capital of Veland", "zzz"]
    )
    assert r.exit_code == 0, r.output
    assert "1. [c1] Tirrow" in r.output and "(no hits)" in r.output
    r = runner.invoke(app, ["search", "--index", str(tmp_path / "idx"), "--json", "Glass Harbor"])
    hits = json.loads(r.output)
    assert hits[0][0]["doc_id"] == "w1" and set(hits[0][0]) == {"doc_id", "score", "title", "text"}


def test_clear_errors(tmp_path):
    r = runner.invoke(
        app, ["index", "--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]
    )
    assert r.exit_code != 0 and "corpus file not found" in r.output
    r = runner.invoke(app, ["search", "q"])
    assert r.exit_code != 0 and "exactly one of --index or --url" in r.output
    for cmd in ("index", "search", "serve"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "--help" in r.output


def test_serve_command_starts_a_real_server(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    assert (
        runner.invoke(app, ["index", "--corpus", str(corpus), "--out", str(tmp_path / "idx")]).exit_code == 0
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "searchrl.cli",
            "serve",
            "--index",
            str(tmp_path / "idx"),
            "--port",
            str(port),
            "--max-topk",
            "5",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert httpx.get(url + "/health").json()["limits"]["max_topk"] == 5
        r = httpx.post(url + "/retrieve", json={"queries": ["rivers"], "topk": 6})
        assert r.status_code == 422 and "between 1 and 5" in r.json()["error"]
        r = runner.invoke(app, ["search", "--url", url, "--k", "1", "--json", "Tirrow capital"])
        assert json.loads(r.output)[0][0]["doc_id"] == "c1"
    finally:
        proc.kill()
        proc.wait(timeout=10)
