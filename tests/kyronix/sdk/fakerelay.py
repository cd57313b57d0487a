"""A stand-in for the server's ``/ws`` relay that speaks docs/tunnel.md on a loopback socket.

A real ``websockets`` asyncio server in a thread of its own. It authenticates like the server
(a Bearer header, or a first ``auth`` frame; otherwise close 4401), sends ``ready``, records
every frame it receives, and answers each frame with what ``script(frame, n)`` returns (``n``:
how many frames of that type came before): frames to send back, or :data:`CLOSE` to drop the
connection without a word.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve

CLOSE = "close"
Reply = list[dict[str, Any]] | str
Script = Callable[[dict[str, Any], int], Reply]


def results_for(frame: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"tool": "echo", "args": {}, "result": {"success": True, "output": frame["kmlResponse"]}}
    ]


def answer_all(frame: dict[str, Any], _n: int) -> Reply:
    if frame["type"] == "kml_request":
        return [
            {
                "type": "kml_result",
                "executionId": frame["executionId"],
                "results": results_for(frame),
            }
        ]
    return []


class FakeRelay:
    def __init__(self, script: Script = answer_all, *, key: str = "kyr_test") -> None:
        self.script = script
        self.key = key
        self.received: list[dict[str, Any]] = []
        self.connections: list[dict[str, str]] = []  # each connection's opening headers
        self.counts: dict[str, int] = {}
        self.send_first: list[dict[str, Any]] = []  # sent right after ready (e.g. a ping)
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await serve(self._handle, "127.0.0.1", 0)
            started.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        headers = {k.lower(): v for k, v in ws.request.headers.raw_items()}
        self.connections.append(headers)
        if "authorization" in headers and headers["authorization"] != f"Bearer {self.key}":
            await ws.close(4401, "this API key is unknown or has been revoked")
            return
        if "authorization" not in headers:
            try:
                first = json.loads(await asyncio.wait_for(ws.recv(), 5))
            except Exception:
                await ws.close(4401, "authenticate first")
                return
            self.received.append(first)
            if first.get("type") != "auth" or first.get("apiKey") != self.key:
                await ws.close(4401, "this API key is unknown or has been revoked")
                return
        await ws.send(json.dumps({"type": "ready", "role": "runtime", "projectId": "proj_fake"}))
        for frame in self.send_first:
            await ws.send(json.dumps(frame))
        async for message in ws:
            frame = json.loads(message)
            self.received.append(frame)
            n = self.counts.get(frame["type"], 0)
            self.counts[frame["type"]] = n + 1
            reply = self.script(frame, n)
            if reply == CLOSE:
                ws.transport.abort()  # a dropped connection, not a polite close
                return
            for out in reply:
                await ws.send(json.dumps(out))

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.received if f.get("type") == kind]

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FakeRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
