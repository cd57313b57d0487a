"""``kiso login chatgpt``: the browser round trip of the ChatGPT subscription sign-in.

1. A fresh PKCE pair and ``state`` (:mod:`kiso.runtime.oauth`); a callback server on
   ``127.0.0.1:<port>`` (``KISO_CHATGPT_CALLBACK_PORT``, default 1455, the port the client's
   registered redirect URI ``http://localhost:1455/auth/callback`` names).
2. The authorize URL is printed (for a machine without a browser) and opened in the browser
   (``webbrowser.open``), unless ``KISO_NO_BROWSER=1``.
3. Whichever comes first: the browser's redirect to ``/auth/callback?code=...&state=...``, or a
   line on stdin (the paste fallback, when the redirect cannot reach this machine): the whole
   redirected URL (its ``state`` is checked) or the bare code (PKCE binds it to this sign-in).
4. A wrong or missing ``state``, an ``error=`` callback, a failed token exchange, or nothing
   within ``KISO_CHATGPT_LOGIN_TIMEOUT`` seconds (default 300) ends the sign-in with a message
   and nothing stored. Otherwise the tokens are stored under ``chatgpt`` in auth.json (0600).

The browser is answered only after the exchange, with a page saying how it went.
"""

from __future__ import annotations

import contextlib
import html
import os
import queue
import select
import sys
import threading
import time
import webbrowser
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import click

from kiso.runtime.auth import AuthStore, OAuthCredential
from kiso.runtime.oauth import (
    CALLBACK_PATH,
    ChatGPTSettings,
    OAuthError,
    Pkce,
    authorize_url,
    credential_from,
    exchange_code,
    new_pkce,
    new_state,
)

__all__ = ["LoginFailed", "sign_in"]

DEFAULT_TIMEOUT_S = 300.0


class LoginFailed(click.ClickException):
    """The sign-in did not complete; nothing was stored."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; nothing was stored")


@dataclass
class _Callback:
    """One request to the callback path, waiting for the page to answer it with."""

    params: dict[str, str]
    answer: queue.Queue[tuple[int, str]]


class _Server(ThreadingHTTPServer):
    """Handler threads are joined on close (each page is written whole before kiso exits)."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, port: int, inbox: queue.Queue[_Callback], wake: int) -> None:
        self.inbox = inbox
        self.wake = wake
        self.ended = False
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    def deliver(self, callback: _Callback) -> bool:
        """Hand a callback to the sign-in; False once it has ended."""
        with self.lock:
            if self.ended:
                return False
            self.inbox.put(callback)
        with contextlib.suppress(OSError):
            os.write(self.wake, b"!")
        return True

    def end(self) -> None:
        """No more callbacks: answer the ones still waiting."""
        with self.lock:
            self.ended = True
        while True:
            try:
                left = self.inbox.get_nowait()
            except queue.Empty:
                return
            left.answer.put((409, "This sign-in has already ended; see the terminal."))


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # a connection that sends nothing does not hold the sign-in open

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path != CALLBACK_PATH:
            self._page(404, "Not found", "This is kiso's sign-in callback; nothing is here.")
            return
        callback = _Callback(_single(parse_qs(parts.query)), queue.Queue(maxsize=1))
        if not self.server.deliver(callback):
            status, message = 409, "This sign-in has already ended; see the terminal."
        else:
            try:
                status, message = callback.answer.get(timeout=120)
            except queue.Empty:
                status, message = 500, "kiso stopped waiting before the sign-in finished."
        title = "Signed in to kiso" if status == 200 else "kiso sign-in failed"
        self._page(status, title, message)

    def _page(self, status: int, title: str, message: str) -> None:
        body = (
            f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<h1>{html.escape(title)}</h1><p>{html.escape(message)}</p>"
        ).encode()
        self.send_response(status)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _single(query: dict[str, list[str]]) -> dict[str, str]:
    return {k: v[0] for k, v in query.items() if v}


def _pasted(line: str) -> dict[str, str] | None:
    """A pasted line as callback parameters: a redirected URL (or its query), or a bare code;
    None when it is neither."""
    text = line.strip()
    if "=" in text:
        query = urlsplit(text).query if "?" in text else text.lstrip("?")
        return _single(parse_qs(query)) or None
    if not text or any(ch.isspace() for ch in text):
        return None
    return {"code": text}


class _Flow:
    def __init__(
        self, settings: ChatGPTSettings, store: AuthStore, redirect_uri: str, pkce: Pkce
    ) -> None:
        self.settings = settings
        self.store = store
        self.redirect_uri = redirect_uri
        self.pkce = pkce
        self.state = new_state()

    def finish(self, params: dict[str, str], *, pasted_code: bool) -> OAuthCredential:
        """Check a callback (or a paste) and exchange its code; LoginFailed if it is refused."""
        if not pasted_code and params.get("state") != self.state:
            what = "has no state" if "state" not in params else "has the wrong state"
            raise LoginFailed(
                f"the sign-in callback {what} (a stale or forged redirect, not the one this "
                f"sign-in started); run `kiso login chatgpt` again"
            )
        if "error" in params:
            description = params.get("error_description") or "no description"
            raise LoginFailed(
                f"the sign-in was refused by {self.settings.issuer}: {params['error']} "
                f"({description})"
            )
        code = params.get("code")
        if not code:
            raise LoginFailed("the sign-in callback carries no authorization code")
        try:
            tokens = exchange_code(
                self.settings,
                code=code,
                verifier=self.pkce.verifier,
                redirect_uri=self.redirect_uri,
            )
        except OAuthError as exc:
            raise LoginFailed(str(exc)) from None
        credential = credential_from(tokens, self.settings)
        self.store.store_oauth(credential)
        return credential


def _timeout() -> float:
    raw = os.environ.get("KISO_CHATGPT_LOGIN_TIMEOUT", "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise click.UsageError(
            f"KISO_CHATGPT_LOGIN_TIMEOUT={raw!r}: must be a number of seconds"
        ) from None
    if value <= 0:
        raise click.UsageError(f"KISO_CHATGPT_LOGIN_TIMEOUT={raw!r}: must be positive")
    return value


def sign_in(settings: ChatGPTSettings, store: AuthStore) -> OAuthCredential:
    """The whole round trip; the stored credential, or LoginFailed."""
    timeout = _timeout()
    inbox: queue.Queue[_Callback] = queue.Queue()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)  # a full pipe already says "look at the inbox"
    try:
        try:
            server = _Server(settings.port, inbox, wake_w)
        except OSError as exc:
            raise LoginFailed(
                f"cannot listen for the sign-in callback on 127.0.0.1:{settings.port} "
                f"({exc.strerror}; is another `kiso login chatgpt` running?). Set "
                f"KISO_CHATGPT_CALLBACK_PORT to another port the client allows"
            ) from None
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            return _run(settings, store, server=server, inbox=inbox, wake=wake_r, timeout=timeout)
        finally:
            server.end()
            server.shutdown()
            server.server_close()
            thread.join()
    finally:
        os.close(wake_r)
        os.close(wake_w)


def _run(
    settings: ChatGPTSettings,
    store: AuthStore,
    *,
    server: _Server,
    inbox: queue.Queue[_Callback],
    wake: int,
    timeout: float,
) -> OAuthCredential:
    port = int(server.server_address[1])
    redirect_uri = f"http://localhost:{port}{CALLBACK_PATH}"
    pkce = new_pkce()
    flow = _Flow(settings, store, redirect_uri, pkce)
    url = authorize_url(
        settings, redirect_uri=redirect_uri, challenge=pkce.challenge, state=flow.state
    )
    click.echo("Sign in to ChatGPT in your browser. If it does not open, open this URL:")
    click.echo(f"\n  {url}\n")
    click.echo(
        f"Waiting for the browser to come back to {redirect_uri} . If it cannot reach this "
        f"machine, paste the address it was sent to (or just its code) here and press Enter."
    )
    if os.environ.get("KISO_NO_BROWSER") != "1":
        with contextlib.suppress(Exception):
            webbrowser.open(url)
    stdin = _stdin_fd()
    pending = b""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LoginFailed(
                f"no sign-in arrived within {timeout:g} s; run `kiso login chatgpt` again "
                f"(without a browser here, open the URL elsewhere and paste where it sends you)"
            )
        readable, _, _ = select.select(
            [wake] + ([stdin] if stdin is not None else []), [], [], remaining
        )
        if wake in readable:
            os.read(wake, 64)
            while True:
                try:
                    callback = inbox.get_nowait()
                except queue.Empty:
                    break
                try:
                    credential = flow.finish(callback.params, pasted_code=False)
                except LoginFailed as exc:
                    callback.answer.put((400, exc.message))
                    raise
                callback.answer.put((200, "You are signed in. You can close this tab."))
                return credential
        if stdin is not None and stdin in readable:
            chunk = os.read(stdin, 65536)
            if not chunk:
                stdin = None  # stdin closed: the callback alone can finish the sign-in
                lines = [pending]
            else:
                pending += chunk
                *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.decode("utf-8", "replace")
                params = _pasted(text)
                if params is not None:
                    return flow.finish(params, pasted_code=set(params) == {"code"})
                if text.strip():
                    click.echo(
                        "That is neither the address the browser was sent to nor a code; "
                        "paste it again.",
                        err=True,
                    )


def _stdin_fd() -> int | None:
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd
