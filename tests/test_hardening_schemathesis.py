"""schemathesis against the search service's own OpenAPI spec: no request it generates gets a 5xx.

The server is a real subprocess on 127.0.0.1 (with a bearer token); schemathesis reads its
`/openapi.json`, generates request bodies for every operation (valid and, through its negative
mode, invalid ones) and sends them over loopback. Bounded: a fixed number of examples per operation.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from support.search import TOY_SERVER_TOKEN

TOKEN = TOY_SERVER_TOKEN


def _operations(server) -> list:
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    return [result.ok() for result in api.get_all_operations()]


def test_no_generated_request_gets_a_5xx(toy_server) -> None:
    # schemathesis' own pytest plugin does not load under pytest 9, so its strategies drive hypothesis here.
    operations = _operations(toy_server)
    paths = {op.path for op in operations}
    assert {"/retrieve", "/batch_search", "/search", "/health"} <= paths
    seen: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=40,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case) -> None:
            response = case.call(
                base_url=toy_server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
            )
            seen.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
            if response.status_code >= 400:
                assert response.text.strip(), "a 4xx must say what was wrong"

        check()
    assert len(seen) >= 4 * 10 and any(code == 200 for code in seen)
