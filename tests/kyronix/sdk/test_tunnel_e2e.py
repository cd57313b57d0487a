"""The tunnel end to end: the SDK, a real ``kyronix serve`` and an executer on its ``/ws``.

One executer is a raw ``websockets`` client (role executer) that answers when the test lets it,
so the runtime's connection can be cut while a request is pending; the other is the real
``KyronixExecuter`` daemon, running the agent's KML in a temporary directory.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from kyronix import Kyronix, NoExecuterError, TunnelError, kml
from kyronix.executer import KyronixExecuter
from tests.kyronix.server.helpers import wait_until

from .conftest import Served
from .proxy import Forwarder

pytestmark = pytest.mark.timeout(120)

KML = '<tool name="note" executionId="exec_e2e1"><text>hello</text></tool>'


def ws_url(served: Served) -> str:
    return served.url.replace("http://", "ws://") + "/ws"


class RawExecuter:
    """An executer made of a bare WebSocket: records each request, answers once released."""

    def __init__(self, served: Served, executer_id: str = "laptop") -> None:
        self.requests: list[dict[str, Any]] = []
        self.got_request = threading.Event()
        self.release = threading.Event()
        self.ready = threading.Event()
        self._ws = connect(
            f"{ws_url(served)}?role=executer&executerId={executer_id}",
            additional_headers={"Authorization": f"Bearer {served.key}"},
        ).__enter__()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self.ready.wait(30)

    def _serve(self) -> None:
        for message in self._ws:
            frame = json.loads(message)
            if frame["type"] == "ready":
                self.ready.set()
            elif frame["type"] == "kml_request":
                self.requests.append(frame)
                self.got_request.set()
                self.release.wait(60)
                results = [
                    {"tool": t.name, "args": t.args,
                     "result": {"success": True, "output": "done", "executionId": t.execution_id}}
                    for t in kml.parse(frame["kmlResponse"]).tools
                ]  # fmt: skip
                answer = {
                    "type": "kml_result",
                    "executionId": frame["executionId"],
                    "results": results,
                }
                self._ws.send(json.dumps(answer))

    def close(self) -> None:
        self.release.set()
        self._ws.close()
        self._thread.join(10)


@pytest.fixture
def raw_executer(server: Served) -> Iterator[RawExecuter]:
    executer = RawExecuter(server)
    yield executer
    executer.close()


def test_a_request_survives_the_runtimes_dropped_connection(
    server: Served, raw_executer: RawExecuter
) -> None:
    """The runtime's connection is cut while its request waits at the executer; the client
    connects again and sends the same request, and the server gives it the one result. The
    executer was asked once."""
    out: dict[str, Any] = {}
    with (
        Forwarder(server.url) as forwarder,
        Kyronix(api_key=server.key, base_url=forwarder.url) as kx,
    ):

        def call() -> None:
            try:
                out["results"] = kx.execute_kml_over_ws(KML, executer_id="laptop", timeout=60)
            except Exception as exc:  # reported below
                out["error"] = exc

        caller = threading.Thread(target=call)
        caller.start()
        assert raw_executer.got_request.wait(30)
        assert forwarder.cut() == 1  # the runtime's one connection
        assert wait_until(lambda: forwarder.accepted >= 2)  # it connected again
        raw_executer.release.set()
        caller.join(60)
    assert "error" not in out, out.get("error")
    assert out["results"] == [
        {"tool": "note", "args": {"text": "hello"},
         "result": {"success": True, "output": "done", "executionId": "exec_e2e1"}}
    ]  # fmt: skip
    assert len(raw_executer.requests) == 1


def test_no_executer_connected_is_no_executer_error(server: Served) -> None:
    with (
        Kyronix(api_key=server.key, base_url=server.url) as kx,
        pytest.raises(NoExecuterError, match="no executer 'nobody'") as info,
    ):
        kx.execute_kml_over_ws(KML, executer_id="nobody", timeout=10)
    assert info.value.code == "no_executer"


@pytest.fixture
def executer(server: Served, tmp_path: Path) -> Iterator[tuple[KyronixExecuter, Path]]:
    base = tmp_path / "work"
    base.mkdir()
    daemon = KyronixExecuter(
        ws_url=ws_url(server),
        api_key=server.key,
        executer_id="daemon",
        base_path=base,
        receipts=tmp_path / "receipts.sqlite3",
    )
    with daemon:
        assert daemon.wait_connected(30)
        yield daemon, base


def test_an_agents_plan_runs_once_at_the_executer(
    server: Served, executer: tuple[KyronixExecuter, Path]
) -> None:
    _, base = executer
    with Kyronix(api_key=server.key, base_url=server.url) as kx:
        run = kx.run(agent="coding", input="Create src/hello.py")
        first = kx.execute_kml_over_ws(
            run.response, executer_id="daemon", session_id=run.session_id
        )
        written = (base / "src" / "hello.py").read_text()
        (base / "src" / "hello.py").write_text("changed since")
        again = kx.execute_kml_over_ws(run.response, executer_id="daemon")
    assert [e["result"]["executionId"] for e in first] == run.execution_ids
    assert first[0]["tool"] == "write_file" and first[0]["result"]["success"] is True
    assert "Create src/hello.py" in written
    assert again == first  # the receipts answered: nothing ran again
    assert (base / "src" / "hello.py").read_text() == "changed since"


def test_resolve_reaches_the_executer_and_its_answer_comes_back(
    server: Served, executer: tuple[KyronixExecuter, Path]
) -> None:
    with Kyronix(api_key=server.key, base_url=server.url) as kx:
        done = kx.execute_kml_over_ws(
            '<tool name="write_file" executionId="exec_resolve1"><path>r.txt</path>'
            "<content>r</content></tool>",
            executer_id="daemon",
        )
        assert done[0]["result"]["success"] is True
        with pytest.raises(TunnelError) as info:
            kx.resolve("exec_resolve1", "rerun", executer_id="daemon")
    assert info.value.code == "not_uncertain"  # it finished: there is nothing to rule on


def test_the_server_driven_loop_returns_the_results(
    server: Served, executer: tuple[KyronixExecuter, Path]
) -> None:
    _, base = executer
    with Kyronix(api_key=server.key, base_url=server.url) as kx:
        got = kx.run(input="Create src/driven.py", execute="tunnel")
    assert got.results is not None and got.results
    assert got.results[0]["tool"] == "write_file"
    assert (base / "src" / "driven.py").exists()
