"""The child environment: credentials never reach a process the model can drive.

Decided by rule (names containing KEY, TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL, WEBHOOK;
ending in _PAT, _JWT, _AUTH; values that are URLs carrying a password; the agent sockets), tested
both ways: each credential removed, each ordinary variable kept, and what the caller passes
explicitly winning over the rule. Then the same through a real run of kiso's shell tool, whose
child prints its environment.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from kiso.tools import SHELL, ToolContext
from kiso.tools.env import child_env, is_stripped

KEPT = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/dev",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "xterm-256color",
    "TMPDIR": "/tmp/dev",
    "USER": "dev",
    "SHELL": "/bin/bash",
    "PWD": "/home/dev/project",
    "OPENAI_BASE_URL": "https://llm.example/v1",
    "ANTHROPIC_BASE_URL": "https://anthropic.example",
    "HTTP_PROXY": "http://proxy.example:3128",
    "PIP_INDEX_URL": "https://pypi.example/simple",
    "GIT_REMOTE": "ssh://git@github.com/org/repo.git",  # a user, no password
    "EDITOR": "vim",
    "CI": "true",
}
"""Ordinary variables: none of them is removed."""

STRIPPED = {
    # the list, each by its rule
    "DATABASE_URL": "postgres://app:hunter2@db.internal:5432/app",  # URL with a password
    "PGPASSWORD": "hunter2",  # contains PASSWORD
    "MY_SERVICE_PASSWORD": "pw",
    "NPM_CONFIG__AUTHTOKEN": "npm_abc",  # contains TOKEN
    "GH_PAT": "github_pat_abc",  # ends in _PAT
    "CI_JOB_JWT": "eyJhbGciOi",  # ends in _JWT
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",  # an agent socket
    "GPG_AGENT_INFO": "/run/user/1000/gnupg/S.gpg-agent:0:1",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/XXXX",  # contains WEBHOOK
    "REDIS_URL": "redis://:s3cret@cache:6379/0",  # URL with a password and no user
    # the rest of the rule
    "OPENAI_API_KEY": "sk-openai",
    "ANTHROPIC_AUTH_TOKEN": "ant-token",
    "AWS_ACCESS_KEY_ID": "AKIA",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_SESSION_TOKEN": "aws-session",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/dev/sa.json",
    "DB_PASSWD": "pw",
    "NPM_CONFIG__AUTH": "dXNlcjpwYXNz",  # ends in _AUTH
    "DOCKER_AUTH_CONFIG": '{"auths": {}}',
    "SENTRY_DSN": "https://abc123@o1.ingest.sentry.io/1",
    "AMQP_BROKER": "amqp://guest:guest@rabbit//",  # any name: the value decides
    "UPSTREAMS": "http://a.example,https://u:p@b.example/x",  # a URL among others
    "KISO_FAILPOINT": "after_append",
    "my_service_api_key": "lower case",
    "Internal_Auth_Token": "mixed case",
    "gh_pat": "lower-case suffix",
    # broad on purpose: these only look like secrets, and go too (keep= brings them back)
    "KEYBOARD": "us",
    "TOKENIZERS_PARALLELISM": "false",
}


@pytest.mark.parametrize("name", sorted(STRIPPED))
def test_each_credential_is_removed(name: str) -> None:
    env = child_env({**KEPT, name: STRIPPED[name]})
    assert name not in env
    assert env == KEPT
    assert is_stripped(name, value=STRIPPED[name])


@pytest.mark.parametrize("name", sorted(KEPT))
def test_each_ordinary_variable_is_kept(name: str) -> None:
    assert child_env({name: KEPT[name]}) == {name: KEPT[name]}
    assert not is_stripped(name, value=KEPT[name])


def test_urls_without_a_password_are_kept_and_the_url_rule_reads_values_only() -> None:
    kept = {
        "UPSTREAM": "https://user@example.com/path",  # a user name is not a password
        "CACHE_URL": "redis://user:@cache:6379",  # an empty password
        "NOT_A_URL": "user:pass@host",  # no scheme: not a URL
        "PORT_ONLY": "http://example.com:8080/x@y",  # ':' before the host's port, '@' in path
    }
    assert child_env(kept) == kept
    assert child_env({"URL": "http://u:p@h"}) == {}


def test_profile_variables_are_stripped_whatever_their_name() -> None:
    environ = {**KEPT, "MY_LLM_CRED": "s1", "corp_gateway": "s2"}
    env = child_env(environ, also_strip=["MY_LLM_CRED", "CORP_GATEWAY"])
    assert env == KEPT
    # A lone string is one name, not a list of letters.
    assert child_env(environ, also_strip="MY_LLM_CRED") == {**KEPT, "corp_gateway": "s2"}
    assert is_stripped("custom", also_strip=["CUSTOM"])


def test_what_the_caller_passes_explicitly_wins() -> None:
    environ = {**KEPT, **STRIPPED}
    env = child_env(environ, keep=["DATABASE_URL", "tokenizers_parallelism"])
    assert env == {
        **KEPT,
        "DATABASE_URL": STRIPPED["DATABASE_URL"],
        "TOKENIZERS_PARALLELISM": "false",
    }
    # keep wins over also_strip too; extra values are set as given, on top of everything
    env = child_env(
        {"PATH": "/bin", "X_TOKEN": "t"},
        also_strip=["X_TOKEN"],
        keep="X_TOKEN",
        extra={"GIT_TERMINAL_PROMPT": "0", "PATH": "/opt/bin"},
    )
    assert env == {"PATH": "/opt/bin", "X_TOKEN": "t", "GIT_TERMINAL_PROMPT": "0"}
    assert not is_stripped("GH_PAT", keep=["gh_pat"])


def test_a_new_dict_is_returned_and_the_input_is_untouched() -> None:
    environ = {**KEPT, "OPENAI_API_KEY": "sk"}
    env = child_env(environ)
    assert env is not environ
    assert environ["OPENAI_API_KEY"] == "sk"
    env["X"] = "1"
    assert "X" not in environ


def test_through_a_real_run_of_the_shell_tool(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kiso's shell tool, with no environment given by the runtime, builds it with child_env
    from its own: the child's own `env` shows none of the credentials and all of the rest."""
    for name, value in STRIPPED.items():
        monkeypatch.setenv(name, value)
    for name, value in KEPT.items():
        if name != "PWD":  # the shell sets its own
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("TMPDIR", str(workspace))
    result = asyncio.run(
        SHELL.run({"command": "env -0"}, ToolContext(workspace=workspace, execution_id="k:1"))
    )
    assert not result.is_error, result.content
    printed = result.content.rsplit("\n", 1)[0]
    seen = dict(item.split("=", 1) for item in printed.split("\0") if "=" in item)
    for name, value in STRIPPED.items():
        assert name not in seen, name
        if len(value) > 6:  # "us" and "false" appear in other variables' values
            assert value not in result.content, name
    for name in ("PATH", "HOME", "LANG", "TERM", "USER", "SHELL", "OPENAI_BASE_URL"):
        assert seen[name] == os.environ[name], name
    assert seen["TMPDIR"] == str(workspace)
    assert seen["PWD"] == str(workspace)
