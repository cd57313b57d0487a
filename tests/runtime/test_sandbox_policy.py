"""The sandbox setting: user config, KISO_SANDBOX, --sandbox; a project only tightens; a call
asking to run outside the sandbox is put to a person, whatever the mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import ApprovalDecided, ExecutionFinished
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.config import ConfigError, load_config
from kiso.tools import builtin_tools
from kiso.tools.sandbox import SandboxPolicy
from tests.runtime.helpers import store


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    return home, ws


def test_the_default_is_workspace_write_without_network(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    policy = load_config(home, ws, environ={}).sandbox
    assert (policy.mode, policy.network, policy.source) == ("workspace-write", False, "default")


def test_user_config_environment_and_flag_in_that_order(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    user = write(home / "config.json", {"sandbox": {"mode": "read-only", "network": True}})
    policy = load_config(home, ws, environ={}).sandbox
    assert (policy.mode, policy.network, policy.source) == ("read-only", True, str(user))
    env = load_config(home, ws, environ={"KISO_SANDBOX": "off"}).sandbox
    assert (env.mode, env.source) == ("off", "environment")
    flag = load_config(home, ws, environ={"KISO_SANDBOX": "off"}, sandbox="workspace-write")
    assert (flag.sandbox.mode, flag.sandbox.source) == ("workspace-write", "flag")
    write(home / "config.json", {"sandbox": "off"})
    assert load_config(home, ws, environ={}).sandbox.mode == "off"


def test_a_project_may_tighten_the_sandbox(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    write(home / "config.json", {"sandbox": {"mode": "workspace-write", "network": True}})
    project = write(ws / ".kiso" / "config.json", {"sandbox": "read-only"})
    policy = load_config(home, ws, environ={}).sandbox
    assert (policy.mode, policy.network, policy.source) == ("read-only", False, str(project))
    # the person's --sandbox off does not loosen what the project asks either
    assert load_config(home, ws, environ={}, sandbox="off").sandbox.mode == "read-only"
    write(ws / ".kiso" / "config.json", {"sandbox": {"network": False}})
    assert load_config(home, ws, environ={}).sandbox.network is False


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("off", "turns it off"),
        ({"network": True}, "allows the network"),
        ({"writableRoots": ["/srv"]}, "makes more directories writable"),
    ],
)
def test_a_project_may_never_loosen_it(dirs: tuple[Path, Path], value: Any, said: str) -> None:
    home, ws = dirs
    project = write(ws / ".kiso" / "config.json", {"sandbox": value})
    with pytest.raises(ConfigError) as err:
        load_config(home, ws, environ={})
    assert str(project) in str(err.value) and said in str(err.value)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("strict", "sandbox.mode: must be one of workspace-write, read-only, off"),
        ({"mode": "off", "net": True}, "sandbox.net: unknown key"),
        ({"network": "yes"}, "sandbox.network: must be true or false"),
        ({"writableRoots": ["relative/dir"]}, "writableRoots: must be a list of absolute"),
        (3, "sandbox: must be a mode"),
    ],
)
def test_a_bad_setting_is_a_clear_error(dirs: tuple[Path, Path], value: Any, said: str) -> None:
    home, ws = dirs
    user = write(home / "config.json", {"sandbox": value})
    with pytest.raises(ConfigError) as err:
        load_config(home, ws, environ={})
    assert str(user) in str(err.value) and said in str(err.value)


def test_a_bad_environment_value_is_a_clear_error(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    with pytest.raises(ConfigError, match="KISO_SANDBOX='none': must be one of"):
        load_config(home, ws, environ={"KISO_SANDBOX": "none"})


def _shell_agent(tmp_path: Path, ws: Path, command: str, mode: str) -> Agent:
    script = [
        {
            "tool_calls": [
                {
                    "name": "shell",
                    "input": {
                        "command": command,
                        "outside_sandbox": True,
                        "justification": "write the release notes outside",
                    },
                }
            ]
        },
        {"text": "done"},
    ]
    return Agent(
        adapter=FauxAdapter(script),
        tools=builtin_tools(),
        store=store(tmp_path),
        workspace=ws,
        mode=mode,
        sandbox=SandboxPolicy(),
    )


def test_running_outside_the_sandbox_asks_even_in_bypass_and_runs_once_approved(
    tmp_path: Path,
) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    target = outside / "notes.txt"
    agent = _shell_agent(tmp_path, ws, f"echo shipped > {target}", "bypass")
    with agent.session("s") as session:
        asked = []
        for ev in session.run_sync("ship"):
            if ev.type == "approval_request":
                asked.append(ev)
                assert not target.exists()  # nothing ran before the person said yes
                session.approve(ev.call_id)
        assert len(asked) == 1
        decided = [e for e in session.events if isinstance(e, ApprovalDecided)]
        assert [(d.decision, d.decided_by) for d in decided] == [("approved", "user")]
    (request,) = asked
    assert request.offer is not None and request.offer.rule is None  # never "don't ask again"
    assert "outside the sandbox" in (request.offer.no_rule_because or "")
    assert request.request.speaker == "sandbox"  # not the mode, which allows everything
    assert request.call.input["justification"] == "write the release notes outside"
    assert target.read_text() == "shipped\n"  # it ran outside: the sandbox would refuse this


def test_a_headless_run_never_leaves_the_sandbox_by_itself(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    target = outside / "notes.txt"
    agent = _shell_agent(tmp_path, ws, f"echo shipped > {target}", "bypass")
    with agent.session("s", headless=True) as session:
        seen = [ev.type for ev in session.run_sync("ship")]
        assert "approval_request" not in seen
        (verdict,) = [e for e in session.events if isinstance(e, ApprovalDecided)]
        assert verdict.decision == "denied"
        assert not [e for e in session.events if isinstance(e, ExecutionFinished)]
    assert not target.exists()


# --------------------------------------------------------------- hooks and checks in the sandbox


def _hook_run(tmp_path: Path, ws: Path, raw: dict[str, Any], project: bool = False) -> list[str]:
    from kiso.runtime.command_hooks import CommandHooks, parse_hooks
    from kiso.tools.sandbox import Sandbox

    said: list[str] = []
    sandbox = Sandbox.for_workspace(SandboxPolicy(), ws)
    specs = parse_hooks(ws / "config.json", raw, project=project)
    hooks = CommandHooks(specs, workspace=ws, report=said.append, sandbox=sandbox)
    script = [
        {"tool_calls": [{"name": "shell", "input": {"command": "echo hi"}}]},
        {"text": "done"},
    ]
    agent = Agent(
        adapter=FauxAdapter(script),
        tools=builtin_tools(),
        store=store(tmp_path),
        workspace=ws,
        mode="bypass",
        hooks=hooks.hooks,
        sandbox=sandbox,
    )
    with agent.session("s", headless=True) as session:
        list(session.run_sync("go"))
    return said


def test_a_hook_runs_the_workspaces_script_in_the_sandbox(tmp_path: Path) -> None:
    """The model can rewrite ./check.sh before the hook runs it: it must stay contained."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    check = ws / "check.sh"
    check.write_text(f"#!/bin/sh\necho escaped > {outside}/hook\nexit 0\n")
    check.chmod(0o755)
    raw = {"before_tool": [{"matcher": "shell", "command": "./check.sh"}]}
    _hook_run(tmp_path, ws, raw)
    assert not (outside / "hook").exists()
    _hook_run(
        tmp_path / "again", ws, {"before_tool": [{**raw["before_tool"][0], "sandbox": False}]}
    )
    assert (outside / "hook").read_text() == "escaped\n"  # your own config's explicit choice
    with pytest.raises(ConfigError, match="a project's hook always runs in the sandbox"):
        _hook_run(tmp_path / "p", ws, {"run_end": [{"command": "x", "sandbox": False}]}, True)


def test_a_hook_whose_json_is_broken_asks(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    said = _hook_run(tmp_path, ws, {"before_tool": [{"command": 'echo \'{"decision": "deny"\''}]})
    assert any("starts like JSON and is not" in line for line in said), said
