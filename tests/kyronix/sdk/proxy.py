"""A loopback HTTP/1.1 proxy for the SDK's tests: a real socket between the client and the server
that can lose a response, cut a stream or answer in the server's place, one request at a time.

Every request and response that crosses it is recorded (method, path, headers; status, headers),
so a test asserts on what went over the wire.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Pass:
    """Relay the request and its response; ``cut_after``: close both sockets once that many
    bytes of the response's body went to the client (a dropped stream)."""

    cut_after: int | None = None


@dataclass(frozen=True)
class Drop:
    """Relay the request, read the server's whole response, send the client nothing, close."""


@dataclass(frozen=True)
class Answer:
    """Answer in the server's place (the request never reaches it)."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


Action = Pass | Drop | Answer
Plan = Callable[[int, Request], Action]
"""``plan(index of the request through this proxy, the request)``."""


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buf += data
        return True

    def until(self, marker: bytes) -> bytes | None:
        while marker not in self.buf:
            if not self._more():
                return None
        head, _, self.buf = self.buf.partition(marker)
        return head + marker

    def exactly(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self._more():
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def some(self) -> bytes:
        if self.buf:
            out, self.buf = self.buf, b""
            return out
        return self.sock.recv(65536)


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    out: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            out[name.strip().lower()] = value.strip()
    return lines[0], out


class Proxy:
    def __init__(self, upstream: str, plan: Plan | None = None) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.plan: Plan = plan or (lambda _i, _r: Pass())
        self.requests: list[Request] = []
        self.responses: list[Response] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        self._open.add(client)
        try:
            reader = _Reader(client)
            while True:
                request = self._read_request(reader)
                if request is None:
                    return
                with self._lock:
                    index = len(self.requests)
                    self.requests.append(request[0])
                action = self.plan(index, request[0])
                if isinstance(action, Answer):
                    self._answer(client, action)
                    return
                if upstream is None:
                    upstream = socket.create_connection(self.upstream)
                    self._open.add(upstream)
                upstream.sendall(request[1])
                if not self._relay(_Reader(upstream), client, action):
                    return
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    self._open.discard(sock)
                    with contextlib.suppress(OSError):
                        sock.close()

    def _read_request(self, reader: _Reader) -> tuple[Request, bytes] | None:
        head = reader.until(b"\r\n\r\n")
        if head is None:
            return None
        start, headers = _headers(head)
        body = reader.exactly(int(headers.get("content-length", "0"))) or b""
        method, path, _ = start.split(" ", 2)
        return Request(method, path, headers, body), head + body

    def _answer(self, client: socket.socket, action: Answer) -> None:
        headers = {"content-type": "application/json", **action.headers}
        lines = [f"HTTP/1.1 {action.status} Injected"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += [f"content-length: {len(action.body)}", "connection: close", "", ""]
        # Recorded before the client can have it: a client that retries at once must find
        # this response in ``responses`` before its next request's.
        with self._lock:
            self.responses.append(Response(action.status, headers, action.body))
        client.sendall("\r\n".join(lines).encode() + action.body)

    def _relay(self, upstream: _Reader, client: socket.socket, action: Pass | Drop) -> bool:
        """Relay one response; False once the connection is to be closed."""
        head = upstream.until(b"\r\n\r\n")
        if head is None:
            return False
        start, headers = _headers(head)
        status = int(start.split(" ", 2)[1])
        out = [head]
        budget = action.cut_after if isinstance(action, Pass) else None
        body = b""
        recorded = False

        def record() -> None:
            # Called before the response's last bytes go to the client, so ``responses`` holds
            # it by the time the client could act on it (a retry, the next request).
            nonlocal recorded
            if not recorded:
                recorded = True
                with self._lock:
                    self.responses.append(Response(status, headers, body))

        def send(data: bytes) -> bool:
            nonlocal budget
            if isinstance(action, Drop):
                out.append(data)
                return True
            if out:
                client.sendall(b"".join(out))
                out.clear()
            if budget is not None:
                data = data[:budget]
                budget -= len(data)
            client.sendall(data)
            return budget is None or budget > 0

        going = True
        if "content-length" in headers:
            body = upstream.exactly(int(headers["content-length"])) or b""
            record()
            going = send(body)
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while going:
                size_line = upstream.until(b"\r\n")
                if size_line is None:
                    return False
                size = int(size_line.strip().split(b";")[0], 16)
                chunk = (upstream.exactly(size + 2) or b"") if size else b""
                if not size:
                    chunk = upstream.until(b"\r\n") or b""
                    record()
                body += chunk[:-2] if size else b""
                going = send(size_line + chunk)
                if not size:
                    break
        else:
            while going:
                data = upstream.some()
                if not data:
                    break
                body += data
                going = send(data)
        record()
        if not isinstance(action, Drop) and out:
            client.sendall(b"".join(out))
        return going and not isinstance(action, Drop)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in list(self._open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Forwarder:
    """A plain TCP forwarder (for WebSocket connections): ``cut()`` drops every connection that
    is open now, as a network failure would."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.accepted = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self.accepted += 1
                self._pairs.append((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        src.close()  # each socket is the source of exactly one pump

    def cut(self) -> int:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        return len(pairs)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
