"""The browser tools: ``navigate``, ``click``, ``type`` and ``screenshot`` on one headless Chromium.

An executer owns at most one :class:`BrowserSession` (``Resources.browser``), started on the
first ``navigate``: the system Chromium (``$KYRONIX_CHROMIUM``, Debian's ``chromium``) driven by
Playwright's sync API. Playwright objects belong to the thread that created them, so every call
is run on the session's single worker thread; handlers may call the session from any thread.
The tools act on one page: ``navigate`` loads it, ``click``, ``type`` and ``screenshot`` use it.

The browser must not become a way into the machine's network. Unless ``net:private`` allows the
``host:port``, nothing may reach a loopback, private, shared (CGNAT), link-local, unspecified,
multicast or cloud metadata address. Three layers enforce it:

1. ``navigate`` checks its URL up front: only ``http``/``https``; the host is resolved and every
   address is checked (:func:`kyronix.executer.tools.net.is_private_address`).
2. A ``context.route("**/*")`` guard checks every request the pages make (images, scripts,
   fetches, frames, popups) and aborts those bound for such an address.
3. Chromium sends all its traffic through a small forward proxy on 127.0.0.1 owned by the
   session (:class:`_GuardProxy`). Playwright does not route redirects, so a public page could
   otherwise redirect the browser to ``http://169.254.169.254``; the proxy sees every hop,
   WebSockets included, resolves the host itself and connects only to the addresses it checked
   (so a DNS answer that changes between check and use does not get through).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import ipaddress
import os
import secrets
import selectors
import shutil
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from kiso.tools.atomic import atomic_write
from kiso.tools.env import child_env
from kyronix.errors import KyronixUsageError
from kyronix.executer.tools.base import (
    Call,
    Param,
    SecurityError,
    ToolFailure,
    ToolOutput,
    ToolSpec,
)
from kyronix.executer.tools.net import (
    METADATA_ADDRESSES,
    METADATA_HOSTS,
    host_target,
    is_private_address,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Locator, Page, Playwright, Route

    from kyronix.executer.permissions import PermissionManager

__all__ = ["DEFAULT_TIMEOUT", "TOOLS", "BlockedRequest", "BrowserSession", "find_chromium"]

DEFAULT_TIMEOUT = 15.0
"""Seconds one browser action (a page load, a click, a fill, a screenshot) may take."""

SNAPSHOT_CHARS = 8000
"""The page text ``navigate`` returns is cut here (``truncated`` is set)."""

VIEWPORT = {"width": 1280, "height": 800}

POPUP_WAIT = 0.25
"""Seconds a click waits for a new tab it may have opened (which then becomes the page)."""

CHROMIUM_PATHS = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")

LAUNCH_ARGS = (
    "--no-sandbox",  # the executer may run as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-quic",  # QUIC is UDP: it would not go through the guard proxy
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)

_PIP_HINT = "pip install 'kiso[browser]'"
_BLOCK_HEADER = "x-kyronix-blocked"
_BLOCKED_ERRORS = ("ERR_BLOCKED_BY_CLIENT", "ERR_TUNNEL_CONNECTION_FAILED")
"""How a navigation the route guard aborted, or whose tunnel the proxy refused, fails."""

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Which addresses the browser may reach.


def _kind(ip: str) -> str | None:
    """Why the browser may not reach ``ip`` without ``net:private`` (None: it may)."""
    if not is_private_address(ip):
        return None
    try:
        if ipaddress.ip_address(ip.split("%", 1)[0]) in METADATA_ADDRESSES:
            return "cloud metadata"
    except ValueError:
        return "not an IP address"
    return "loopback, private, link-local or reserved"


def _canonical_host(host: str) -> str:
    """The host as Chromium will see it: lower case, no trailing dot, numeric forms such as
    ``2130706433`` or ``0x7f.1`` written as the address they are."""
    name = host.strip().strip("[]").rstrip(".").lower()
    try:
        info = socket.getaddrinfo(name, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return name
    return str(info[0][4][0]) if info else name


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


Address = tuple[int, tuple[Any, ...]]
"""A resolved address: socket family and sockaddr."""


def _vet(host: str, port: int, permissions: PermissionManager | None) -> list[Address]:
    """Resolve ``host`` and return its addresses if the browser may reach all of them.

    Raises :class:`SecurityError` when one is private (see
    :func:`~kyronix.executer.tools.net.is_private_address`) and ``net:private`` does not allow
    ``host:port``; :class:`ToolFailure` when the host does not
    resolve. ``permissions`` None allows no private address.
    """
    name = _canonical_host(host)
    if not name:
        raise ToolFailure("the URL has no host")
    special = None
    if name == "localhost" or name.endswith(".localhost"):
        special = f"{name} is a loopback name"
    elif name in METADATA_HOSTS:
        special = f"{name} is the cloud metadata server"
    addresses: list[Address] = []
    try:
        for family, _, _, _, sockaddr in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM):
            if (family, sockaddr) not in addresses:
                addresses.append((family, sockaddr))
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        if special is None:
            raise ToolFailure(f"the host {host!r} could not be resolved ({exc})") from None
    reason = special
    for _, sockaddr in addresses:
        ip = str(sockaddr[0])
        kind = _kind(ip)
        if reason is None and kind is not None:
            if _is_ip(name):
                reason = f"{ip} is a {kind} address"
            else:
                reason = f"{name} is {ip}, a {kind} address"
    if reason is not None:
        target = host_target(name, port)
        if permissions is None or not permissions.check("net:private", target):
            raise SecurityError(
                f"the browser may not reach {target}: {reason}. Loopback, private, link-local "
                f"and cloud metadata addresses need the permission net:private; allow this one "
                f"with allow('net:private', {target!r}) or use ROOT_POLICIES"
            )
    return addresses


_REFUSED_SCHEMES = {
    "file": "file: URLs would read files outside the base path; use read_file",
    "javascript": "javascript: URLs run script; use click and type on the page",
    "data": "data: URLs are not web pages",
    "chrome": "chrome: pages are the browser's internals",
}


def _split_url(url: str) -> tuple[str, int]:
    """Check a ``navigate`` URL's form and return its host and port (no network)."""
    if not url:
        raise ToolFailure("navigate needs a url, such as https://example.com/")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url) or "\\" in url:
        raise ToolFailure(
            f"the url {url[:200]!r} contains spaces, control characters or backslashes; "
            "percent-encode them (a space is %20)"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        if scheme and not url[len(scheme) + 1 :][:1].isdigit():  # not "localhost:8080"
            why = _REFUSED_SCHEMES.get(scheme, f"{scheme}: URLs are not web pages")
            raise SecurityError(
                f"navigate opens only http:// and https:// URLs, not {url[:100]!r}: {why}"
            )
        raise ToolFailure(
            f"the url {url[:200]!r} has no http:// or https:// scheme; write it in full, such as "
            f"https://{url[:100]}"
        )
    try:
        port = parts.port
    except ValueError:
        raise ToolFailure(f"the url {url[:200]!r} has an invalid port") from None
    if not parts.hostname:
        raise ToolFailure(f"the url {url[:200]!r} has no host")
    return parts.hostname, port or (443 if scheme == "https" else 80)


def find_chromium(environ: Mapping[str, str] | None = None) -> str:
    """The Chromium binary: ``$KYRONIX_CHROMIUM``, else Debian's, else ``chromium`` on PATH."""
    env = os.environ if environ is None else environ
    explicit = env.get("KYRONIX_CHROMIUM")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise ToolFailure(
            f"KYRONIX_CHROMIUM={explicit!r} is not an executable file; point it at a Chromium "
            "binary (Debian: /usr/lib/chromium/chromium) or unset it"
        )
    for path in CHROMIUM_PATHS:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which("chromium", path=env.get("PATH"))
    if found:
        return found
    raise ToolFailure(
        "the browser tools need Chromium and none was found (looked at $KYRONIX_CHROMIUM, "
        f"{', '.join(CHROMIUM_PATHS)} and chromium on PATH); install Debian's chromium "
        "(apt-get install chromium) or set KYRONIX_CHROMIUM to a Chromium binary"
    )


# ---------------------------------------------------------------------------------------------
# The session.


@dataclass(frozen=True, slots=True)
class BlockedRequest:
    """A request the guard refused: by the ``route`` guard or the ``proxy``."""

    layer: str
    target: str
    reason: str


class BrowserSession:
    """One headless Chromium and one page, driven from one worker thread.

    Chromium starts on the first :meth:`navigate`; :meth:`close` stops it (idempotent). The
    guard's ``net:private`` decisions use the permissions of the call being run.
    """

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="kyronix-browser"
        )
        self._lock = threading.Lock()
        self._closed = False
        self._permissions: PermissionManager | None = None
        self._token = secrets.token_hex(12)
        self._blocked: deque[BlockedRequest] = deque(maxlen=100)
        self._blocked_total = 0
        self._blocked_lock = threading.Lock()
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._context: BrowserContext | None = None
        self._page: Page | None = None
        self._proxy: _GuardProxy | None = None

    # -- the public operations (any thread) --------------------------------------------------

    def navigate(self, url: str, permissions: PermissionManager) -> ToolOutput:
        return self._run(lambda: self._navigate(url), permissions)

    def click(self, selector: str, permissions: PermissionManager) -> ToolOutput:
        return self._run(lambda: self._click(selector), permissions)

    def type(self, selector: str, text: str, permissions: PermissionManager) -> ToolOutput:
        return self._run(lambda: self._type(selector, text), permissions)

    def screenshot(self, permissions: PermissionManager) -> tuple[bytes, str]:
        """The visible part of the page as PNG bytes, and the page's URL."""
        return self._run(self._screenshot, permissions)

    @property
    def started(self) -> bool:
        """Whether Chromium is running."""
        return self._browser is not None

    @property
    def blocked(self) -> list[BlockedRequest]:
        """The latest requests the guard refused (up to 100)."""
        with self._blocked_lock:
            return list(self._blocked)

    def close(self) -> None:
        """Close the page, Chromium, Playwright and the worker thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._executor.submit(self._teardown).result(timeout=60)
        finally:
            self._executor.shutdown(wait=True)

    # -- worker-thread side ------------------------------------------------------------------

    def _run(self, op: Callable[[], T], permissions: PermissionManager) -> T:
        def job() -> T:
            self._permissions = permissions
            return op()

        with self._lock:
            if self._closed:
                raise ToolFailure("the browser session was closed; start a new executer")
            future = self._executor.submit(job)
        try:
            return future.result(timeout=self.timeout * 4 + 60)
        except concurrent.futures.TimeoutError:
            raise ToolFailure(
                f"the browser did not answer within {self.timeout * 4 + 60:g} s"
            ) from None

    def _start(self) -> Page:
        if self._page is not None and self._browser is not None and self._browser.is_connected():
            return self._page
        self._teardown()  # a crashed browser: start again
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise ToolFailure(
                f"the browser tools need Playwright, which is not installed: {_PIP_HINT} "
                "(it drives the system Chromium; `playwright install` is not needed)"
            ) from None
        executable = find_chromium()
        try:
            self._proxy = _GuardProxy(self._vet_for_proxy, self._record, self._token, self.timeout)
            self._playwright = sync_playwright().start()
            self._browser = self._playwright.chromium.launch(
                executable_path=executable,
                headless=True,
                args=[
                    *LAUNCH_ARGS,
                    f"--proxy-server=http://127.0.0.1:{self._proxy.port}",
                    "--proxy-bypass-list=<-loopback>",  # loopback goes through the proxy too
                ],
                env=dict[str, str | float | bool](child_env(os.environ)),
                timeout=max(self.timeout, 30.0) * 1000,
            )
            self._context = self._browser.new_context(
                viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]},
                accept_downloads=False,
                service_workers="block",
            )
            self._context.set_default_timeout(self.timeout * 1000)
            self._context.route("**/*", self._guard)
            self._page = self._context.new_page()
        except Exception as exc:  # whatever stopped it, leave nothing half-started
            self._teardown()
            raise ToolFailure(
                f"could not start Chromium ({executable}): {_first_line(exc)}"
            ) from None
        return self._page

    def _teardown(self) -> None:
        page, context, browser, playwright, proxy = (
            self._page,
            self._context,
            self._browser,
            self._playwright,
            self._proxy,
        )
        self._page = self._context = self._browser = self._playwright = self._proxy = None
        closers: list[Callable[[], object]] = []
        if page is not None:
            closers.append(page.close)
        if context is not None:
            closers.append(context.close)
        if browser is not None:
            closers.append(browser.close)
        if playwright is not None:
            closers.append(playwright.stop)
        if proxy is not None:
            closers.append(proxy.close)
        for close in closers:
            with contextlib.suppress(Exception):  # already gone (a crashed browser)
                close()

    def _require_page(self, tool: str) -> Page:
        if self._page is None:
            raise ToolFailure(f"{tool} acts on the open page; navigate first")
        return self._page

    def _record(self, layer: str, target: str, reason: str) -> None:
        with self._blocked_lock:
            self._blocked.append(BlockedRequest(layer, target, reason))
            self._blocked_total += 1

    def _blocked_since(self, mark: int) -> list[BlockedRequest]:
        with self._blocked_lock:
            new = min(self._blocked_total - mark, len(self._blocked))
            return list(self._blocked)[len(self._blocked) - new :]

    def _vet_for_proxy(self, host: str, port: int) -> list[Address]:
        return _vet(host, port, self._permissions)

    def _guard(self, route: Route) -> None:
        """Abort a request bound for an address the browser may not reach."""
        url = route.request.url
        verdict: str | None = None
        try:
            parts = urlsplit(url)
            if parts.scheme in ("http", "https") and parts.hostname:
                default = 443 if parts.scheme == "https" else 80
                _vet(parts.hostname, parts.port or default, self._permissions)
        except SecurityError as exc:
            self._record("route", url, exc.message)
            verdict = "blockedbyclient"
        except (ToolFailure, ValueError):
            verdict = "namenotresolved"
        try:
            if verdict is None:
                route.continue_()
            else:
                route.abort(verdict)
        except Exception:
            pass  # the page went away meanwhile; nothing was sent

    def _navigate(self, url: str) -> ToolOutput:
        page = self._start()
        from playwright.sync_api import Error, TimeoutError

        with self._blocked_lock:
            mark = self._blocked_total
        try:
            response = page.goto(url, wait_until="load")
        except TimeoutError:
            raise ToolFailure(f"{url} did not finish loading within {self.timeout:g} s") from None
        except Error as exc:
            blocked = self._blocked_since(mark)
            if blocked and any(code in str(exc) for code in _BLOCKED_ERRORS):
                raise SecurityError(
                    f"loading {url} was stopped: {blocked[-1].reason}",
                    data={"blocked": [b.target for b in blocked]},
                ) from None
            raise ToolFailure(f"could not load {url}: {_first_line(exc)}") from None
        if response is not None and response.headers.get(_BLOCK_HEADER) == self._token:
            blocked = self._blocked_since(mark)
            why = blocked[-1].reason if blocked else "a private address"
            raise SecurityError(f"{url} led to {page.url}, which was refused: {why}")
        status = response.status if response is not None else None
        title = page.title()
        try:
            snapshot = page.locator("body").aria_snapshot()
        except Error as exc:
            snapshot = f"(the page's structure could not be read: {_first_line(exc)})"
        truncated = len(snapshot) > SNAPSHOT_CHARS
        if truncated:
            snapshot = snapshot[:SNAPSHOT_CHARS] + "\n… (page text truncated)"
        head = f"Navigated to {page.url} (HTTP {status if status is not None else '-'})"
        lines = [head, f"Title: {title}" if title else "Title: (none)"]
        data: dict[str, Any] = {"url": page.url, "status": status, "title": title}
        self._note_blocked(mark, lines, data)
        lines += ["", snapshot]
        return ToolOutput("\n".join(lines), data, truncated)

    def _note_blocked(self, mark: int, lines: list[str], data: dict[str, Any]) -> None:
        blocked = self._blocked_since(mark)
        if blocked:
            data["blocked"] = [b.target for b in blocked]
            lines.append(
                f"Blocked {len(blocked)} request(s) to addresses the browser may not reach:"
            )
            lines += [f"  {b.target}" for b in blocked[:10]]

    def _locate(self, tool: str, selector: str) -> tuple[Page, Locator, int]:
        page = self._require_page(tool)
        if not selector.strip():
            raise ToolFailure(f"{tool} needs a selector, such as 'button[type=submit]' or '#email'")
        locator = page.locator(selector)
        try:
            count = locator.count()
        except Exception as exc:
            raise ToolFailure(
                f"the selector {selector!r} is not valid: {_first_line(exc)}; use a CSS selector "
                "or Playwright's text=/role= syntax"
            ) from None
        return page, locator, count

    def _act_failure(
        self, tool: str, selector: str, page: Page, locator: Locator, exc: Exception
    ) -> ToolFailure:
        from playwright.sync_api import TimeoutError

        try:
            count = locator.count()
        except Exception:
            count = -1
        if isinstance(exc, TimeoutError) and count == 0:
            return ToolFailure(
                f"no element matches the selector {selector!r} on {page.url} (waited "
                f"{self.timeout:g} s); navigate again to see the page's structure"
            )
        if isinstance(exc, TimeoutError):
            return ToolFailure(
                f"could not {tool} {selector!r} on {page.url} within {self.timeout:g} s: the "
                "element is not visible, enabled and editable/clickable; try a more specific "
                "selector"
            )
        return ToolFailure(f"could not {tool} {selector!r} on {page.url}: {_first_line(exc)}")

    def _click(self, selector: str) -> ToolOutput:
        page, locator, count = self._locate("click", selector)
        from playwright.sync_api import Error, TimeoutError

        with self._blocked_lock:
            mark = self._blocked_total
        before = page.url
        try:
            locator.first.click()
        except Error as exc:
            raise self._act_failure("click", selector, page, locator, exc) from None
        opened: Page | None = None
        with contextlib.suppress(TimeoutError):  # target=_blank, window.open: follow the new tab
            opened = page.wait_for_event("popup", timeout=POPUP_WAIT * 1000)
        if opened is not None:
            page.close()
            page = self._page = opened
        with contextlib.suppress(TimeoutError):  # a click that navigates: let the page load
            page.wait_for_load_state("load")
        title = page.title()
        which = f" (the first of {count} matches)" if count > 1 else ""
        lines = [f"Clicked {selector}{which}" + (" (it opened a new tab)" if opened else "")]
        if page.url != before:
            lines.append(f"The page is now {page.url}" + (f" — {title}" if title else ""))
        else:
            lines.append(f"Page: {page.url}")
        data: dict[str, Any] = {"selector": selector, "url": page.url, "title": title}
        if count > 1:
            data["matches"] = count
        self._note_blocked(mark, lines, data)
        return ToolOutput("\n".join(lines), data)

    def _type(self, selector: str, text: str) -> ToolOutput:
        page, locator, count = self._locate("type", selector)
        from playwright.sync_api import Error

        try:
            locator.first.fill(text)
        except Error as exc:
            raise self._act_failure("type into", selector, page, locator, exc) from None
        which = f" (the first of {count} matches)" if count > 1 else ""
        output = f"Typed {len(text)} character(s) into {selector}{which} on {page.url}"
        data: dict[str, Any] = {"selector": selector, "url": page.url, "chars": len(text)}
        return ToolOutput(output, data)

    def _screenshot(self) -> tuple[bytes, str]:
        page = self._require_page("screenshot")
        from playwright.sync_api import Error

        try:
            return page.screenshot(type="png"), page.url
        except Error as exc:
            raise ToolFailure(
                f"could not take a screenshot of {page.url}: {_first_line(exc)}"
            ) from None


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# The guard proxy: every connection Chromium makes goes through here.

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
    if not sep or not port.isdigit():
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


# ---------------------------------------------------------------------------------------------
# The tools.


def _png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ToolFailure("the browser returned something that is not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


def navigate(call: Call) -> ToolOutput:
    url = str(call.args["url"]).strip()
    host, port = _split_url(url)
    _vet(host, port, call.permissions)
    return call.resources.browser.navigate(url, call.permissions)


def click(call: Call) -> ToolOutput:
    return call.resources.browser.click(str(call.args["selector"]), call.permissions)


def type_text(call: Call) -> ToolOutput:
    selector, text = str(call.args["selector"]), str(call.args["text"])
    return call.resources.browser.type(selector, text, call.permissions)


def screenshot(call: Call) -> ToolOutput:
    path: Path | None = call.args.get("path")
    if path is not None and path.suffix.lower() != ".png":
        raise ToolFailure(
            f"screenshot writes PNG images; give a path ending in .png, not {call.rel(path)!r}"
        )
    if path is not None and path.is_dir():
        raise ToolFailure(f"{call.rel(path)!r} is a directory; give a file path ending in .png")
    png, url = call.resources.browser.screenshot(call.permissions)
    width, height = _png_size(png)
    data: dict[str, Any] = {"url": url, "width": width, "height": height, "bytes": len(png)}
    if path is None:
        data["png_base64"] = base64.b64encode(png).decode("ascii")
        return ToolOutput(
            f"Took a {width}x{height} screenshot of {url} ({len(png)} bytes of PNG in "
            "data.png_base64)",
            data,
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, png)
    except OSError as exc:
        raise ToolFailure(
            f"could not write the screenshot to {call.rel(path)!r}: {exc.strerror or exc}"
        ) from None
    data["path"] = call.rel(path)
    return ToolOutput(
        f"Saved a {width}x{height} screenshot of {url} to {call.rel(path)} ({len(png)} bytes)",
        data,
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "navigate",
        (Param("url", "string", description="an http:// or https:// URL"),),
        navigate,
        description=(
            "Open a URL in the headless browser; returns the final URL, HTTP status, title and "
            "the page's structure (roles, names, text)."
        ),
        # Not read-only: it changes the page click/type act on, and a page load reaches a
        # server. Idempotent: loading the same URL again (a GET) leaves the browser where one
        # load does, and after a crash the browser is a new one that must load it again.
        read_only=False,
        idempotent=True,
    ),
    ToolSpec(
        "click",
        (Param("selector", "string", description="CSS or Playwright selector"),),
        click,
        description="Click the first element matching the selector on the open page.",
        # A click may submit, buy, send: the page decides.
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "type",
        (
            Param("selector", "string", description="CSS or Playwright selector of a field"),
            Param("text", "string", description="the text to put in the field"),
        ),
        type_text,
        description="Fill a field on the open page with text (replacing what it held).",
        # Filling a field fires input events the page's scripts may act on (autosave).
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "screenshot",
        (Param("path", "path", required=False, description="where to save the PNG (.png)"),),
        screenshot,
        description=(
            "Capture the visible page as PNG: saved to path inside the base, or returned as "
            "base64 when no path is given."
        ),
        writes=True,
        # It may write a PNG (atomically, the whole file): again is the same as once.
        read_only=False,
        idempotent=True,
    ),
)
