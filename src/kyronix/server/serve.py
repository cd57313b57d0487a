"""``kyronix serve``: one uvicorn process, a graceful drain on SIGTERM.

SIGTERM (or Ctrl-C) starts the drain at once: ``/api`` answers 503 ``draining``, uvicorn stops
accepting connections and lets requests in flight finish for up to ``drainTimeout`` seconds;
then every run still going is recorded interrupted (its hold released) before the process exits.

On SQLite, one server per database: ``serve`` holds an exclusive lock on
``<home>/server.lock`` (and on ``<database>.server-lock`` beside a database file kept outside
the home), so the start sweep (which takes over every run it finds ``running``)
never touches a live server's runs. On PostgreSQL any number of replicas share the database:
each registers itself and takes over only the runs of replicas that died
(:mod:`kyronix.server.cluster`, docs/deploy.md).
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import sys
from pathlib import Path
from typing import Any

from kyronix.errors import KyronixUsageError
from kyronix.server.config import ServerConfig

__all__ = ["is_loopback", "serve"]

log = logging.getLogger("kyronix.server")


class _ClientFault(logging.Filter):
    """uvicorn logs a client's text frame that is not UTF-8 as an error with a traceback (it
    closes the connection, 1007): anyone may send one, before authenticating, so it is one
    line at INFO, like any other refused frame."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Invalid UTF-8 sequence received from client.":
            record.msg = "a WebSocket client sent a text frame that is not UTF-8: closed (1007)"
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
        return True


CLIENT_FAULT = _ClientFault()


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _lock(home: Path) -> int:
    return _lock_file(
        home / "server.lock",
        f"another kyronix server is already running on {home} (it holds server.lock); stop "
        f"it first, or give this one its own KYRONIX_HOME",
    )


def _lock_database(url: str, home: Path) -> int | None:
    """The lock beside a SQLite database file kept outside the home (``--db sqlite:///…``):
    two servers with two homes must not share one database either. None for the home's own
    database (``server.lock`` covers it) and for an in-memory one."""
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    if not name or name == ":memory:":
        return None
    db = Path(name).expanduser().resolve()
    if db == (home / "kyronix.sqlite3").resolve():
        return None
    db.parent.mkdir(parents=True, exist_ok=True)
    return _lock_file(
        db.with_name(db.name + ".server-lock"),
        f"another kyronix server is already running on the database {db}; SQLite takes one "
        f"server (use PostgreSQL for several: docs/deploy.md)",
    )


def _lock_file(path: Path, busy: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise KyronixUsageError(busy) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


async def _owner_link(state: Any, base: str) -> str:
    """A fresh one-time sign-in link for the server's owner (the user ``owner``)."""
    import asyncio

    from kyronix.server.users import create_link

    token, _ = await asyncio.to_thread(
        state.db.write, lambda conn: create_link(conn, state.secret, login="owner", purpose="owner")
    )
    return f"{base.rstrip('/')}/signin/{token}"


def serve(
    config: ServerConfig,
    host: str,
    port: int,
    *,
    announce: Any = None,
    announce_signin: Any = None,
) -> None:
    """Serve until SIGTERM. Once listening: ``announce(url)``; then, when the dashboard does not
    sign in with GitHub, ``announce_signin(link)`` with a fresh one-time owner link
    (``<public_url or url>/signin/kxs_…``)."""
    import uvicorn

    from kyronix.server.app import create_app
    from kyronix.server.config import ensure_home
    from kyronix.server.transport import TunnelProtocol

    ensure_home(config.home)
    sqlite = config.database_url.startswith("sqlite")
    lock = _lock(config.home) if sqlite else None
    try:
        db_lock = _lock_database(config.database_url, config.home) if sqlite else None
    except BaseException:
        if lock is not None:
            os.close(lock)
        raise
    try:
        app = create_app(config)
        state = app.state.kx

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                state.begin_drain()
                super().handle_exit(sig, frame)
                # A drained stop is a normal exit (status 0), not death by the signal.
                self._captured_signals.clear()

        logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
        logging.getLogger("uvicorn.error").addFilter(CLIENT_FAULT)
        uv = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info",
            access_log=False,
            timeout_graceful_shutdown=max(1, int(config.drain_timeout)),
            ws=TunnelProtocol,  # a peer flooding on after the server closed it is cut off
            ws_max_size=config.tunnel.max_frame,  # a larger frame closes its connection: 1009
            ws_per_message_deflate=False,  # no frame costs more to read than its bytes on the wire
            # The client's address (what failed authentications count against) is the socket's
            # peer, unless it is a proxy named in trustedProxies: then its X-Forwarded-For.
            proxy_headers=bool(config.trusted_proxies),
            forwarded_allow_ips=list(config.trusted_proxies) or None,
            lifespan="on",
        )
        server = Server(uv)
        if announce is not None:
            original = server.startup

            async def startup(sockets: Any = None) -> None:
                await original(sockets)
                for srv in server.servers:
                    for sock in srv.sockets:
                        bound = sock.getsockname()
                        shown = f"[{host}]" if ":" in host else host  # an IPv6 address
                        url = f"http://{shown}:{bound[1]}"
                        announce(url)
                        if announce_signin is not None and not config.github_enabled:
                            try:
                                link = await _owner_link(state, config.public_url or url)
                            except Exception as exc:  # the API serves on without the dashboard
                                log.error("no owner sign-in link: %s", type(exc).__name__)
                            else:
                                announce_signin(link)
                        return

            server.startup = startup  # type: ignore[method-assign]
        server.run()
        if not server.started:
            sys.exit(1)
    finally:
        if lock is not None:
            os.close(lock)
        if db_lock is not None:
            os.close(db_lock)
