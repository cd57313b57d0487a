"""A scripted local HTTP server for provider tests: server-sent event streams, JSON errors, cuts.

Provider-neutral: it knows HTTP, SSE framing and JSON, nothing about any vendor's payloads::

    with SSEServer([Stream([Event({"a": 1}, event="ping"), Event("[DONE]")]),
                    Reply(429, {"error": "slow"}, headers={"retry-after": "2"})]) as server:
        ...  # point a client at server.url; each request consumes the next reply
        server.requests[0].json  # what the client sent

* The script is a list of replies consumed in order, or a function from the recorded request to
  a reply (to answer based on what the client sent). A request past the end of a list gets a 500
  whose body says the script is exhausted.
* :class:`Stream` replies are ``text/event-stream`` with chunked transfer encoding; an
  :class:`Event` is written as ``event: <name>`` (if named) and ``data: <json or text>`` lines.
  ``cut=True`` drops the connection after the events, without the chunked terminator, so the
  client sees a broken body (what a dropped connection looks like), never a clean end.
  ``until_close=True`` sends no chunked framing at all: the body ends when the connection closes.
* :class:`Reply` is any other response: a status, a JSON (or raw) body and headers.
* Every request is recorded (method, path, lower-cased headers, raw body, parsed JSON), whatever
  its credentials (``Authorization: Bearer ...`` or ``x-api-key``: both are just recorded).

The server listens on 127.0.0.1 on a free port, serves from a thread, and on exit closes every
connection it still holds and joins its threads, so tests leave no sockets behind.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, TypeAlias

__all__ = ["Event", "Recorded", "Reply", "SSEServer", "Script", "Stream"]


@dataclass(frozen=True)
class Event:
    """One server-sent event. ``data``: a ``str`` is sent verbatim, anything else as JSON."""

    data: Any
    event: str | None = None
    delay: float = 0.0
    """Seconds to wait before sending this event."""

    def encode(self) -> bytes:
        text = self.data if isinstance(self.data, str) else json.dumps(self.data)
        lines = [f"event: {self.event}"] if self.event is not None else []
        lines += [f"data: {line}" for line in text.split("\n")]
        return ("\n".join(lines) + "\n\n").encode()


@dataclass(frozen=True)
class Stream:
    """An SSE reply: the events in order, then a clean end (or a dropped connection)."""

    events: Sequence[Event]
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    cut: bool = False
    """Drop the connection after the events, mid-body."""
    until_close: bool = False
    """No chunked framing: the body ends when the server closes the connection (HTTP/1.0 style,
    as some gateways and proxies send a stream)."""


@dataclass(frozen=True)
class Reply:
    """A plain reply: ``body`` is JSON-encoded unless it is ``bytes`` or ``str``."""

    status: int
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return b"" if self.body is None else json.dumps(self.body).encode()


@dataclass(frozen=True)
class Recorded:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def credential(self) -> str | None:
        """The bearer token or the ``x-api-key`` the request carried, if any."""
        auth = self.headers.get("authorization")
        if auth is not None and auth.startswith("Bearer "):
            return auth[len("Bearer ") :]
        return self.headers.get("x-api-key")


Script: TypeAlias = Sequence[Stream | Reply] | Callable[[Recorded], Stream | Reply]


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True

    def __init__(self, owner: SSEServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    # NB: BaseHTTPRequestHandler owns a class attribute named ``responses``; never shadow it.
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 10  # an idle keep-alive connection does not outlive a slow test

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        recorded = Recorded(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        reply = self.server.owner._next(recorded)
        if isinstance(reply, Stream):
            self._stream(reply)
        else:
            self._reply(reply)

    def _reply(self, reply: Reply) -> None:
        payload = reply.encode()
        self.send_response(reply.status)
        headers = {"content-type": "application/json", **reply.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def _stream(self, reply: Stream) -> None:
        self.send_response(reply.status)
        headers = {"content-type": "text/event-stream", "cache-control": "no-cache"}
        for name, value in {**headers, **reply.headers}.items():
            self.send_header(name, value)
        if reply.until_close:
            self.send_header("connection", "close")
        else:
            self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        try:
            for event in reply.events:
                if event.delay:
                    time.sleep(event.delay)
                data = event.encode()
                self.wfile.write(data if reply.until_close else b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            if reply.until_close:
                self.close_connection = True
                return
            if reply.cut:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the client went away first
            self.close_connection = True


class SSEServer:
    """A scripted HTTP server on 127.0.0.1; use it as a context manager."""

    def __init__(self, script: Script = ()) -> None:
        self._script = script
        self._position = 0
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self.requests: list[Recorded] = []
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``; append the API's path prefix (``/v1``) as needed."""
        return f"http://127.0.0.1:{self.port}"

    def add(self, *replies: Stream | Reply) -> None:
        """Append replies to a list script."""
        if callable(self._script):
            raise TypeError("this server answers with a function; it has no list to extend")
        with self._lock:
            self._script = [*self._script, *replies]

    def _next(self, recorded: Recorded) -> Stream | Reply:
        with self._lock:
            self.requests.append(recorded)
            script = self._script
            if callable(script):
                pass
            elif self._position < len(script):
                self._position += 1
                return script[self._position - 1]
            else:
                return Reply(500, {"error": f"script exhausted after {len(script)} replies"})
        return script(recorded)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def __enter__(self) -> SSEServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving, drop the connections still open, join every thread."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()  # joins the handler threads
