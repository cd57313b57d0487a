"""Signing in to the dashboard: GitHub OAuth against a loopback fake GitHub, one-time links,
signing out, the session cookie, and the ``kyronix serve`` / ``kyronix users`` commands."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from sqlalchemy import delete, select

from kyronix.server import billing
from kyronix.server.db import ledger, memberships, projects, signin_links, users, web_sessions
from kyronix.server.users import create_link, projects_of

from .fake_github import FakeGitHub
from .helpers import ON_BOTH, ServerProcess, kyronix, wait_until

CALLBACK = "http://testserver/api/auth/callback"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
LINK_LINE = re.compile(r"^kyronix: sign in to the dashboard: (\S+/signin/kxs_\S+)$", re.M)


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as gh:
        yield gh


def session_of(client: Any) -> dict[str, Any]:
    """The session cookie's content (Starlette's: base64 JSON, then the signature)."""
    raw = client.cookies.get("kyronix_session")
    if not raw:
        return {}
    payload = raw.strip('"').split(".", 1)[0]
    data: dict[str, Any] = json.loads(base64.b64decode(payload + "=" * (-len(payload) % 4)))
    return data


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, html
    return found.group(1)


def start(client: Any, path: str = "/api/auth") -> str:
    """``GET /api/auth``: the URL of GitHub's authorize page it sends the browser to."""
    r = client.get(path, follow_redirects=False)
    assert r.status_code == 302, r.text
    return str(r.headers["location"])


def approve(authorize_url: str) -> str:
    """The (fake) GitHub approves: the callback URL it sends the browser back to."""
    r = httpx2.get(authorize_url, follow_redirects=False, timeout=10)
    assert r.status_code == 302, r.text
    return str(r.headers["location"])


def github_sign_in(client: Any, path: str = "/api/auth") -> Any:
    return client.get(approve(start(client, path)), follow_redirects=False)


def db_rows(app: Any, table: Any) -> list[Any]:
    return app.state.kx.db.read(lambda c: list(c.execute(select(table))))


def make_link(app: Any, login: str = "alice", **kw: Any) -> str:
    state = app.state.kx
    token, _ = state.db.write(lambda c: create_link(c, state.secret, login=login, **kw))
    return str(token)


def assert_refused(r: Any, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert "Traceback" not in r.text and 'File "' not in r.text
    for word in words:
        assert word in r.text, r.text


def has_dashboard(app: Any) -> bool:
    return any(getattr(route, "path", None) == "/dashboard" for route in app.routes)


# -- GitHub -----------------------------------------------------------------------------------


def test_github_sign_in_makes_the_user_a_project_with_100_credits_and_a_membership(
    make_client: Any, github: FakeGitHub
) -> None:
    client, app = make_client(**github.config())
    github.sign_in_as("octocat", id=583231, name="The Octocat")
    authorize = start(client)
    q = parse_qs(urlsplit(authorize).query)
    assert authorize.startswith(github.url + "/login/oauth/authorize?")
    assert q["scope"] == ["read:user"] and q["redirect_uri"] == [CALLBACK]
    assert q["client_id"] == [github.client_id] and q["code_challenge_method"] == ["S256"]
    assert not session_of(client).get("uid")

    r = client.get(approve(authorize), follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    (user,) = db_rows(app, users)
    assert (user.github_id, user.login, user.name) == ("583231", "octocat", "The Octocat")
    assert session_of(client)["uid"] == user.id
    assert not [k for k in session_of(client) if k.startswith("_state_")]  # the flow is spent
    (project,) = app.state.kx.db.read(lambda c: projects_of(c, user.id))
    assert project.name == "octocat"
    assert app.state.kx.db.read(lambda c: billing.balance(c, project.id)) == 100_000
    grants = [row for row in db_rows(app, ledger) if row.project_id == project.id]
    assert [(g.kind, g.amount) for g in grants] == [("grant", 100_000)]
    (member,) = db_rows(app, memberships)
    assert (member.user_id, member.project_id, member.role) == (user.id, project.id, "owner")

    token_call = next(x for x in github.requests if x.path == "/login/oauth/access_token")
    assert token_call.form["redirect_uri"] == CALLBACK and token_call.form["code_verifier"]
    assert token_call.form["client_secret"] == github.client_secret
    assert github.paths()[-1] == "/api/v3/user"  # GitHub Enterprise's API path for a non-github.com


def test_a_second_sign_in_reuses_the_user_and_makes_no_second_project(
    make_client: Any, github: FakeGitHub
) -> None:
    client, app = make_client(**github.config(enterprise_api=False))
    github.sign_in_as("octocat", id=7)
    assert github_sign_in(client).status_code == 303
    (first,) = db_rows(app, users)
    github.sign_in_as("octo-renamed", id=7, name="Renamed")
    client.cookies.clear()  # another browser
    assert github_sign_in(client).status_code == 303
    (again,) = db_rows(app, users)
    assert again.id == first.id and again.login == "octo-renamed" and again.name == "Renamed"
    assert len(app.state.kx.db.read(lambda c: projects_of(c, first.id))) == 1
    assert len(db_rows(app, memberships)) == 1
    assert github.paths()[-1] == "/user"  # KYRONIX_GITHUB_API_URL given: its /user
    github.sign_in_as("someone-else", id=8)
    client.cookies.clear()
    assert github_sign_in(client).status_code == 303
    assert len(db_rows(app, users)) == 2 and len(db_rows(app, memberships)) == 2


def test_next_is_remembered_but_only_a_dashboard_path(make_client: Any, github: FakeGitHub) -> None:
    client, _ = make_client(**github.config())
    r = github_sign_in(client, "/api/auth?next=/dashboard/projects")
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/projects"
    for evil in ("https://evil.example/x", "//evil.example", "/dashboard//evil.example"):
        client.cookies.clear()
        r = github_sign_in(client, f"/api/auth?next={evil}")
        assert r.status_code == 303 and r.headers["location"] == "/dashboard", evil


def test_a_forged_or_missing_state_is_a_400_page(make_client: Any, github: FakeGitHub) -> None:
    client, app = make_client(**github.config())
    back = approve(start(client))
    forged = re.sub(r"state=[^&]+", "state=forged", back)
    assert_refused(client.get(forged, follow_redirects=False), 400, "state", "/dashboard/signin")
    assert_refused(
        client.get(back.split("&state=")[0].split("?state=")[0], follow_redirects=False), 400
    )
    # a wrong code (GitHub refuses the exchange)
    client.cookies.clear()
    assert_refused(client.get(approve(start(client)).replace("code=", "code=x")), 400)
    # a callback in a browser that never started a sign-in
    fresh, _ = make_client(**github.config())
    assert_refused(fresh.get(back, follow_redirects=False), 400, "state")
    assert db_rows(app, users) == []


def test_a_replayed_callback_is_a_400_page(make_client: Any, github: FakeGitHub) -> None:
    client, app = make_client(**github.config())
    authorize = start(client)
    before = dict(client.cookies.items())  # the cookie as it was before the callback
    back = approve(authorize)
    assert client.get(back, follow_redirects=False).status_code == 303
    assert_refused(client.get(back, follow_redirects=False), 400, "state")
    # even with the cookie saved before the callback (the state is spent on the server too)
    client.cookies.clear()
    for name, value in before.items():
        client.cookies.set(name, value)
    assert_refused(client.get(back, follow_redirects=False), 400)
    assert len(db_rows(app, users)) == 1


@ON_BOTH
def test_a_callback_replayed_on_another_replica_is_refused_before_github_is_asked(
    make_client: Any, github: FakeGitHub
) -> None:
    """The spent state is in the database: a second server on it refuses the replay itself
    (GitHub's single-use code is not what stops it)."""
    client, app = make_client(**github.config())
    other, _ = make_client(**github.config())  # another replica: same database, same secret
    authorize = start(client)
    before = dict(client.cookies.items())
    back = approve(authorize)
    first = client.get(back, follow_redirects=False)
    assert first.status_code == 303, first.text[-1500:]
    exchanges = github.paths().count("/login/oauth/access_token")
    for name, value in before.items():
        other.cookies.set(name, value)
    assert_refused(other.get(back, follow_redirects=False), 400, "the state was used")
    assert github.paths().count("/login/oauth/access_token") == exchanges
    assert len(db_rows(app, users)) == 1


def test_github_access_denied_and_a_failed_exchange_are_400_pages(
    make_client: Any, github: FakeGitHub
) -> None:
    client, app = make_client(**github.config())
    github.deny()
    r = github_sign_in(client)
    assert_refused(r, 400, "denied", 'href="/dashboard/signin"')
    assert not [k for k in session_of(client) if k.startswith("_state_")]
    github.deny(False)
    github.fail_token_exchange("bad_verification_code")
    assert_refused(github_sign_in(client), 400, "bad_verification_code")
    github.fail_token_exchange(None)
    assert github_sign_in(client).status_code == 303  # trying again works
    assert len(db_rows(app, users)) == 1


def test_github_down_is_a_502_page(make_client: Any, github: FakeGitHub) -> None:
    client, app = make_client(**github.config())
    back = approve(start(client))
    github.stop()
    assert_refused(client.get(back, follow_redirects=False), 502, "GitHub")
    assert db_rows(app, users) == []


def test_sign_in_pages_with_and_without_github(make_client: Any, github: FakeGitHub) -> None:
    plain, _ = make_client()
    page = plain.get("/dashboard/signin")
    assert page.status_code == 200
    assert "kyronix users invite" in page.text and "kyronix serve" in page.text
    assert 'href="/api/auth' not in page.text
    assert_refused(plain.get("/api/auth", follow_redirects=False), 404, "one-time")
    assert_refused(plain.get("/api/auth/callback?code=x&state=y"), 404)

    client, _ = make_client(**github.config())
    page = client.get("/dashboard/signin?next=/dashboard/usage")
    assert page.status_code == 200 and "<h1" in page.text
    assert (
        'href="/api/auth?next=/dashboard/usage"' in page.text and "Sign in with GitHub" in page.text
    )
    r = github_sign_in(client)
    signed_in = client.get("/dashboard/signin?next=/dashboard/usage", follow_redirects=False)
    assert r.status_code == 303 and signed_in.headers["location"] == "/dashboard/usage"


def test_public_url_makes_the_callback_and_a_secure_cookie(
    make_client: Any, github: FakeGitHub
) -> None:
    client, _ = make_client(**github.config(), public_url="https://kx.example")
    r = client.get("/api/auth", follow_redirects=False)
    q = parse_qs(urlsplit(r.headers["location"]).query)
    assert q["redirect_uri"] == ["https://kx.example/api/auth/callback"]
    cookie = r.headers["set-cookie"].lower()
    assert "kyronix_session=" in cookie and "secure" in cookie
    assert "httponly" in cookie and "samesite=lax" in cookie

    plain, _ = make_client()
    cookie = plain.get("/dashboard/signin").headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "secure" not in cookie


# -- one-time links ---------------------------------------------------------------------------


def test_a_link_is_shown_by_get_spent_by_post_once(make_client: Any) -> None:
    client, app = make_client()
    token = make_link(app, "alice")
    page = client.get(f"/signin/{token}")
    assert page.status_code == 200 and 'method="post"' in page.text
    assert f'action="/signin/{token}"' in page.text and "<button" in page.text
    assert client.get(f"/signin/{token}").status_code == 200  # a prefetch or an unfurler
    (link,) = db_rows(app, signin_links)
    assert link.used_at is None and db_rows(app, users) == []
    before = session_of(client)

    r = client.post(f"/signin/{token}", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    (user,) = db_rows(app, users)
    assert user.login == "alice" and user.github_id is None
    after = session_of(client)
    assert after["uid"] == user.id and after["csrf"] != before["csrf"]  # a fresh session
    (project,) = app.state.kx.db.read(lambda c: projects_of(c, user.id))
    assert app.state.kx.db.read(lambda c: billing.balance(c, project.id)) == 100_000
    assert db_rows(app, signin_links)[0].used_at is not None

    assert_refused(client.get(f"/signin/{token}"), 400, "already used or has expired")
    r = client.post(f"/signin/{token}", data={"csrf": session_of(client)["csrf"]})
    assert_refused(r, 400, "already used or has expired", "ask for a new one")
    assert len(db_rows(app, users)) == 1


def test_a_post_without_csrf_is_403_and_does_not_spend_the_link(make_client: Any) -> None:
    client, app = make_client()
    token = make_link(app)
    client.get(f"/signin/{token}")
    assert_refused(client.post(f"/signin/{token}", data={}), 403, "CSRF")
    assert_refused(client.post(f"/signin/{token}", data={"csrf": "x" * 43}), 403)
    assert db_rows(app, signin_links)[0].used_at is None and db_rows(app, users) == []
    page = client.get(f"/signin/{token}")
    ok = client.post(f"/signin/{token}", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert ok.status_code == 303


def test_expired_and_unknown_links_are_400_pages(make_client: Any) -> None:
    client, app = make_client()
    expired = make_link(app, "late", ttl_ms=-1000)
    client.get("/dashboard/signin")
    for token in (expired, "kxs_" + "A" * 32):
        assert_refused(client.get(f"/signin/{token}"), 400, "already used or has expired")
        r = client.post(f"/signin/{token}", data={"csrf": session_of(client)["csrf"]})
        assert_refused(r, 400, "already used or has expired", 'href="/dashboard/signin"')
    assert_refused(client.get("/signin/not-a-link"), 400, "expired")
    assert db_rows(app, users) == []


def test_an_invited_user_signs_in_again_as_the_same_user(make_client: Any) -> None:
    client, app = make_client()
    for _ in range(2):
        token = make_link(app, "bob")
        client.cookies.clear()
        page = client.get(f"/signin/{token}")
        r = client.post(f"/signin/{token}", data={"csrf": csrf_of(page.text)})
        assert r.history[0].status_code == 303
    (user,) = db_rows(app, users)
    assert len(app.state.kx.db.read(lambda c: projects_of(c, user.id))) == 1


def test_sign_out_clears_the_session(make_client: Any) -> None:
    client, app = make_client()
    token = make_link(app)
    page = client.get(f"/signin/{token}")
    client.post(f"/signin/{token}", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert session_of(client).get("uid")
    signed_in = client.get("/dashboard/signin", follow_redirects=False)
    assert signed_in.status_code == 303
    csrf = session_of(client)["csrf"]
    assert_refused(client.post("/dashboard/signout", data={}), 403)  # CSRF-checked
    assert session_of(client).get("uid")
    r = client.post("/dashboard/signout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/signin"
    assert not session_of(client).get("uid")
    assert client.get("/dashboard/signin", follow_redirects=False).status_code == 200
    if has_dashboard(app):  # the pages' router: the next dashboard page asks to sign in
        r = client.get("/dashboard", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/dashboard/signin")


@ON_BOTH
def test_sign_out_ends_the_session_on_the_server_for_every_copy_of_the_cookie(
    make_client: Any,
) -> None:
    client, app = make_client()
    replica, _ = make_client()
    token = make_link(app)
    page = client.get(f"/signin/{token}")
    client.post(f"/signin/{token}", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    copied = dict(client.cookies.items())
    csrf = session_of(client)["csrf"]
    for name, value in copied.items():
        replica.cookies.set(name, value)
    assert replica.get("/dashboard/projects").status_code == 200  # signed in on both
    (row,) = db_rows(app, web_sessions)
    assert row.id != session_of(client)["sid"]  # only a digest of the token is stored
    r = client.post("/dashboard/signout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303
    assert db_rows(app, web_sessions) == []
    for c in (client, replica):
        c.cookies.clear()
        for name, value in copied.items():
            c.cookies.set(name, value)
        r = c.get("/dashboard/projects", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/dashboard/signin")
        late = c.post(
            "/dashboard/projects", data={"csrf": csrf, "name": "late"}, follow_redirects=False
        )
        assert late.status_code == 303 and "/dashboard/signin" in late.headers["location"]
    assert "late" not in [p.name for p in db_rows(app, projects)]


def test_a_cookie_from_before_server_sessions_signs_nobody_in(make_client: Any) -> None:
    """A signed cookie with a user id but no server-side session (forged with the key, or
    written by an older server) is not a sign-in."""
    client, app = make_client()
    token = make_link(app)
    page = client.get(f"/signin/{token}")
    client.post(f"/signin/{token}", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    app.state.kx.db.write(lambda c: c.execute(delete(web_sessions)))
    r = client.get("/dashboard/projects", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/dashboard/signin")


# -- the commands -----------------------------------------------------------------------------


def test_kyronix_serve_prints_an_owner_link_that_signs_in(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with ServerProcess(home, {"KYRONIX_GITHUB_CLIENT_ID": "", "KYRONIX_PUBLIC_URL": ""}) as server:
        assert wait_until(lambda: LINK_LINE.search(server.log), timeout=30), server.log
        found = LINK_LINE.search(server.log)
        assert found
        link = found.group(1)
        assert link.startswith(server.url + "/signin/kxs_")
        with httpx2.Client(timeout=30) as browser:
            page = browser.get(link)
            assert page.status_code == 200
            r = browser.post(link, data={"csrf": csrf_of(page.text)}, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == "/dashboard"
            assert "kyronix_session" in browser.cookies
            assert browser.get(link).status_code == 400  # spent
        listed = kyronix("users", "list", home=home)
        assert listed.returncode == 0, listed.stderr
        (line,) = listed.stdout.splitlines()
        assert line.startswith("owner\tlink\t") and line.endswith("\towner")
    assert server.proc.returncode == 0


def test_kyronix_serve_with_github_prints_no_link(tmp_path: Path, github: FakeGitHub) -> None:
    with ServerProcess(tmp_path / "home", github.env()) as server:
        with server.client() as browser:
            r = browser.get("/api/auth", follow_redirects=False)
        assert r.status_code == 302
        assert r.headers["location"].startswith(github.url + "/login/oauth/authorize")
    assert "sign in to the dashboard" not in server.log


def test_kyronix_users_invite_and_list(kx_home: Path, make_client: Any) -> None:
    bad = kyronix("users", "invite", "no spaces!", home=kx_home)
    assert bad.returncode != 0 and "invalid user name" in bad.stderr and not bad.stdout
    assert kyronix("users", "invite", "carol", "--url", "ftp://x", home=kx_home).returncode != 0
    empty = kyronix("users", "list", home=kx_home)
    assert empty.returncode == 0 and empty.stdout == "" and "no users yet" in empty.stderr

    made = kyronix("users", "invite", "carol", "--url", "https://kx.example/", home=kx_home)
    assert made.returncode == 0, made.stderr
    (url,) = made.stdout.splitlines()
    assert url.startswith("https://kx.example/signin/kxs_")
    assert "carol" in made.stderr and "UTC" in made.stderr
    default = kyronix("users", "invite", "dave", home=kx_home)
    assert default.stdout.startswith("http://127.0.0.1:8080/signin/kxs_")
    public = kyronix(
        "users", "invite", "erin", home=kx_home, env={"KYRONIX_PUBLIC_URL": "https://p.example"}
    )
    assert public.stdout.startswith("https://p.example/signin/kxs_")

    client, _app = make_client()  # the same home: the same database and secret
    path = urlsplit(url).path
    page = client.get(path)
    r = client.post(path, data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert r.status_code == 303
    listed = kyronix("users", "list", home=kx_home)
    (line,) = listed.stdout.splitlines()
    login, how, created, projects = line.split("\t")
    assert (login, how, projects) == ("carol", "link", "carol") and re.match(r"\d{4}-", created)
