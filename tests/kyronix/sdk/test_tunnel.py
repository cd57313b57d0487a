"""The runtime side of the tunnel against a loopback relay that speaks docs/tunnel.md.

The relay (tests/kyronix/sdk/fakerelay.py) is a real ``websockets`` server: it checks the
authentication, records every frame, and drops connections when a test says so, so reconnects
and re-sends are seen on the wire.
"""

from __future__ import annotations

import asyncio
import re
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from websockets.asyncio.client import connect as aconnect
from websockets.sync.client import connect

from kyronix import (
    APIConnectionError,
    APITimeoutError,
    AsyncKyronix,
    AuthenticationError,
    ExecuterDisconnectedError,
    KmlError,
    Kyronix,
    KyronixError,
    KyronixTypeError,
    NoExecuterError,
    TunnelError,
    kml,
)

from .fakerelay import CLOSE, FakeRelay, Reply, answer_all, results_for

pytestmark = pytest.mark.timeout(60)

KML = '<tool name="write_file" executionId="exec_1"><path>a.txt</path><content>hi</content></tool>'


def sync_client(relay: FakeRelay, **kw: Any) -> Kyronix:
    return Kyronix(api_key=relay.key, base_url=relay.url, **kw)


def async_client(relay: FakeRelay, **kw: Any) -> AsyncKyronix:
    return AsyncKyronix(api_key=relay.key, base_url=relay.url, **kw)


def test_a_request_is_sent_as_the_document_says_and_its_results_returned() -> None:
    with FakeRelay() as relay, sync_client(relay) as kx:
        results = kx.execute_kml_over_ws(KML, executer_id="laptop", session_id="sess_1", timeout=30)
        again = kx.execute_kml_over_ws(KML)
    (frame, second) = relay.of_type("kml_request")
    assert re.fullmatch(r"req_[0-9a-f]{32}", frame["executionId"])
    assert frame == {
        "type": "kml_request",
        "executionId": frame["executionId"],
        "kmlResponse": KML,
        "timeout": 30.0,
        "executerId": "laptop",
        "sessionId": "sess_1",
    }
    assert second["executionId"] != frame["executionId"] and second["timeout"] == 60.0
    assert results == results_for(frame) and again == results_for(second)
    assert len(relay.connections) == 1  # one connection, kept
    assert relay.connections[0]["authorization"] == f"Bearer {relay.key}"
    assert relay.of_type("auth") == []  # the header authenticated it


def drop_first(frame: dict[str, Any], n: int) -> Reply:
    if frame["type"] == "kml_request" and n == 0:
        return CLOSE
    return answer_all(frame, n)


def test_a_dropped_connection_is_reconnected_and_the_same_frame_sent_again() -> None:
    with FakeRelay(drop_first) as relay, sync_client(relay) as kx:
        results = kx.execute_kml_over_ws(KML, timeout=30)
    first, again = relay.of_type("kml_request")
    assert again == first  # the same executionId, byte for byte the same frame
    assert len(relay.connections) == 2
    assert results == results_for(first)


def test_async_reconnects_and_sends_the_same_frame_again() -> None:
    async def main(relay: FakeRelay) -> list[dict[str, Any]]:
        async with async_client(relay) as kx:
            return await kx.execute_kml_over_ws(KML, timeout=30)

    with FakeRelay(drop_first) as relay:
        results = asyncio.run(main(relay))
    first, again = relay.of_type("kml_request")
    assert again == first and len(relay.connections) == 2
    assert results == results_for(first)


def test_tools_without_ids_get_them_once_so_a_resend_names_the_same_receipts() -> None:
    bare = '<tool name="write_file"><path>a.txt</path><content>hi</content></tool>'
    with FakeRelay(drop_first) as relay, sync_client(relay) as kx:
        kx.execute_kml_over_ws(bare, timeout=30)
    first, again = relay.of_type("kml_request")
    (tool,) = kml.parse(first["kmlResponse"]).tools
    assert re.fullmatch(r"exec_[0-9a-f]{32}", tool.execution_id) and not tool.assigned
    assert again["kmlResponse"] == first["kmlResponse"]


def test_malformed_kml_is_refused_before_connecting() -> None:
    with FakeRelay() as relay, sync_client(relay) as kx:
        with pytest.raises(KmlError):
            kx.execute_kml_over_ws("<kyronix><tool name='write_file'><path>a")
        with pytest.raises(KyronixTypeError):
            kx.execute_kml_over_ws(b"<tool name='x'/>")  # type: ignore[arg-type]
        assert relay.connections == []


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("no_executer", NoExecuterError),
        ("timeout", APITimeoutError),
        ("executer_disconnected", ExecuterDisconnectedError),
        ("bad_frame", TunnelError),
    ],
)
def test_an_error_frame_raises_its_error(code: str, cls: type[KyronixError]) -> None:
    def script(frame: dict[str, Any], _n: int) -> Reply:
        return [
            {"type": "error", "code": code, "message": f"said {code}",
             "executionId": frame["executionId"]}
        ]  # fmt: skip

    with FakeRelay(script) as relay, sync_client(relay) as kx, pytest.raises(cls) as info:
        kx.execute_kml_over_ws(KML)
    assert info.value.code == code and info.value.message == f"said {code}"  # type: ignore[attr-defined]
    assert len(relay.of_type("kml_request")) == 1  # an answer: not sent again


def test_a_kml_result_with_an_error_raises_it() -> None:
    def script(frame: dict[str, Any], _n: int) -> Reply:
        return [
            {"type": "kml_result", "executionId": frame["executionId"], "results": [],
             "error": {"code": "bad_kml", "message": "no <tool> in it"}}
        ]  # fmt: skip

    with (
        FakeRelay(script) as relay,
        sync_client(relay) as kx,
        pytest.raises(TunnelError, match="no <tool> in it") as info,
    ):
        kx.execute_kml_over_ws(KML)
    assert info.value.code == "bad_kml"


def progress_script(frame: dict[str, Any], _n: int) -> Reply:
    rid = frame["executionId"]
    events = [
        {"type": "kml_progress", "executionId": rid, "event": "tool_started",
         "tool": "terminal", "toolExecutionId": "exec_1"},
        {"type": "kml_progress", "executionId": rid, "event": "output",
         "tool": "terminal", "toolExecutionId": "exec_1", "chunk": "hello\n"},
        {"type": "kml_progress", "executionId": "req_someone_else", "event": "output",
         "tool": "terminal", "toolExecutionId": "exec_9", "chunk": "not mine"},
        {"type": "kml_progress", "executionId": rid, "event": "tool_finished",
         "tool": "terminal", "toolExecutionId": "exec_1", "success": True},
    ]  # fmt: skip
    return [*events, *answer_all(frame, 0)]


def test_progress_frames_of_the_request_go_to_on_progress() -> None:
    seen: list[dict[str, Any]] = []
    with FakeRelay(progress_script) as relay, sync_client(relay) as kx:
        kx.execute_kml_over_ws(KML, on_progress=seen.append)
    assert [(p["event"], p.get("chunk")) for p in seen] == [
        ("tool_started", None),
        ("output", "hello\n"),
        ("tool_finished", None),
    ]


def test_async_calls_share_the_connection_and_each_gets_its_own_answer() -> None:
    """The relay holds the first two requests and answers them in reverse order when the third
    arrives; progress of each goes to its own callback (a coroutine function is awaited)."""
    held: list[dict[str, Any]] = []

    def script(frame: dict[str, Any], _n: int) -> Reply:
        held.append(frame)
        if len(held) < 3:
            return []
        out: list[dict[str, Any]] = []
        for f in reversed(held):
            out.append(
                {"type": "kml_progress", "executionId": f["executionId"], "event": "output",
                 "tool": "x", "toolExecutionId": "exec_1", "chunk": f["kmlResponse"]}
            )  # fmt: skip
            out += answer_all(f, 0)
        return out

    progress: dict[int, list[str]] = {0: [], 1: [], 2: []}

    def on(i: int) -> Any:
        async def got(frame: dict[str, Any]) -> None:
            await asyncio.sleep(0)
            progress[i].append(frame["chunk"])

        return got

    kmls = [f'<tool name="x" executionId="exec_{i}"></tool>' for i in range(3)]

    async def main(relay: FakeRelay) -> list[list[dict[str, Any]]]:
        async with async_client(relay) as kx:
            return await asyncio.gather(
                *(kx.execute_kml_over_ws(k, on_progress=on(i)) for i, k in enumerate(kmls))
            )

    with FakeRelay(script) as relay:
        results = asyncio.run(main(relay))
    assert [r[0]["result"]["output"] for r in results] == kmls
    assert progress == {i: [k] for i, k in enumerate(kmls)}
    assert len(relay.connections) == 1


def test_threads_share_a_sync_client_and_each_gets_its_own_answer() -> None:
    held: list[dict[str, Any]] = []

    def script(frame: dict[str, Any], _n: int) -> Reply:
        held.append(frame)
        if len(held) < 3:
            return []
        return [out for f in reversed(held) for out in answer_all(f, 0)]

    kmls = [f'<tool name="x" executionId="exec_{i}"></tool>' for i in range(3)]
    with FakeRelay(script) as relay, sync_client(relay) as kx, ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda k: kx.execute_kml_over_ws(k, timeout=30), kmls))
    assert [r[0]["result"]["output"] for r in results] == kmls
    assert len(relay.connections) == 1


def test_a_connection_passed_in_is_used_and_authenticated_if_it_was_not() -> None:
    with FakeRelay() as relay:
        url = relay.url.replace("http", "ws") + "/ws"
        with connect(url) as ws, sync_client(relay, ws=ws) as kx:
            assert kx.execute_kml_over_ws(KML)
        assert relay.received[0] == {"type": "auth", "apiKey": relay.key, "role": "runtime"}
        headers = {"Authorization": f"Bearer {relay.key}"}
        with connect(url, additional_headers=headers) as ws, sync_client(relay, ws=ws) as kx:
            assert kx.execute_kml_over_ws(KML)
        assert len(relay.of_type("auth")) == 1  # the second one came authenticated
        assert len(relay.connections) == 2  # each client used the connection it was given

        async def main() -> None:
            async with (
                aconnect(url) as aws,
                AsyncKyronix(api_key=relay.key, base_url=relay.url, ws=aws) as akx,
            ):
                assert await akx.execute_kml_over_ws(KML)

        asyncio.run(main())
        assert len(relay.of_type("auth")) == 2 and len(relay.connections) == 3


def test_the_wrong_kind_of_connection_is_refused() -> None:
    with pytest.raises(KyronixTypeError, match=r"websockets\.sync\.client"):
        Kyronix(api_key="kyr_x", ws=object())  # type: ignore[arg-type]
    with pytest.raises(KyronixTypeError, match=r"websockets\.asyncio\.client"):
        AsyncKyronix(api_key="kyr_x", ws="ws://localhost/ws")  # type: ignore[arg-type]


def test_a_refused_key_is_an_authentication_error_not_a_retry() -> None:
    with FakeRelay(key="kyr_right") as relay:
        with (
            Kyronix(api_key="kyr_wrong", base_url=relay.url) as kx,
            pytest.raises(AuthenticationError, match="refused the API key") as info,
        ):
            kx.execute_kml_over_ws(KML, timeout=30)
        assert info.value.code == "invalid_api_key"
        assert info.value.details["closeCode"] == 4401
        assert len(relay.connections) == 1


def test_resolve_sends_a_ruling_and_returns_the_resolved_frame() -> None:
    def script(frame: dict[str, Any], _n: int) -> Reply:
        if frame["type"] != "resolve":
            return []
        if frame["executionId"] == "exec_known":
            return [
                {"type": "resolved", "executionId": frame["executionId"],
                 "resolution": frame["resolution"], "requestId": frame["requestId"]}
            ]  # fmt: skip
        return [{"type": "error", "code": "not_uncertain", "message": "it finished",
                 "requestId": frame["requestId"]}]  # fmt: skip

    with FakeRelay(script) as relay, sync_client(relay) as kx:
        resolved = kx.resolve("exec_known", "applied", executer_id="laptop")
        with pytest.raises(TunnelError, match="it finished") as info:
            kx.resolve("exec_done", "rerun")
    sent = relay.of_type("resolve")[0]
    assert sent["executionId"] == "exec_known" and sent["executerId"] == "laptop"
    assert resolved["type"] == "resolved" and resolved["resolution"] == "applied"
    assert resolved["requestId"] == sent["requestId"]
    assert info.value.code == "not_uncertain"


def test_pings_are_answered_with_pongs() -> None:
    with FakeRelay() as relay:
        relay.send_first = [{"type": "ping", "ts": 42}]
        with sync_client(relay) as kx:
            kx.execute_kml_over_ws(KML)
    assert relay.of_type("pong") == [{"type": "pong", "ts": 42}]


def test_no_answer_in_time_is_a_timeout_error() -> None:
    def silent(_frame: dict[str, Any], _n: int) -> Reply:
        return []

    with (
        FakeRelay(silent) as relay,
        sync_client(relay) as kx,
        pytest.raises(APITimeoutError, match="send it again") as info,
    ):
        kx.execute_kml_over_ws(KML, timeout=0.2)
    assert info.value.code == "timeout"


def test_a_tunnel_nobody_answers_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        Kyronix(api_key="kyr_x", base_url=f"http://127.0.0.1:{port}") as kx,
        pytest.raises(APIConnectionError, match=f"ws://127.0.0.1:{port}/ws") as info,
    ):
        kx.execute_kml_over_ws(KML, timeout=0.5)
    assert not isinstance(info.value, APITimeoutError)
    assert info.value.code == "connection_error"


def test_closing_the_client_ends_a_waiting_call() -> None:
    def silent(_frame: dict[str, Any], _n: int) -> Reply:
        return []

    async def main(relay: FakeRelay) -> None:
        kx = async_client(relay)
        waiting = asyncio.ensure_future(kx.execute_kml_over_ws(KML, timeout=30))
        while not relay.of_type("kml_request"):
            await asyncio.sleep(0.01)
        await kx.close()
        with pytest.raises(APIConnectionError, match="closed"):
            await waiting

    with FakeRelay(silent) as relay:
        asyncio.run(main(relay))
