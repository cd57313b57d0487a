"""One headless Chromium and one page, driven from one worker thread (:class:`BrowserSession`).

Playwright objects belong to the thread that created them, so every operation runs on the
session's single worker thread; callers may use the session from any thread. The session owns
its guard proxy and the ``context.route`` guard, and remembers what they refused.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import secrets
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from kiso.tools.env import child_env
from kyronix.executer.tools.base import SecurityError, ToolFailure, ToolOutput
from kyronix.executer.tools.browser import launch
from kyronix.executer.tools.browser.guard import Address, BlockedRequest, _vet
from kyronix.executer.tools.browser.launch import LAUNCH_ARGS, VIEWPORT
from kyronix.executer.tools.browser.proxy import BLOCK_HEADER, _GuardProxy

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Locator, Page, Playwright, Route

    from kyronix.executer.permissions import PermissionManager

__all__ = ["DEFAULT_TIMEOUT", "POPUP_WAIT", "SNAPSHOT_CHARS", "BrowserSession"]

DEFAULT_TIMEOUT = 15.0
"""Seconds one browser action (a page load, a click, a fill, a screenshot) may take."""

SNAPSHOT_CHARS = 8000
"""The page text ``navigate`` returns is cut here (``truncated`` is set)."""

POPUP_WAIT = 0.25
"""Seconds a click waits for a new tab it may have opened (which then becomes the page)."""

_BLOCK_HEADER = BLOCK_HEADER
_BLOCKED_ERRORS = ("ERR_BLOCKED_BY_CLIENT", "ERR_TUNNEL_CONNECTION_FAILED")
"""How a navigation the route guard aborted, or whose tunnel the proxy refused, fails."""
_PIP_HINT = launch.PIP_HINT

T = TypeVar("T")


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
        executable = launch.find_chromium()
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
