"""The SDK's pure logic, without a socket: settings, requests, retries, errors, SSE, frames."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kyronix import kml, wire
from kyronix.client import _base
from kyronix.client._base import ClientConfig, ws_url
from kyronix.client._errors import STATUS_OF_CODE, api_error, tunnel_error
from kyronix.client._frames import (
    classify,
    kml_request,
    prepare_kml,
    resolve_frame,
    waiter_key,
)
from kyronix.client._retry import MAX_DELAY, Retrier, backoff, parse_retry_after
from kyronix.client.response import RunResponse, Usage, parse_run
from kyronix.client.streaming import RunStream, SseDecoder, SseEvent
from kyronix.errors import (
    APIError,
    APITimeoutError,
    AuthenticationError,
    ConflictError,
    ExecuterDisconnectedError,
    InsufficientCreditsError,
    KmlError,
    KyronixError,
    KyronixTypeError,
    KyronixUsageError,
    NoExecuterError,
    NotFoundError,
    ProjectNotFoundError,
    RateLimitError,
    TunnelError,
)


def config(**changes: Any) -> ClientConfig:
    args: dict[str, Any] = {
        "api_key": "kyr_k",
        "project_id": None,
        "base_url": None,
        "timeout": 60.0,
        "max_retries": 3,
        "environ": {},
    }
    return ClientConfig.resolve(**{**args, **changes})


# --------------------------------------------------------------------------- settings


def test_the_key_and_the_url_come_from_the_arguments_then_the_environment() -> None:
    env = {"KYRONIX_API_KEY": "kyr_env", "KYRONIX_BASE_URL": "https://kx.example/base/"}
    got = config(api_key=None, environ=env)
    assert (got.api_key, got.base_url) == ("kyr_env", "https://kx.example/base")
    got = config(api_key="kyr_arg", base_url="http://h:1", environ=env)
    assert (got.api_key, got.base_url) == ("kyr_arg", "http://h:1")
    assert config().base_url == "http://127.0.0.1:8080"
    assert config().headers()["Authorization"] == "Bearer kyr_k"


def test_a_missing_key_says_how_to_get_one() -> None:
    with pytest.raises(KyronixUsageError, match="KYRONIX_API_KEY") as info:
        config(api_key=None)
    assert "kyronix keys create" in str(info.value)
    with pytest.raises(KyronixUsageError, match="spaces"):
        config(api_key="kyr_ab cd")
    with pytest.raises(KyronixTypeError, match="api_key must be a string"):
        config(api_key=b"kyr_x")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"base_url": "ftp://x"}, "http:// or https://"),
        ({"base_url": "localhost:8080"}, "http:// or https://"),
        ({"base_url": "http://h/?q=1"}, "query"),
        ({"timeout": 0}, "positive"),
        ({"timeout": float("nan")}, "positive"),
        ({"timeout": "60"}, "number of seconds"),
        ({"max_retries": -1}, "max_retries"),
        ({"project_id": 5}, "project_id must be a string"),
    ],
)
def test_bad_settings_are_refused_with_what_to_do(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(KyronixUsageError, match=match):
        config(**changes)


def test_the_tunnel_url_follows_the_base_url() -> None:
    assert ws_url("http://127.0.0.1:8080") == "ws://127.0.0.1:8080/ws"
    assert ws_url("https://kx.example/prefix") == "wss://kx.example/prefix/ws"


# --------------------------------------------------------------------------- requests


def test_a_run_call_has_the_documents_body_and_a_fresh_idempotency_key() -> None:
    cfg = config(project_id="proj_default1")
    one = _base.run_call(cfg, agent="database", input="make a table", session_id="sess_abcd")
    two = _base.run_call(cfg, agent="database", input="make a table")
    assert (one.method, one.path) == ("POST", "/api/agents/database")
    assert one.body == {
        "input": "make a table",
        "projectId": "proj_default1",
        "sessionId": "sess_abcd",
    }
    assert one.idempotent and one.idempotency_key != two.idempotency_key
    assert re.fullmatch(r"idem_[0-9a-f]{32}", one.idempotency_key or "")
    assert one.headers({"A": "b"})["Idempotency-Key"] == one.idempotency_key
    other = _base.run_call(
        cfg, agent="coding", input="x", project_id="proj_other11", execute="tunnel"
    )
    assert other.body == {"input": "x", "projectId": "proj_other11", "execute": "tunnel"}
    stream = _base.custom_run_call(cfg, agent_id="a" * 64, input="hi", stream=True)
    assert stream.path == "/api/customagents/run/stream" and stream.stream
    assert stream.body == {"agentId": "a" * 64, "input": "hi", "projectId": "proj_default1"}
    assert stream.headers({})["Accept"] == "text/event-stream"


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"input": ""}, "input must be a non-empty string"),
        ({"input": None}, "input is required"),
        ({"agent": "../credits"}, "agent's slug"),
        ({"execute": "local"}, "execute must be None"),
        ({"timeout": -1}, "positive"),
        ({"session_id": 7}, "session_id must be a string"),
    ],
)
def test_bad_run_arguments_are_refused_before_anything_is_sent(
    changes: dict[str, Any], match: str
) -> None:
    args: dict[str, Any] = {"agent": "coding", "input": "x", **changes}
    with pytest.raises(KyronixUsageError, match=match):
        _base.run_call(config(), **args)


def test_a_dropped_stream_resumes_by_run_id_or_by_the_same_post() -> None:
    call = _base.run_call(config(), agent="coding", input="x", stream=True)
    joined = call.resumed("run_abcd1234", "0:120")
    assert (joined.method, joined.path) == ("GET", "/api/runs/run_abcd1234/stream")
    assert joined.headers({})["Last-Event-ID"] == "0:120"
    again = call.resumed(None, "1:40")
    assert (again.path, again.body, again.idempotency_key) == (
        call.path,
        call.body,
        call.idempotency_key,
    )
    assert again.headers({})["Last-Event-ID"] == "1:40"
    assert "Last-Event-ID" not in call.headers({})


def test_a_session_call_is_not_idempotent() -> None:
    call = _base.session_call(config(), agent="sales", project_id=None, custom_agent_id=None)
    assert call.body == {"agent": "sales"} and not call.idempotent
    assert _base.history_call("sess_a/b").path == "/api/sessions/sess_a%2Fb"


# --------------------------------------------------------------------------- retries


@given(st.integers(min_value=0, max_value=40), st.floats(min_value=0, max_value=0.999999))
def test_backoff_grows_from_half_a_second_with_jitter_in_the_upper_half(
    attempt: int, r: float
) -> None:
    step = min(MAX_DELAY, 0.5 * 2**attempt)
    delay = backoff(attempt, lambda: r)
    assert step / 2 < delay <= step


def test_retry_after_reads_seconds_and_dates() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("inf") is None
    later = datetime(2030, 1, 1, tzinfo=UTC)
    when = format_datetime(later + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(when, now=later.timestamp) == 30.0


def test_the_retrier_retries_what_the_policy_says_and_no_more() -> None:
    r = Retrier(3, rand=lambda: 0.0)
    assert [r.after_status(503, {}, "draining") for _ in range(4)] == [0.5, 1.0, 2.0, None]
    r = Retrier(3, rand=lambda: 0.0)
    assert r.after_status(429, {"retry-after": "2"}, "rate_limited") == 2.0
    assert r.after_status(429, {"retry-after": "120"}, "rate_limited") is None
    assert Retrier(3).after_status(408, {}, None) is not None
    for status, headers, code in [
        (400, {}, "invalid_request"),
        (409, {}, "session_busy"),
        (502, {}, "model_error"),  # a failed run's recorded answer: a retry replays it
        (502, {}, "invalid_kml"),
        (500, {"idempotent-replayed": "true"}, "internal_error"),
    ]:
        assert Retrier(3).after_status(status, headers, code) is None, (status, code)
    assert Retrier(3).after_status(500, {}, "internal_error", idempotent=False) is None
    assert Retrier(3).after_status(503, {}, "draining", idempotent=False) is not None
    assert Retrier(3).after_status(429, {}, "rate_limited", idempotent=False) is not None
    assert Retrier(3).after_connection_error(reached=True, idempotent=False) is None
    assert Retrier(3).after_connection_error(reached=False, idempotent=False) is not None
    r = Retrier(1)
    assert r.after_connection_error(reached=True, idempotent=True) is not None
    assert r.after_connection_error(reached=True, idempotent=True) is None
    r.progressed()
    assert r.after_connection_error(reached=True, idempotent=True) is not None


# --------------------------------------------------------------------------- errors


def body(code: str, message: str = "msg", **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (401, "invalid_api_key", AuthenticationError),
        (401, "missing_api_key", AuthenticationError),
        (402, "insufficient_credits", InsufficientCreditsError),
        (404, "project_not_found", ProjectNotFoundError),
        (404, "session_not_found", NotFoundError),
        (409, "session_busy", ConflictError),
        (429, "rate_limited", RateLimitError),
        (400, "invalid_request", APIError),
        (422, "idempotency_key_reused", APIError),
        (502, "model_error", APIError),
    ],
)
def test_each_status_is_its_error_and_keeps_the_servers_fields(
    status: int, code: str, cls: type[APIError]
) -> None:
    err = api_error(status, body(code, "what happened", runId="run_x"), {})
    assert type(err) is cls and isinstance(err, KyronixError)
    assert (err.code, err.status_code, err.message) == (code, status, "what happened")
    assert err.details == {"runId": "run_x"}
    assert str(err) == f"what happened ({status} {code})"
    # the same code in an SSE error event (no status): the same class, the documented status
    again = api_error(None, body(code))
    assert type(again) is cls and again.status_code == STATUS_OF_CODE[code]


def test_a_rate_limit_error_says_how_long_to_wait() -> None:
    err = api_error(429, body("rate_limited", retryAfter=0.25), {"retry-after": "1"})
    assert isinstance(err, RateLimitError) and err.retry_after == 1.0
    err = api_error(429, body("rate_limited", retryAfter=0.25), {})
    assert isinstance(err, RateLimitError) and err.retry_after == 0.25


def test_a_reply_that_is_not_a_kyronix_error_says_so() -> None:
    err = api_error(502, None, {}, text="<html><body>Bad   Gateway</body></html>")
    assert (err.code, err.status_code) == ("http_502", 502)
    assert "without a Kyronix error body: <html><body>Bad Gateway" in err.message
    assert "base_url" in err.message


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("no_executer", NoExecuterError),
        ("timeout", APITimeoutError),
        ("executer_disconnected", ExecuterDisconnectedError),
        ("not_uncertain", TunnelError),
        ("bad_frame", TunnelError),
    ],
)
def test_each_tunnel_error_code_is_its_error(code: str, cls: type[KyronixError]) -> None:
    frame = {"type": "error", "code": code, "message": "why", "executionId": "req_1"}
    err = tunnel_error(frame)
    assert type(err) is cls
    assert err.code == code and err.message == "why"  # type: ignore[attr-defined]
    assert err.details == {"executionId": "req_1"}


# --------------------------------------------------------------------------- responses, SSE


RUN = {
    "response": "<kyronix><status>complete</status></kyronix>",
    "sessionId": "sess_abcd",
    "creditsRemaining": 99.5,
    "usage": {"input": 10, "output": 20},
    "cost": 0.5,
    "executionIds": ["exec_" + "0" * 32],
    "runId": "run_abcd",
}


def test_a_run_body_becomes_a_run_response() -> None:
    got = parse_run(RUN)
    assert got == RunResponse(
        response=RUN["response"],
        session_id="sess_abcd",
        credits_remaining=99.5,
        usage=Usage(10, 20),
        execution_ids=["exec_" + "0" * 32],
        cost=0.5,
        run_id="run_abcd",
        results=None,
        raw=RUN,
    )
    assert parse_run({**RUN, "results": [{"tool": "x"}]}).results == [{"tool": "x"}]
    for broken in ({**RUN, "response": None}, {**RUN, "creditsRemaining": "lots"}, [RUN]):
        with pytest.raises(APIError) as info:
            parse_run(broken)
        assert info.value.code == "invalid_response"


def _wire(events: list[SseEvent], newline: str) -> list[str]:
    text = ""
    for ev in events:
        text += f": ping{newline}event: {ev.event}{newline}"
        if ev.id is not None:
            text += f"id: {ev.id}{newline}"
        for line in ev.data.split("\n"):
            text += f"data: {line}{newline}"
        text += newline
    return text.split(newline)


_events = st.lists(
    st.builds(
        SseEvent,
        event=st.sampled_from(["chunk", "attempt", "complete", "error"]),
        data=st.text(st.characters(blacklist_characters="\r\n\x00"), max_size=30).map(
            lambda t: t + "\nsecond line" if t.startswith("x") else t
        ),
        id=st.one_of(st.none(), st.from_regex(r"\A[0-9]{1,3}:[0-9]{1,5}\Z")),
    ),
    max_size=8,
)


@given(_events, st.sampled_from(["\n", "\r\n"]))
def test_sse_lines_decode_to_the_events_that_were_sent(
    events: list[SseEvent], newline: str
) -> None:
    decoder = SseDecoder()
    got = [e for line in _wire(events, newline) if (e := decoder.feed(line)) is not None]
    assert got == events


def test_a_run_stream_follows_chunks_attempts_and_the_end() -> None:
    stream = RunStream()
    stream.opened({"content-type": "text/event-stream; charset=utf-8", "x-run-id": "run_abcd"})
    assert stream.run_id == "run_abcd"
    with pytest.raises(APIError, match="not text/event-stream") as info:
        RunStream().opened({"content-type": "text/html"})
    assert info.value.code == "invalid_response"
    assert stream.handle(SseEvent("chunk", json.dumps({"text": "<kyr"}), "0:4")).text == "<kyr"
    step = stream.handle(SseEvent("attempt", json.dumps({"attempt": 1, "reason": "r"}), "1:0"))
    assert step.new_attempt and stream.attempt == 1 and stream.resume_from() == "1:0"
    end = stream.handle(SseEvent("complete", json.dumps(RUN), "end"))
    assert end.done and end.result == parse_run(RUN) and stream.result == end.result
    failed = RunStream().handle(SseEvent("error", json.dumps(body("model_error")), "end"))
    assert isinstance(failed.error, APIError) and failed.error.status_code == 502
    assert RunStream().handle(SseEvent("later", "{}")) == type(end)()  # unknown: ignored


# --------------------------------------------------------------------------- tunnel frames


def test_kml_without_execution_ids_gets_them_once_before_it_is_sent() -> None:
    bare = '<tool name="write_file"><path>a.txt</path><content>hi</content></tool>'
    sent = prepare_kml(bare)
    ids = [t.execution_id for t in kml.parse(sent).tools]
    assert all(re.fullmatch(r"exec_[0-9a-f]{32}", i) for i in ids)
    assert prepare_kml(sent) == sent  # ids fixed now: the same text every time
    assert [t.execution_id for t in kml.parse(sent).tools] == ids
    named = '<tool name="x" executionId="exec_1"><a>1</a></tool>'
    assert prepare_kml(named) == named  # sent exactly as given
    with pytest.raises(KmlError):
        prepare_kml("<kyronix><tool name='x'>")
    with pytest.raises(KyronixTypeError, match="string of KML"):
        prepare_kml(None)


def test_the_runtime_frames_are_docs_tunnel_md() -> None:
    frame = kml_request("<tool name='x'/>", timeout=30.0, executer_id="laptop", session_id="sess_1")
    assert re.fullmatch(r"req_[0-9a-f]{32}", frame["executionId"])
    assert frame == {
        "type": "kml_request",
        "executionId": frame["executionId"],
        "kmlResponse": "<tool name='x'/>",
        "timeout": 30.0,
        "executerId": "laptop",
        "sessionId": "sess_1",
    }
    with pytest.raises(KyronixUsageError, match="at most 3600"):
        kml_request("k", timeout=4000.0)
    with pytest.raises(KyronixUsageError, match="executer_id"):
        kml_request("k", timeout=1.0, executer_id="a b")
    res = resolve_frame("exec_1", "applied", executer_id="laptop")
    assert (
        re.fullmatch(r"res_[0-9a-f]{32}", res["requestId"]) and waiter_key(res) == res["requestId"]
    )
    assert res["type"] == "resolve" and res["resolution"] == "applied"
    with pytest.raises(KyronixUsageError, match="rerun, skipped, applied"):
        resolve_frame("exec_1", "undo")


def received(frame: dict[str, Any]) -> wire.Frame | wire.BadFrame:
    """``frame`` as the tunnel's reader gets it: text off the wire, parsed by kyronix.wire."""
    return wire.parse(json.dumps(frame))


def test_answers_are_routed_by_request_id_first() -> None:
    routed = classify(
        received({"type": "resolved", "executionId": "exec_1", "resolution": "rerun",
                  "requestId": "res_1"})
    )  # fmt: skip
    assert routed is not None and routed[0] == ["res_1", "exec_1"]
    assert routed[1].kind == "result"
    progress = classify(
        received({"type": "kml_progress", "executionId": "req_1", "event": "output",
                  "tool": "terminal", "toolExecutionId": "exec_1", "chunk": "hi"})
    )  # fmt: skip
    assert progress is not None and progress[1].kind == "progress"
    failed = classify(
        received({"type": "kml_result", "executionId": "req_1", "results": [],
                  "error": {"code": "bad_kml", "message": "no tools"}})
    )  # fmt: skip
    assert failed is not None and isinstance(failed[1].value, TunnelError)
    assert failed[1].value.code == "bad_kml"
    assert classify(received({"type": "ready", "role": "runtime", "projectId": "p"})) is None
