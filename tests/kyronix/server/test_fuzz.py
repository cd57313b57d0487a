"""A bounded schemathesis run over every route of the published OpenAPI document: no 5xx, and no
response (status, content type, body) outside what the document says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from starlette.testclient import TestClient

from kyronix.server.app import create_app

from .helpers import auth, config, project_with_key

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


KNOWN: dict[str, list[str]] = {"agent": ["coding", "research", "database", "sales"]}


def _operations(tmp_path: Path) -> tuple[Any, list[Any], str, TestClient]:
    # the rate limit and the failed-authentication throttle have tests of their own; here every
    # guess must reach the check it fuzzes
    app = create_app(config(tmp_path / "fuzz-home", rate_burst=10**6, auth_failure_burst=10**6))
    client = TestClient(app, raise_server_exceptions=False)
    client.__enter__()
    _, key = project_with_key(app, "fuzz", credits=10**9)
    run = client.post("/api/agents/coding", json={"input": "seed"}, headers=auth(key)).json()
    agent = client.post(
        "/api/customagents",
        json={"name": "fz", "tools": [{"name": "t", "params": ["a"]}]},
        headers=auth(key),
    ).json()
    KNOWN.update(
        session_id=[run["sessionId"]], sessionId=[run["sessionId"]], run_id=[run["runId"]],
        agent_id=[agent["id"]], agentId=[agent["id"]], customAgentId=[agent["id"]],
    )  # fmt: skip
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    return schema, operations, key, client


def _fuzz(operation: Any, headers: dict[str, str], examples: int, seen: list[int]) -> None:
    """Every other case gets real ids (a built-in agent, the project's session, run, custom
    agent) where the schema has such a field, so the fuzzer reaches past the 404s."""
    count = [0]

    @given(case=operation.as_strategy())
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    def one(case: Any) -> None:
        count[0] += 1
        if count[0] % 2:
            params = case.path_parameters or {}
            for name in params:
                if name in KNOWN:
                    params[name] = KNOWN[name][count[0] % len(KNOWN[name])]
            if isinstance(case.body, dict):
                for name in list(case.body):
                    if name in KNOWN and isinstance(case.body[name], str):
                        case.body[name] = KNOWN[name][0]
        response = case.call_and_validate(headers=headers, checks=CHECKS)
        seen.append(response.status_code)

    one()


def test_every_route_answers_within_its_schema(tmp_path: Path) -> None:
    _, operations, key, client = _operations(tmp_path)
    try:
        assert len(operations) >= 14  # every route of the document is fuzzed
        for operation in operations:
            seen: list[int] = []
            _fuzz(operation, auth(key), 12, seen)
            assert seen and all(code < 500 for code in seen), (operation.label, seen)
    finally:
        client.__exit__(None, None, None)


def test_every_route_without_a_valid_key_is_refused_within_its_schema(tmp_path: Path) -> None:
    _, operations, _, client = _operations(tmp_path)
    try:
        for operation in operations:
            seen: list[int] = []
            _fuzz(operation, {"Authorization": "Bearer kyr_" + "x" * 43}, 3, seen)
            assert all(code in (400, 401, 404, 413) for code in seen), (operation.label, seen)
    finally:
        client.__exit__(None, None, None)
