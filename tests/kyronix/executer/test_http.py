"""http_request against real HTTP servers on loopback: bodies, caps, redirects and the guard."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kyronix.executer import KyronixExecuter
from kyronix.executer.permissions import (
    ROOT_POLICIES,
    SAFE_POLICIES,
    PermissionManager,
    Policy,
    allow,
)
from kyronix.executer.tools import http
from kyronix.executer.tools.base import Call, SecurityError, ToolFailure, ToolOutput

# -- a recording, scriptable HTTP server ---------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Reply = tuple[int, list[tuple[str, str]], bytes]


@dataclass
class Server:
    respond: Callable[[Seen], Reply]
    seen: list[Seen] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        self.server.owner.seen.append(seen)
        status, headers, payload = self.server.owner.respond(seen)
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if not any(n.lower() == "content-length" for n, _ in headers):
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _any

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: Server


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Seen], Reply]], Server]]:
    started: list[_HTTPServer] = []

    def start(respond: Callable[[Seen], Reply]) -> Server:
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        server = Server(respond, port=httpd.server_address[1])
        httpd.owner = server
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        started.append(httpd)
        return server

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def echo(seen: Seen) -> Reply:
    payload = {
        "method": seen.method,
        "path": seen.path,
        "headers": seen.headers,
        "body": seen.body.decode(),
    }
    return 200, [("Content-Type", "application/json")], json.dumps(payload).encode()


def call_for(
    tmp_path: Path, policies: tuple[Policy, ...] | PermissionManager = ROOT_POLICIES, **args: Any
) -> Call:
    manager = policies if isinstance(policies, PermissionManager) else PermissionManager(policies)
    return Call(
        tool="http_request",
        execution_id="e1",
        args=args,
        base=tmp_path.resolve(),
        permissions=manager,
    )


def run(call: Call) -> ToolOutput:
    return asyncio.run(http.http_request(call))


SAFE_HTTP = PermissionManager(SAFE_POLICIES).with_policies(allow("tool:http_request"))


# -- requests and responses ---------------------------------------------------------------------


def test_get_sends_headers_and_reports_status_headers_and_body(tmp_path: Path, serve: Any) -> None:
    server = serve(echo)
    out = run(call_for(tmp_path, url=f"{server.url}/a/b?q=1", headers={"X-Test": "abc"}))

    assert out.output.startswith("HTTP 200 OK\ncontent-type: application/json\n")
    body = json.loads(out.output.split("\n\n", 1)[1])
    assert body["method"] == "GET"
    assert body["path"] == "/a/b?q=1"
    assert body["headers"]["x-test"] == "abc"
    # The Host header names the host of the URL even though the connection is pinned to the IP.
    assert body["headers"]["host"] == f"127.0.0.1:{server.port}"
    assert out.data is not None
    assert out.data["status"] == 200
    assert out.data["url"] == f"{server.url}/a/b?q=1"
    assert out.data["headers"]["content-type"] == "application/json"
    assert out.data["bytes"] == len(out.output.split("\n\n", 1)[1].encode())
    assert isinstance(out.data["elapsed_ms"], int)
    assert out.truncated is False
    assert len(server.seen) == 1


def test_post_sends_the_body_and_method_and_content_type(tmp_path: Path, serve: Any) -> None:
    server = serve(echo)
    out = run(
        call_for(
            tmp_path,
            url=server.url + "/submit",
            method="post",
            headers={"Content-Type": "application/json"},
            body='{"name": "café"}',
        )
    )
    assert server.seen[0].method == "POST"
    assert server.seen[0].body == '{"name": "café"}'.encode()
    assert server.seen[0].headers["content-type"] == "application/json"
    assert json.loads(out.output.split("\n\n", 1)[1])["body"] == '{"name": "café"}'


def test_head_has_no_body(tmp_path: Path, serve: Any) -> None:
    server = serve(lambda s: (200, [("Content-Type", "text/plain")], b"hello"))
    out = run(call_for(tmp_path, url=server.url, method="HEAD"))
    assert server.seen[0].method == "HEAD"
    assert out.data is not None and out.data["bytes"] == 0
    assert out.output.endswith("\n\n")


def test_body_over_the_cap_is_cut_and_marked_truncated(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "MAX_BODY_BYTES", 1000)
    server = serve(lambda s: (200, [("Content-Type", "text/plain")], b"a" * 999 + b"b" * 2001))
    out = run(call_for(tmp_path, url=server.url))
    assert out.truncated is True
    assert out.data is not None and out.data["bytes"] == 1000
    body = out.output.split("\n\n", 1)[1]
    assert body.startswith("a" * 999 + "b\n[body truncated")
    assert "bb" not in body


def test_body_exactly_at_the_cap_is_not_truncated(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "MAX_BODY_BYTES", 1000)
    server = serve(lambda s: (200, [("Content-Type", "text/plain")], b"x" * 1000))
    out = run(call_for(tmp_path, url=server.url))
    assert out.truncated is False
    assert out.output.split("\n\n", 1)[1] == "x" * 1000


def test_default_cap_is_one_mebibyte(tmp_path: Path, serve: Any) -> None:
    server = serve(lambda s: (200, [("Content-Type", "text/plain")], b"z" * (3 * 1024 * 1024)))
    out = run(call_for(tmp_path, url=server.url))
    assert out.truncated is True
    assert out.data is not None and out.data["bytes"] == 1024 * 1024


def test_binary_body_is_returned_as_base64(tmp_path: Path, serve: Any) -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    server = serve(lambda s: (200, [("Content-Type", "image/png")], png))
    out = run(call_for(tmp_path, url=server.url + "/logo.png"))
    assert out.data is not None
    assert base64.b64decode(out.data["body_base64"]) == png
    assert "binary body: 1032 bytes of image/png" in out.output
    assert "PNG" not in out.output.split("\n\n", 1)[1]


def test_untyped_body_with_nul_bytes_is_binary_and_utf8_is_text(tmp_path: Path, serve: Any) -> None:
    server = serve(lambda s: (200, [], b"\x00\x01\x02" if s.path == "/bin" else "héllo".encode()))
    out = run(call_for(tmp_path, url=server.url + "/bin"))
    assert out.data is not None and base64.b64decode(out.data["body_base64"]) == b"\x00\x01\x02"
    out = run(call_for(tmp_path, url=server.url + "/text"))
    assert out.output.endswith("\n\nhéllo")
    assert out.data is not None and "body_base64" not in out.data


def test_text_is_decoded_by_its_charset(tmp_path: Path, serve: Any) -> None:
    latin = "café crème".encode("iso-8859-1")
    server = serve(lambda s: (200, [("Content-Type", "text/plain; charset=iso-8859-1")], latin))
    out = run(call_for(tmp_path, url=server.url))
    assert out.output.endswith("\n\ncafé crème")


def test_error_status_is_a_failure_with_status_headers_and_body(tmp_path: Path, serve: Any) -> None:
    server = serve(lambda s: (404, [("Content-Type", "text/plain")], b"no such page here"))
    with pytest.raises(ToolFailure) as info:
        run(call_for(tmp_path, url=server.url + "/missing"))
    failure = info.value
    assert not isinstance(failure, SecurityError)
    assert failure.error_type == "HTTPError"
    assert "HTTP 404 Not Found" in failure.message and "no such page here" in failure.message
    assert failure.data is not None
    assert failure.data["status"] == 404
    assert failure.data["headers"]["content-type"] == "text/plain"
    assert failure.output.startswith("HTTP 404 Not Found\n")
    assert failure.output.endswith("\n\nno such page here")


def test_url_credentials_are_sent_as_basic_auth_and_never_shown(tmp_path: Path, serve: Any) -> None:
    server = serve(echo)
    url = f"http://alice:s3cret@127.0.0.1:{server.port}/private"
    out = run(call_for(tmp_path, url=url))
    expected = "Basic " + base64.b64encode(b"alice:s3cret").decode()
    assert server.seen[0].headers["authorization"] == expected
    assert out.data is not None
    assert "s3cret" not in json.dumps(out.data)
    assert out.data["url"] == f"http://alice:***@127.0.0.1:{server.port}/private"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"method": "TRACE"}, "the method 'TRACE' is not supported"),
        ({"headers": ["X-A", "b"]}, "headers must be a JSON object"),
        ({"headers": {"X-Count": 3}}, "must have a string value"),
        ({"headers": {"X-A": "b\r\nX-Injected: 1"}}, "line break"),
        ({"headers": {"Bad Name": "x"}}, "not a valid HTTP header name"),
        ({"headers": {"Host": "evil.example"}}, "set by http_request itself"),
        ({"headers": {"Content-Length": "5"}}, "set by http_request itself"),
    ],
)
def test_bad_arguments_are_refused_before_any_request(
    tmp_path: Path, serve: Any, args: dict[str, Any], needle: str
) -> None:
    server = serve(echo)
    with pytest.raises(ToolFailure) as info:
        run(call_for(tmp_path, url=server.url, **args))
    assert needle in info.value.message
    assert info.value.error_type == "InvalidArguments"
    assert server.seen == []


@pytest.mark.parametrize("url", ["ftp://example.com/file", "file:///etc/passwd", "gopher://x/"])
def test_other_schemes_are_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(ToolFailure) as info:
        run(call_for(tmp_path, url=url))
    assert "only http://, https:// URLs are accepted" in info.value.message
    assert repr(url.split(":", maxsplit=1)[0]) in info.value.message


# -- timeouts -----------------------------------------------------------------------------------


@pytest.fixture
def stalling_server() -> Iterator[tuple[int, Callable[[bytes], None]]]:
    """A raw TCP server that reads the request and then sends only what the test scripts."""
    listener = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()
    script: list[bytes] = []
    conns: list[socket.socket] = []

    def loop() -> None:
        while not release.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            conn.recv(65536)
            for piece in script:
                if release.wait(0.2):
                    return
                try:
                    conn.sendall(piece)
                except OSError:
                    break
            release.wait()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield listener.getsockname()[1], script.append
    release.set()
    listener.close()
    for conn in conns:
        conn.close()
    thread.join(5)


def test_a_server_that_never_answers_fails_within_the_total_timeout(
    tmp_path: Path, stalling_server: tuple[int, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "TOTAL_TIMEOUT_S", 1.0)
    port, _ = stalling_server
    started = time.monotonic()
    with pytest.raises(ToolFailure) as info:
        run(call_for(tmp_path, url=f"http://127.0.0.1:{port}/slow"))
    elapsed = time.monotonic() - started
    assert info.value.error_type == "Timeout"
    assert elapsed >= 0.9, elapsed  # it waited for the timeout; the error type says what ended it


def test_a_body_that_trickles_forever_fails_within_the_total_timeout(
    tmp_path: Path, stalling_server: tuple[int, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each read succeeds within any per-read timeout; only a whole-request deadline stops this.
    monkeypatch.setattr(http, "TOTAL_TIMEOUT_S", 1.5)
    port, send = stalling_server
    send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(100):
        send(b"x")
    started = time.monotonic()
    with pytest.raises(ToolFailure) as info:
        run(call_for(tmp_path, url=f"http://127.0.0.1:{port}/drip"))
    elapsed = time.monotonic() - started
    assert info.value.error_type == "Timeout"
    assert "did not complete within 1.5 s" in info.value.message
    assert elapsed >= 1.4, elapsed


# -- the network guard --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "http://127.0.0.1:{port}/",
        "http://localhost:{port}/",
        "http://LOCALHOST.:{port}/",
        "http://2130706433:{port}/",
        "http://0x7f000001:{port}/",
        "http://127.1:{port}/",
        "http://0177.0.0.1:{port}/",
        "http://[::1]:{port}/",
        "http://[::ffff:127.0.0.1]:{port}/",
        "http://[::ffff:7f00:1]:{port}/",
        "http://user:pw@127.0.0.1:{port}/",
    ],
)
def test_loopback_in_every_spelling_is_refused_under_safe_policies(
    tmp_path: Path, serve: Any, template: str
) -> None:
    server = serve(echo)
    with pytest.raises(SecurityError) as info:
        run(call_for(tmp_path, SAFE_HTTP, url=template.format(port=server.port)))
    assert "allow('net:private'" in info.value.message
    assert "127.0.0.1" in info.value.message or "::1" in info.value.message
    assert "pw" not in info.value.message.replace("private", "")
    assert server.seen == []


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every socket connect attempted in this process during the test."""
    attempts: list[object] = []
    original = socket.socket.connect
    original_ex = socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        original(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        attempts.append(address)
        return original_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return attempts


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://10.0.0.1/",
        "http://192.168.1.1/admin",
        "http://100.64.0.1/",
    ],
)
def test_metadata_and_private_addresses_are_refused_before_any_connection(
    tmp_path: Path, url: str, connects: list[object]
) -> None:
    with pytest.raises(SecurityError) as info:
        run(call_for(tmp_path, SAFE_HTTP, url=url))
    assert "allow('net:private'" in info.value.message
    assert connects == []


def test_connects_spy_sees_real_connections(
    tmp_path: Path, serve: Any, connects: list[object]
) -> None:
    # The spy above is only evidence if it notices a connection that does happen.
    server = serve(echo)
    run(call_for(tmp_path, url=server.url))
    assert ("127.0.0.1", server.port) in connects


def test_an_allowed_host_port_is_reached_and_only_that_port(tmp_path: Path, serve: Any) -> None:
    a, b = serve(echo), serve(echo)
    permissions = SAFE_HTTP.with_policies(allow("net:private", f"127.0.0.1:{a.port}"))
    out = run(call_for(tmp_path, permissions, url=a.url))
    assert out.data is not None and out.data["status"] == 200
    with pytest.raises(SecurityError):
        run(call_for(tmp_path, permissions, url=b.url))
    assert len(a.seen) == 1 and b.seen == []


def test_a_redirect_to_a_private_address_is_refused_and_never_reached(
    tmp_path: Path, serve: Any
) -> None:
    b = serve(echo)
    a = serve(lambda s: (302, [("Location", f"http://127.0.0.1:{b.port}/internal")], b""))
    permissions = SAFE_HTTP.with_policies(allow("net:private", f"127.0.0.1:{a.port}"))
    with pytest.raises(SecurityError) as info:
        run(call_for(tmp_path, permissions, url=a.url + "/start"))
    assert f"127.0.0.1:{b.port}" in info.value.message
    assert len(a.seen) == 1
    assert b.seen == []


def test_a_redirect_to_the_metadata_service_is_refused(
    tmp_path: Path, serve: Any, connects: list[object]
) -> None:
    a = serve(lambda s: (301, [("Location", "http://169.254.169.254/latest/meta-data/")], b""))
    permissions = SAFE_HTTP.with_policies(allow("net:private", f"127.0.0.1:{a.port}"))
    with pytest.raises(SecurityError) as info:
        run(call_for(tmp_path, permissions, url=a.url))
    assert "169.254.169.254" in info.value.message
    assert all(addr[1] == a.port for addr in connects if isinstance(addr, tuple))


def test_redirects_are_followed_with_the_right_method_and_headers(
    tmp_path: Path, serve: Any
) -> None:
    b = serve(echo)

    def a_reply(seen: Seen) -> Reply:
        if seen.path == "/same":
            return 307, [("Location", "/echo")], b""
        if seen.path == "/echo":
            return echo(seen)
        return 303, [("Location", f"{b.url}/landed")], b""

    a = serve(a_reply)
    # 303 after POST: GET without the body; another origin: no Authorization.
    out = run(
        call_for(
            tmp_path, url=a.url + "/form", method="POST", body="x=1", headers={"Authorization": "t"}
        )
    )
    assert out.data is not None
    assert out.data["url"] == f"{b.url}/landed"
    assert out.data["redirects"] == [f"{b.url}/landed"]
    landed = b.seen[0]
    assert (landed.method, landed.body) == ("GET", b"")
    assert "authorization" not in landed.headers
    # 307 on the same origin: same method, same body, Authorization kept.
    run(
        call_for(
            tmp_path, url=a.url + "/same", method="PUT", body="y=2", headers={"Authorization": "t"}
        )
    )
    again = a.seen[-1]
    assert (again.path, again.method, again.body) == ("/echo", "PUT", b"y=2")
    assert again.headers["authorization"] == "t"


def test_too_many_redirects_fail(tmp_path: Path, serve: Any) -> None:
    loop = serve(lambda s: (302, [("Location", "/again")], b""))
    with pytest.raises(ToolFailure) as info:
        run(call_for(tmp_path, url=loop.url))
    assert info.value.error_type == "TooManyRedirects"
    assert len(loop.seen) == http.MAX_REDIRECTS + 1


def test_cookies_are_not_carried_across_hops_or_calls(tmp_path: Path, serve: Any) -> None:
    def reply(seen: Seen) -> Reply:
        if seen.path == "/set":
            return 302, [("Set-Cookie", "sid=abc; Path=/"), ("Location", "/check")], b""
        return echo(seen)

    server = serve(reply)
    run(call_for(tmp_path, url=server.url + "/set"))
    run(call_for(tmp_path, url=server.url + "/check"))
    assert [s.path for s in server.seen] == ["/set", "/check", "/check"]
    assert all("cookie" not in s.headers for s in server.seen)


def test_environment_proxies_are_ignored(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = serve(lambda s: (200, [("Content-Type", "text/plain")], b"via proxy"))
    target = serve(lambda s: (200, [("Content-Type", "text/plain")], b"direct"))
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    out = run(call_for(tmp_path, url=f"http://localhost:{target.port}/"))
    assert out.output.endswith("\n\ndirect")
    assert proxy.seen == []


def test_the_connection_goes_to_the_checked_address_not_a_second_lookup(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name answers 127.0.0.1 once, then something else; the request must use
    the first answer (the one the guard checked) and never ask again."""
    server = serve(echo)
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.example":
            lookups.append(host)
            if len(lookups) > 1:
                raise socket.gaierror(socket.EAI_NONAME, "rebound")
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    permissions = SAFE_HTTP.with_policies(allow("net:private", f"rebind.example:{server.port}"))
    out = run(call_for(tmp_path, permissions, url=f"http://rebind.example:{server.port}/x"))
    assert out.data is not None and out.data["status"] == 200
    assert lookups == ["rebind.example"]
    assert server.seen[0].headers["host"] == f"rebind.example:{server.port}"


def test_a_name_with_one_private_address_among_public_ones_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connects: list[object]
) -> None:
    def mixed(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        assert host == "mixed.example"
        stream = socket.SOCK_STREAM
        return [
            (socket.AF_INET, stream, 6, "", ("93.184.216.34", port)),
            (socket.AF_INET, stream, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", mixed)
    with pytest.raises(SecurityError) as info:
        run(call_for(tmp_path, SAFE_HTTP, url="http://mixed.example/"))
    assert "'mixed.example' resolves to 127.0.0.1" in info.value.message
    assert connects == []


def test_https_sends_the_host_name_as_sni_and_verifies_the_certificate(
    tmp_path: Path,
) -> None:
    """Pinned to the IP, TLS still names (and verifies) the host: a self-signed certificate for
    localhost is refused, and the server saw SNI 'localhost', not '127.0.0.1'."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subject = ["-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject],
        check=True,
        capture_output=True,
    )
    names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def record(sock: Any, name: str | None, ctx: Any) -> None:
        names.append(name)

    context.sni_callback = record
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_once() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            context.wrap_socket(conn, server_side=True).close()

    thread = threading.Thread(target=serve_once, daemon=True)
    thread.start()
    try:
        with pytest.raises(ToolFailure) as info:
            run(call_for(tmp_path, url=f"https://localhost:{port}/"))
    finally:
        thread.join(5)
        listener.close()
    assert "CERTIFICATE_VERIFY_FAILED" in info.value.message
    assert names == ["localhost"]


# -- end to end through the executer -------------------------------------------------------------


def _kml(*tools: str) -> str:
    return "<kyronix>\n" + "\n".join(tools) + "\n<status>complete</status>\n</kyronix>"


def test_through_the_executer_safe_policies_refuse_loopback(tmp_path: Path, serve: Any) -> None:
    server = serve(echo)
    kml = _kml(f'<tool name="http_request"><url>{server.url}/</url></tool>')
    ex = KyronixExecuter(permissions=SAFE_HTTP, receipts=tmp_path / "r.sqlite3")
    try:
        [entry] = ex.execute_sync(kml, tmp_path)
    finally:
        ex.close()
    assert entry["result"]["success"] is False
    assert entry["result"]["errorType"] == "SecurityError"
    assert "allow('net:private'" in entry["result"]["error"]
    assert server.seen == []


def test_through_the_executer_without_the_tool_allowed_nothing_is_sent(
    tmp_path: Path, serve: Any
) -> None:
    server = serve(echo)
    kml = _kml(f'<tool name="http_request"><url>{server.url}/</url></tool>')
    ex = KyronixExecuter(permissions=PermissionManager(SAFE_POLICIES), receipts=tmp_path / "r.db")
    try:
        [entry] = ex.execute_sync(kml, tmp_path)
    finally:
        ex.close()
    assert entry["result"]["errorType"] == "SecurityError"
    assert "tool:http_request" in entry["result"]["error"]
    assert server.seen == []


def test_through_the_executer_with_headers_as_json(tmp_path: Path, serve: Any) -> None:
    server = serve(echo)
    kml = _kml(
        '<tool name="http_request">'
        f"<url>{server.url}/api</url><method>PUT</method>"
        '<headers>{"X-Api": "v2"}</headers><body>payload</body></tool>'
    )
    ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=tmp_path / "r.db")
    try:
        [entry] = ex.execute_sync(kml, tmp_path)
    finally:
        ex.close()
    result = entry["result"]
    assert result["success"] is True, result
    assert result["data"]["status"] == 200
    assert (server.seen[0].method, server.seen[0].body) == ("PUT", b"payload")
    assert server.seen[0].headers["x-api"] == "v2"
    assert result["output"].startswith("HTTP 200 OK")
