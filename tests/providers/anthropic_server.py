"""A scripted stand-in for the Anthropic Messages API, on 127.0.0.1 in a thread (stdlib only).

Each request takes the next reply from the script; a reply is :class:`Sse` (a streamed answer,
optionally cut off mid-body), :class:`Status` (an error status with a JSON body and headers), or a
callable that builds one from the request's decoded JSON body. Every request is recorded: path,
headers (lower-cased names), the raw body bytes and the decoded JSON.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeAlias

JsonObj: TypeAlias = dict[str, Any]


@dataclass(frozen=True)
class Sse:
    """A 200 ``text/event-stream`` reply: ``(event type, data)`` pairs, sent chunked.

    ``cut`` drops the connection after the events without the closing chunk (a torn stream).
    """

    events: list[tuple[str, JsonObj]]
    cut: bool = False


@dataclass(frozen=True)
class Status:
    status: int
    body: JsonObj
    headers: dict[str, str] = field(default_factory=dict)


Reply: TypeAlias = Sse | Status | Callable[[JsonObj], "Sse | Status"]


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    raw: bytes
    body: JsonObj


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, script: list[Reply]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = list(script)
        self.recorded: list[Recorded] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        body = json.loads(raw) if raw else {}
        with self.server.lock:
            self.server.recorded.append(
                Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, raw, body)
            )
            reply = self.server.script.pop(0) if self.server.script else None
        if callable(reply):
            reply = reply(body)
        if reply is None:
            reply = Status(500, error("api_error", "the test server's script is exhausted"))
        self.close_connection = True
        if isinstance(reply, Status):
            data = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("connection", "close")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("connection", "close")
        self.end_headers()
        for kind, data_obj in reply.events:
            chunk = f"event: {kind}\ndata: {json.dumps(data_obj)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        if not reply.cut:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


@contextmanager
def serve(script: list[Reply]) -> Iterator[_Server]:
    """Run a server for ``script``; ``.url`` style base is ``http://127.0.0.1:<port>``."""
    server = _Server(script)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def base_url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


# --------------------------------------------------------------------------- the event shapes


def error(kind: str, message: str) -> JsonObj:
    return {"type": "error", "error": {"type": kind, "message": message}}


def message_start(
    model: str = "claude-test-1",
    *,
    input_tokens: int = 25,
    output_tokens: int = 1,
    cache_read: int | None = None,
    cache_write: int | None = None,
) -> tuple[str, JsonObj]:
    usage: JsonObj = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if cache_write is not None:
        usage["cache_creation_input_tokens"] = cache_write
    if cache_read is not None:
        usage["cache_read_input_tokens"] = cache_read
    message = {
        "id": "msg_01TestMessage",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return ("message_start", {"type": "message_start", "message": message})


def ping() -> tuple[str, JsonObj]:
    return ("ping", {"type": "ping"})


def block_start(index: int, block: JsonObj) -> tuple[str, JsonObj]:
    return (
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def delta(index: int, payload: JsonObj) -> tuple[str, JsonObj]:
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": index, "delta": payload},
    )


def block_stop(index: int) -> tuple[str, JsonObj]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def message_delta(stop_reason: str | None, output_tokens: int = 15) -> tuple[str, JsonObj]:
    return (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
    )


def message_stop() -> tuple[str, JsonObj]:
    return ("message_stop", {"type": "message_stop"})


def text_block(index: int, *pieces: str) -> list[tuple[str, JsonObj]]:
    return [
        block_start(index, {"type": "text", "text": ""}),
        *(delta(index, {"type": "text_delta", "text": p}) for p in pieces),
        block_stop(index),
    ]


def thinking_block(
    index: int, pieces: list[str], signature: list[str]
) -> list[tuple[str, JsonObj]]:
    return [
        block_start(index, {"type": "thinking", "thinking": "", "signature": ""}),
        *(delta(index, {"type": "thinking_delta", "thinking": p}) for p in pieces),
        *(delta(index, {"type": "signature_delta", "signature": s}) for s in signature),
        block_stop(index),
    ]


def tool_block(index: int, call_id: str, name: str, *fragments: str) -> list[tuple[str, JsonObj]]:
    return [
        block_start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}}),
        *(delta(index, {"type": "input_json_delta", "partial_json": f}) for f in fragments),
        block_stop(index),
    ]


def turn(
    *blocks: list[tuple[str, JsonObj]],
    stop: str | None = "end_turn",
    model: str = "claude-test-1",
    output_tokens: int = 15,
    **usage: Any,
) -> Sse:
    """A whole documented stream: message_start, ping, the blocks, message_delta, message_stop."""
    events = [message_start(model, **usage), ping()]
    for block in blocks:
        events.extend(block)
    events += [message_delta(stop, output_tokens), message_stop()]
    return Sse(events)
