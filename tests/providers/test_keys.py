"""A key never reaches another origin, and never reaches a shell child the model drives.

Both are checked on the wire: a local server records every request, including the second one,
which carries the shell's output back to the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiso.runtime import Agent
from kiso.runtime.auth import AuthStore
from kiso.runtime.config import load_config
from kiso.runtime.models import build_adapter, resolve_model
from kiso.tools import builtin_tools

from .sse import SSEServer, Stream
from .test_openai_compat import call_fragment, chunk, sse, text_reply

SECRETS = {
    "stored": "sk-stored-SECRET-1111",
    "OPENAI_API_KEY": "sk-env-SECRET-2222",
    "GATEWAY_TOKEN": "gw-SECRET-3333",
    "ANTHROPIC_API_KEY": "sk-ant-SECRET-4444",
}


def shell_call(command: str) -> Stream:
    args = json.dumps({"command": command})
    return sse(
        chunk({"role": "assistant", "content": ""}),
        call_fragment(0, args[:9], call_id="call_env", name="shell"),
        call_fragment(0, args[9:]),
        chunk({}, "tool_calls"),
    )


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    for name in ("OPENAI_API_KEY", "GATEWAY_TOKEN", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(name, SECRETS[name])
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    AuthStore(home).store("openai", SECRETS["stored"])
    return home, ws


def gateway_profile(home: Path, url: str, key_env: str | None) -> None:
    profile: dict[str, Any] = {"kind": "openai-compat", "model": "m", "baseUrl": url + "/v1"}
    if key_env:
        profile["apiKeyEnv"] = key_env
    (home / "config.json").write_text(json.dumps({"model": "gw", "models": {"gw": profile}}))


def everything_sent(server: SSEServer) -> str:
    return "\n".join(
        json.dumps(r.headers) + r.body.decode("utf-8", "replace") for r in server.requests
    )


@pytest.mark.parametrize("key_env", ["GATEWAY_TOKEN", None])
def test_a_stored_key_never_reaches_another_origin(
    setup: tuple[Path, Path], key_env: str | None
) -> None:
    home, ws = setup
    with SSEServer([text_reply("hello")]) as server:
        gateway_profile(home, server.url, key_env)
        resolved = resolve_model(load_config(home, ws), home=home)
        agent = Agent(adapter=build_adapter(resolved), store=None, workspace=ws)
        with agent.session() as session:
            assert [e.type for e in session.run_sync("hi")][-1] == "terminal"
        sent = everything_sent(server)
    assert server.requests[0].credential == (SECRETS["GATEWAY_TOKEN"] if key_env else "no-key")
    assert SECRETS["stored"] not in sent
    assert SECRETS["OPENAI_API_KEY"] not in sent


def test_no_key_reaches_a_shell_child(setup: tuple[Path, Path]) -> None:
    home, ws = setup
    replies = [shell_call("env; echo DONE"), text_reply("done")]
    with SSEServer(replies) as server:
        gateway_profile(home, server.url, "GATEWAY_TOKEN")
        resolved = resolve_model(load_config(home, ws), home=home)
        agent = Agent(
            adapter=build_adapter(resolved),
            tools=builtin_tools(),
            workspace=ws,
            mode="bypass",
            strip_env=resolved.strip_env,
        )
        with agent.session() as session:
            kinds = [e.type for e in session.run_sync("show me the environment")]
            assert kinds[-1] == "terminal"
            output = next(e for e in session.events if e.type == "execution_finished")
            assert "DONE" in output.content  # type: ignore[union-attr]
        second = server.requests[1].body.decode()
    assert "DONE" in second  # the shell's output went back to the model ...
    for name, secret in SECRETS.items():
        assert secret not in output.content, name  # type: ignore[union-attr]
        assert secret not in second, name
    assert server.requests[1].credential == SECRETS["GATEWAY_TOKEN"]  # ... and only the header
