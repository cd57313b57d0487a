"""update_tasks: validation, the list read back from the log, and durability across kill -9.

This file is also the agent process of its crash test:

    python -m tests.runtime.test_tasks HOME WORKSPACE SESSION run|resume

The model saves a list, calls ``effect`` (a side effect in WORKSPACE/effects.log), saves a second
list and ends; on resume an uncertain ``effect`` is ruled ``rerun``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kiso.kernel import (
    Compacted,
    ExecutionFinished,
    JsonlSessionStore,
    MemorySessionStore,
    RunEnded,
)
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.config import ConfigError, load_config
from kiso.runtime.stream import UncertainPending
from kiso.tools.base import ToolContext, define_tool
from kiso.tools.tasks import (
    MAX_TASKS,
    Task,
    TaskListError,
    current_tasks,
    parse_tasks,
    render_tasks,
    update_tasks_tool,
)

ROOT = Path(__file__).resolve().parents[2]
FIRST = [
    {"content": "read the code", "status": "active"},
    {"content": "fix it", "status": "pending"},
]
SECOND = [{"content": "read the code", "status": "done"}, {"content": "fix it", "status": "active"}]


def save(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": "update_tasks", "input": {"tasks": tasks}}]}


def test_a_valid_list_is_normalized() -> None:
    assert parse_tasks([{"content": "  two   words ", "status": "done"}]) == (
        Task("two words", "done"),
    )
    assert parse_tasks([]) == ()


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"content": "x"}, "must be a list"),
        ([{"content": "a", "status": "active"}, {"content": "b", "status": "active"}],
         "items 1, 2 are all active"),
        ([{"content": "", "status": "pending"}], r"tasks\[1\].content"),
        ([{"content": "a", "status": "started"}], r"tasks\[1\].status: must be pending"),
        ([{"content": "a", "status": "done", "owner": "me"}], "unknown keys"),
        ([{"content": "a", "status": "done"}] * (MAX_TASKS + 1), f"at most {MAX_TASKS}"),
        ([{"content": "a" * 501, "status": "done"}], "at most 500"),
    ],
)  # fmt: skip
def test_a_bad_list_names_the_problem(raw: Any, said: str) -> None:
    with pytest.raises(TaskListError, match=said):
        parse_tasks(raw)


def test_the_list_is_read_back_from_the_log_and_a_bad_update_changes_nothing(
    tmp_path: Path,
) -> None:
    two_active = [{"content": "a", "status": "active"}, {"content": "b", "status": "active"}]
    agent = Agent(
        adapter=FauxAdapter([save(FIRST), save(two_active), {"text": "done"}]),
        tools=[update_tasks_tool()],
        store=MemorySessionStore(),
        workspace=tmp_path,
        mode="default",
    )
    with agent.session("s") as session:
        seen = [ev.type for ev in session.run_sync("plan it")]
        events = list(session.events)
    assert "approval_request" not in seen
    ok, bad = [e for e in events if isinstance(e, ExecutionFinished)]
    assert not ok.is_error and '"read the code"' in ok.content
    assert bad.is_error and "all active" in bad.content and "not changed" in bad.content
    assert current_tasks(events) == [Task("read the code", "active"), Task("fix it", "pending")]
    compacted = Compacted(
        run="r", covers_to_seq=events[-1].seq, summary="s", trigger="manual",
        tokens_before=None, tokens_after=None,
    )  # fmt: skip
    assert current_tasks([*events, compacted]) == current_tasks(events)  # a summary keeps it


def test_no_update_means_no_tasks() -> None:
    assert current_tasks([]) == []


def test_the_checklist_marks_each_status() -> None:
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(
        render_tasks([Task("a", "done"), Task("b", "active"), Task("c")])
    )
    assert out.getvalue().splitlines() == ["[x] a", "[>] b", "[ ] c"]


def test_tasks_is_an_opt_in_config_key(home: Path, workspace: Path) -> None:
    assert load_config(home, workspace, environ={}).tasks is False
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.json").write_text('{"tasks": true}')
    assert load_config(home, workspace, environ={}).tasks is True
    (home / "config.json").write_text('{"tasks": "yes"}')
    with pytest.raises(ConfigError, match="tasks: must be true or false"):
        load_config(home, workspace, environ={})


# ------------------------------------------------------------------------------- kill -9


def _effect(args: dict[str, Any], ctx: ToolContext) -> str:
    with open(ctx.workspace / "effects.log", "a", encoding="utf-8") as f:
        f.write(args["tag"] + "\n")
    return f"effect {args['tag']}"


def driver(home: str, ws: str, session_id: str, command: str) -> int:
    obj = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
    turns: list[Mapping[str, Any]] = [
        save(FIRST),
        {"tool_calls": [{"name": "effect", "input": {"tag": "fixed"}}]},
        save(SECOND),
        {"text": "done"},
    ]
    agent = Agent(
        adapter=FauxAdapter(turns),
        tools=[
            update_tasks_tool(),
            define_tool("effect", "Record a side effect", obj, _effect, effects="other"),
        ],
        store=JsonlSessionStore(home),
        workspace=Path(ws),
        mode="bypass",
    )
    with agent.session(session_id) as session:
        events = session.run_sync("fix it") if command == "run" else session.resume_sync()
        for ev in events:
            if isinstance(ev, UncertainPending):
                for u in ev.executions:
                    if not u.auto_rerun:
                        session.resolve(u.execution_id, "rerun")
    return 0


def test_the_list_survives_kill9_and_resume_continues_it(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    argv = [sys.executable, "-m", "tests.runtime.test_tasks", str(home), str(ws), "k9"]
    env = {k: v for k, v in os.environ.items() if k not in ("KISO_FAILPOINT", "KISO_FAUX_SCRIPT")}
    killed = subprocess.run(
        [*argv, "run"], cwd=ROOT, env={**env, "KISO_FAILPOINT": "execution_finished"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = JsonlSessionStore(home).load("k9").events
    assert not any(isinstance(e, RunEnded) for e in before)
    assert current_tasks(before) == [Task("read the code", "active"), Task("fix it")]

    resumed = subprocess.run(
        [*argv, "resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    after = JsonlSessionStore(home).load("k9").events
    assert isinstance(after[-1], RunEnded) and after[-1].outcome.kind == "completed"
    assert current_tasks(after) == [Task("read the code", "done"), Task("fix it", "active")]
    assert (ws / "effects.log").read_text() == "fixed\n"


if __name__ == "__main__":
    sys.exit(driver(*sys.argv[1:]))
