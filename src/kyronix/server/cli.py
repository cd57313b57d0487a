"""The server's commands: ``serve``, ``projects``, ``users``, ``keys``, ``credits``.

FastAPI, SQLAlchemy and uvicorn are imported inside the command bodies, so ``kyronix --help``
stays fast. The bootstrap commands write the same database a running server uses (SQLite
handles the second writer; each command is one short transaction).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = ["add_commands"]

T = TypeVar("T")
_CTX = {"help_option_names": ["-h", "--help"]}


def _db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        "db_url",
        default=None,
        metavar="URL",
        help="The database: sqlite:///path or postgresql://user@host/db (default: "
        "$KYRONIX_DATABASE_URL, else sqlite:///$KYRONIX_HOME/kyronix.sqlite3).",
    )(fn)


def _with_db(db_url: str | None, fn: Callable[[Any, Any], T], *, write: bool = True) -> T:
    """Open (and migrate) the database, run ``fn(connection, config)`` in one transaction."""
    from kyronix.errors import KyronixError
    from kyronix.server.config import ensure_home, load_server_config
    from kyronix.server.db import Database
    from kyronix.server.migrations import migrate

    try:
        config = load_server_config(db_url=db_url)
        ensure_home(config.home)
        db = Database(config.database_url)
        try:
            migrate(db)
            run = db.write if write else db.read
            return run(lambda conn: fn(conn, config))
        finally:
            db.close()
    except KyronixError as exc:
        raise click.ClickException(str(exc)) from None


def _project_or_fail(conn: Any, ref: str) -> Any:
    from kyronix.server.accounts import find_project

    project = find_project(conn, ref)
    if project is None:
        raise click.ClickException(
            f"no project {ref!r}; `kyronix projects list` shows them, `kyronix projects create "
            f"NAME` makes one"
        )
    return project


def credits_text(milli: int | None) -> str:
    from kyronix.server.config import credits_text as text

    return text(milli)


def add_commands(group: click.Group) -> None:
    """Add the server's commands to the ``kyronix`` group."""

    @group.command("serve", context_settings=_CTX)
    @click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
    @click.option(
        "--port",
        default=8080,
        show_default=True,
        type=click.IntRange(0, 65535),
        help="0 picks a free port.",
    )
    @_db_option
    def serve_command(host: str, port: int, db_url: str | None) -> None:
        """Run the Kyronix server (the HTTP API) in this process, until SIGTERM or Ctrl-C."""
        from kyronix.errors import KyronixError
        from kyronix.server.config import load_server_config
        from kyronix.server.serve import is_loopback, serve

        if not is_loopback(host):
            click.echo(
                f"warning: serving on {host}, not loopback: API keys and prompts travel in "
                f"clear text unless TLS is in front. Put a TLS-terminating proxy (Caddy, nginx) "
                f"before this server.",
                err=True,
            )
        try:
            config = load_server_config(db_url=db_url)

            def announce(url: str) -> None:
                click.echo(f"kyronix: serving on {url} (home {config.home})", err=True)

            def announce_signin(link: str) -> None:
                click.echo(f"kyronix: sign in to the dashboard: {link}", err=True)

            serve(config, host, port, announce=announce, announce_signin=announce_signin)
        except KyronixError as exc:
            raise click.ClickException(str(exc)) from None

    @group.group("projects", context_settings=_CTX)
    def projects_group() -> None:
        """Projects: each has its own keys, credits, sessions and custom agents."""

    @projects_group.command("create", context_settings=_CTX)
    @click.argument("name")
    @_db_option
    def projects_create(name: str, db_url: str | None) -> None:
        """Create a project (with its initial credits) and print its id."""
        from kyronix.errors import KyronixUsageError
        from kyronix.server.accounts import create_project

        def tx(conn: Any, config: Any) -> Any:
            try:
                return create_project(conn, name, config.initial_credits)
            except KyronixUsageError as exc:
                raise click.ClickException(str(exc)) from None

        project = _with_db(db_url, tx)
        click.echo(project.id)
        click.echo(
            f"created project {project.name} ({project.id}) with {credits_text(project.credits)} "
            f"credits; next: kyronix keys create --project {project.name}",
            err=True,
        )

    @projects_group.command("list", context_settings=_CTX)
    @_db_option
    def projects_list(db_url: str | None) -> None:
        """List the projects and their credits."""
        from kyronix.server.accounts import list_projects

        for p in _with_db(db_url, lambda c, _cfg: list_projects(c), write=False):
            click.echo(f"{p.id}\t{p.name}\t{credits_text(p.credits)} credits")

    @group.group("users", context_settings=_CTX)
    def users_group() -> None:
        """The dashboard's users: invite one with a one-time sign-in link, list them."""

    @users_group.command("invite", context_settings=_CTX)
    @click.argument("login", metavar="LOGIN")
    @click.option(
        "--url",
        "base_url",
        default=None,
        metavar="BASE",
        help="Where browsers reach the server (default: KYRONIX_PUBLIC_URL, else "
        "http://127.0.0.1:8080).",
    )
    @_db_option
    def users_invite(login: str, base_url: str | None, db_url: str | None) -> None:
        """Print a one-time sign-in link for LOGIN (made a user on first use); it lasts a day."""
        from datetime import UTC, datetime

        from kyronix.server.accounts import load_secret
        from kyronix.server.users import create_link

        if base_url is not None and not base_url.startswith(("http://", "https://")):
            raise click.BadParameter("must be an http(s) URL", param_hint="--url")

        def tx(conn: Any, config: Any) -> tuple[str, int, str]:
            secret = load_secret(config.home, config.key_secret)
            token, expires = create_link(conn, secret, login=login, purpose="invite")
            return token, expires, base_url or config.public_url or "http://127.0.0.1:8080"

        token, expires, base = _with_db(db_url, tx)
        click.echo(f"{base.rstrip('/')}/signin/{token}")
        until = datetime.fromtimestamp(expires / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")
        click.echo(
            f"a one-time sign-in link for {login}: it works once, until {until}; send it over a "
            f"private channel"
            + ("" if base_url else f" (the link assumes the server is at {base}; --url sets it)"),
            err=True,
        )

    @users_group.command("list", context_settings=_CTX)
    @_db_option
    def users_list(db_url: str | None) -> None:
        """List the dashboard's users: login, how they sign in, created, their projects."""
        from datetime import UTC, datetime

        from kyronix.server.users import list_users

        def read(conn: Any, _cfg: Any) -> list[tuple[Any, list[Any]]]:
            return list_users(conn)

        found = _with_db(db_url, read, write=False)
        if not found:
            click.echo("no users yet; `kyronix users invite NAME` makes a sign-in link", err=True)
        for row, projects in found:
            how = f"github:{row.github_id}" if row.github_id else "link"
            made = datetime.fromtimestamp(row.created_at / 1000, UTC).strftime("%Y-%m-%d %H:%M")
            names = ",".join(p.name for p in projects) or "-"
            click.echo(f"{row.login}\t{how}\t{made}\t{names}")

    @group.group("keys", context_settings=_CTX)
    def keys_group() -> None:
        """API keys (kyr_…): shown once when made, stored only as a keyed hash."""

    @keys_group.command("create", context_settings=_CTX)
    @click.option("--project", "project_ref", required=True, help="The project's name or id.")
    @click.option("--name", default=None, help="A label for the key.")
    @_db_option
    def keys_create(project_ref: str, name: str | None, db_url: str | None) -> None:
        """Make an API key for a project and print it, once: it cannot be shown again."""
        from kyronix.server.accounts import create_key, load_secret

        def tx(conn: Any, config: Any) -> tuple[str, Any]:
            project = _project_or_fail(conn, project_ref)
            return create_key(conn, load_secret(config.home, config.key_secret), project.id, name)

        key, info = _with_db(db_url, tx)
        click.echo(key)
        click.echo(
            f"key {info.id} ({info.prefix}…) for {info.project_id}: store it now, it is not "
            f"shown again",
            err=True,
        )

    @keys_group.command("list", context_settings=_CTX)
    @click.option("--project", "project_ref", default=None, help="Only this project's keys.")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @_db_option
    def keys_list(project_ref: str | None, as_json: bool, db_url: str | None) -> None:
        """List keys (their id and display prefix; never the key)."""
        from kyronix.server.accounts import list_keys

        def read(conn: Any, _cfg: Any) -> list[Any]:
            pid = _project_or_fail(conn, project_ref).id if project_ref else None
            return list_keys(conn, pid)

        keys = _with_db(db_url, read, write=False)
        if as_json:
            click.echo(
                json.dumps(
                    [
                        {
                            "id": k.id,
                            "projectId": k.project_id,
                            "prefix": k.prefix,
                            "name": k.name,
                            "createdAt": k.created_at,
                            "lastUsedAt": k.last_used_at,
                            "revoked": k.revoked_at is not None,
                        }
                        for k in keys
                    ],
                    indent=2,
                )
            )
            return
        for k in keys:
            state = "revoked" if k.revoked_at else "active"
            used = "never used" if k.last_used_at is None else f"last used {k.last_used_at}"
            click.echo(f"{k.id}\t{k.prefix}…\t{k.project_id}\t{state}\t{used}")

    @keys_group.command("revoke", context_settings=_CTX)
    @click.argument("key_ref", metavar="KEY_ID")
    @_db_option
    def keys_revoke(key_ref: str, db_url: str | None) -> None:
        """Revoke a key (by its id or display prefix): it is refused from now on."""
        from kyronix.server.accounts import revoke_key

        info = _with_db(db_url, lambda c, _cfg: revoke_key(c, key_ref))
        if info is None:
            raise click.ClickException(f"no key {key_ref!r}; `kyronix keys list` shows them")
        click.echo(f"revoked {info.id} ({info.prefix}…)")

    @group.group("credits", context_settings=_CTX)
    def credits_group() -> None:
        """A project's credits: grant them, show the balance and the ledger."""

    @credits_group.command("grant", context_settings=_CTX)
    @click.argument("project_ref", metavar="PROJECT")
    @click.argument("amount", type=float)
    @_db_option
    def credits_grant(project_ref: str, amount: float, db_url: str | None) -> None:
        """Add AMOUNT credits to PROJECT (a ledger grant)."""
        from kyronix.server import billing

        if not amount > 0 or amount > 1e9:
            raise click.BadParameter("must be a positive number of credits", param_hint="AMOUNT")

        def tx(conn: Any, _cfg: Any) -> int:
            project = _project_or_fail(conn, project_ref)
            billing.grant(conn, project.id, round(amount * 1000), note="kyronix credits grant")
            return billing.balance(conn, project.id)

        balance = _with_db(db_url, tx)
        click.echo(f"granted {amount:g}; balance {credits_text(balance)}")

    @credits_group.command("show", context_settings=_CTX)
    @click.argument("project_ref", metavar="PROJECT")
    @click.option("--ledger", "show_ledger", is_flag=True, help="Also print every ledger entry.")
    @_db_option
    def credits_show(project_ref: str, show_ledger: bool, db_url: str | None) -> None:
        """Show PROJECT's balance, what runs in flight hold, and (--ledger) the ledger."""
        from kyronix.server import billing

        def read(conn: Any, _cfg: Any) -> tuple[Any, int, int, int, list[Any]]:
            project = _project_or_fail(conn, project_ref)
            rows = billing.entries(conn, project.id) if show_ledger else []
            return (
                project,
                billing.balance(conn, project.id),
                billing.held(conn, project.id),
                billing.ledger_sum(conn, project.id),
                rows,
            )

        project, balance, held, total, rows = _with_db(db_url, read, write=False)
        click.echo(f"{project.name} ({project.id}): {credits_text(balance)} credits")
        click.echo(
            f"held by runs in flight: {credits_text(held)}; ledger sum: {credits_text(total)}"
        )
        for r in rows:
            click.echo(
                f"{r.id}\t{r.created_at}\t{r.kind}\t{credits_text(r.amount)}\t{r.run_id or ''}"
            )
        if total != balance:  # never: every change is a ledger row in the same transaction
            sys.exit(1)
