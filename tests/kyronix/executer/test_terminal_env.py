"""Credentials never reach the executer's terminal: a real command prints its environment.

The rule is kiso's one :func:`kiso.tools.env.child_env` (tests/tools/test_env.py has it both
ways, name by name); here it is seen through a real ``terminal`` run, through the API and
through ``kyronix exec --pass-env``, where what the caller passes explicitly wins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kyronix.executer import ROOT_POLICIES, KyronixExecuter, PermissionManager

from .kmlkit import kml

SECRETS = {
    "DATABASE_URL": "postgres://app:hunter2-db@db.internal:5432/app",
    "PGPASSWORD": "hunter2-pg",
    "DEPLOY_PASSWORD": "hunter2-deploy",
    "NPM_CONFIG__AUTHTOKEN": "npm_secret_token",
    "GH_PAT": "github_pat_secret",
    "CI_JOB_JWT": "eyJhbGciOiJSUzI1NiJ9.secret",
    "SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.4242",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/secretwebhook",
    "REDIS_URL": "redis://:s3cret-redis@cache:6379/0",
    "OPENAI_API_KEY": "sk-secret-openai",
}
KEPT = ("PATH", "HOME", "LANG", "TERM", "TMPDIR", "USER", "SHELL")


def _env_of(output: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in output.split("\0") if "=" in item)


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    defaults = {"LANG": "C.UTF-8", "TERM": "xterm", "USER": "dev", "SHELL": "/bin/sh"}
    for name, value in defaults.items():
        monkeypatch.setenv(name, os.environ.get(name, value))
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@pytest.mark.usefixtures("environ")
def test_the_terminal_sees_no_credential_and_everything_else(tmp_path: Path, base: Path) -> None:
    ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=":memory:")
    with ex:
        [entry] = ex.execute_sync(kml(("terminal", {"command": "env -0"})), base)
    result = entry["result"]
    assert result["success"], result
    seen = _env_of(result["output"])
    for name, value in SECRETS.items():
        assert name not in seen, name
        assert value not in result["output"], name
    for name in KEPT:
        if name != "TMPDIR":
            assert seen[name] == os.environ[name], name
    # the OS sandbox gives the command a temporary directory of its own (docs/sandbox.md)
    assert Path(seen["TMPDIR"]).parent.name == "sandbox-tmp", seen["TMPDIR"]
    assert seen["PWD"] == str(base)


@pytest.mark.usefixtures("environ")
def test_what_the_caller_passes_explicitly_reaches_the_terminal(base: Path) -> None:
    ex = KyronixExecuter(
        permissions=PermissionManager(ROOT_POLICIES),
        receipts=":memory:",
        pass_env=["DATABASE_URL", "pgpassword"],
        env={**os.environ, "EXTRA_TOKEN": "given"},
    )
    with ex:
        [entry] = ex.execute_sync(kml(("terminal", {"command": "env -0"})), base)
    seen = _env_of(entry["result"]["output"])
    assert seen["DATABASE_URL"] == SECRETS["DATABASE_URL"]
    assert seen["PGPASSWORD"] == SECRETS["PGPASSWORD"]
    assert "EXTRA_TOKEN" not in seen  # env= is the source; the rule still applies to it
    assert "GH_PAT" not in seen and "REDIS_URL" not in seen


@pytest.mark.usefixtures("environ")
def test_kyronix_exec_pass_env(tmp_path: Path, base: Path) -> None:
    plan = kml(("terminal", {"command": "env -0"}))
    out = subprocess.run(
        [sys.executable, "-m", "kyronix.executer", "-", "--base", str(base),
         "--allow", "tool:terminal", "--pass-env", "REDIS_URL", "--receipts",
         str(tmp_path / "r.sqlite3")],
        input=plan,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = _env_of(json.loads(out.stdout)[0]["result"]["output"])
    assert seen["REDIS_URL"] == SECRETS["REDIS_URL"]
    for name in SECRETS.keys() - {"REDIS_URL"}:
        assert name not in seen, name
