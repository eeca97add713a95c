"""The search service under fuzzing driven by its own OpenAPI spec, under load, and behind its guards.

* OpenAPI fuzz (schemathesis is not installed, so the same idea with hypothesis): request bodies are
  generated from the `/openapi.json` schemas of `/retrieve`, `/batch_search` and `/search`, then
  mutated (wrong types, unknown keys, huge numbers, non-objects, raw bytes). Every answer must be a
  2xx of the documented shape or a 4xx whose JSON names the problem; never a 5xx, never a dropped
  connection. The server is a real `searchrl.search.server` process on 127.0.0.1.
* Load: `benchmarks/load_search.py` with 64 concurrent clients for 3 s: no errors, /health keeps
  answering, p99 reported.
* Guards: bearer token (401 without it, constant-time compare), request limits (413/422), loopback bind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.processes import ROOT, python_env
from support.search import TOY_SERVER_TOKEN

TOKEN = TOY_SERVER_TOKEN
FUZZ = dict(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def http(toy_server):
    with httpx.Client(
        base_url=toy_server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30.0
    ) as client:
        yield client


@pytest.fixture(scope="module")
def body_schemas(http):
    spec = http.get("/openapi.json").json()
    out = {}
    for path in ("/retrieve", "/batch_search", "/search"):
        out[path] = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return out


json_junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def from_schema(schema: dict) -> st.SearchStrategy:
    """Values that satisfy `schema` (the small JSON-schema subset the service's spec uses)."""
    if "oneOf" in schema:
        return st.one_of([from_schema(s) for s in schema["oneOf"]])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        required = schema.get("required", [])
        return st.fixed_dictionaries(
            {k: from_schema(props[k]) for k in required},
            optional={k: from_schema(v) for k, v in props.items() if k not in required},
        )
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), max_size=6)
    if kind == "string":
        return st.text(max_size=60)
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum", -(2**31)), max_value=300)
    if kind == "boolean":
        return st.booleans()
    return json_junk


def mutated(schema: dict) -> st.SearchStrategy:
    """Schema-valid bodies, then bodies broken in one way: a value swapped for junk, an extra key, a non-object."""
    valid = from_schema(schema)
    swap = st.tuples(valid, st.sampled_from(sorted(schema.get("properties", {}))), json_junk).map(
        lambda t: {**t[0], t[1]: t[2]}
    )
    extra = st.tuples(valid, st.text(min_size=1, max_size=8), json_junk).map(lambda t: {**t[0], t[1]: t[2]})
    return st.one_of(valid, valid, swap, extra, json_junk)


def check_answer(path: str, body, resp: httpx.Response) -> None:
    assert resp.status_code < 500, f"{path} {body!r} -> {resp.status_code} {resp.text[:300]}"
    payload = resp.json()
    if resp.status_code >= 400:
        assert isinstance(payload.get("error"), str) and payload["error"], payload
        return
    assert resp.status_code == 200
    if path == "/retrieve":
        queries = body["queries"] if "queries" in body else [body["query"]]
        assert len(payload["result"]) == len(queries)
    elif path == "/batch_search":
        docs = payload[0] if body.get("return_score") else payload
        assert len(docs) == len(body["query"])


@pytest.mark.parametrize("path", ["/retrieve", "/batch_search", "/search"])
def test_openapi_driven_fuzz_never_gets_a_5xx(http, body_schemas, path):
    schema = body_schemas[path]
    assert schema.get("type") == "object"  # the spec really documents the body

    @settings(max_examples=150, **FUZZ)
    @given(body=mutated(schema))
    def run(body):
        # json.dumps writes NaN and ±Infinity as bare tokens (httpx's json= refuses them): the server must
        # meet them too, and answer 4xx or a clean 2xx, never a 5xx.
        raw = json.dumps(body).encode()
        resp = http.post(path, content=raw, headers={"content-type": "application/json"})
        check_answer(path, body if isinstance(body, dict) else {}, resp)

    run()


@settings(max_examples=60, **FUZZ)
@given(raw=st.binary(max_size=200), content_type=st.sampled_from(["application/json", "text/plain", ""]))
def test_raw_bytes_and_wrong_content_types_get_4xx(http, raw, content_type):
    resp = http.post("/retrieve", content=raw, headers={"content-type": content_type})
    assert 400 <= resp.status_code < 500 or (resp.status_code == 200 and json.loads(raw))
    assert resp.json()["error"] if resp.status_code >= 400 else True


def test_bearer_token_is_required_except_for_health(toy_server):
    body = {"queries": ["Tirrow"], "topk": 1}
    assert httpx.get(toy_server.url + "/health").status_code == 200
    missing = httpx.post(toy_server.url + "/retrieve", json=body)
    assert missing.status_code == 401 and "Bearer" in missing.json()["error"]
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = httpx.post(toy_server.url + "/retrieve", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = httpx.post(toy_server.url + "/retrieve", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["result"][0][0]["id"]


def test_request_limits_answer_4xx_with_the_limit(http):
    limits = http.get("/health").json()["limits"]
    too_many = http.post("/retrieve", json={"queries": ["a"] * (limits["max_queries"] + 1)})
    assert too_many.status_code == 422 and str(limits["max_queries"]) in too_many.json()["error"]
    too_long = http.post("/retrieve", json={"queries": ["a" * (limits["max_query_chars"] + 1)]})
    assert too_long.status_code == 422 and str(limits["max_query_chars"]) in too_long.json()["error"]
    too_deep = http.post("/retrieve", json={"queries": ["a"], "topk": limits["max_topk"] + 1})
    assert too_deep.status_code == 422
    huge = http.post("/retrieve", content=b"x" * (limits["max_body_bytes"] + 1))
    assert huge.status_code == 413 and "byte limit" in huge.json()["error"]


def test_server_binds_loopback_by_default(toy_server):
    # Every address the process listens on is 127.0.0.1 (read from the kernel, not from our config).
    pid = toy_server.proc.pid
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if parts[9] in inodes and parts[3] == "0A":  # state LISTEN
            listening.append(parts[1])
    assert listening, "the server listens on no IPv4 socket"
    assert all(addr.split(":")[0] == "0100007F" for addr in listening), listening  # 127.0.0.1


@pytest.mark.slow
def test_bounded_loopback_load_keeps_serving(toy_server, tmp_path):
    out = tmp_path / "load.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "load_search.py"), "--url", toy_server.url]
    cmd += ["--clients", "64", "--seconds", "3", "--token", TOKEN, "--json", str(out)]
    subprocess.run(cmd, cwd=ROOT, env=python_env(), check=True, timeout=120, capture_output=True)
    report = json.loads(out.read_text())
    print("load (64 clients, 3 s):", report["latency_ms"], f"{report['requests_per_s']:.0f} req/s")
    assert report["clients_finished"] == 64 and report["probe_finished"]  # no client and no health probe hung
    assert report["error_count"] == 0, report["errors"]
    assert report["requests"] >= 64
    assert report["latency_ms"]["p99"] > 0
    assert report["health_probes"] >= 2 and report["health_max_ms"] < 10_000


@pytest.mark.parametrize(
    "raw",
    [
        b'{"queries": ["Tirrow"], "topk": Infinity}',
        b'{"queries": ["Tirrow"], "topk": NaN}',
        b'{"queries": [-Infinity]}',
        b'{"query": ["Tirrow"], "topk": 1e400}',
    ],
)
def test_nan_and_infinity_tokens_get_a_4xx_that_names_the_field(http, raw):
    path = "/batch_search" if b'"query"' in raw else "/retrieve"
    resp = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert 400 <= resp.status_code < 500, resp.text
    error = resp.json()["error"]
    assert "topk" in error or "queries" in error, error
