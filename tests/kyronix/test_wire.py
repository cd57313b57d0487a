"""kyronix.wire, the tunnel's one wire format (docs/tunnel.md): every frame parses to its typed
value and is made again by its builder; every malformed frame, hostile ones included, is a
BadFrame that says what was wrong, and parse never raises. The executer and the SDK use it and
keep no copy of their own."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kyronix import Kyronix, wire
from kyronix.wire import (
    Auth,
    BadFrame,
    ErrorFrame,
    KmlProgress,
    KmlRequest,
    KmlResult,
    Ping,
    Pong,
    Ready,
    Resolve,
    Resolved,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "kyronix"
FRAME_TYPES = (Auth, Ready, KmlRequest, KmlResult, KmlProgress, Resolve, Resolved, Ping, Pong,
               ErrorFrame)  # fmt: skip
ENTRY: wire.EntryDict = {
    "tool": "write_file",
    "args": {"path": "/b/a.txt", "content": "hi"},
    "result": {"success": True, "output": "wrote 2 bytes", "executionId": "exec_1", "ms": 3},
}


def nested(depth: int) -> Any:
    """A JSON value of ``depth`` nested objects."""
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def rebuilt(frame: wire.Frame) -> dict[str, Any]:
    """The typed frame made again by its builder."""
    match frame:
        case Auth():
            role: Any = frame.role
            return wire.auth(frame.api_key, role, frame.executer_id)
        case Ready():
            return wire.ready(frame.role, frame.project_id, frame.executer_id)
        case KmlRequest():
            return wire.kml_request(
                frame.request_id,
                frame.kml,
                executer_id=frame.executer_id,
                timeout=frame.timeout,
                session_id=frame.session_id,
            )
        case KmlResult():
            return wire.kml_result(frame.request_id, frame.results, frame.error)
        case KmlProgress():
            return wire.kml_progress(
                frame.request_id,
                frame.event,
                frame.tool,
                frame.tool_execution_id,
                success=frame.success,
                chunk=frame.chunk,
            )
        case Resolve():
            assert frame.request_id is not None
            return wire.resolve(
                frame.execution_id,
                frame.resolution,
                frame.request_id,
                executer_id=frame.executer_id,
                base_path=frame.base_path,
            )
        case Resolved():
            return wire.resolved(frame.execution_id, frame.resolution, frame.request_id)
        case Ping():
            return wire.ping(frame.ts)
        case Pong():
            return wire.pong(frame.ts)
        case ErrorFrame():
            return wire.error(
                frame.code,
                frame.message,
                execution_id=frame.execution_id,
                request_id=frame.request_id,
            )
    raise AssertionError(frame)


ROUND_TRIPS: list[tuple[dict[str, Any], wire.Frame]] = [
    (wire.auth("kyr_k"), Auth("kyr_k", "runtime")),
    (wire.auth("kyr_k", "executer", "laptop"), Auth("kyr_k", "executer", "laptop")),
    (wire.ready("runtime", "proj_1"), Ready("runtime", "proj_1")),
    (wire.ready("executer", "proj_1", "laptop"), Ready("executer", "proj_1", "laptop")),
    (wire.kml_request("req_1", "<tool/>"), KmlRequest("req_1", "<tool/>")),
    (
        wire.kml_request("req_1", "<tool/>", executer_id="lap.top", timeout=30.5,
                         session_id="sess_1"),
        KmlRequest("req_1", "<tool/>", "lap.top", 30.5, "sess_1"),
    ),
    (wire.kml_request("a:b", "k", timeout=3600), KmlRequest("a:b", "k", None, 3600.0)),
    (wire.kml_result("req_1", [ENTRY]), KmlResult("req_1", (ENTRY,))),
    (
        wire.kml_result("req_1", [], {"code": "bad_kml", "message": "at offset 3"}),
        KmlResult("req_1", (), {"code": "bad_kml", "message": "at offset 3"}),
    ),
    (
        wire.kml_progress("req_1", "tool_started", "terminal", "exec_1"),
        KmlProgress("req_1", "tool_started", "terminal", "exec_1"),
    ),
    (
        wire.kml_progress("req_1", "output", "terminal", "exec_1", chunk="hi\n"),
        KmlProgress("req_1", "output", "terminal", "exec_1", chunk="hi\n"),
    ),
    (
        wire.kml_progress("req_1", "tool_finished", "terminal", "exec_1", success=False),
        KmlProgress("req_1", "tool_finished", "terminal", "exec_1", success=False),
    ),
    (wire.resolve("exec_1", "rerun", "res_1"), Resolve("exec_1", "rerun", "res_1")),
    (
        wire.resolve("exec_1", "applied", "res_1", executer_id="laptop", base_path="/b"),
        Resolve("exec_1", "applied", "res_1", "/b", "laptop"),
    ),
    (wire.resolved("exec_1", "skipped", "res_1"), Resolved("exec_1", "skipped", "res_1")),
    (wire.resolved("exec_1", "skipped", None), Resolved("exec_1", "skipped")),
    (wire.ping(), Ping()),
    (wire.ping(7), Ping(7)),
    (wire.pong(), Pong()),
    (wire.pong({"at": [1, 2]}), Pong({"at": [1, 2]})),
    (wire.error("forbidden", "no"), ErrorFrame("forbidden", "no")),
    (
        wire.error("not_uncertain", "it finished", execution_id="exec_1", request_id="res_1"),
        ErrorFrame("not_uncertain", "it finished", "exec_1", "res_1"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("sent", "typed"), ROUND_TRIPS, ids=lambda v: str(v)[:60])
def test_every_frame_parses_to_its_typed_value_and_back(
    sent: dict[str, Any], typed: wire.Frame
) -> None:
    got = wire.parse(wire.encode(sent))
    assert got == typed
    assert isinstance(got, FRAME_TYPES)
    assert rebuilt(got) == sent
    assert wire.as_dict(got) == sent  # what the SDK hands its callers
    assert wire.parse(wire.encode(rebuilt(got))) == typed


def test_every_frame_type_has_a_round_trip() -> None:
    assert {type(typed) for _, typed in ROUND_TRIPS} == set(FRAME_TYPES)
    assert {sent["type"] for sent, _ in ROUND_TRIPS} == {
        kind for kinds in wire.SENT_BY.values() for kind in kinds
    } | {"auth", "ready"}


def test_encode_is_compact_json_text() -> None:
    text = wire.encode(wire.kml_request("req_1", "é\udc80"))
    # ASCII: a lone surrogate (a file read with surrogateescape) is escaped, never unsendable
    assert text == '{"type":"kml_request","executionId":"req_1","kmlResponse":"\\u00e9\\udc80"}'
    assert text.encode("utf-8")


# --------------------------------------------------------------------------- malformed

MALFORMED: list[tuple[str, str]] = [
    ("nope", "not JSON"),
    ('{"type": "ping"', "not JSON"),
    ("", "not JSON"),
    ("[1]", "JSON list"),
    ('"ping"', "not an object"),
    ("null", "not an object"),
    ("3.5", "not an object"),
    ("{}", '"type"'),
    ('{"type": 3}', '"type"'),
    ('{"type": null}', '"type"'),
    ('{"type": "dance"}', "unknown frame type 'dance'"),
    ('{"type": "KML_REQUEST"}', "unknown frame type"),
    ('{"type": "auth"}', "'apiKey'"),
    ('{"type": "auth", "apiKey": 3}', "'apiKey'"),
    ('{"type": "auth", "apiKey": "k", "role": 1}', "'role'"),
    ('{"type": "auth", "apiKey": "k", "executerId": "a b"}', "'executerId'"),
    ('{"type": "ready", "role": "runtime"}', "'projectId'"),
    ('{"type": "ready", "role": 1, "projectId": "p"}', "'role'"),
    ('{"type": "kml_request", "kmlResponse": "k"}', "'executionId'"),
    ('{"type": "kml_request", "executionId": "a b", "kmlResponse": "k"}', "'executionId'"),
    ('{"type": "kml_request", "executionId": "", "kmlResponse": "k"}', "'executionId'"),
    ('{"type": "kml_request", "executionId": 7, "kmlResponse": "k"}', "'executionId'"),
    (json.dumps(wire.kml_request("r" * 129, "k")), "'executionId'"),
    ('{"type": "kml_result", "executionId": "r", "results": {}}', "'results'"),
    ('{"type": "kml_result", "executionId": "r"}', "'results'"),
    ('{"type": "kml_result", "executionId": "a b", "results": []}', "'executionId'"),
    ('{"type": "kml_result", "executionId": "r", "results": [1]}', "{tool, args, result}"),
    ('{"type": "kml_result", "executionId": "r", "results": [{"tool": "t", "result": []}]}',
     "{tool, args, result}"),
    ('{"type": "kml_result", "executionId": "r", "results": [{"tool": "t", "args": [],'
     ' "result": {}}]}', "{tool, args, result}"),
    ('{"type": "kml_result", "executionId": "r", "results": [], "error": "bad"}', "'error'"),
    ('{"type": "kml_result", "executionId": "r", "results": [], "error": {"message": "m"}}',
     "'error'"),
    ('{"type": "kml_progress", "executionId": "r", "event": "dance", "tool": "t",'
     ' "toolExecutionId": "e"}', "'event'"),
    ('{"type": "kml_progress", "executionId": "r", "event": "output", "toolExecutionId": "e"}',
     "'tool'"),
    ('{"type": "kml_progress", "executionId": "r", "event": "output", "tool": "t"}',
     "'toolExecutionId'"),
    ('{"type": "resolve", "executionId": "t"}', "'resolution'"),
    ('{"type": "resolve", "executionId": "t", "resolution": 1}', "'resolution'"),
    ('{"type": "resolve", "executionId": "a b", "resolution": "rerun"}', "'executionId'"),
    ('{"type": "resolve", "executionId": "t", "resolution": "rerun", "requestId": 5}',
     "'requestId'"),
    ('{"type": "resolve", "executionId": "t", "resolution": "rerun", "basePath": []}',
     "'basePath'"),
    ('{"type": "resolve", "executionId": "t", "resolution": "rerun", "executerId": "a:b"}',
     "'executerId'"),
    ('{"type": "resolved", "executionId": "t"}', "'resolution'"),
    ('{"type": "resolved", "executionId": "t", "resolution": "rerun", "requestId": "a b"}',
     "'requestId'"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "says"), MALFORMED, ids=lambda v: str(v)[:50])
def test_a_malformed_frame_is_a_bad_frame_that_says_why(text: str, says: str) -> None:
    got = wire.parse(text)
    assert isinstance(got, BadFrame), got
    assert says in got.reason, got.reason
    assert got.request_id is None


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, "'kmlResponse'"),
        ({"kmlResponse": 3}, "'kmlResponse'"),
        ({"kmlResponse": None}, "'kmlResponse'"),
        ({"kmlResponse": "k", "timeout": 0}, "'timeout'"),
        ({"kmlResponse": "k", "timeout": -1}, "'timeout'"),
        ({"kmlResponse": "k", "timeout": 3600.5}, "at most 3600"),
        ({"kmlResponse": "k", "timeout": "30"}, "'timeout'"),
        ({"kmlResponse": "k", "timeout": True}, "'timeout'"),
        ({"kmlResponse": "k", "timeout": float("nan")}, "'timeout'"),
        ({"kmlResponse": "k", "sessionId": "a b"}, "'sessionId'"),
        ({"kmlResponse": "k", "sessionId": 3}, "'sessionId'"),
        ({"kmlResponse": "k", "executerId": "a:b"}, "'executerId'"),
        ({"kmlResponse": "k", "executerId": "x" * 65}, "'executerId'"),
    ],
    ids=str,
)
def test_a_kml_request_with_a_valid_id_keeps_it_when_it_is_bad(
    fields: dict[str, Any], says: str
) -> None:
    """So the executer can still answer it (a kml_result with error bad_frame)."""
    got = wire.parse(json.dumps({"type": "kml_request", "executionId": "req-1", **fields}))
    assert isinstance(got, BadFrame), got
    assert got.request_id == "req-1"
    assert says in got.reason, got.reason


def test_an_error_frame_keeps_only_what_it_can_use() -> None:
    got = wire.parse('{"type": "error", "code": 7, "executionId": "a b", "requestId": "r"}')
    assert got == ErrorFrame("unknown_error", "", None, "r")


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000,
        "[" * 200_000 + "]" * 200_000,
        '{"type": "ping", "ts": ' + "[" * 200_000 + "]" * 200_000 + "}",
        '{"type": "ping", "ts": ' + '{"a": ' * 200_000 + "1" + "}" * 200_001,
        json.dumps({"type": "ping", "ts": nested(70)}),
        json.dumps({"type": "kml_result", "executionId": "r", "results": [
            {"tool": "t", "args": {}, "result": {"success": True, "data": nested(70)}}]}),
        json.dumps({"type": "kml_request", "executionId": "r", "kmlResponse": "k",
                    "extra": nested(70)}),
    ],
    ids=["200000 [", "200000 [] closed", "in a ping", "200000 objects", "70-deep ts",
         "70-deep result data", "70-deep extra field"],
)  # fmt: skip
def test_a_frame_nested_too_deep_is_a_bad_frame_not_an_exception(text: str) -> None:
    got = wire.parse(text)
    assert isinstance(got, BadFrame)
    assert f"deeper than {wire.MAX_DEPTH}" in got.reason


def test_nesting_up_to_the_limit_is_a_frame() -> None:
    # the frame itself is one level: MAX_DEPTH levels in all parse, one more does not
    assert wire.parse(json.dumps({"type": "ping", "ts": nested(wire.MAX_DEPTH - 1)})) == Ping(
        nested(wire.MAX_DEPTH - 1)
    )
    assert isinstance(
        wire.parse(json.dumps({"type": "ping", "ts": nested(wire.MAX_DEPTH)})), BadFrame
    )


@pytest.mark.parametrize("message", [b'{"type": "ping"}', bytearray(b'{"type":"ping"}'), b""])
def test_a_binary_frame_is_a_bad_frame(message: bytes | bytearray) -> None:
    got = wire.parse(message)
    assert isinstance(got, BadFrame) and "binary" in got.reason


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "ping", "ts": NaN}',
        '{"type": "ping", "ts": -Infinity}',
        '{"type": "ping", "ts": 1e999}',
        '{"type": "kml_result", "executionId": "req-9", "results": [{"tool": "t", "args": {},'
        ' "result": {"success": true, "output": "", "executionId": "e", "ms": NaN}}]}',
        '{"type": "kml_progress", "executionId": "req-9", "event": "output", "tool": "t",'
        ' "toolExecutionId": "e", "chunk": "x", "extra": [[[Infinity]]]}',
    ],
)
def test_a_number_json_has_no_place_for_is_a_bad_frame_wherever_it_is(text: str) -> None:
    """Python's parser takes NaN, Infinity and 1e999; relayed, recorded or shown, they are JSON
    nobody else can read (PostgreSQL's jsonb, a browser's JSON.parse)."""
    got = wire.parse(text)
    assert isinstance(got, BadFrame), got
    assert got.reason == wire.NONFINITE_REASON or "'ts'" in got.reason, got.reason
    if "req-9" in text:  # an answer still names its request (the executer can answer it)
        assert got.request_id == "req-9" and got.reason == wire.NONFINITE_REASON
    assert "a JSON number" in wire.parse("NaN").reason  # type: ignore[union-attr]
    assert isinstance(wire.parse('{"type": "ping", "ts": 1e300}'), wire.Ping)  # large is fine


def test_no_frame_at_all_is_a_bad_frame() -> None:
    assert isinstance(wire.parse(None), BadFrame)


# --------------------------------------------------------------------------- never raises

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)
FIELDS = ("executionId", "kmlResponse", "results", "error", "event", "tool", "toolExecutionId",
          "success", "chunk", "resolution", "requestId", "basePath", "executerId", "timeout",
          "sessionId", "apiKey", "role", "projectId", "code", "message", "ts")  # fmt: skip
ID_LIKE = st.sampled_from(["req_1", "exec_1", "a b", "", "x" * 129, "laptop", "a:b"])
FRAME_LIKE = st.fixed_dictionaries(
    {"type": st.sampled_from([*wire.SENT_BY["executer"], *wire.SENT_BY["runtime"], "auth",
                              "ready", "dance"])},
    optional={name: JSON_VALUES | ID_LIKE for name in FIELDS},
)  # fmt: skip


def _checked(text: str | bytes) -> None:
    got = wire.parse(text)
    assert isinstance(got, (*FRAME_TYPES, BadFrame))
    if isinstance(got, BadFrame):
        assert got.reason


@settings(max_examples=300)
@given(st.text())
def test_parse_never_raises_on_any_text(text: str) -> None:
    _checked(text)


@settings(max_examples=300)
@given(st.binary())
def test_parse_never_raises_on_any_bytes(data: bytes) -> None:
    _checked(data)


@settings(max_examples=300)
@given(JSON_VALUES)
def test_parse_never_raises_on_any_json_value(value: Any) -> None:
    _checked(json.dumps(value))


@settings(max_examples=500)
@given(FRAME_LIKE)
def test_parse_never_raises_on_frames_of_known_types_with_any_fields(frame: dict[str, Any]) -> None:
    _checked(json.dumps(frame))


@settings(max_examples=300)
@given(FRAME_LIKE)
def test_what_parses_is_made_again_by_its_builder(frame: dict[str, Any]) -> None:
    """Whatever a frame became, its builder's frame parses to the same value (a progress
    frame's builder keeps ``success`` for ``tool_finished`` only, ``chunk`` for ``output``)."""
    got = wire.parse(json.dumps(frame))
    if isinstance(got, BadFrame):
        return
    if isinstance(got, KmlProgress):
        got = dataclasses.replace(
            got,
            success=got.success if got.event == "tool_finished" else None,
            chunk=got.chunk if got.event == "output" else None,
        )
    assert wire.parse(wire.encode(wire.as_dict(got))) == got
    if not (isinstance(got, Resolve) and got.request_id is None):  # resolve's builder names one
        assert wire.parse(wire.encode(rebuilt(got))) == got


# --------------------------------------------------------------------------- one copy


def test_the_executer_uses_the_wire_format_and_keeps_no_copy() -> None:
    from kyronix.executer import daemon, frames, results

    assert frames.ID_PATTERN is wire.REQUEST_ID
    assert frames.EXECUTER_ID_PATTERN is wire.EXECUTER_ID
    assert frames.RULINGS is wire.RULINGS
    assert frames.RESULT_ERROR_CODES is wire.RESULT_ERROR_CODES
    assert frames.RESOLVE_ERROR_CODES is wire.RESOLVE_ERROR_CODES
    assert frames.valid_id is wire.valid_id
    assert frames.BadFrame is wire.BadFrame
    assert frames.ServerError is wire.ErrorFrame
    assert frames.Ready is wire.Ready and frames.KmlRequest is wire.KmlRequest
    assert frames.Resolve is wire.Resolve
    assert frames.Ping is wire.Ping and frames.Pong is wire.Pong
    assert frames.ResultError is wire.ResultError
    for builder in ("kml_result", "kml_progress", "resolved", "error", "ping", "pong", "encode"):
        assert getattr(frames, builder) is getattr(wire, builder), builder
    assert results.ResultDict is wire.ResultDict and results.EntryDict is wire.EntryDict
    assert daemon.CLOSE_REFUSED == wire.CLOSE_UNAUTHORIZED
    assert daemon.CLOSE_REPLACED == wire.CLOSE_REPLACED


def test_the_executer_reads_frames_the_other_way_as_other_frames() -> None:
    from kyronix.executer import frames

    for sent, typed in ROUND_TRIPS:
        got = frames.parse_frame(wire.encode(sent))
        if isinstance(typed, Auth | KmlResult | KmlProgress | Resolved):
            assert got == frames.OtherFrame(sent["type"])
        else:
            assert got == typed
    assert isinstance(frames.parse_frame("[" * 200_000), BadFrame)
    bad = frames.parse_frame('{"type": "kml_result"}')
    assert isinstance(bad, BadFrame)


def test_the_sdk_builds_frames_the_wire_format_reads_back() -> None:
    from kyronix.client import _frames

    req = _frames.kml_request("<tool/>", timeout=30.0, executer_id="laptop", session_id="sess_1")
    assert wire.parse(wire.encode(req)) == KmlRequest(
        req["executionId"], "<tool/>", "laptop", 30.0, "sess_1"
    )
    res = _frames.resolve_frame("exec_1", "skipped", executer_id="laptop")
    assert wire.parse(wire.encode(res)) == Resolve(
        "exec_1", "skipped", res["requestId"], None, "laptop"
    )
    assert wire.valid_id(req["executionId"]) and wire.valid_id(res["requestId"])
    assert _frames.close_error(wire.CLOSE_UNAUTHORIZED, "no") is not None
    assert _frames.close_error(wire.CLOSE_REPLACED, "no") is None


@pytest.mark.parametrize("executer_id", ["a:b", "x" * 65, "a b"])
def test_the_sdk_refuses_an_executer_id_the_wire_format_would_refuse(executer_id: str) -> None:
    from kyronix.client import _frames
    from kyronix.errors import KyronixUsageError

    with pytest.raises(KyronixUsageError, match="executer_id"):
        _frames.kml_request("k", timeout=1.0, executer_id=executer_id)
    with pytest.raises(KyronixUsageError, match="executer_id"):
        _frames.resolve_frame("exec_1", "rerun", executer_id=executer_id)


_OWN_COPIES = ("client", "executer")


def _modules() -> list[Path]:
    return [p for part in _OWN_COPIES for p in sorted((SRC / part).rglob("*.py"))]


def test_neither_the_executer_nor_the_sdk_compiles_an_id_pattern_of_its_own() -> None:
    """An id pattern (``[A-Za-z0-9_.:-]{1,128}``, ``[A-Za-z0-9_.-]{1,64}``) is wire's
    REQUEST_ID or EXECUTER_ID; a tool name's (``[A-Za-z_][A-Za-z0-9_.-]*``) is not one."""
    found: list[str] = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("compile", "fullmatch", "match")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and "A-Za-z0-9_." in node.args[0].value
                and "{1," in node.args[0].value
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize(
    "module", ["client/_frames.py", "client/tunnel.py", "executer/frames.py", "executer/daemon.py"]
)
def test_the_tunnel_modules_decode_no_frame_themselves(module: str) -> None:
    tree = ast.parse((SRC / module).read_text(encoding="utf-8"))
    loads = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "loads"
    ]
    assert loads == [], f"{module} decodes JSON itself at lines {loads}: use kyronix.wire.parse"


# --------------------------------------------------------------------------- the SDK's reader


@pytest.mark.parametrize(
    "message",
    [
        "[" * 200_000,
        json.dumps({"type": "kml_result", "executionId": "req_1", "results": [],
                    "x": nested(70)}),
        "not json",
        b'{"type": "kml_result", "executionId": "req_1", "results": []}',
        '{"type": "kml_result", "executionId": "req_1", "results": 3}',
        '{"type": "error"}',
        '{"type": "dance"}',
        "",
    ],
    ids=["200000 [", "70 deep", "not json", "binary", "bad field", "bare error", "unknown",
         "empty"],
)  # fmt: skip
def test_the_sdk_reader_ignores_a_hostile_frame(message: str | bytes) -> None:
    import queue

    from kyronix.client.tunnel import SyncTunnel

    with Kyronix(api_key="kyr_k", base_url="http://127.0.0.1:9") as kx:
        tunnel = SyncTunnel(kx._config)
        waiter: queue.Queue[Any] = queue.Queue()
        tunnel._register("req_1", waiter)
        assert tunnel._dispatch(message, 1) is None
        assert waiter.empty()
        ping = tunnel._dispatch('{"type": "ping", "ts": 5}', 1)
        assert ping == Ping(5)


def test_a_hostile_frame_from_the_relay_does_not_stop_the_sdk_reader() -> None:
    """A real connection: frames the wire format refuses come first, then the answer."""
    from kyronix import AsyncKyronix

    from .sdk.fakerelay import FakeRelay

    hostile = [
        {"type": "kml_result", "executionId": "req_x", "results": [], "ts": nested(70)},
        {"type": "kml_result", "executionId": "req_x", "results": "nope"},
        {"type": "kml_progress", "executionId": "req_x"},
        {"type": "dance"},
        {"type": "ping", "ts": 9},
    ]
    kml = '<tool name="x" executionId="exec_1"></tool>'
    with FakeRelay() as relay:
        relay.send_first = hostile
        with Kyronix(api_key=relay.key, base_url=relay.url) as kx:
            results = kx.execute_kml_over_ws(kml, timeout=10)
        assert results[0]["result"]["output"] == kml

        async def main() -> list[dict[str, Any]]:
            async with AsyncKyronix(api_key=relay.key, base_url=relay.url) as akx:
                return await akx.execute_kml_over_ws(kml, timeout=10)

        assert asyncio.run(main())[0]["result"]["output"] == kml
        assert [f.get("ts") for f in relay.of_type("pong")] == [9, 9]
