"""The browser tools against a real Chromium (through Playwright) and real local HTTP servers.

Pages are served on 127.0.0.1 by threaded ``http.server`` s that record every request, so the
tests assert on what really reached a server: the form the browser posted, and that a server
the guard protects never saw a request. Chromium is required: without it these tests fail.
"""

from __future__ import annotations

import base64
import http.server
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from kyronix.executer import (
    ROOT_POLICIES,
    SAFE_POLICIES,
    KyronixExecuter,
    PermissionManager,
    allow,
)
from kyronix.executer.tools import browser
from kyronix.executer.tools.base import Call, Resources, SecurityError, ToolFailure, ToolOutput
from kyronix.executer.tools.browser import (
    TOOLS,
    BrowserSession,
    _GuardProxy,
    _split_url,
    _vet,
    find_chromium,
)
from kyronix.executer.tools.net import is_private_address

from .kmlkit import kml

TIMEOUT = 3.0  # the per-action timeout of the shared session (the default is 15 s)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SPECS = {spec.name: spec for spec in TOOLS}


# ---------------------------------------------------------------------------------------------
# Local sites.


class Site:
    """A threaded HTTP server on 127.0.0.1 serving ``pages`` and recording every request."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[int, dict[str, str], str]] = {}
        self.requests: list[tuple[str, str, bytes]] = []
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, body_in: bytes) -> None:
                site.requests.append((self.command, self.path, body_in))
                status, headers, body = site.pages.get(
                    self.path.split("?")[0], (404, {}, "<title>Not found</title>missing")
                )
                data = body.encode()
                self.send_response(status)
                headers = {"Content-Type": "text/html; charset=utf-8", **headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer(b"")

            def do_POST(self) -> None:
                self._answer(self.rfile.read(int(self.headers.get("Content-Length", "0"))))

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self.server.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.hostport = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def page(self, path: str, body: str, status: int = 200, **headers: str) -> str:
        self.pages[path] = (status, headers, body)
        return self.origin + path

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    s = Site()
    yield s
    s.close()


@pytest.fixture(scope="module")
def other() -> Iterator[Site]:
    """A second server the guard must keep the browser away from."""
    s = Site()
    yield s
    s.close()


@pytest.fixture(scope="module")
def session() -> Iterator[BrowserSession]:
    """One Chromium shared by the module's tests (as one executer shares it between calls)."""
    try:
        find_chromium()
    except ToolFailure as exc:
        pytest.fail(f"the browser tests need Chromium: {exc.message}")
    s = BrowserSession(timeout=TIMEOUT)
    yield s
    s.close()


class _Shared(Resources):
    def __init__(self, session: BrowserSession) -> None:
        super().__init__()
        self._shared = session

    @property
    def browser(self) -> BrowserSession:  # type: ignore[override]
        return self._shared


def run(
    session: BrowserSession,
    tool: str,
    permissions: PermissionManager | None = None,
    base: Path | None = None,
    **args: Any,
) -> ToolOutput:
    call = Call(
        tool=tool,
        execution_id="e1",
        args=args,
        base=(base or Path("/nonexistent-base")),
        permissions=permissions or PermissionManager(ROOT_POLICIES),
        resources=_Shared(session),
    )
    out = SPECS[tool].handler(call)
    assert isinstance(out, ToolOutput)
    return out


def without_favicon(urls: list[str]) -> list[str]:
    """Chromium asks each origin for /favicon.ico on its own (the proxy guards those too)."""
    return [u for u in urls if not u.endswith("/favicon.ico")]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def chromium_processes() -> dict[int, int]:
    """Live Chromium processes descended from this test process: pid -> parent pid."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    descendants: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - descendants
        descendants |= frontier
    found = {}
    for pid in descendants:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if b"chromium" in argv0:
            found[pid] = parents[pid]
    return found


def process_state(pid: int) -> str | None:
    """The state letter of a process (``Z`` for a zombie), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def browser_pids() -> set[int]:
    """The main Chromium processes (those whose parent is not Chromium)."""
    procs = chromium_processes()
    return {pid for pid, ppid in procs.items() if ppid not in procs}


# ---------------------------------------------------------------------------------------------
# Which addresses are private (pure).


@pytest.mark.parametrize(
    "ip",
    [
        "127.0.0.1",
        "127.255.255.254",
        "::1",
        "10.0.0.1",
        "10.255.255.255",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "100.64.0.1",
        "100.127.255.255",
        "169.254.0.1",
        "169.254.169.254",
        "100.100.100.200",
        "fd00:ec2::254",
        "fc00::1",
        "fdff:ffff::1",
        "fe80::1",
        "fe80::1%eth0",
        "fec0::1",
        "0.0.0.0",
        "0.1.2.3",
        "::",
        "224.0.0.1",
        "239.255.255.250",
        "ff02::1",
        "255.255.255.255",
        "240.0.0.1",
        "192.0.2.1",
        "2001:db8::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",
        "::127.0.0.1",
        "64:ff9b::a00:1",
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::",
        "2002:a9fe:a9fe::1",
        "[::1]",
    ],
)
def test_private_and_special_addresses_are_private(ip: str) -> None:
    assert is_private_address(ip)


@pytest.mark.parametrize("text", ["not an address", "", "127.0.0.1.example.com"])
def test_text_that_is_no_address_is_refused_loudly(text: str) -> None:
    with pytest.raises(ValueError, match="does not appear to be"):
        is_private_address(text)


@pytest.mark.parametrize(
    "ip",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.215.14",
        "172.15.255.255",
        "172.32.0.0",
        "100.63.255.255",
        "100.128.0.0",
        "169.253.255.255",
        "11.0.0.1",
        "192.169.0.1",
        "2606:4700:4700::1111",
        "2a00:1450:4001:80b::200e",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ],
)
def test_public_addresses_are_not_private(ip: str) -> None:
    assert not is_private_address(ip)


# ---------------------------------------------------------------------------------------------
# The up-front checks of navigate (pure but for numeric getaddrinfo: no network).


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("file:///etc/passwd", SecurityError),
        ("FILE:///etc/passwd", SecurityError),
        ("javascript:alert(1)", SecurityError),
        ("data:text/html,<h1>hi</h1>", SecurityError),
        ("chrome://version", SecurityError),
        ("view-source:http://127.0.0.1/", SecurityError),
        ("ftp://example.com/x", SecurityError),
        ("about:blank", SecurityError),
        ("mailto:someone@example.com", SecurityError),
        ("example.com", ToolFailure),
        ("localhost:8080/path", ToolFailure),
        ("localhost:²/path", SecurityError),
        ("", ToolFailure),
        ("http://", ToolFailure),
        ("http://example.com:99999/", ToolFailure),
        ("http://127.0.0.1\\@example.com/", ToolFailure),
        ("java\tscript:alert(1)", ToolFailure),
    ],
)
def test_split_url_refuses(url: str, error: type[ToolFailure]) -> None:
    with pytest.raises(error) as info:
        _split_url(url)
    assert type(info.value) is error
    assert info.value.message


@pytest.mark.parametrize(
    "target", ["example.com", "example.com:", "example.com:²", "x:\uff18\uff10"]
)
def test_a_connect_target_without_an_ascii_port_is_refused_in_words(target: str) -> None:
    from kyronix.errors import KyronixUsageError
    from kyronix.executer.tools.browser.proxy import _split_host_port

    with pytest.raises(KyronixUsageError, match="expected host:port"):
        _split_host_port(target)


def test_split_url_gives_host_and_default_ports() -> None:
    assert _split_url("https://Example.com/path?q=1") == ("example.com", 443)
    assert _split_url("http://example.com/") == ("example.com", 80)
    assert _split_url("http://[::1]:8080/") == ("::1", 8080)


def test_vet_asks_net_private_for_host_port() -> None:
    only_8080 = PermissionManager([allow("net:private", "127.0.0.1:8080")])
    assert _vet("127.0.0.1", 8080, only_8080)
    with pytest.raises(SecurityError) as info:
        _vet("127.0.0.1", 8081, only_8080)
    assert "127.0.0.1:8081" in info.value.message
    assert "net:private" in info.value.message
    assert "loopback" in info.value.message


@pytest.mark.parametrize(
    ("host", "target"),
    [
        ("localhost", "localhost:80"),
        ("foo.localhost", "foo.localhost:80"),
        ("metadata.google.internal", "metadata.google.internal:80"),
        ("169.254.169.254", "169.254.169.254:80"),
        ("2130706433", "127.0.0.1:80"),  # numeric forms Chromium reads as 127.0.0.1
        ("0x7f.1", "127.0.0.1:80"),
        ("0177.0.0.1", "127.0.0.1:80"),
        ("::ffff:127.0.0.1", "[::ffff:127.0.0.1]:80"),
        ("fd00:ec2::254", "[fd00:ec2::254]:80"),
        ("LOCALHOST.", "localhost:80"),
    ],
)
def test_vet_refuses_private_hosts_without_permission(host: str, target: str) -> None:
    with pytest.raises(SecurityError) as info:
        _vet(host, 80, PermissionManager(SAFE_POLICIES))
    pattern = target  # matched literally: no escaping of the IPv6 brackets
    assert f"allow('net:private', {pattern!r})" in info.value.message
    # the same host passes when exactly that target is allowed, and only then
    _vet(host, 80, PermissionManager([allow("net:private", pattern)]))
    with pytest.raises(SecurityError):
        _vet(host, 81, PermissionManager([allow("net:private", pattern)]))


def test_vet_lets_public_addresses_through_without_permission() -> None:
    assert _vet("93.184.215.14", 443, PermissionManager(SAFE_POLICIES))
    assert _vet("2606:4700:4700::1111", 443, None)


def test_find_chromium(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert find_chromium({"KYRONIX_CHROMIUM": "/bin/true"}) == "/bin/true"
    with pytest.raises(ToolFailure, match="KYRONIX_CHROMIUM='/no/such/chromium'"):
        find_chromium({"KYRONIX_CHROMIUM": "/no/such/chromium"})
    monkeypatch.setattr(browser.launch, "CHROMIUM_PATHS", (str(tmp_path / "chromium"),))
    with pytest.raises(
        ToolFailure, match=r"install Debian's chromium \(apt-get install chromium\)"
    ):
        find_chromium({"PATH": str(tmp_path)})
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_chromium({"PATH": ""}) == str(fake)


def test_a_chromium_that_does_not_start_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KYRONIX_CHROMIUM", "/bin/false")
    threads_before = set(threading.enumerate())
    broken = BrowserSession(timeout=TIMEOUT)
    try:
        with pytest.raises(ToolFailure, match=r"could not start Chromium \(/bin/false\)"):
            broken.navigate("http://127.0.0.1:9/", PermissionManager(ROOT_POLICIES))
        assert not broken.started
        leftovers = set(threading.enumerate()) - threads_before
        assert [t.name for t in leftovers if "proxy" in t.name and t.is_alive()] == []
    finally:
        broken.close()


def test_missing_playwright_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)
    fresh = BrowserSession(timeout=TIMEOUT)
    try:
        with pytest.raises(ToolFailure, match=r"pip install 'kiso\[browser\]'"):
            fresh.navigate("http://127.0.0.1:9/", PermissionManager(ROOT_POLICIES))
        assert not fresh.started
    finally:
        fresh.close()


# ---------------------------------------------------------------------------------------------
# The guard proxy on its own (real sockets).


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_proxy_forwards_plain_http_in_origin_form_and_refuses_private_targets(site: Site) -> None:
    site.page("/proxied", "<title>proxied</title>")
    refused: list[tuple[str, str, str]] = []
    allowed_port = site.port

    def vet(host: str, port: int) -> list[Any]:
        if port != allowed_port:
            raise SecurityError(f"refused {host}:{port}")
        return [(socket.AF_INET, ("127.0.0.1", port))]

    proxy = _GuardProxy(vet, lambda *a: refused.append(a), "tok", TIMEOUT)
    try:
        before = len(site.requests)
        answer = _exchange(
            proxy.port,
            f"GET {site.origin}/proxied?x=1 HTTP/1.1\r\nHost: {site.hostport}\r\n"
            "Proxy-Connection: keep-alive\r\n\r\n".encode(),
        )
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"<title>proxied</title>")
        assert site.requests[before:] == [("GET", "/proxied?x=1", b"")]

        tunnel = _exchange(
            proxy.port,
            f"CONNECT {site.hostport} HTTP/1.1\r\n\r\n"
            f"GET /proxied HTTP/1.1\r\nHost: {site.hostport}\r\nConnection: close\r\n\r\n".encode(),
        )
        assert tunnel.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.0 200")

        for request in (
            b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n",
            b"GET http://127.0.0.1:1/ HTTP/1.1\r\n\r\n",
        ):
            denied = _exchange(proxy.port, request)
            assert denied.startswith(b"HTTP/1.1 403 Forbidden")
            assert b"x-kyronix-blocked: tok" in denied
            assert b"refused 127.0.0.1:1" in denied
        assert [r[0] for r in refused] == ["proxy", "proxy"]
    finally:
        proxy.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()


# ---------------------------------------------------------------------------------------------
# The tools in a real browser.


def test_actions_before_navigate_fail_without_starting_chromium() -> None:
    fresh = BrowserSession(timeout=TIMEOUT)
    try:
        for tool, args in (
            ("click", {"selector": "button"}),
            ("type", {"selector": "input", "text": "x"}),
            ("screenshot", {}),
        ):
            with pytest.raises(ToolFailure, match="navigate first"):
                run(fresh, tool, **args)
        assert not fresh.started
    finally:
        fresh.close()


def test_refused_urls_never_reach_the_browser(site: Site) -> None:
    fresh = BrowserSession(timeout=TIMEOUT)
    try:
        for url in ("file:///etc/passwd", "javascript:alert(document.cookie)", "chrome://version"):
            with pytest.raises(SecurityError, match="only http:// and https://"):
                run(fresh, "navigate", url=url)
        with pytest.raises(SecurityError, match="net:private"):
            run(fresh, "navigate", PermissionManager(SAFE_POLICIES), url=site.origin + "/")
        assert not fresh.started  # refused up front, before Chromium was started
    finally:
        fresh.close()


def test_navigate_shows_status_title_and_page_text(session: BrowserSession, site: Site) -> None:
    url = site.page(
        "/welcome",
        "<title>Welcome page</title><h1>Hello there</h1><a href='/next'>Next step</a>"
        "<label>Name <input id=name></label>",
    )
    out = run(session, "navigate", url=url)
    assert out.data == {"url": url, "status": 200, "title": "Welcome page"}
    assert f"Navigated to {url} (HTTP 200)" in out.output
    assert "Title: Welcome page" in out.output
    assert 'heading "Hello there" [level=1]' in out.output
    assert 'link "Next step"' in out.output
    assert 'textbox "Name"' in out.output
    assert not out.truncated

    missing = run(session, "navigate", url=site.origin + "/no-such-page")
    assert missing.data is not None and missing.data["status"] == 404


def test_navigate_caps_the_page_text(session: BrowserSession, site: Site) -> None:
    url = site.page(
        "/long", "<title>long</title>" + "".join(f"<p>para {i}</p>" for i in range(3000))
    )
    out = run(session, "navigate", url=url)
    assert out.truncated
    assert len(out.output) < browser.SNAPSHOT_CHARS + 500
    assert "para 10" in out.output and "para 2999" not in out.output


def test_type_and_click_post_the_form(session: BrowserSession, site: Site) -> None:
    site.page(
        "/form",
        "<title>Form</title><form method=post action=/submit>"
        "<input id=name name=name><input name=other value=kept>"
        "<button type=submit>Send</button></form>",
    )
    site.page("/submit", "<title>Thanks</title><p>received</p>")
    run(session, "navigate", url=site.origin + "/form")
    first = run(session, "type", selector="#name", text="overwritten")
    assert first.data == {"selector": "#name", "url": site.origin + "/form", "chars": 11}
    typed = run(session, "type", selector="#name", text="Ada Lovelace & co")
    assert "Typed 17 character(s) into #name" in typed.output

    before = len(site.requests)
    clicked = run(session, "click", selector="button[type=submit]")
    posts = [r for r in site.requests[before:] if r[0] == "POST"]
    assert [(m, p) for m, p, _ in posts] == [("POST", "/submit")]
    assert parse_qs(posts[0][2].decode()) == {"name": ["Ada Lovelace & co"], "other": ["kept"]}
    assert clicked.data is not None
    assert clicked.data["selector"] == "button[type=submit]"
    assert clicked.data["url"] == site.origin + "/submit"
    assert f"The page is now {site.origin}/submit — Thanks" in clicked.output


def test_click_on_several_matches_clicks_the_first(session: BrowserSession, site: Site) -> None:
    site.page("/two", "<title>two</title><a href='/one-a'>a</a> <a href='/one-b'>b</a>")
    site.page("/one-a", "<title>A</title>")
    run(session, "navigate", url=site.origin + "/two")
    out = run(session, "click", selector="a")
    assert out.data is not None and out.data["url"] == site.origin + "/one-a"
    assert out.data["matches"] == 2 and "the first of 2 matches" in out.output


def test_click_that_opens_a_tab_moves_to_it(session: BrowserSession, site: Site) -> None:
    site.page("/opener", "<title>opener</title><a href='/opened' target=_blank>open</a>")
    site.page("/opened", "<title>Opened</title><input id=q>")
    run(session, "navigate", url=site.origin + "/opener")
    out = run(session, "click", selector="a")
    assert out.data is not None and out.data["url"] == site.origin + "/opened"
    assert "opened a new tab" in out.output
    typed = run(session, "type", selector="#q", text="here")
    assert typed.data is not None and typed.data["url"] == site.origin + "/opened"


def test_missing_selector_fails_fast_naming_selector_and_page(site: Site) -> None:
    quick = BrowserSession(timeout=1.0)
    try:
        url = site.page("/plain", "<title>plain</title><p>nothing to click</p>")
        run(quick, "navigate", url=url)
        for tool, args in (
            ("click", {"selector": "#does-not-exist"}),
            ("type", {"selector": "#does-not-exist", "text": "x"}),
        ):
            with pytest.raises(ToolFailure) as info:
                run(quick, tool, **args)
            assert "'#does-not-exist'" in info.value.message
            assert url in info.value.message
            assert "no element matches" in info.value.message
    finally:
        quick.close()


def test_invalid_selector_and_unfillable_element(session: BrowserSession, site: Site) -> None:
    run(session, "navigate", url=site.page("/bad", "<title>b</title><p id=p>text</p>"))
    with pytest.raises(ToolFailure, match="is not valid"):
        run(session, "click", selector="p[[[")
    with pytest.raises(ToolFailure, match="could not type into '#p'"):
        run(session, "type", selector="#p", text="x")


def test_screenshot_writes_a_png_inside_the_base(
    session: BrowserSession, site: Site, tmp_path: Path
) -> None:
    run(session, "navigate", url=site.page("/shot", "<title>shot</title><h1>picture me</h1>"))
    base = tmp_path.resolve()
    target = base / "shots" / "deep" / "page.png"
    out = run(session, "screenshot", base=base, path=target)
    written = target.read_bytes()
    assert png_size(written) == (1280, 800)
    assert out.data == {
        "url": site.origin + "/shot",
        "width": 1280,
        "height": 800,
        "bytes": len(written),
        "path": "shots/deep/page.png",
    }
    assert os.listdir(target.parent) == ["page.png"]  # no temporary file left behind

    with pytest.raises(ToolFailure, match=r"ending in \.png"):
        run(session, "screenshot", base=base, path=base / "page.jpg")
    assert not (base / "page.jpg").exists()
    (base / "dir.png").mkdir()
    with pytest.raises(ToolFailure, match="is a directory"):
        run(session, "screenshot", base=base, path=base / "dir.png")


def test_screenshot_without_path_returns_base64(session: BrowserSession, site: Site) -> None:
    run(session, "navigate", url=site.page("/b64", "<title>b64</title>"))
    out = run(session, "screenshot")
    assert out.data is not None
    png = base64.b64decode(out.data["png_base64"])
    assert png_size(png) == (out.data["width"], out.data["height"]) == (1280, 800)
    assert out.data["bytes"] == len(png)
    assert "path" not in out.data


# -- the network guard -------------------------------------------------------------------------


def test_private_navigation_is_refused_without_net_private(
    session: BrowserSession, site: Site
) -> None:
    url = site.page("/private", "<title>private</title>")
    before = len(site.requests)
    for target in (url, f"http://localhost:{site.port}/private", f"http://2130706433:{site.port}/"):
        with pytest.raises(SecurityError) as info:
            run(session, "navigate", PermissionManager(SAFE_POLICIES), url=target)
        assert "net:private" in info.value.message
    assert f"allow('net:private', '{site.hostport}')" in str(info.value.message)
    assert len(site.requests) == before


def test_route_guard_blocks_subrequests_to_other_private_hosts(
    session: BrowserSession, site: Site, other: Site
) -> None:
    other.page("/pixel.png", "not really a png")
    url = site.page(
        "/leaky",
        f"<title>leaky</title><img src='{other.origin}/pixel.png'>"
        f"<script src='{other.origin}/x.js'></script>"
        f"<iframe src='{other.origin}/frame'></iframe>",
    )
    only_site = PermissionManager([allow("net:private", site.hostport)])
    out = run(session, "navigate", only_site, url=url)
    assert out.data is not None and out.data["status"] == 200
    assert other.requests == []
    assert set(without_favicon(out.data["blocked"])) == {
        f"{other.origin}/pixel.png",
        f"{other.origin}/x.js",
        f"{other.origin}/frame",
    }
    layers = {b.target: b.layer for b in session.blocked}
    assert layers[f"{other.origin}/pixel.png"] == "route"
    assert "request(s) to addresses the browser may not reach:" in out.output
    assert f"  {other.origin}/x.js" in out.output


def test_proxy_blocks_redirects_the_route_guard_cannot_see(
    session: BrowserSession, site: Site, other: Site
) -> None:
    site.page("/to-other", "", status=302, Location=f"{other.origin}/secret")
    site.page("/img-to-other", "", status=302, Location=f"{other.origin}/secret-img")
    url = site.page("/redirecting-img", "<title>img</title><img src='/img-to-other'>")
    only_site = PermissionManager([allow("net:private", site.hostport)])

    with pytest.raises(SecurityError) as info:
        run(session, "navigate", only_site, url=site.origin + "/to-other")
    assert f"{other.origin}/secret" in info.value.message
    out = run(session, "navigate", only_site, url=url)
    assert out.data is not None
    assert without_favicon(out.data["blocked"]) == [f"{other.origin}/secret-img"]
    assert other.requests == []
    assert {b.layer for b in session.blocked if other.origin in b.target} >= {"proxy"}
    assert [b.layer for b in session.blocked if b.target.endswith("/secret-img")] == ["proxy"]


def test_proxy_blocks_websockets_to_private_hosts(
    session: BrowserSession, site: Site, other: Site
) -> None:
    url = site.page(
        "/socket",
        f"<title>ws</title><script>new WebSocket('ws://{other.hostport}/feed')</script>",
    )
    run(session, "navigate", PermissionManager([allow("net:private", site.hostport)]), url=url)
    deadline = time.monotonic() + 5
    while not any(b.target == other.hostport for b in session.blocked):
        assert time.monotonic() < deadline, session.blocked
        time.sleep(0.05)
    assert [b.layer for b in session.blocked if b.target == other.hostport] == ["proxy"]
    assert other.requests == []


def test_allowed_private_redirect_is_followed(
    session: BrowserSession, site: Site, other: Site
) -> None:
    site.page("/go", "", status=302, Location=f"{other.origin}/landing")
    other.page("/landing", "<title>Landed</title>")
    out = run(session, "navigate", PermissionManager(ROOT_POLICIES), url=site.origin + "/go")
    assert out.data == {"url": f"{other.origin}/landing", "status": 200, "title": "Landed"}
    assert without_favicon(other.paths()) == ["/landing"]
    other.requests.clear()


# -- one browser per session; close --------------------------------------------------------------


def test_one_browser_is_reused_across_calls(session: BrowserSession, site: Site) -> None:
    run(session, "navigate", url=site.page("/one", "<title>one</title>"))
    first = browser_pids()
    assert len(first) == 1
    run(session, "navigate", url=site.page("/two-again", "<title>two</title>"))
    run(session, "screenshot")
    assert browser_pids() == first


def test_close_leaves_no_chromium_behind(site: Site) -> None:
    existing = set(chromium_processes())
    threads_before = set(threading.enumerate())
    fresh = BrowserSession(timeout=TIMEOUT)
    run(fresh, "navigate", url=site.page("/closing", "<title>closing</title>"))
    mine = set(chromium_processes()) - existing
    assert mine, "the session should have started Chromium"
    its_threads = set(threading.enumerate()) - threads_before
    assert {t.name.rsplit("_", 1)[0] for t in its_threads} >= {
        "kyronix-browser",
        "kyronix-browser-proxy",
    }
    fresh.close()
    fresh.close()  # idempotent
    # close() returns once the main process has exited; its helpers follow within moments. A
    # zombie has exited too (reaping it is its parent's business, init's for an orphan).
    deadline = time.monotonic() + 5
    while (left := {pid for pid in mine if process_state(pid) not in (None, "Z")}) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert left == set()
    assert [t.name for t in its_threads if t.is_alive()] == []
    with pytest.raises(ToolFailure, match="closed"):
        run(fresh, "navigate", url=site.origin + "/closing")


# -- through the executer ------------------------------------------------------------------------


def test_navigate_type_click_screenshot_in_one_envelope(
    site: Site, base: Path, tmp_path: Path
) -> None:
    site.page(
        "/signup",
        "<title>Sign up</title><form method=post action=/signed>"
        "<input id=email name=email><button id=go type=submit>Join</button></form>",
    )
    site.page("/signed", "<title>Signed up</title><h1>Welcome aboard</h1>")
    before = len(site.requests)
    ex = KyronixExecuter(
        permissions=PermissionManager(ROOT_POLICIES), receipts=tmp_path / "r.sqlite3"
    )
    try:
        results = ex.execute_sync(
            kml(
                ("navigate", {"url": site.origin + "/signup"}),
                ("type", {"selector": "#email", "text": "ada@example.com"}),
                ("click", {"selector": "#go"}),
                ("screenshot", {"path": "out/after.png"}),
            ),
            base,
        )
    finally:
        ex.close()
    assert [r["tool"] for r in results] == ["navigate", "type", "click", "screenshot"]
    assert all(r["result"]["success"] for r in results), results
    assert results[0]["result"]["data"]["title"] == "Sign up"
    assert results[2]["result"]["data"]["url"] == site.origin + "/signed"
    assert results[3]["result"]["data"]["path"] == "out/after.png"
    posted = [body for method, _, body in site.requests[before:] if method == "POST"]
    assert parse_qs(posted[0].decode()) == {"email": ["ada@example.com"]}
    assert png_size((base / "out" / "after.png").read_bytes()) == (1280, 800)


def test_executer_refuses_a_private_page_without_net_private(
    site: Site, base: Path, tmp_path: Path
) -> None:
    before = len(site.requests)
    ex = KyronixExecuter(
        permissions=[*SAFE_POLICIES, allow("tool:navigate")], receipts=tmp_path / "r.sqlite3"
    )
    try:
        [entry] = ex.execute_sync(kml(("navigate", {"url": site.origin + "/signup"})), base)
    finally:
        ex.close()
    result = entry["result"]
    assert not result["success"]
    assert result["errorType"] == "SecurityError"
    assert f"allow('net:private', '{site.hostport}')" in result["error"]
    assert len(site.requests) == before
