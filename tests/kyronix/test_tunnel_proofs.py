"""Exactly once across the network, proved with real processes (issue 14): a real `kyronix serve`,
the real `kyronix executer` daemon and the SDK's `execute_kml_over_ws`; every side effect is a line
appended to a file, so running twice would show.

(b) the executer's TCP connection is cut mid-envelope (the process lives): it reconnects, the
    server sends the pending request again, and every effect happens once;
(c) the executer is SIGKILLed mid-`terminal`: a new executer answers the re-sent request with
    that tool `uncertain` and runs nothing again, until someone rules on it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kyronix.server.helpers import ServerProcess, bootstrap
from tests.processes import alive

ROOT = Path(__file__).resolve().parents[2]


def _wait(probe: Any, what: str, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Daemon:
    """`kyronix executer --ws URL --base DIR --root` in a child process, its output collected."""

    def __init__(self, ws: str, base: Path, receipts: Path, key: str, home: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from kyronix.cli import main; main()", "executer",
             "--ws", ws, "--base", str(base), "--root", "--receipts", str(receipts)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "KYRONIX_API_KEY": key, "KYRONIX_HOME": str(home)},
            start_new_session=True, cwd=ROOT,
        )  # fmt: skip
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def connections(self) -> int:
        return sum(1 for line in self.lines if line.startswith("connected to "))

    def stop(self) -> int:
        """SIGTERM, then its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._done()
        return self.proc.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._done()

    def _done(self) -> None:
        self._reader.join(10)
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()


class Proxy:
    """A loopback TCP proxy whose live connections the test can cut (both ends stay up)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.live: list[socket.socket] = []
        self.accepted = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self.live += [client, upstream]
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            live, self.live = self.live, []
        for s in live:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.cut()
        self.sock.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    home = tmp_path / "home"
    _, key = bootstrap(home)
    base = tmp_path / "project"
    base.mkdir()
    with ServerProcess(home) as server:
        yield {"home": home, "key": key, "base": base, "server": server, "tmp": tmp_path}


def _plan(base: Path, middle: str) -> str:
    log = base / "effects.log"
    commands = [f"echo one >> {log}", middle, f"echo three >> {log}"]
    tools = "".join(
        f'<tool name="terminal" executionId="exec_{str(i + 1) * 32}"><command>{c}</command></tool>'
        for i, c in enumerate(commands)
    )
    return f"<kyronix>{tools}</kyronix>"


def _effects(base: Path) -> list[str]:
    log = base / "effects.log"
    return log.read_text().split() if log.exists() else []


def test_b_a_cut_connection_mid_envelope_runs_every_effect_once(world: dict[str, Any]) -> None:
    from kyronix import Kyronix

    server, base, key = world["server"], world["base"], world["key"]
    port = int(server.url.rsplit(":", 1)[1])
    proxy = Proxy(port)
    daemon = Daemon(
        f"ws://127.0.0.1:{proxy.port}/ws", base, world["tmp"] / "receipts.sqlite3", key,
        world["home"],
    )  # fmt: skip
    try:
        _wait(daemon.connections, "the executer to connect")
        log = base / "effects.log"
        plan = _plan(base, f"sleep 1.5; echo two >> {log}")
        out: list[Any] = []
        with Kyronix(api_key=key, base_url=server.url) as client:
            t = threading.Thread(
                target=lambda: out.append(client.execute_kml_over_ws(plan, timeout=120))
            )
            t.start()
            _wait(lambda: _effects(base) == ["one"], "the first effect")
            proxy.cut()  # mid-envelope: the second command is sleeping
            t.join(120)
            assert out, daemon.output
            results = out[0]
            assert [r["result"]["success"] for r in results] == [True, True, True], results
            assert _effects(base) == ["one", "two", "three"]
            assert daemon.connections() >= 2 and proxy.accepted >= 2  # it really reconnected
            # the same request again (a backend retrying): stored results, nothing runs
            again = client.execute_kml_over_ws(plan, timeout=60)
            assert [r["result"]["executionId"] for r in again] == [
                r["result"]["executionId"] for r in results
            ]
        assert _effects(base) == ["one", "two", "three"]
    finally:
        daemon.stop()
        proxy.close()


def test_c_a_killed_executer_leaves_the_tool_uncertain_and_nothing_reruns(
    world: dict[str, Any],
) -> None:
    from kyronix import Kyronix

    server, base, key, tmp = world["server"], world["base"], world["key"], world["tmp"]
    ws = server.url.replace("http://", "ws://") + "/ws"
    receipts = tmp / "receipts.sqlite3"
    log, pidfile = base / "effects.log", base / "command.pid"  # the base: the sandbox's
    go = tmp / "go"  # absent the first time: the command sleeps until it is killed
    plan = _plan(
        base, f"if [ -e {go} ]; then echo two >> {log}; else echo $$ > {pidfile}; sleep 60; fi"
    )
    first = Daemon(ws, base, receipts, key, world["home"])
    second: Daemon | None = None
    command_pid: int | None = None
    try:
        _wait(first.connections, "the executer to connect")
        out: list[Any] = []
        with Kyronix(api_key=key, base_url=server.url) as client:
            t = threading.Thread(
                target=lambda: out.append(client.execute_kml_over_ws(plan, timeout=120))
            )
            t.start()
            command_pid = int(
                _wait(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command")
            )
            first.kill()  # SIGKILL mid-terminal
            os.killpg(command_pid, signal.SIGKILL)  # the command it started (its own group), too
            _wait(lambda: not alive(command_pid), "the command to go")
            second = Daemon(ws, base, receipts, key, world["home"])
            t.join(120)
            assert out, second.output
            results = out[0]
            assert results[0]["result"]["success"] is True  # finished before: its stored result
            assert results[1]["result"].get("uncertain") is True, results[1]
            assert results[2]["result"].get("skipped") is True  # the envelope stops there
            assert _effects(base) == ["one"]  # nothing ran again
            ruled = subprocess.run(
                [sys.executable, "-c", "from kyronix.cli import main; main()", "executer",
                 "resolve", "exec_" + "2" * 32, "rerun", "--base", str(base),
                 "--receipts", str(receipts)],
                capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
                env={**os.environ, "KYRONIX_HOME": str(world["home"])},
            )  # fmt: skip
            assert ruled.returncode == 0, ruled.stdout + ruled.stderr
            go.touch()
            again = client.execute_kml_over_ws(plan, timeout=60)  # the same plan, the same ids
        assert [r["result"]["success"] for r in again] == [True, True, True], again
        assert _effects(base) == ["one", "two", "three"]
    finally:
        if first.proc.poll() is None:
            first.kill()
        if second is not None:
            second.stop()
        if command_pid is not None and alive(command_pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(command_pid, signal.SIGKILL)
