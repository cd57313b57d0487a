"""MCP servers, skills, tasks and ask_user through the real ``kiso``: what the CLI loads, and what
a headless run does not (no question nobody can answer)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kiso.kernel import ApprovalDecided, ExecutionFinished, JsonlSessionStore, SettingChanged
from kiso.kernel.replay import SYSTEM_PROMPT_KEY

from .test_trust import faux, kiso


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    return folder


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "home"
    made.mkdir()
    return made


def receipts(home: Path, session: str = "s1") -> dict[str, ExecutionFinished]:
    events = JsonlSessionStore(home).load(session).events
    calls = {c.call_id: c.name for e in events if e.type == "assistant" for c in e.calls}  # type: ignore[attr-defined]
    return {calls[e.call_id]: e for e in events if isinstance(e, ExecutionFinished)}


def refused(home: Path, session: str = "s1") -> list[str]:
    """The runtime's refusals of calls to tools that do not exist (their reasons)."""
    events = JsonlSessionStore(home).load(session).events
    return [
        e.reason or ""
        for e in events
        if isinstance(e, ApprovalDecided) and e.decided_by == "runtime" and e.decision == "denied"
    ]


def test_an_mcp_servers_tools_are_offered_and_called_in_a_headless_run(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    (home / "mcp.json").write_text(
        json.dumps(
            {"mcpServers": {"time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]}}}
        )
    )
    turns = [
        {
            "tool_calls": [
                {"name": "mcp__time__get_current_time", "input": {"timezone": "Asia/Tokyo"}}
            ]
        },
        {"text": "it is late there"},
    ]
    got = kiso(ws, home, "--mode", "bypass", "-p", "time?", "s1",
               KISO_FAUX_SCRIPT=faux(tmp_path, *turns))  # fmt: skip
    assert got.returncode == 0, got.stderr
    done = receipts(home)["mcp__time__get_current_time"]
    assert done.ok and not done.is_error and "Asia/Tokyo" in done.content


def test_a_bad_mcp_json_is_a_clear_error(tmp_path: Path, ws: Path, home: Path) -> None:
    (home / "mcp.json").write_text('{"mcpServers": {"x": {"args": []}}}')
    got = kiso(ws, home, "-p", "hi", KISO_FAUX_SCRIPT=faux(tmp_path, {"text": "hi"}))
    assert got.returncode != 0
    assert "mcp.json" in got.stderr and "Traceback" not in got.stderr


def test_skills_are_indexed_in_the_prompt_and_read_on_demand(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    skill = home / "skills" / "release"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: release\ndescription: cut a release of this project\n---\n"
        "1. bump the version\n2. tag it\n"
    )
    turns = [
        {"tool_calls": [{"name": "read_skill", "input": {"name": "release"}}]},
        {"text": "ok"},
    ]
    got = kiso(ws, home, "-p", "release it", "s1", KISO_FAUX_SCRIPT=faux(tmp_path, *turns))
    assert got.returncode == 0, got.stderr
    events = JsonlSessionStore(home).load("s1").events
    prompt = next(
        e.value for e in events if isinstance(e, SettingChanged) and e.key == SYSTEM_PROMPT_KEY
    )
    assert "- release: cut a release of this project" in str(prompt)
    done = receipts(home)["read_skill"]
    assert done.ok and "bump the version" in done.content


def test_tasks_are_offered_only_when_the_config_turns_them_on(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    turns = [
        {"tool_calls": [{"name": "update_tasks",
                         "input": {"tasks": [{"content": "write it", "status": "active"}]}}]},
        {"text": "ok"},
    ]  # fmt: skip
    off = kiso(ws, home, "-p", "plan", "s1", KISO_FAUX_SCRIPT=faux(tmp_path, *turns))
    assert off.returncode == 0, off.stderr
    assert any("no tool named 'update_tasks'" in r for r in refused(home, "s1"))
    (home / "config.json").write_text(json.dumps({"tasks": True}))
    on = kiso(ws, home, "-p", "plan", "s2", KISO_FAUX_SCRIPT=faux(tmp_path, *turns))
    assert on.returncode == 0, on.stderr
    done = receipts(home, "s2")["update_tasks"]
    assert done.ok and not done.is_error and "write it" in done.content


def test_ask_user_is_not_offered_in_a_headless_run(tmp_path: Path, ws: Path, home: Path) -> None:
    question = {"question": "Which?", "options": [{"label": "a"}, {"label": "b"}]}
    turns = [
        {"tool_calls": [{"name": "ask_user", "input": {"questions": [question]}}]},
        {"text": "ok"},
    ]
    got = kiso(ws, home, "-p", "ask me", "s1", KISO_FAUX_SCRIPT=faux(tmp_path, *turns))
    assert got.returncode == 0, got.stderr
    assert any("no tool named 'ask_user'" in r for r in refused(home))  # never loaded


def test_ask_user_asks_in_the_interactive_panel_and_skills_run_as_commands(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    from .test_repl import Term, chat

    skill = home / "skills" / "release"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: release\ndescription: cut a release\n---\nbump, tag, push\n"
    )
    question = {
        "question": "Which database?",
        "options": [
            {"label": "SQLite", "description": "one file"},
            {"label": "PostgreSQL", "description": "a server"},
        ],
    }
    checks = {
        "question": "Which checks?",
        "options": [{"label": "lint"}, {"label": "types"}, {"label": "tests"}],
        "multiSelect": True,
    }
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {
                        "tool_calls": [
                            {"name": "ask_user", "input": {"questions": [question, checks]}}
                        ]
                    },
                    {"text": "noted"},
                    {"text": "releasing"},
                ]
            }
        )
    )
    term = Term(chat("a1"), cwd=ws, home=home, script=script)
    try:
        term.wait_for("▸ ")
        term.send("/skills\r")
        term.wait_for("/release")
        term.send("pick one\r")
        term.wait_for("Which database?")
        term.wait_for("PostgreSQL")
        term.send("2")  # the second row
        term.wait_for("Which checks?")
        term.send("3")  # checks "tests"
        term.send(" ")  # space checks the highlighted row too ("tests" again: unchecked)
        term.send("1")  # checks "lint"
        term.send("\r")  # confirms the set
        term.wait_for("noted", timeout=15)
        term.send("/release v2\r")  # a skill is a command: an ordinary user turn
        term.wait_for("releasing", timeout=15)
        term.send("/status\r")  # the skills' prompt rent is shown
        term.wait_for("skills     1 · rent")
        term.send("/exit\r")  # a clean exit: what was staged is durable
        assert term.exit_status(15) == 0
    finally:
        term.close()
    events = JsonlSessionStore(home).load("a1").events
    answered = next(
        e for e in events if isinstance(e, ExecutionFinished) and "PostgreSQL" in e.content
    )
    assert answered.ok and not answered.is_error
    assert "1. Which database?\n   -> PostgreSQL" in answered.content
    assert "2. Which checks?\n   -> lint\n" in answered.content + "\n"  # tests unchecked again
    inputs = [e.text for e in events if e.type == "user"]  # type: ignore[attr-defined]
    assert inputs[0] == "pick one" and "release" in inputs[1] and "v2" in inputs[1]


def test_the_header_names_the_skills_and_mcp_servers_that_loaded(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    skill = home / "skills" / "release"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: release\ndescription: cut a release\n---\nbody\n")
    (home / "mcp.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},
                    "gone": {"command": str(tmp_path / "no-such-server")},
                }
            }
        )
    )
    got = kiso(ws, home, "-p", "hi", KISO_FAUX_SCRIPT=faux(tmp_path, {"text": "hi"}))
    assert got.returncode == 0, got.stderr
    assert "skills: release (user)" in got.stderr
    assert "mcp: " in got.stderr and "time (ready)" in got.stderr and "gone (failed)" in got.stderr
