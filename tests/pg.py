"""A throwaway PostgreSQL for the tests: one cluster per test session, one database per test.

``KYRONIX_TEST_PG_URL`` (a superuser's URL, e.g. ``postgresql://postgres@127.0.0.1/postgres``)
names a server to use; without it the session starts its own: ``initdb`` into a temporary
directory (trust authentication, no TCP: a unix socket in that directory only), ``pg_ctl start``,
and at the end ``pg_ctl stop`` on that data directory (then SIGKILL to the pid in its
``postmaster.pid`` if it did not stop), never anything found by name. ``initdb`` refuses to run
as root, so as root the cluster runs as an unprivileged user (``KYRONIX_TEST_PG_USER``, else
``postgres``, else ``nobody``) through ``runuser``.

The binaries are looked up on ``PATH``, then in Debian's ``/usr/lib/postgresql/<version>/bin``
(newest first). Missing, the tests that need PostgreSQL fail saying how to get it
(``scripts/system-deps`` installs Debian's ``postgresql``); they are never skipped.

The cluster trades durability for speed (``fsync=off``): it is thrown away, and no test kills it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import URL, make_url

__all__ = ["PgCluster", "find_binaries", "start_cluster"]

ENV_URL = "KYRONIX_TEST_PG_URL"
ENV_USER = "KYRONIX_TEST_PG_USER"
SUPERUSER = "kiso"


class PgUnavailable(Exception):
    """No PostgreSQL to test with; the message says how to get one."""


def find_binaries() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    found = shutil.which("initdb")
    if found:
        where = Path(found).resolve().parent
        if (where / "pg_ctl").exists() and (where / "postgres").exists():
            return where

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", path.parent.parent.name)) or (0,)

    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=version, reverse=True)
    for initdb in debian:
        if (initdb.parent / "pg_ctl").exists():
            return initdb.parent
    return None


class PgCluster:
    """A server the tests may create databases on (``admin`` is a superuser's URL)."""

    def __init__(self, admin: URL, stop: list[str] | None = None, owned: Path | None = None):
        self.admin = admin
        self._stop = stop
        self._owned = owned
        self._names = itertools.count(1)
        self._prefix = f"kisotest_{os.getpid()}_"

    def _execute(self, sql: str) -> None:
        import psycopg

        params = self.admin.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(params, autocommit=True) as conn:
            conn.execute(sql.encode())  # our own DDL, with names made here

    def create_database(self) -> URL:
        """A new empty database (from ``template0``), as a ``postgresql+psycopg`` URL."""
        name = f"{self._prefix}{next(self._names)}"
        self._execute(f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8'")
        return self.admin.set(drivername="postgresql+psycopg", database=name)

    def drop_database(self, url: URL) -> None:
        """Drop a database made by :meth:`create_database` (closing its sessions)."""
        assert url.database and url.database.startswith(self._prefix)
        self._execute(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')

    def close(self) -> None:
        """Stop the cluster this session started (nothing for ``KYRONIX_TEST_PG_URL``)."""
        if self._stop is None or self._owned is None:
            return
        data = self._owned / "data"
        pid = _postmaster_pid(data)
        stopped = subprocess.run(self._stop, capture_output=True, text=True, check=False)
        if stopped.returncode != 0 and pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the postmaster we started, by its own pid file
        shutil.rmtree(self._owned, ignore_errors=True)


def _postmaster_pid(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _as_user() -> tuple[list[str], int, int]:
    """The command prefix to run PostgreSQL's programs, and the uid/gid that will own the files."""
    if os.geteuid() != 0:
        return [], os.getuid(), os.getgid()
    names = [os.environ.get(ENV_USER, ""), "postgres", "nobody"]
    for name in filter(None, names):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        runuser = shutil.which("runuser") or shutil.which("setpriv")
        if runuser is None:
            raise PgUnavailable(
                "the tests run as root and initdb refuses root, but neither runuser nor setpriv "
                "(util-linux) is installed to run it as another user"
            )
        if Path(runuser).name == "runuser":
            return [runuser, "-u", name, "--"], entry.pw_uid, entry.pw_gid
        prefix = [runuser, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
        return prefix, entry.pw_uid, entry.pw_gid
    raise PgUnavailable(
        f"the tests run as root and initdb refuses root: set {ENV_USER} to an unprivileged user "
        f"to run PostgreSQL as"
    )


def start_cluster() -> PgCluster:
    """``KYRONIX_TEST_PG_URL``'s server, or a new cluster of our own (raises PgUnavailable)."""
    given = os.environ.get(ENV_URL, "").strip()
    if given:
        return PgCluster(make_url(given).set(drivername="postgresql+psycopg"))
    bin_dir = find_binaries()
    if bin_dir is None:
        raise PgUnavailable(
            "PostgreSQL is not installed: no initdb on PATH or in /usr/lib/postgresql/*/bin. "
            "Install it (Debian: `apt-get install postgresql`, which scripts/system-deps does), "
            f"or set {ENV_URL} to a server the tests may create databases on"
        )
    prefix, uid, gid = _as_user()
    root = Path(tempfile.mkdtemp(prefix="kiso-pg-"))  # short: the socket path has a limit
    try:
        os.chown(root, uid, gid)
        data = root / "data"
        _run(
            [*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust",
             "-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions"],
            "initdb",
        )  # fmt: skip
        options = (
            f"-c listen_addresses='' -k {root} -c fsync=off -c synchronous_commit=off "
            f"-c full_page_writes=off -c max_connections=200"
        )
        pg_ctl = [*prefix, str(bin_dir / "pg_ctl"), "-D", str(data)]
        _run([*pg_ctl, "-l", str(root / "log"), "-w", "-t", "60", "-o", options, "start"], "start")
    except BaseException:
        pid = _postmaster_pid(root / "data")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
        raise
    admin = URL.create(
        "postgresql+psycopg", username=SUPERUSER, database="postgres", query={"host": str(root)}
    )
    cluster = PgCluster(admin, [*pg_ctl, "-m", "immediate", "-w", "-t", "30", "stop"], root)
    deadline = time.monotonic() + 30
    while True:  # pg_ctl -w waited for it; be sure it takes connections over the socket
        try:
            cluster._execute("SELECT 1")
            return cluster
        except Exception:
            if time.monotonic() > deadline:
                cluster.close()
                raise
            time.sleep(0.1)


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise PgUnavailable(
            f"PostgreSQL's {what} failed ({' '.join(command)}), exit {done.returncode}:\n"
            f"{done.stdout}{done.stderr}"
        )
