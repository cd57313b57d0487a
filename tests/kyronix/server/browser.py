"""A user signed in to the dashboard with a one-time link, through Starlette's TestClient: the
cookies kept per user (several users share one client), and the session's CSRF token."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import select

from kyronix.server import users
from kyronix.server.db import users as users_table

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "no CSRF token on the page"
    return found.group(1)


class SignedIn:
    def __init__(self, client: Any, app: Any, login: str) -> None:
        self.client, self.app, self.login = client, app, login
        state = app.state.kx
        token, _ = state.db.write(lambda c: users.create_link(c, state.secret, login=login))
        client.cookies.clear()
        page = client.get(f"/signin/{token}")
        assert page.status_code == 200, page.text
        signed = client.post(
            f"/signin/{token}", data={"csrf": csrf_of(page.text)}, follow_redirects=False
        )
        assert signed.status_code == 303, signed.text
        self.cookies = dict(client.cookies)
        self.csrf = csrf_of(self.get("/dashboard/projects").text)
        self.uid: str = state.db.read(
            lambda c: c.execute(
                select(users_table.c.id).where(users_table.c.login == login)
            ).scalar_one()
        )

    def _use(self) -> None:
        if dict(self.client.cookies) != self.cookies:
            self.client.cookies.clear()
            for name, value in self.cookies.items():
                self.client.cookies.set(name, value)

    def get(self, url: str, **kw: Any) -> Any:
        self._use()
        r = self.client.get(url, follow_redirects=kw.pop("follow_redirects", False), **kw)
        self.cookies = dict(self.client.cookies)
        return r

    def post(self, url: str, data: dict[str, Any] | None = None, *, csrf: bool = True) -> Any:
        self._use()
        form = dict(data or {})
        if csrf:
            form["csrf"] = self.csrf
        r = self.client.post(url, data=form, follow_redirects=False)
        self.cookies = dict(self.client.cookies)
        return r
