"""The guard proxy: every connection Chromium makes goes through here.

An HTTP forward proxy on 127.0.0.1, owned by one session. Playwright does not route redirects,
so a public page could otherwise send the browser to ``http://169.254.169.254``; the proxy sees
every hop, WebSockets included, resolves the host itself and connects only to the addresses it
checked (a DNS answer that changes between check and use does not get through).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from kyronix.errors import KyronixUsageError
from kyronix.executer.tools.base import SecurityError, ToolFailure
from kyronix.executer.tools.browser.guard import Address
from kyronix.executer.tools.net import host_target

__all__ = ["BLOCK_HEADER", "PROXY_IDLE"]

BLOCK_HEADER = "x-kyronix-blocked"
"""The header of the proxy's 403 answer (with the session's token): how the session tells its
own refusal from a site's."""
_BLOCK_HEADER = BLOCK_HEADER


_HOP_HEADERS = frozenset(
    {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate"}
)
_HEAD_LIMIT = 64 * 1024
PROXY_IDLE = 300.0
"""Seconds a proxied connection (a kept-alive TLS tunnel, a quiet WebSocket) may stay idle."""


class _GuardProxy:
    """An HTTP forward proxy (CONNECT tunnels and plain ``http://`` requests) on 127.0.0.1 that
    refuses hosts :func:`_vet` refuses and connects only to the addresses it vetted."""

    def __init__(
        self,
        vet: Callable[[str, int], list[Address]],
        record: Callable[[str, str, str], None],
        token: str,
        timeout: float,
    ) -> None:
        self._vet = vet
        self._record = record
        self._token = token
        self._timeout = timeout
        self._lock = threading.Lock()
        self._closed = False
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="kyronix-browser-proxy", daemon=True
        )
        self._acceptor.start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._sockets)
            threads = list(self._threads)
        for sock in (self._server, *live):
            with contextlib.suppress(OSError):  # wakes accept() and select() in other threads
                sock.shutdown(socket.SHUT_RDWR)
        self._acceptor.join(timeout=5)
        self._server.close()
        for thread in threads:
            thread.join(timeout=5)

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._sockets.add(conn)
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.add(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            conn.settimeout(self._timeout)
            head, rest = _read_head(conn)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            if method.upper() == "CONNECT":
                host, port = _split_host_port(target)
                upstream = self._open(conn, host, port, target)
                if upstream is None:
                    return
                conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                parts = urlsplit(target)
                if parts.scheme != "http" or not parts.hostname:
                    _reply(conn, 400, "the proxy takes absolute http:// requests")
                    return
                upstream = self._open(conn, parts.hostname, parts.port or 80, target)
                if upstream is None:
                    return
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                kept = [
                    line
                    for line in lines[1:]
                    if line and line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS
                ]
                request = f"{method} {path} {version}\r\n" + "".join(f"{h}\r\n" for h in kept)
                upstream.sendall(f"{request}Connection: close\r\n\r\n".encode("latin-1"))
            if rest:
                upstream.sendall(rest)
            _pipe(conn, upstream, idle=PROXY_IDLE)
        except (OSError, ValueError):
            pass
        finally:
            for sock in (conn, upstream):
                if sock is not None:
                    sock.close()
            with self._lock:
                self._sockets.discard(conn)
                if upstream is not None:
                    self._sockets.discard(upstream)
                self._threads.discard(threading.current_thread())

    def _open(self, conn: socket.socket, host: str, port: int, what: str) -> socket.socket | None:
        try:
            addresses = self._vet(host, port)
        except SecurityError as exc:
            self._record("proxy", what, exc.message)
            _reply(conn, 403, exc.message, {_BLOCK_HEADER: self._token})
            return None
        except ToolFailure as exc:
            _reply(conn, 502, exc.message)
            return None
        for family, sockaddr in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            with self._lock:
                self._sockets.add(sock)
            try:
                sock.settimeout(self._timeout)
                sock.connect(sockaddr)
                return sock
            except OSError:
                with self._lock:
                    self._sockets.discard(sock)
                sock.close()
        _reply(conn, 502, f"could not connect to {host_target(host, port)}")
        return None


def _read_head(conn: socket.socket) -> tuple[bytes | None, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > _HEAD_LIMIT:
            return None, b""
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _split_host_port(authority: str) -> tuple[str, int]:
    host, sep, port = authority.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise KyronixUsageError(f"bad CONNECT target {authority!r}: expected host:port")
    return host.strip("[]"), int(port)


def _reply(
    conn: socket.socket, status: int, message: str, headers: Mapping[str, str] | None = None
) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}
    body = f"kyronix browser guard: {message}\n".encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    conn.sendall(head.encode("latin-1") + body)


def _pipe(a: socket.socket, b: socket.socket, *, idle: float) -> None:
    """Copy bytes both ways until both sides have closed (or nothing moved for ``idle`` s)."""
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        open_ends = 2
        while open_ends:
            events = sel.select(timeout=idle)
            if not events:
                return
            for key, _ in events:
                src: socket.socket = key.fileobj  # type: ignore[assignment]
                dst: socket.socket = key.data
                try:
                    chunk = src.recv(65536)
                except OSError:
                    return
                if chunk:
                    dst.sendall(chunk)
                    continue
                sel.unregister(src)
                open_ends -= 1
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    return
