"""The Kyronix dashboard in a real browser: Debian's Chromium driven by Playwright, a real
``kyronix serve`` process, and a fake GitHub on loopback for the sign-in.

One user's whole day: sign in with GitHub, create a project, create an API key and use it with
the SDK, create a custom agent and run it through the API, see the charge in Usage, open that
session's timeline and download its log. Then the refusals: a form posted without its CSRF
token, another user's project by URL, a revoked key. Every page is also looked at 390 pixels
wide (nothing wider than the screen) and reached by keyboard.

A screenshot of each page is saved under ``artifacts/screenshots/`` (the README names it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from kyronix import Kyronix
from kyronix.errors import AuthenticationError
from kyronix.executer.tools.browser.launch import find_chromium
from tests.kyronix.server.fake_github import FakeGitHub
from tests.kyronix.server.helpers import ServerProcess, kyronix

ROOT = Path(__file__).resolve().parents[2]
LONG_NAME = "AcmeAnalyticsWarehouseNightlyReportingAndBillingPipeline2026Dec01"[:64]
SHOTS = ROOT / "artifacts" / "screenshots"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=find_chromium(), args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as gh:
        yield gh


@pytest.fixture
def server(tmp_path: Path, github: FakeGitHub) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "home", github.env()) as s:
        yield s


WIDEST = """() => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .filter(e => !e.parentElement.closest('.scroll'))
  .slice(0, 5)
  .map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"""


def _save(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def shot(page: Page, name: str) -> None:
    """The page as it is, 1280 px wide, then at 390 px: readable there too (nothing wider than
    the screen; tables scroll in their own box). A screenshot of each is kept."""
    _save(page, name)
    size = page.viewport_size
    page.set_viewport_size({"width": 390, "height": 844})
    _save(page, f"{name}-390")
    width = page.evaluate("document.documentElement.scrollWidth")
    wide = page.evaluate(WIDEST)
    assert width <= 392, f"{name}: the page is {width}px wide at 390px; widest: {wide}"
    if size is not None:
        page.set_viewport_size(size)


def sign_in(
    browser: Browser, server: ServerProcess, github: FakeGitHub, login: str, gid: int
) -> Page:
    github.sign_in_as(login, id=gid, name=login.title())
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{server.url}/dashboard")
    expect(page).to_have_url(re.compile(r"/dashboard/signin"))
    page.get_by_role("link", name="Sign in with GitHub").click()
    expect(page.get_by_text(f"Signed in as {login}")).to_be_visible()
    return page


def test_a_users_day_in_the_dashboard(
    browser: Browser, server: ServerProcess, github: FakeGitHub, tmp_path: Path
) -> None:
    # --- sign in (the first sign-in makes the first project, with its credits)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{server.url}/dashboard/signin")
    shot(page, "01-signin")
    page.keyboard.press("Tab")  # the first stop is the skip link
    assert page.evaluate("document.activeElement.textContent").strip() == "Skip to content"
    github.sign_in_as("ana", id=1001, name="Ana")
    page.get_by_role("link", name="Sign in with GitHub").click()
    expect(page.get_by_text("Signed in as ana")).to_be_visible()
    assert [r.path for r in github.requests][:1] == ["/login/oauth/authorize"]
    cookie = next(c for c in context.cookies() if c["name"] == "kyronix_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"

    # --- create a project
    page.goto(f"{server.url}/dashboard/projects")
    page.get_by_label("Project name").fill("shop-backend")
    page.get_by_role("button", name="Create project").click()
    # the free credits came once, with ana's first project: a second one starts empty and says
    # how to get more (issue 29: no credits minted by making projects)
    expect(page.get_by_role("status")).to_contain_text(
        "Project shop-backend created with 0 credits"
    )
    expect(page.get_by_role("status")).to_contain_text("once per account")
    found = re.search(r"/dashboard/projects/(proj_[0-9a-f]+)/agents", page.url)
    assert found, page.url
    project_id = found.group(1)
    granted = kyronix("credits", "grant", project_id, "100", home=server.home)  # the operator
    assert granted.returncode == 0, granted.stderr
    page.goto(f"{server.url}/dashboard/projects")
    expect(page.get_by_role("cell", name="shop-backend")).to_be_visible()
    # a second project with the longest name allowed: it is in every page's selector, and no
    # page may grow wider than a phone for it
    page.get_by_label("Project name").fill(LONG_NAME)
    page.get_by_role("button", name="Create project").click()
    expect(page.get_by_role("status")).to_contain_text(LONG_NAME)
    page.goto(f"{server.url}/dashboard/projects")
    shot(page, "02-projects")

    # --- Project Settings: a key, shown once, copied with the button
    page.goto(f"{server.url}/dashboard/projects/{project_id}/settings")
    page.get_by_label("Name").first.fill("backend")
    page.get_by_role("button", name="Create API key").click()
    key = page.locator("#new-key").inner_text().strip()
    assert re.fullmatch(r"kyr_[A-Za-z0-9_-]{43}", key)
    shot(page, "03-new-key")
    page.goto(f"{server.url}/dashboard/projects/{project_id}/settings")
    assert key not in page.content()  # shown once, never again
    assert key[:12] in page.content()  # listed by its prefix
    shot(page, "04-settings")

    # --- the key works with the SDK: a built-in agent run
    with Kyronix(api_key=key, base_url=server.url) as kx:
        first = kx.run(input="Create src/hello.py that prints hello")
    assert first.run_id

    # --- My Agents: the document's Step 1 and Step 2
    page.goto(f"{server.url}/dashboard/projects/{project_id}/agents")
    page.get_by_role("link", name="+ Create Custom Agent").click()
    page.get_by_label("Agent Name").fill("Database Assistant")
    page.get_by_label("Description", exact=True).fill(
        "Queries analytics tables and generates summary reports"
    )
    tool = page.get_by_role("group", name="Tool 1")  # each tool row is a labelled fieldset
    tool.get_by_label("Tool Name").fill("execute_sql")
    tool.get_by_label("Tool Description").fill("Executes a SQL query on analytical database")
    tool.get_by_label("Parameters").fill("sql_query, limit")
    shot(page, "05-agent-form")
    page.get_by_role("button", name="Save Agent").click()
    agent_id = page.locator("#agent-id").inner_text().strip()
    assert re.fullmatch(r"[0-9a-f]{16,}", agent_id), agent_id
    shot(page, "06-agent")
    page.get_by_role("link", name="Delete this agent…").click()
    expect(page.get_by_role("heading", name="Delete Database Assistant?")).to_be_visible()
    shot(page, "06b-agent-delete")  # looked at, not confirmed
    page.goto(f"{server.url}/dashboard/projects/{project_id}/agents")
    expect(page.get_by_role("link", name="Database Assistant")).to_be_visible()
    expect(page.get_by_role("button", name="Copy ID of Database Assistant")).to_be_visible()
    shot(page, "07-agents")

    # --- run the custom agent through the API with that key
    with Kyronix(api_key=key, base_url=server.url) as kx:
        custom = kx.run_custom_agent(agent_id, "How many orders were placed yesterday?")
    assert custom.run_id

    # --- Usage: the balance, the ledger, each run's tokens and charge, the chart
    page.goto(f"{server.url}/dashboard/projects/{project_id}/usage")
    usage = page.content()
    assert custom.run_id in usage and first.run_id in usage
    expect(page.locator("svg.chart")).to_be_visible()
    balance = _balance(server, key)
    assert f"{balance:g}" in usage  # what the API says is left is what the page says
    shot(page, "08-usage")

    # --- Sessions: the custom run's timeline, and its raw log
    page.goto(f"{server.url}/dashboard/projects/{project_id}/sessions")
    shot(page, "09-sessions")
    page.get_by_role("link", name=custom.session_id).click()
    timeline = page.locator(".timeline")
    expect(timeline).to_contain_text("How many orders were placed yesterday?")
    expect(timeline).to_contain_text("<kyronix>")  # the model's KML, escaped, as it was sent
    shot(page, "10-timeline")
    with page.expect_download() as got:
        page.get_by_role("link", name=re.compile("log", re.I)).first.click()
    saved = tmp_path / "log.jsonl"
    got.value.save_as(saved)
    lines = [json.loads(x) for x in saved.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["type"] == "session" and lines[0]["id"] == custom.session_id
    assert any(x["type"] == "user" for x in lines[1:])

    # --- refusals: a form without its CSRF token changes nothing
    refused = page.request.post(
        f"{server.url}/dashboard/projects", form={"name": "sneaky"}, max_redirects=0
    )
    assert refused.status == 403
    assert "CSRF" in refused.text()
    page.goto(f"{server.url}/dashboard/projects")
    assert "sneaky" not in page.content()
    # the same refusal as a person meets it: a page's form whose token is not the session's
    page.get_by_label("Project name").fill("sneaky")
    page.locator("form:has(#project-name) input[name=csrf]").evaluate("e => e.value = 'forged'")
    page.get_by_role("button", name="Create project").click()
    expect(page.get_by_role("heading", name="Refused")).to_be_visible()
    shot(page, "11-refused-403")
    page.goto(f"{server.url}/dashboard/projects")
    assert "sneaky" not in page.content()
    response = page.goto(f"{server.url}/dashboard/projects/proj_0000/usage")
    assert response is not None and response.status == 404
    shot(page, "11b-not-found-404")
    response = page.goto(f"{server.url}/api/auth/callback?state=forged&code=x")
    assert response is not None and response.status == 400
    shot(page, "11c-signin-failed-400")

    # --- another user cannot see this project, by any URL
    other = sign_in(browser, server, github, "mallory", 2002)
    for path in ("settings", "agents", "usage", "sessions", f"sessions/{custom.session_id}"):
        response = other.goto(f"{server.url}/dashboard/projects/{project_id}/{path}")
        assert response is not None and response.status == 404, path
        assert "shop-backend" not in other.content()
    shot(other, "12-another-users-project")
    other.context.close()

    # --- revoke the key: the SDK is refused from then on
    page.goto(f"{server.url}/dashboard/projects/{project_id}/settings")
    page.get_by_role("button", name=re.compile(f"Revoke key {re.escape(key[:12])}")).click()
    with (
        Kyronix(api_key=key, base_url=server.url, max_retries=0) as kx,
        pytest.raises(AuthenticationError),
    ):
        kx.run(input="still there?")
    shot(page, "13-revoked")

    # --- sign out: the session ends on the server, so a copy of the cookie is dead too
    copied = next(c for c in context.cookies() if c["name"] == "kyronix_session")
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/dashboard/signin"))
    page.goto(f"{server.url}/dashboard/projects")
    expect(page).to_have_url(re.compile(r"/dashboard/signin"))
    context.close()
    thief = browser.new_context(viewport={"width": 1280, "height": 900})
    thief.add_cookies([copied])  # type: ignore[list-item]
    stolen = thief.new_page()
    stolen.goto(f"{server.url}/dashboard/projects")
    expect(stolen).to_have_url(re.compile(r"/dashboard/signin"))
    assert "shop-backend" not in stolen.content()
    thief.close()


def _balance(server: ServerProcess, key: str) -> float:
    response = httpx2.get(
        f"{server.url}/api/credits", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    body: dict[str, Any] = response.json()
    return float(body.get("credits", body.get("balance", 0)))
