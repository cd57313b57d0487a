"""Command hooks (``hooks`` in config): real commands given the event on stdin, in real runs.

A ``before_tool`` hook denies (exit 2, its stderr the reason the model reads) or asks (JSON on
stdout), never allows; a failure or a timeout is loud and counts as an ask (denied headless); an
``after_tool`` hook's output is added to the tool result; a ``run_end`` hook is told the outcome.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import (
    ApprovalDecided,
    ApprovalRequested,
    ExecutionFinished,
    JsonlSessionStore,
    RunEnded,
    ToolResultMessage,
    project,
)
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.command_hooks import CommandHooks, parse_hooks
from kiso.runtime.config import ConfigError, load_config
from kiso.tools import builtin_tools


class Reports:
    """What the hooks said out loud to the person."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def hooks(ws: Path, raw: dict[str, Any], reports: Reports, **kw: Any) -> CommandHooks:
    specs = parse_hooks(ws / "config.json", raw)
    return CommandHooks(specs, workspace=ws, report=reports, **kw)


def agent(tmp_path: Path, turns: list[dict[str, Any]], command_hooks: CommandHooks, mode: str):  # type: ignore[no-untyped-def]
    ws = tmp_path / "ws"
    return Agent(
        adapter=FauxAdapter(turns),
        tools=builtin_tools(),
        workspace=ws,
        home=tmp_path / "home",
        store=JsonlSessionStore(tmp_path / "home"),
        mode=mode,
        rules=tmp_path / "home" / "rules",
        hooks=command_hooks.hooks,
    )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


def shell(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "shell", "input": {"command": command}}]}


def results(events: Any) -> list[ToolResultMessage]:
    return [m for m in project(events) if isinstance(m, ToolResultMessage)]


# ------------------------------------------------------------------------------- before_tool


def test_exit_2_denies_and_the_model_reads_the_hooks_stderr(tmp_path: Path, ws: Path) -> None:
    check = ws / "check.sh"
    check.write_text(
        "#!/bin/sh\ncat > seen.json\necho 'no network from this repo: use the cache' >&2\nexit 2\n"
    )
    check.chmod(0o755)
    said = Reports()
    raw = {"before_tool": [{"matcher": "shell", "command": "./check.sh", "timeout": 10}]}
    a = agent(tmp_path, [shell("touch made.txt"), {"text": "ok"}], hooks(ws, raw, said), "bypass")
    with a.session("s1") as s:
        list(s.run_sync("go"))
        (decided,) = [e for e in s.events if isinstance(e, ApprovalDecided)]
        run_id = decided.run
        (result,) = results(s.events)
    assert (decided.decision, decided.decided_by) == ("denied", "hook:before_tool[0]:./check.sh")
    assert decided.reason == "no network from this repo: use the cache"
    assert "no network from this repo: use the cache" in result.content and result.is_error
    assert not (ws / "made.txt").exists()  # bypass would have run it: the hook tightened it
    event = json.loads((ws / "seen.json").read_text())
    assert event == {
        "event": "before_tool",
        "session_id": "s1",
        "run_id": run_id,
        "workspace": str(ws),
        "mode": "bypass",
        "tool": "shell",
        "input": {"command": "touch made.txt"},
        "call_id": event["call_id"],
    }
    assert event["call_id"] and said.lines == []


def test_json_ask_puts_the_call_to_a_person(tmp_path: Path, ws: Path) -> None:
    said = Reports()
    raw = {"before_tool": [{"command": """echo '{"decision": "ask", "reason": "looks risky"}'"""}]}
    a = agent(tmp_path, [shell("touch made.txt"), {"text": "ok"}], hooks(ws, raw, said), "bypass")
    with a.session("s1") as s:
        kinds = [e.type for e in s.run_sync("go")]
        (asked,) = [e for e in s.events if isinstance(e, ApprovalRequested)]
    assert kinds[-1] == "paused"
    assert asked.speaker.startswith("hook:before_tool[0]:echo")
    assert said.lines == [f"{asked.speaker} asks about this shell call: looks risky"]
    assert not (ws / "made.txt").exists()


def test_a_call_with_a_verdict_on_disk_is_never_put_to_the_hook_again(
    tmp_path: Path, ws: Path
) -> None:
    count = ws / "count"
    raw = {"before_tool": [{"command": f'echo ran >> {count}; echo \'{{"decision": "ask"}}\''}]}
    turns = [shell("echo hi > out.txt"), {"text": "ok"}]
    with agent(tmp_path, turns, hooks(ws, raw, Reports()), "bypass").session("s1") as s:
        assert [e.type for e in s.run_sync("go")][-1] == "paused"
    assert count.read_text() == "ran\n"
    again = agent(tmp_path, turns, hooks(ws, raw, Reports()), "bypass")  # a new process
    with again.session("s1") as s:
        kinds = [e.type for e in s.resume_sync()]
        assert kinds[-1] == "paused" and count.read_text() == "ran\n"  # asked again, not re-run
        (asked,) = [e for e in s.events if isinstance(e, ApprovalRequested)]
        s.approve(asked.call_id)
        assert [e.type for e in s.resume_sync()][-1] == "terminal"
    assert (ws / "out.txt").read_text() == "hi\n" and count.read_text() == "ran\n"


def test_a_hook_saying_allow_cannot_allow_what_the_mode_asks_about(
    tmp_path: Path, ws: Path
) -> None:
    said = Reports()
    raw = {"before_tool": [{"matcher": "*", "command": """echo '{"decision": "allow"}'"""}]}
    a = agent(tmp_path, [shell("touch made.txt"), {"text": "ok"}], hooks(ws, raw, said), "default")
    with a.session("s1") as s:
        list(s.run_sync("go"))
        (asked,) = [e for e in s.events if isinstance(e, ApprovalRequested)]
    assert asked.speaker == "mode:default"
    assert not (ws / "made.txt").exists()
    assert len(said.lines) == 1 and "may never" in said.lines[0]  # refused out loud


def test_a_timeout_is_loud_counts_as_an_ask_and_is_denied_headless(
    tmp_path: Path, ws: Path
) -> None:
    said = Reports()
    count = ws / "count"
    raw = {"before_tool": [{"command": f"echo ran >> {count}; exec sleep 60", "timeout": 0.5}]}
    a = agent(tmp_path, [shell("touch made.txt"), {"text": "ok"}], hooks(ws, raw, said), "bypass")
    with a.session("s1", headless=True) as s:
        list(s.run_sync("go"))
        (decided,) = [e for e in s.events if isinstance(e, ApprovalDecided)]
        (result,) = results(s.events)
    assert (decided.decision, decided.decided_by) == ("denied", "headless")
    assert "hook:before_tool[0]:" in (decided.reason or "") and "timed out" in (
        decided.reason or ""
    )
    assert "timed out after 0.5s" in result.content
    assert len(said.lines) == 1 and "timed out after 0.5s" in said.lines[0]
    assert count.read_text() == "ran\n"  # once per call, though the chain was composed again
    assert not (ws / "made.txt").exists()


def test_a_failing_hook_counts_as_an_ask_and_its_stderr_is_recorded(
    tmp_path: Path, ws: Path
) -> None:
    said = Reports()
    raw = {"before_tool": [{"command": "echo 'lint config missing' >&2; exit 3"}]}
    a = agent(tmp_path, [shell("ls"), {"text": "ok"}], hooks(ws, raw, said), "bypass")
    with a.session("s1", headless=True) as s:
        list(s.run_sync("go"))
        (decided,) = [e for e in s.events if isinstance(e, ApprovalDecided)]
    assert decided.decision == "denied"
    assert "failed (exit 3): lint config missing" in (decided.reason or "")
    assert "exit 3" in said.lines[0]


def test_the_matcher_is_a_regex_on_the_whole_tool_name(tmp_path: Path, ws: Path) -> None:
    raw = {
        "before_tool": [
            {"matcher": "edit_file|write_file", "command": "echo edit >> hits; exit 2"},
            {"matcher": "shel", "command": "echo shel >> hits; exit 2"},
        ]
    }
    a = agent(
        tmp_path, [shell("echo hi > out.txt"), {"text": "ok"}], hooks(ws, raw, Reports()), "bypass"
    )
    with a.session("s1") as s:
        list(s.run_sync("go"))
        (decided,) = [e for e in s.events if isinstance(e, ApprovalDecided)]
    assert (decided.decision, decided.decided_by) == ("approved", "mode:bypass")
    assert (ws / "out.txt").read_text() == "hi\n" and not (ws / "hits").exists()


def test_a_hook_gets_the_child_environment_without_credentials(tmp_path: Path, ws: Path) -> None:
    environ = {
        "PATH": os.environ["PATH"],
        "MY_API_KEY": "sk-secret",
        "PROFILE_VAR": "x",
        "LANG": "C",
    }
    raw = {"after_tool": [{"command": "env > env.txt"}]}
    made = hooks(ws, raw, Reports(), environ=environ, strip_env=["PROFILE_VAR"])
    turns = [{"tool_calls": [{"name": "write_file", "input": {"path": "a.txt", "content": "a"}}]}]
    a = agent(tmp_path, [*turns, {"text": "ok"}], made, "bypass")
    with a.session("s9") as s:
        list(s.run_sync("go"))
    env = dict(
        line.split("=", 1) for line in (ws / "env.txt").read_text().splitlines() if "=" in line
    )
    assert "MY_API_KEY" not in env and "PROFILE_VAR" not in env and env["LANG"] == "C"
    assert env["KISO_SESSION_ID"] == "s9" and env["KISO_WORKSPACE"] == str(ws)
    assert env["KISO_HOOK_EVENT"] == "after_tool" and env["KISO_TOOL_NAME"] == "write_file"
    assert env["KISO_TOOL_PATH"] == "a.txt" and env["KISO_RUN_ID"]


# ------------------------------------------------------------------------------- after_tool


def test_after_tool_output_is_added_to_the_result_the_model_reads(tmp_path: Path, ws: Path) -> None:
    fmt = (
        'tr a-z A-Z < "$KISO_TOOL_PATH" > .t && mv .t "$KISO_TOOL_PATH"; cat > seen.json; '
        'echo "formatted $KISO_TOOL_PATH"'
    )
    raw = {"after_tool": [{"matcher": "write_file", "command": fmt}]}
    turns = [
        {"tool_calls": [{"name": "write_file", "input": {"path": "a.txt", "content": "hello"}}]},
        {"text": "ok"},
    ]
    a = agent(tmp_path, turns, hooks(ws, raw, Reports()), "bypass")
    with a.session("s1") as s:
        list(s.run_sync("go"))
        (result,) = results(s.events)
        (finished,) = [e for e in s.events if isinstance(e, ExecutionFinished)]
    assert (ws / "a.txt").read_text() == "HELLO"
    assert result.content.startswith("wrote 5 bytes to a.txt")
    assert result.content.endswith(" said]\nformatted a.txt")
    assert "\n\n[hook:after_tool[0]:tr a-z A-Z" in result.content
    assert not result.is_error and "formatted a.txt" in json.dumps(finished.to_json())
    seen = json.loads((ws / "seen.json").read_text())
    assert seen["event"] == "after_tool" and seen["tool"] == "write_file"
    assert seen["result"]["is_error"] is False and seen["input"]["path"] == "a.txt"


def test_a_failing_after_tool_hook_is_noted_loudly_and_keeps_is_error(
    tmp_path: Path, ws: Path
) -> None:
    said = Reports()
    raw = {"after_tool": [{"command": "echo boom >&2; exit 1"}]}
    a = agent(tmp_path, [shell("echo fine"), {"text": "ok"}], hooks(ws, raw, said), "bypass")
    with a.session("s1") as s:
        list(s.run_sync("go"))
        (result,) = results(s.events)
    assert "fine" in result.content and not result.is_error
    assert "[hook:after_tool[0]:echo boom >&2; exit 1 failed (exit 1): boom]" in result.content
    assert len(said.lines) == 1 and "failed (exit 1)" in said.lines[0]


# ------------------------------------------------------------------------------- run_end


def test_run_end_is_told_the_outcome_after_it_is_durable(tmp_path: Path, ws: Path) -> None:
    said = Reports()
    log = tmp_path / "home" / "projects"
    raw = {
        "run_end": [
            {"command": f"cat > end.json; grep -rh '\"run_ended\"' {log} > on-disk.txt"},
            {"command": "echo nope >&2; exit 2"},
        ]
    }
    a = agent(tmp_path, [{"text": "done"}], hooks(ws, raw, said), "default")
    with a.session("s1") as s:
        list(s.run_sync("go"))
        (ended,) = [e for e in s.events if isinstance(e, RunEnded)]
    end = json.loads((ws / "end.json").read_text())
    assert end["event"] == "run_end" and end["outcome"] == {"kind": "completed"}
    assert end["session_id"] == "s1" and end["run_id"] == ended.run
    assert json.loads((ws / "on-disk.txt").read_text())["run"] == ended.run  # durable first
    assert ended.outcome.kind == "completed"  # the failing one changed nothing
    assert len(said.lines) == 1
    assert "hook:run_end[1]:echo nope >&2; exit 2 failed (exit 2): nope" in said.lines[0]


# ------------------------------------------------------------------------------- config


def test_user_then_project_hooks_are_both_loaded(tmp_path: Path, ws: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"hooks": {"run_end": [{"command": "a"}]}}))
    (ws / ".kiso").mkdir()
    (ws / ".kiso" / "config.json").write_text(
        json.dumps({"hooks": {"run_end": [{"command": "b"}], "before_tool": [{"command": "c"}]}})
    )
    config = load_config(home, ws, environ={})
    assert [(h.event, h.command) for h in config.hooks] == [
        ("run_end", "a"),
        ("run_end", "b"),
        ("before_tool", "c"),
    ]
    assert load_config(home, ws, environ={}, project=False).hooks[0].command == "a"
    names = [h.name for h in CommandHooks(config.hooks, workspace=ws).hooks]
    assert names == ["hook:run_end[0]:a", "hook:run_end[1]:b", "hook:before_tool[0]:c"]


@pytest.mark.parametrize(
    ("hooks_value", "said"),
    [
        ([], "hooks: must be an object"),
        ({"PreToolUse": []}, "hooks.PreToolUse: unknown hook event; known: before_tool"),
        ({"before_tol": []}, "hooks.before_tol: unknown hook event; did you mean before_tool?"),
        ({"before_tool": {}}, "hooks.before_tool: must be a list"),
        ({"before_tool": ["ls"]}, "hooks.before_tool[0]: must be an object"),
        (
            {"after_tool": [{"command": "x", "matchr": "a"}]},
            "hooks.after_tool[0].matchr: unknown key; did you mean matcher?",
        ),
        ({"before_tool": [{"command": ""}]}, "hooks.before_tool[0].command: must be the command"),
        (
            {"before_tool": [{"command": "x", "matcher": "(["}]},
            "hooks.before_tool[0].matcher: '([' is not a regular expression",
        ),
        ({"before_tool": [{"command": "x", "timeout": 0}]}, "before_tool[0].timeout: must be"),
        ({"before_tool": [{"command": "x", "timeout": 601}]}, "at most 600"),
        ({"before_tool": [{"command": "x", "timeout": True}]}, "got true"),
        (
            {"run_end": [{"command": "x", "matcher": "shell"}]},
            "hooks.run_end[0].matcher: run_end hooks have no matcher",
        ),
    ],
)
def test_bad_hooks_are_one_clear_error_naming_the_file_and_key(
    tmp_path: Path, hooks_value: object, said: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"hooks": hooks_value}))
    with pytest.raises(ConfigError) as exc:
        load_config(home, None, environ={})
    assert str(exc.value).startswith(f"{home / 'config.json'}: ")
    assert said in str(exc.value)
