"""The executer's end of the WebSocket tunnel, against a real WebSocket server on loopback.

:class:`FakeServer` plays ``kyronix serve``'s ``/ws`` the way docs/tunnel.md says the server
behaves (``ready``, pending requests sent again on reconnect, ``pong``) and records every frame
the executer sends, byte for byte, and every connection's path and headers. The executer under
test is the real one (``KyronixExecuter(ws_url=...)``) with its real pipeline and receipts;
side effects are counted in files the tools append to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from websockets.asyncio.server import ServerConnection, serve

from kiso.kernel.execution import ExecutionId
from kyronix.executer import (
    ROOT_POLICIES,
    KyronixExecuter,
    KyronixUsageError,
    PermissionManager,
    TunnelEvent,
    TunnelRefusedError,
    TunnelReplacedError,
)
from kyronix.executer import frames as f
from kyronix.executer.receipts import request_hash

from .kmlkit import kml

KEY = "kyr_test_key_0123456789abcdefghijklmnopqrstuvwxyz"


# -- a server that plays /ws ------------------------------------------------------------------


class FakeServer:
    """A WebSocket server on 127.0.0.1 in a thread of its own, speaking docs/tunnel.md."""

    def __init__(
        self,
        *,
        project: str = "proj_test",
        close_with: tuple[int, str] | None = None,
        resend: bool = True,
    ) -> None:
        self.project = project
        self.close_with = close_with
        self.resend = resend
        self.frames: list[dict[str, Any]] = []
        """Every frame the executer sent, in order, with ``_conn`` (its connection number)."""
        self.connections: list[dict[str, Any]] = []
        self.pending: dict[str, dict[str, Any]] = {}
        self.paused = False
        """While True, every connection is closed at once with 1013 (try again later)."""
        self._lock = threading.Lock()
        self._current: ServerConnection | None = None
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._main, name="fake-ws-server", daemon=True)
        self._thread.start()
        assert self._started.wait(30), "the fake server did not start"

    # the server's loop

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = self._loop.create_future()
        async with serve(self._handler, "127.0.0.1", 0) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._started.set()
            await self._stop

    async def _handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        if self.paused:
            await ws.close(1013, "try again later")
            return
        with self._lock:
            number = len(self.connections) + 1
            self.connections.append(
                {"path": ws.request.path, "headers": dict(ws.request.headers.raw_items())}
            )
        if self.close_with is not None:
            await ws.close(*self.close_with)
            return
        self._current = ws
        query = parse_qs(urlsplit(ws.request.path).query)
        await ws.send(
            json.dumps(
                {
                    "type": "ready",
                    "role": query.get("role", ["runtime"])[0],
                    "projectId": self.project,
                    "executerId": query.get("executerId", ["default"])[0],
                }
            )
        )
        if self.resend:
            with self._lock:
                again = list(self.pending.values())
            for frame in again:
                await ws.send(json.dumps(frame))
        with contextlib.suppress(Exception):
            async for message in ws:
                frame = json.loads(message)
                frame["_conn"] = number
                with self._lock:
                    self.frames.append(frame)
                    if frame["type"] == "kml_result":
                        self.pending.pop(frame["executionId"], None)
                if frame["type"] == "ping":
                    await ws.send(json.dumps({"type": "pong"}))
        if self._current is ws:
            self._current = None

    # the test's side

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def send(self, frame: dict[str, Any]) -> None:
        """Send a frame to the executer now (a kml_request stays pending until answered)."""
        if frame.get("type") == "kml_request":
            with self._lock:
                self.pending[frame["executionId"]] = frame
        assert self.wait_for(lambda: self._current is not None), "no executer is connected"
        ws = self._current
        assert ws is not None
        asyncio.run_coroutine_threadsafe(ws.send(json.dumps(frame)), self._loop).result(30)

    def request(self, rid: str, text: str) -> None:
        self.send({"type": "kml_request", "executionId": rid, "kmlResponse": text})

    def drop(self) -> None:
        """Cut the executer's TCP connection without a closing handshake."""
        ws = self._current
        assert ws is not None
        self._current = None
        self._loop.call_soon_threadsafe(ws.transport.abort)

    def close_current(self, code: int, reason: str) -> None:
        ws = self._current
        assert ws is not None
        asyncio.run_coroutine_threadsafe(ws.close(code, reason), self._loop).result(30)

    def of(self, kind: str, rid: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                fr
                for fr in self.frames
                if fr["type"] == kind and (rid is None or fr.get("executionId") == rid)
            ]

    def wait_for(self, predicate: Callable[[], object], timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return bool(predicate())

    def result(self, rid: str, count: int = 1) -> dict[str, Any]:
        """The ``count``-th kml_result for ``rid`` (waiting for it), without ``_conn``."""
        assert self.wait_for(lambda: len(self.of("kml_result", rid)) >= count), (
            f"no kml_result #{count} for {rid}; frames: {self.frames}"
        )
        frame = dict(self.of("kml_result", rid)[count - 1])
        frame.pop("_conn")
        return frame

    def close(self) -> None:
        stop = self._stop
        if stop is not None:
            self._loop.call_soon_threadsafe(lambda: stop.done() or stop.set_result(None))
        self._thread.join(30)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.close()


@pytest.fixture
def events() -> list[TunnelEvent]:
    return []


def _executer(
    server: FakeServer, base: Path, tmp_path: Path, events: list[TunnelEvent], **kw: Any
) -> KyronixExecuter:
    return KyronixExecuter(
        server.url,
        PermissionManager(ROOT_POLICIES),
        api_key=KEY,
        base_path=base,
        receipts=tmp_path / "receipts.sqlite3",
        on_tunnel_event=events.append,
        **kw,
    )


@pytest.fixture
def served(
    server: FakeServer, base: Path, tmp_path: Path, events: list[TunnelEvent]
) -> Iterator[KyronixExecuter]:
    """A ROOT executer serving the fake server from a background thread."""
    ex = _executer(server, base, tmp_path, events, executer_id="laptop")
    ex.start()
    assert ex.wait_connected(60)
    yield ex
    ex.close()
    assert not [t for t in threading.enumerate() if t.name == "kyronix-tunnel"]


class Gate:
    """A custom tool with effects: it appends a line to ``count`` and then waits for
    :meth:`open` (so a test can act while it runs)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.event = threading.Event()

    def __call__(self, args: dict[str, Any]) -> str:
        with self.path.open("a") as out:
            out.write(f"{args.get('label', 'run')}\n")
        assert self.event.wait(60), "the gate was never opened"
        return "passed the gate"

    def open(self) -> None:
        self.event.set()

    @property
    def runs(self) -> int:
        return len(self.path.read_text().splitlines()) if self.path.exists() else 0


# -- the pure part --------------------------------------------------------------------------


def test_frames_parse_what_the_server_sends() -> None:
    assert f.parse_frame('{"type":"ready","role":"executer","projectId":"p1"}') == f.Ready(
        "executer", "p1", None
    )
    assert f.parse_frame(
        '{"type":"kml_request","executionId":"req_1","kmlResponse":"<tool name=\\"x\\"/>"}'
    ) == f.KmlRequest("req_1", '<tool name="x"/>')
    assert f.parse_frame(
        '{"type":"resolve","executionId":"t1","resolution":"rerun","requestId":"r","basePath":"/b"}'
    ) == f.Resolve("t1", "rerun", "r", "/b")
    assert f.parse_frame('{"type":"ping","ts":7}') == f.Ping(7)
    assert f.parse_frame('{"type":"error","code":"forbidden","message":"no"}') == f.ServerError(
        "forbidden", "no"
    )
    assert f.parse_frame('{"type":"kml_result","executionId":"x","results":[]}') == f.OtherFrame(
        "kml_result"
    )
    for bad in ("nope", "[1]", '{"type":3}', '{"type":"dance"}', b"{}"):
        assert isinstance(f.parse_frame(bad), f.BadFrame), bad
    bad_id = f.parse_frame('{"type":"kml_request","executionId":"a b","kmlResponse":""}')
    assert isinstance(bad_id, f.BadFrame) and bad_id.request_id is None
    no_body = f.parse_frame('{"type":"kml_request","executionId":"r-1"}')
    assert isinstance(no_body, f.BadFrame) and no_body.request_id == "r-1"
    assert isinstance(f.parse_frame('{"type":"resolve","executionId":"t"}'), f.BadFrame)


def test_frames_the_executer_sends_have_the_documented_shape() -> None:
    entry: Any = {"tool": "t", "args": {}, "result": {"success": True}}
    assert f.kml_result("r", [entry]) == {
        "type": "kml_result",
        "executionId": "r",
        "results": [entry],
    }
    assert f.kml_result("r", [], {"code": "bad_kml", "message": "m"})["error"] == {
        "code": "bad_kml",
        "message": "m",
    }
    assert f.kml_progress("r", "output", "terminal", "t1", chunk="hi", success=True) == {
        "type": "kml_progress",
        "executionId": "r",
        "event": "output",
        "tool": "terminal",
        "toolExecutionId": "t1",
        "chunk": "hi",
    }
    assert f.kml_progress("r", "tool_finished", "x", "t1", success=False)["success"] is False
    assert f.resolved("t1", "rerun", None) == {
        "type": "resolved",
        "executionId": "t1",
        "resolution": "rerun",
    }
    assert f.error("running", "m", execution_id="t1", request_id="q") == {
        "type": "error",
        "code": "running",
        "message": "m",
        "executionId": "t1",
        "requestId": "q",
    }
    assert f.pong(5) == {"type": "pong", "ts": 5} and f.pong() == {"type": "pong"}


def test_executer_url_adds_role_and_id() -> None:
    url = f.executer_url("ws://localhost:8080/ws?x=1&role=runtime", "laptop")
    assert parse_qs(urlsplit(url).query) == {
        "x": ["1"],
        "role": ["executer"],
        "executerId": ["laptop"],
    }
    assert f.shown_url("wss://u:p@host:9/ws?a=b") == "wss://host:9/ws"
    for bad_url in ("http://localhost/ws", "ws:///ws", "localhost:8080"):
        with pytest.raises(KyronixUsageError, match="ws://"):
            f.executer_url(bad_url, "x")
    for bad_id in ("has space", "a:b", "x" * 65):
        with pytest.raises(KyronixUsageError, match="executer id"):
            f.executer_url("ws://h/ws", bad_id)


def test_backoff_doubles_from_half_a_second_to_thirty_with_jitter_and_resets() -> None:
    backoff = f.Backoff(rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(12)]
    for n, delay in enumerate(delays):
        top = min(30.0, 0.5 * 2**n)
        assert top / 2 <= delay <= top, (n, delay)
    assert delays[-1] <= 30.0 and len(set(delays)) == len(delays)  # jittered
    backoff.connection_ended(3.0)  # not stable: the schedule goes on
    assert backoff.next_delay() >= 15.0
    backoff.connection_ended(10.0)  # stable: start over
    assert backoff.next_delay() <= 0.5


# -- connecting --------------------------------------------------------------------------------


def test_constructing_needs_no_loop_and_a_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KYRONIX_API_KEY", raising=False)
    with pytest.raises(KyronixUsageError, match="KYRONIX_API_KEY"):
        KyronixExecuter("ws://localhost:8080/ws", receipts=":memory:")
    with pytest.raises(KyronixUsageError, match="ws://"):
        KyronixExecuter("http://localhost:8080/ws", api_key=KEY, receipts=":memory:")
    with pytest.raises(KyronixUsageError, match="printable"):
        KyronixExecuter("ws://localhost:8080/ws", api_key="kyr_x\nEvil: 1", receipts=":memory:")
    monkeypatch.setenv("KYRONIX_API_KEY", KEY)
    monkeypatch.chdir(tmp_path)
    ex = KyronixExecuter("ws://localhost:8080/ws", receipts=":memory:")
    assert ex.tunnel is None and ex.base_path == tmp_path.resolve()  # nothing dialled yet
    ex.close()


def test_dials_as_executer_with_the_key_and_answers_a_request(
    server: FakeServer, served: KyronixExecuter, base: Path, events: list[TunnelEvent]
) -> None:
    [conn] = server.connections
    query = parse_qs(urlsplit(conn["path"]).query)
    assert urlsplit(conn["path"]).path == "/ws"
    assert query == {"role": ["executer"], "executerId": ["laptop"]}
    assert conn["headers"]["Authorization"] == f"Bearer {KEY}"
    assert [e.message for e in events if e.kind == "connected"] == [
        f"connected to {server.url} as executer laptop of project proj_test"
    ]
    assert served.tunnel is not None and served.tunnel.project_id == "proj_test"

    server.request("req_1", kml(("write_file", {"path": "src/a.txt", "content": "hello\n"}, "w-1")))
    result = server.result("req_1")
    assert (base / "src/a.txt").read_text() == "hello\n"
    assert set(result) == {"type", "executionId", "results"}
    assert result["type"] == "kml_result" and result["executionId"] == "req_1"
    [entry] = result["results"]
    assert entry["tool"] == "write_file" and entry["args"]["path"] == str(base / "src/a.txt")
    assert entry["result"]["success"] is True and entry["result"]["executionId"] == "w-1"


def test_malformed_kml_is_answered_with_bad_kml_and_runs_nothing(
    server: FakeServer, served: KyronixExecuter, base: Path
) -> None:
    server.request("req_bad", '<kyronix><tool name="write_file"><path>x</path><content>cut')
    result = server.result("req_bad")
    assert result["results"] == []
    assert result["error"]["code"] == "bad_kml"
    assert (
        "offset" in result["error"]["message"] and "nothing was run" in result["error"]["message"]
    )
    server.send({"type": "kml_request", "executionId": "req_nobody"})
    assert server.result("req_nobody")["error"]["code"] == "bad_frame"
    assert os.listdir(base) == []


def test_a_refused_key_ends_the_tunnel_with_a_clear_error(
    base: Path, tmp_path: Path, events: list[TunnelEvent]
) -> None:
    refusing = FakeServer(close_with=(4401, "unknown key"))
    try:
        ex = _executer(refusing, base, tmp_path, events)
        ex.start()
        with pytest.raises(TunnelRefusedError, match="refused the executer's key"):
            ex.wait_connected(60)
        ex.close()
        assert len(refusing.connections) == 1  # no retry: a refused key stays refused
    finally:
        refusing.close()


def test_an_id_held_by_another_key_is_tried_again_not_given_up(
    base: Path, tmp_path: Path, events: list[TunnelEvent]
) -> None:
    """4409: another key's live executer holds the id. The executer keeps trying (with its
    backoff) rather than stopping: a squatter cannot keep it off once its own connection goes."""
    held = FakeServer(close_with=(4409, "the executer id 'default' is held by another key"))
    try:
        ex = _executer(held, base, tmp_path, events)
        ex.start()
        assert held.wait_for(lambda: len(held.connections) >= 2)  # it came back
        tunnel = ex.tunnel
        assert tunnel is not None and not tunnel.ended and tunnel.error is None
        said = [e.message for e in events if e.kind == "disconnected"]
        assert said and "another key" in said[0] and "--executer-id" in said[0]
        held.close_with = None  # the holder is gone: the id is this executer's now
        assert ex.wait_connected(60)
        ex.close()
    finally:
        held.close()


def test_being_replaced_by_another_executer_stops_this_one(
    server: FakeServer, served: KyronixExecuter
) -> None:
    server.close_current(4000, "replaced")
    tunnel = served.tunnel
    assert tunnel is not None
    assert server.wait_for(lambda: tunnel.ended)
    assert isinstance(tunnel.error, TunnelReplacedError)
    assert len(server.connections) == 1


def test_heartbeat_pings_and_pongs(
    server: FakeServer, base: Path, tmp_path: Path, events: list[TunnelEvent]
) -> None:
    ex = _executer(server, base, tmp_path, events, heartbeat_s=0.05)
    with ex:
        assert ex.wait_connected(60)
        assert server.wait_for(lambda: len(server.of("ping")) >= 3)
        assert server.of("ping")[0] == {"type": "ping", "_conn": 1}
        server.send({"type": "ping", "ts": 42})
        assert server.wait_for(lambda: server.of("pong"))
        assert server.of("pong") == [{"type": "pong", "ts": 42, "_conn": 1}]
    assert not [t for t in threading.enumerate() if t.name == "kyronix-tunnel"]


# -- exactly once over a connection that drops -------------------------------------------------


def test_a_request_resent_after_a_drop_mid_envelope_is_not_run_twice(
    server: FakeServer,
    served: KyronixExecuter,
    base: Path,
    tmp_path: Path,
    events: list[TunnelEvent],
) -> None:
    gate = Gate(tmp_path / "gate.count")
    served.register("gate", gate)
    plan = kml(
        ("gate", {"label": "one"}, "g-1"),
        ("write_file", {"path": "after.txt", "content": "after\n"}, "w-2"),
    )
    server.request("req_drop", plan)
    assert server.wait_for(lambda: gate.runs == 1)
    server.drop()  # mid-envelope: the gate holds the first tool
    assert server.wait_for(lambda: len(server.connections) == 2), "the executer did not return"
    tunnel = served.tunnel
    assert tunnel is not None
    assert server.wait_for(lambda: tunnel.connected)
    # The fake server sent the pending request again on the new connection, as the server does.
    assert server.wait_for(lambda: tunnel.connections == 2)
    assert server.wait_for(
        lambda: any(e.message == "req_drop: already running; the run in progress answers it"
                    for e in events)
    )  # fmt: skip
    gate.open()
    result = server.result("req_drop")
    assert [r["result"]["success"] for r in result["results"]] == [True, True]
    assert gate.runs == 1  # the gate ran once, though the request came twice
    assert (base / "after.txt").read_text() == "after\n"
    # One answer, on the second connection.
    assert [a["_conn"] for a in server.of("kml_result", "req_drop")] == [2]


def test_a_duplicate_while_running_waits_for_the_same_run(
    server: FakeServer, served: KyronixExecuter, tmp_path: Path, events: list[TunnelEvent]
) -> None:
    gate = Gate(tmp_path / "gate.count")
    served.register("gate", gate)
    plan = kml(("gate", {"label": "one"}, "g-dup"))
    server.request("req_dup", plan)
    assert server.wait_for(lambda: gate.runs == 1)
    server.request("req_dup", plan)
    assert server.wait_for(
        lambda: any("already running" in e.message for e in events if e.kind == "request")
    )
    gate.open()
    result = server.result("req_dup")
    assert result["results"][0]["result"]["output"] == "passed the gate"
    assert gate.runs == 1
    server.request("req_dup", plan)  # and once finished, the same answer again
    assert server.result("req_dup", 2) == result
    assert gate.runs == 1


@pytest.mark.parametrize("resend", [False, True], ids=["server-forgot", "server-resends"])
def test_a_result_that_finished_offline_is_sent_after_the_reconnect(
    base: Path, tmp_path: Path, events: list[TunnelEvent], resend: bool
) -> None:
    # Without resend only the executer can bring the result back; with it, the request sent
    # again right after ready must not get a second answer.
    quiet = FakeServer(resend=resend)
    try:
        ex = _executer(quiet, base, tmp_path, events)
        gate = Gate(tmp_path / "gate.count")
        ex.register("gate", gate)
        with ex:
            assert ex.wait_connected(60)
            quiet.request("req_off", kml(("gate", {}, "g-off")))
            assert quiet.wait_for(lambda: gate.runs == 1)
            quiet.paused = True
            quiet.drop()
            gate.open()  # it finishes while the executer cannot connect
            assert quiet.wait_for(
                lambda: any(e.message.startswith("req_off: 1 tool(s)") for e in events)
            )
            quiet.paused = False
            result = quiet.result("req_off")
            assert result["results"][0]["result"]["success"] is True
            assert gate.runs == 1
            if resend:
                assert quiet.wait_for(
                    lambda: any("just sent on this connection" in e.message for e in events)
                )
            assert [r["_conn"] for r in quiet.of("kml_result", "req_off")] == [2]
            assert any(e.kind == "disconnected" for e in events)
    finally:
        quiet.close()


def test_a_recent_request_is_answered_from_memory(
    server: FakeServer, served: KyronixExecuter, base: Path
) -> None:
    plan = kml(("write_file", {"path": "mem.txt", "content": "first\n"}, "w-mem"))
    server.request("req_mem", plan)
    first = server.result("req_mem")
    # Forget the receipts: only the executer's memory can now keep the write from running again.
    assert server.wait_for(lambda: served.prune_receipts(0) == 1)
    assert served.receipts.get(str(base), ExecutionId("w-mem")) is None
    (base / "mem.txt").write_text("changed since\n")
    server.request("req_mem", plan)
    assert server.result("req_mem", 2) == first
    assert (base / "mem.txt").read_text() == "changed since\n"


def test_uncertain_is_not_remembered_and_a_resolve_frame_lets_it_run(
    server: FakeServer, served: KyronixExecuter, base: Path, tmp_path: Path
) -> None:
    gate = Gate(tmp_path / "gate.count")
    gate.open()
    served.register("gate", gate)
    # What a killed executer leaves behind: a started receipt that nothing runs any more.
    served.receipts.start(str(base), ExecutionId("g-unc"), "gate", request_hash("gate", {}))
    plan = kml(("gate", {}, "g-unc"))
    server.request("req_unc", plan)
    [entry] = server.result("req_unc")["results"]
    assert entry["result"]["uncertain"] is True and gate.runs == 0

    server.send(
        {"type": "resolve", "executionId": "g-unc", "resolution": "rerun", "requestId": "q1"}
    )
    assert server.wait_for(lambda: server.of("resolved"))
    assert server.of("resolved") == [
        {"type": "resolved", "executionId": "g-unc", "resolution": "rerun", "requestId": "q1",
         "_conn": 1}
    ]  # fmt: skip
    server.request("req_unc", plan)
    assert server.result("req_unc", 2)["results"][0]["result"]["success"] is True
    assert gate.runs == 1

    # A ruling made elsewhere (`kyronix executer resolve` is another process on the same store)
    # reaches the daemon too: the uncertain answer was not kept in its memory.
    served.receipts.start(str(base), ExecutionId("g-unc2"), "gate", request_hash("gate", {}))
    plan2 = kml(("gate", {}, "g-unc2"))
    server.request("req_unc2", plan2)
    assert server.result("req_unc2")["results"][0]["result"]["uncertain"] is True
    with KyronixExecuter(receipts=tmp_path / "receipts.sqlite3") as elsewhere:
        elsewhere.resolve("g-unc2", "rerun", base)
    server.request("req_unc2", plan2)
    assert server.result("req_unc2", 2)["results"][0]["result"]["success"] is True
    assert gate.runs == 2


def test_resolve_frames_that_cannot_apply_get_error_frames(
    server: FakeServer, served: KyronixExecuter, base: Path, tmp_path: Path
) -> None:
    gate = Gate(tmp_path / "gate.count")
    served.register("gate", gate)
    server.request("req_w", kml(("write_file", {"path": "w.txt", "content": "w"}, "w-done")))
    server.result("req_w")
    server.request("req_g", kml(("gate", {}, "g-run")))
    assert server.wait_for(lambda: gate.runs == 1)

    cases = {
        "nobody": ("rerun", None, "unknown_execution"),
        "w-done": ("applied", None, "not_uncertain"),
        "g-run": ("skipped", None, "running"),
        "w-x": ("maybe", None, "bad_ruling"),
        "w-y": ("rerun", "/somewhere/else", "unknown_execution"),
    }
    for n, (eid, (how, where, _)) in enumerate(cases.items()):
        frame: dict[str, Any] = {
            "type": "resolve",
            "executionId": eid,
            "resolution": how,
            "requestId": f"q{n}",
        }
        if where is not None:
            frame["basePath"] = where
        server.send(frame)
    assert server.wait_for(lambda: len(server.of("error")) == len(cases))
    got = {e["executionId"]: e for e in server.of("error")}
    for n, (eid, (_, _, code)) in enumerate(cases.items()):
        assert got[eid]["code"] == code, got[eid]
        assert got[eid]["requestId"] == f"q{n}" and got[eid]["message"]
    assert server.of("resolved") == []
    gate.open()
    assert server.result("req_g")["results"][0]["result"]["success"] is True


# -- progress ----------------------------------------------------------------------------------


def test_progress_frames_stream_the_terminal_as_it_runs(
    server: FakeServer, served: KyronixExecuter, base: Path
) -> None:
    command = "echo one; while [ ! -f go ]; do sleep 0.02; done; echo two"
    server.request("req_p", kml(("terminal", {"command": command}, "t-p")))

    def printed() -> str:
        return "".join(p.get("chunk", "") for p in server.of("kml_progress", "req_p"))

    # "one" arrives while the command still waits: it was streamed, not sent with the result.
    assert server.wait_for(lambda: "one" in printed())
    assert server.of("kml_result", "req_p") == []
    (base / "go").touch()
    result = server.result("req_p")
    assert result["results"][0]["result"]["output"] == "one\ntwo\n"
    progress = [
        {k: v for k, v in p.items() if k != "_conn"} for p in server.of("kml_progress", "req_p")
    ]
    assert progress[0] == {
        "type": "kml_progress",
        "executionId": "req_p",
        "event": "tool_started",
        "tool": "terminal",
        "toolExecutionId": "t-p",
    }
    assert progress[-1] == {**progress[0], "event": "tool_finished", "success": True}
    assert {p["event"] for p in progress[1:-1]} == {"output"}
    assert printed() == "one\ntwo\n"
    order = [fr["type"] for fr in server.frames if fr.get("executionId") == "req_p"]
    assert order[-1] == "kml_result"  # every progress frame came before the result


def test_execute_on_progress_in_process(root_executer: KyronixExecuter, base: Path) -> None:
    seen: list[Any] = []
    plan = kml(
        ("write_file", {"path": "a.txt", "content": "x"}, "w-a"),
        ("terminal", {"command": "printf 'out'"}, "t-a"),
    )

    root_executer.execute_sync(plan, base, on_progress=seen.append)
    events = [(p.event, p.execution_id) for p in seen]
    assert events[:3] == [
        ("tool_started", "w-a"),
        ("tool_finished", "w-a"),
        ("tool_started", "t-a"),
    ]
    assert events[-1] == ("tool_finished", "t-a")
    assert "".join(p.chunk for p in seen if p.event == "output") == "out"
    seen.clear()
    root_executer.execute_sync(plan, base, on_progress=seen.append)
    assert seen == []  # replayed from receipts: nothing ran, nothing is reported


# -- the async API and stopping ---------------------------------------------------------------


def test_async_with_connects_serves_and_leaves_nothing_behind(
    server: FakeServer, base: Path, tmp_path: Path, events: list[TunnelEvent]
) -> None:
    async def main() -> None:
        ex = _executer(server, base, tmp_path, events)
        async with ex:
            assert ex.tunnel is not None and ex.tunnel.connected
            server_request = asyncio.to_thread(
                server.request, "req_a", kml(("create_dir", {"path": "made"}, "c-a"))
            )
            await server_request
            result = await asyncio.to_thread(server.result, "req_a")
            assert result["results"][0]["result"]["success"] is True
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
    assert (base / "made").is_dir()


def test_async_refused_key_raises_from_async_with(
    base: Path, tmp_path: Path, events: list[TunnelEvent]
) -> None:
    refusing = FakeServer(close_with=(4401, "revoked"))

    async def main() -> None:
        with pytest.raises(TunnelRefusedError, match="4401"):
            async with _executer(refusing, base, tmp_path, events):
                pytest.fail("connected with a refused key")
        assert asyncio.all_tasks() == {asyncio.current_task()}

    try:
        asyncio.run(main())
    finally:
        refusing.close()


def test_close_lets_a_running_request_finish_and_answers_it(
    server: FakeServer, base: Path, tmp_path: Path, events: list[TunnelEvent]
) -> None:
    ex = _executer(server, base, tmp_path, events)
    gate = Gate(tmp_path / "gate.count")
    ex.register("gate", gate)
    ex.start()
    assert ex.wait_connected(60)
    server.request("req_c", kml(("gate", {}, "g-c")))
    assert server.wait_for(lambda: gate.runs == 1)
    closer = threading.Thread(target=ex.close)
    closer.start()
    assert server.wait_for(lambda: any(e.kind == "stopping" for e in events))
    assert closer.is_alive()  # still waiting for the gate
    server.request("req_late", kml(("create_dir", {"path": "late"}, "c-late")))
    gate.open()
    closer.join(60)
    assert not closer.is_alive()
    assert server.result("req_c")["results"][0]["result"]["success"] is True
    assert server.of("kml_result", "req_late") == [] and not (base / "late").exists()
    assert [e.kind for e in events][-1] == "stopped"
    assert not [t for t in threading.enumerate() if t.name == "kyronix-tunnel"]
