"""The system prompt: what it says, the project's AGENTS.md, and that the log pins it."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import platform
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import MemorySessionStore, SettingChanged
from kiso.providers.base import ModelRequest, StreamEvent
from kiso.providers.faux import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.prompt import (
    BASE_PROMPT,
    INSTRUCTIONS_CAP,
    build_system_prompt,
    estimate_tokens,
    find_instructions,
    git_summary,
)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "trunk")
    return path


# --------------------------------------------------------------------------- what it says


def test_it_says_how_to_work_where_it_is_and_what_day_it_is(tmp_path: Path) -> None:
    prompt = build_system_prompt(tmp_path, today=dt.date(2026, 12, 1))
    text = prompt.text
    assert text.startswith(BASE_PROMPT)
    for needle in ("Read before you edit", "edit_file", "run the project's checks", "brief"):
        assert needle in text
    assert str(tmp_path.resolve()) in text
    assert "2026-12-01" in text
    assert platform.system() in text and "/bin/" in text  # the OS and the shell tool's shell
    assert "not a git repository" in text
    assert prompt.sources == ()
    assert prompt.tokens == estimate_tokens(text) and 100 < prompt.tokens < 1500  # short


def test_system_prompt_file_replaces_the_instructions_and_append_comes_last(
    tmp_path: Path,
) -> None:
    prompt = build_system_prompt(tmp_path, base="You are a pirate.", append="Say arr.")
    assert prompt.text.startswith("You are a pirate.")
    assert BASE_PROMPT not in prompt.text
    assert str(tmp_path.resolve()) in prompt.text  # the environment is still there
    assert prompt.text.rstrip().endswith("Say arr.")


def test_the_git_branch_and_a_short_status(tmp_path: Path) -> None:
    ws = repo(tmp_path / "r")
    (ws / "a.txt").write_text("a\n")
    git(ws, "add", "a.txt")
    git(ws, "commit", "-qm", "one")
    assert git_summary(ws) == "branch trunk; clean"
    (ws / "a.txt").write_text("changed\n")
    (ws / "new.txt").write_text("n\n")
    summary = git_summary(ws)
    assert summary is not None
    assert summary.startswith("branch trunk; 2 changed")
    assert " M a.txt" in summary and "?? new.txt" in summary
    assert "Git: branch trunk; 2 changed" in build_system_prompt(ws).text


def test_a_long_status_is_cut_and_counted(tmp_path: Path) -> None:
    ws = repo(tmp_path / "r")
    for i in range(25):
        (ws / f"f{i:02}.txt").write_text("x")
    summary = git_summary(ws)
    assert summary is not None
    assert "25 changed" in summary and "… and 15 more" in summary
    assert summary.count("?? f") == 10


def test_reading_the_status_runs_no_program_the_repository_names(tmp_path: Path) -> None:
    """A repository that arrived with its .git/config (an archive, a model's files): its clean
    filter, fsmonitor and hooks must not run when kiso builds the prompt."""
    ws = repo(tmp_path / "r")
    marker = tmp_path / "pwned"
    (ws / "a.txt").write_text("one\n")
    git(ws, "add", "a.txt")
    git(ws, "commit", "-qm", "one")
    evil = f"sh -c 'touch {marker}'; cat"
    git(ws, "config", "filter.p.clean", evil)
    git(ws, "config", "filter.p.process", f"touch {marker}")
    git(ws, "config", "core.fsmonitor", f"touch {marker}; false")
    (ws / ".git" / "info" / "attributes").write_text("* filter=p\n")
    (ws / "a.txt").write_text("two\n")
    os.utime(ws / "a.txt", (0, 0))  # stat-dirty: git must look at the content
    # The same repository does run the program for a plain git (the test would mean nothing
    # otherwise).
    subprocess.run(["git", "diff", "--stat"], cwd=ws, capture_output=True, check=False)
    assert marker.exists()
    marker.unlink()
    summary = git_summary(ws)
    assert summary is not None and "a.txt" in summary
    assert not marker.exists()


# --------------------------------------------------------------------------- AGENTS.md


def test_agents_md_from_the_git_root_down_nearest_last(tmp_path: Path) -> None:
    root = repo(tmp_path / "r")
    ws = root / "pkg" / "app"
    ws.mkdir(parents=True)
    (tmp_path / "AGENTS.md").write_text("ABOVE THE REPO")  # outside the repository: not read
    (root / "AGENTS.md").write_text("ROOT RULES")
    (root / "pkg" / "CLAUDE.md").write_text("PKG CLAUDE")  # no AGENTS.md here: CLAUDE.md
    (ws / "AGENTS.md").write_text("APP RULES")
    (ws / "CLAUDE.md").write_text("APP CLAUDE")  # AGENTS.md wins in the same directory
    found = find_instructions(ws)
    assert [f.text for f in found] == ["ROOT RULES", "PKG CLAUDE", "APP RULES"]
    text = build_system_prompt(ws).text
    assert text.index("ROOT RULES") < text.index("PKG CLAUDE") < text.index("APP RULES")
    assert "ABOVE THE REPO" not in text and "APP CLAUDE" not in text
    assert '<instructions path="../../AGENTS.md">' in text


def test_outside_a_repository_only_the_workspace_is_read(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "AGENTS.md").write_text("PARENT")
    (ws / "AGENTS.md").write_text("HERE")
    assert [f.text for f in find_instructions(ws)] == ["HERE"]


def test_instructions_are_capped_and_the_cut_is_said(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("x" * (INSTRUCTIONS_CAP + 5000))
    (found,) = find_instructions(ws)
    assert found.truncated and len(found.text) == INSTRUCTIONS_CAP
    assert f"capped at {INSTRUCTIONS_CAP} bytes" in build_system_prompt(ws).text


def test_a_symlink_out_of_the_repository_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    ws = repo(tmp_path / "r")
    (ws / "AGENTS.md").symlink_to(secret)
    (ws / "CLAUDE.md").write_text("fallback")
    assert "PRIVATE KEY" not in build_system_prompt(ws).text
    assert [f.text for f in find_instructions(ws)] == ["fallback"]
    (ws / "docs").mkdir()
    (ws / "docs" / "agents.md").write_text("inside")
    (ws / "AGENTS.md").unlink()
    (ws / "AGENTS.md").symlink_to(ws / "docs" / "agents.md")  # inside: fine
    assert [f.text for f in find_instructions(ws)] == ["inside"]


def test_a_fifo_named_agents_md_does_not_hang(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "AGENTS.md")
    assert find_instructions(ws) == []


# --------------------------------------------------------------------------- the log pins it


class Recording(FauxAdapter):
    """The scripted model, keeping every request's system prompt."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        super().__init__(turns)
        self.systems: list[str | None] = []

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.systems.append(request.system)
        return super().stream(request)


def run(agent: Agent, session_id: str, prompt: str, **kw: Any) -> None:
    async def go() -> None:
        with agent.session(session_id, **kw) as session:
            async for _ in session.run(prompt):
                pass

    asyncio.run(go())


def system_records(store: MemorySessionStore, session_id: str) -> list[Any]:
    return [
        e.value
        for e in store.load(session_id).events
        if isinstance(e, SettingChanged) and e.key == "system_prompt"
    ]


def test_the_prompt_is_recorded_once_and_a_resume_keeps_it(tmp_path: Path) -> None:
    store = MemorySessionStore()
    first = Recording([{"text": "one"}, {"text": "two"}])
    agent = Agent(adapter=first, store=store, workspace=tmp_path, system_prompt="AGENTS says A")
    run(agent, "s1", "hi")
    run(agent, "s1", "again")
    assert first.systems == ["AGENTS says A", "AGENTS says A"]
    assert system_records(store, "s1") == ["AGENTS says A"]  # recorded once
    # AGENTS.md changed since: a new agent builds another prompt, the session keeps its own.
    later = Recording([{"text": "one"}, {"text": "two"}, {"text": "three"}])
    agent2 = Agent(adapter=later, store=store, workspace=tmp_path, system_prompt="AGENTS says B")
    run(agent2, "s1", "third")
    assert later.systems == ["AGENTS says A"]
    with agent2.session("s1") as session:
        assert session.system_prompt == "AGENTS says A"
    # A new session gets the new prompt.
    run(agent2, "s2", "hi")
    assert system_records(store, "s2") == ["AGENTS says B"]


def test_opening_with_a_system_prompt_changes_it_and_records_the_change(tmp_path: Path) -> None:
    store = MemorySessionStore()
    adapter = Recording([{"text": "one"}, {"text": "two"}])
    agent = Agent(adapter=adapter, store=store, workspace=tmp_path, system_prompt="first")
    run(agent, "s", "hi")
    run(agent, "s", "again", system_prompt="second")
    assert adapter.systems == ["first", "second"]
    assert system_records(store, "s") == ["first", "second"]
    run(agent, "s", "same", system_prompt="second")  # no change: nothing more recorded
    assert system_records(store, "s") == ["first", "second"]


def test_an_agent_without_a_system_prompt_records_none(tmp_path: Path) -> None:
    store = MemorySessionStore()
    adapter = Recording([{"text": "one"}])
    run(Agent(adapter=adapter, store=store, workspace=tmp_path), "s", "hi")
    assert adapter.systems == [None]
    assert system_records(store, "s") == []


@pytest.mark.parametrize("name", ["demo-kill9-recovered", "scripted-3-runs"])
def test_v1_logs_without_a_recorded_prompt_load_and_keep_the_agents(
    tmp_path: Path, name: str
) -> None:
    """A v1 log (no system prompt recorded) still loads; its next request sends the agent's
    prompt and records it."""
    import shutil

    from kiso.kernel import JsonlSessionStore
    from kiso.kernel.jsonl import parse_log

    corpus = Path(__file__).parents[1] / "corpus" / "v1" / f"{name}.jsonl"
    log = parse_log(corpus.read_bytes())
    store = JsonlSessionStore(tmp_path / "home")
    ws = Path(log.header.workspace)
    with store.create(str(ws), session_id="probe") as probe:
        folder = Path(probe.path or "").parent
    shutil.copy(corpus, folder / f"{log.header.id}.jsonl")
    assert store.load(log.header.id).events == log.events
    from kiso.kernel import replay

    assert replay(log.events).system_prompt is None
