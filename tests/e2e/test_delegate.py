"""``delegate`` end to end: a real parent ``kiso -p``, real child kiso processes, real git
worktrees, every model scripted (``KISO_SUBAGENT_SCRIPTS``: one script per child). What is
asserted is on disk: the logs, the files, the worktrees, the processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.processes import alive

BIN = Path(sys.executable).parent / "kiso"
_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_MODEL", "KISO_MODE")


class World:
    """A home, a git repository with one commit, a scripts directory, a parent session."""

    def __init__(self, tmp_path: Path, *, git: bool = True) -> None:
        self.root = tmp_path
        self.home = tmp_path / "home"
        self.ws = tmp_path / "ws"
        self.scripts = tmp_path / "scripts"
        self.channel = tmp_path / "channel"
        """Where the children's commands leave what the test reads: outside their worktrees,
        so the user config makes it writable in their sandbox (docs/sandbox.md)."""
        for d in (self.home, self.ws, self.scripts, self.channel):
            d.mkdir()
        (self.home / "config.json").write_text(
            json.dumps({"sandbox": {"writableRoots": [str(self.channel)]}})
        )
        (self.ws / "a.txt").write_text("hello\n")
        if git:
            for args in (["init", "-q"], ["add", "a.txt"], ["commit", "-qm", "init"]):
                subprocess.run(["git", *args], cwd=self.ws, check=True, env=_git_env())

    def env(self, **extra: str) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in _KEYS and not k.startswith(("KISO_SUBAGENT_", "KISO_FAUX", "KISO_FAIL"))
        }
        base.update(
            KISO_HOME=str(self.home),
            KISO_FAUX_SCRIPT=str(self.root / "parent.json"),
            KISO_SUBAGENT_SCRIPTS=str(self.scripts),
        )
        base.update(extra)
        return base

    def parent(self, *turns: dict[str, Any]) -> None:
        _script(self.root / "parent.json", *turns)

    def child(self, n: int, *turns: dict[str, Any]) -> None:
        _script(self.scripts / f"{n}.json", *turns)

    def delegate(self, *tasks: dict[str, Any], **env: str) -> subprocess.CompletedProcess[str]:
        self.parent(
            {"tool_calls": [{"name": "delegate", "input": {"tasks": list(tasks)}}]},
            {"text": "parent done"},
        )
        return self.kiso("-p", "go", "p1", "--mode", "bypass", **env)

    def kiso(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN), *args],
            cwd=self.ws,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def log(self, session: str) -> list[dict[str, Any]]:
        found = list(self.home.glob(f"projects/*/{session}.jsonl"))
        assert len(found) == 1, f"{session}: {found}"
        return [json.loads(line) for line in found[0].read_text().splitlines()]

    def has_log(self, session: str) -> bool:
        return any(self.home.glob(f"projects/*/{session}.jsonl"))

    def results(self, session: str = "p1") -> list[str]:
        return [e["content"] for e in self.log(session) if e["type"] == "execution_finished"]

    def child_ids(self) -> list[str]:
        return sorted(p.stem for p in self.home.glob("projects/*/sub-p1-*.jsonl"))


def _git_env() -> dict[str, str]:
    return {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }


def _script(path: Path, *turns: dict[str, Any]) -> None:
    path.write_text(json.dumps({"turns": list(turns)}))


def _call(name: str, **input: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "input": input}]}


def _denials(log: list[dict[str, Any]]) -> list[str]:
    return [
        str(e["reason"])
        for e in log
        if e["type"] == "approval_decided" and e["decision"] == "denied"
    ]


def _porcelain(ws: Path) -> str:
    done = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ws, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_an_explorer_reads_the_parent_workspace_and_has_no_write_tool(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.child(
        1,
        _call("read_file", path="a.txt"),
        _call("write_file", path="made.txt", content="x"),
        {"text": "a.txt says hello"},
    )
    out = w.delegate({"role": "explorer", "task": "What does a.txt say?"})
    assert out.returncode == 0, out.stderr
    [child] = w.child_ids()
    assert child.startswith("sub-p1-") and child.endswith("-1-explorer")
    log = w.log(child)
    assert log[0]["parent"] == "p1" and log[0]["workspace"] == str(w.ws)
    assert [e["trigger"] for e in log if e["type"] == "run_started"] == ["subagent"]
    names = [e["name"] for e in log if e["type"] == "execution_started"]
    assert names == ["read_file"]  # write_file is not an explorer's tool: it never ran
    [read] = [e for e in log if e["type"] == "execution_finished"]
    assert "hello" in read["content"]
    assert not (w.ws / "made.txt").exists()  # write_file is not an explorer's tool
    assert not (w.home / "worktrees").exists()  # explorers work in place
    [result] = w.results()
    assert "1 of 1 subagent tasks completed" in result and "a.txt says hello" in result
    assert "outcome: completed · 2 tool call(s)" in result


def test_an_implementer_works_in_a_worktree_and_its_diff_comes_back(tmp_path: Path) -> None:
    w = World(tmp_path)
    (w.home / "config.json").write_text(
        json.dumps({"subagents": {"checks": {"has-b": "test -f b.txt && echo found b"}}})
    )
    w.child(
        1,
        _call("write_file", path="b.txt", content="brand new\n"),
        _call("edit_file", path="a.txt", edits=[{"oldText": "hello", "newText": "HELLO"}]),
        _call("delegate", tasks=[{"role": "explorer", "task": "nested"}]),
        {"text": "wrote b, shouted a"},
    )
    w.child(2, _call("read_file", path="a.txt"), {"text": "nothing to change"})
    out = w.delegate(
        {"role": "implementer", "task": "add b.txt", "acceptance": "has-b"},
        {"role": "implementer", "task": "look only", "acceptance": "has-b"},
    )
    assert out.returncode == 0, out.stderr
    first, second = w.child_ids()
    tree = w.home / "worktrees" / first
    [result] = w.results()
    # the dirty worktree is kept, named, and its diff (a new file, an edit) is in the result
    assert f"worktree kept (it has changes): {tree}" in result
    assert "b.txt | 1 +" in result and "+brand new" in result and "+HELLO" in result
    assert (tree / "b.txt").read_text() == "brand new\n"
    assert "acceptance 'has-b' (test -f b.txt && echo found b): passed, exit 0\nfound b" in result
    # the clean one is removed, and its check ran in its worktree before: no b.txt there
    assert not (w.home / "worktrees" / second).exists()
    assert "worktree removed: no changes" in result and "FAILED, exit 1" in result
    # the parent's workspace is untouched
    assert (w.ws / "a.txt").read_text() == "hello\n" and not (w.ws / "b.txt").exists()
    assert _porcelain(w.ws) == ""
    # a child cannot delegate: the tool is not offered, so no grandchild exists
    log = w.log(first)
    assert log[0]["parent"] == "p1" and log[0]["workspace"] == str(tree)
    assert [e["trigger"] for e in log if e["type"] == "run_started"] == ["subagent"]
    assert not any(e["type"] == "execution_started" and e["name"] == "delegate" for e in log)
    assert w.child_ids() == [first, second]
    assert "1 of 2 subagent tasks completed" in result  # the failed check counts


def test_a_workspace_that_is_not_a_repository_starts_nothing(tmp_path: Path) -> None:
    w = World(tmp_path, git=False)
    (w.home / "config.json").write_text(json.dumps({"subagents": {"checks": {"t": "true"}}}))
    w.parent(
        _call("delegate", tasks=[{"role": "implementer", "task": "change it"}]),
        _call("delegate", tasks=[]),
        _call("delegate", tasks=[{"role": "explorer", "task": "x"}] * 9),
        _call("delegate", tasks=[{"role": "boss", "task": "x"}]),
        _call("delegate", tasks=[{"role": "explorer", "task": "x", "acceptance": "lint"}]),
        _call("delegate", tasks=[{"role": "implementer", "task": "x", "scope": ["../up"]}]),
        {"text": "ok"},
    )
    out = w.kiso("-p", "go", "p1", "--mode", "bypass")
    assert out.returncode == 0, out.stderr
    # bad input never reaches the tool (the runtime checks the schema); the rest is its own
    answers = [
        e.get("content") or e.get("reason")
        for e in w.log("p1")
        if e["type"] == "execution_finished" or e.get("decided_by") == "schema"
    ]
    repo, empty, many, role, check, scope = (str(a) for a in answers)
    assert f"the workspace {w.ws} is not a git repository" in repo
    assert "nothing was started" in repo
    assert "tasks: at least 1 items (got 0)" in empty
    assert "tasks: at most 8 items (got 9)" in many
    assert "'explorer'" not in many  # the bound and the size, not the whole list back
    assert "boss" in role and "is not one of" in role
    assert "no check named 'lint' is configured (defined: t)" in check
    assert "must not contain '..'" in scope
    assert w.child_ids() == [] and not (w.home / "worktrees").exists()


def test_a_scope_denies_writes_outside_it_and_offers_no_shell(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.child(
        1,
        _call("write_file", path="src/ok.txt", content="inside\n"),
        _call("write_file", path="top.txt", content="outside\n"),
        _call("shell", command="touch shell-ran"),
        {"text": "tried"},
    )
    out = w.delegate({"role": "implementer", "task": "edit src", "scope": ["src/**"]})
    assert out.returncode == 0, out.stderr
    [child] = w.child_ids()
    tree = w.home / "worktrees" / child
    assert (tree / "src" / "ok.txt").exists()
    assert not (tree / "top.txt").exists() and not (tree / "shell-ran").exists()
    log = w.log(child)
    assert any("'top.txt' is outside this task's scope" in r for r in _denials(log))
    assert not any(e["type"] == "execution_started" and e["name"] == "shell" for e in log)
    [result] = w.results()
    assert "src/ok.txt" in result and "top.txt" not in result.split("diff:")[1]


def test_more_than_four_tasks_run_at_most_four_at_a_time(tmp_path: Path) -> None:
    w = World(tmp_path)
    ledger = w.channel / "ledger"
    ledger.mkdir()
    # each child: mark its start, wait until four have started (or 20 s), mark its end. Run four
    # at a time, the first four meet and the last two follow: the overlap is exactly four.
    for n in range(1, 7):
        wait = (
            f"echo start >> {ledger}/events; touch {ledger}/started-{n}; "
            f"for i in $(seq 400); do [ $(ls {ledger} | grep -c started) -ge 4 ] && break; "
            f"sleep 0.05; done; echo end >> {ledger}/events"
        )
        w.child(n, _call("shell", command=wait), {"text": f"child {n} done"})
    tasks = [{"role": "implementer", "task": f"task {n}"} for n in range(1, 7)]
    out = w.delegate(*tasks)
    assert out.returncode == 0, out.stderr
    running = peak = 0
    for line in (ledger / "events").read_text().split():
        running += 1 if line == "start" else -1
        peak = max(peak, running)
    assert peak == 4
    [result] = w.results()
    assert "6 of 6 subagent tasks completed" in result
    assert len(w.child_ids()) == 6


def test_credentials_reach_the_child_but_not_its_shell(tmp_path: Path) -> None:
    w = World(tmp_path)
    seen = tmp_path / "seen"
    # the shell's parent is its supervisor, whose parent is the child kiso process
    probe = (
        f"env > {seen}.shell; kiso=$(cut -d' ' -f4 /proc/$PPID/stat); "
        f"tr '\\0' '\\n' < /proc/$kiso/environ > {seen}.kiso"
    )
    w.child(1, _call("shell", command=probe), {"text": "probed"})
    # the probe reads the child kiso's /proc/<pid>/environ from its shell, which the sandbox
    # forbids (a sandboxing kiso is not dumpable: tests/tools/test_sandbox.py); this test is
    # about what the child is given, so it runs without the sandbox
    out = w.delegate(
        {"role": "implementer", "task": "probe"}, OPENAI_API_KEY="sk-fake-123", KISO_SANDBOX="off"
    )
    assert out.returncode == 0, out.stderr
    kiso_env = Path(f"{seen}.kiso").read_text().splitlines()
    assert "OPENAI_API_KEY=sk-fake-123" in kiso_env
    assert "KISO_SUBAGENT_ROLE=implementer" in kiso_env and "KISO_SUBAGENT_DEPTH=1" in kiso_env
    assert not any(line.startswith("KISO_FAILPOINT=") for line in kiso_env)
    assert f"KISO_FAUX_SCRIPT={w.scripts / '1.json'}" in kiso_env  # its own, not the parent's
    assert "sk-fake-123" not in Path(f"{seen}.shell").read_text()


def test_a_timeout_kills_the_child_and_says_so(tmp_path: Path) -> None:
    w = World(tmp_path)
    pid = w.channel / "sleeper.pid"
    w.child(1, _call("shell", command=f"echo $$ > {pid}; exec sleep 120"), {"text": "never"})
    out = w.delegate({"role": "implementer", "task": "block"}, KISO_SUBAGENT_TIMEOUT_MS="8000")
    assert out.returncode == 0, out.stderr
    [result] = w.results()
    assert "timed out after 8000 ms (KISO_SUBAGENT_TIMEOUT_MS)" in result
    assert not alive(int(pid.read_text()))  # the child's own shell was killed with it
    [child] = w.child_ids()
    log = w.log(child)
    assert not any(e["type"] == "run_ended" for e in log)  # killed: its run is open, resumable


def _wait(what: str, check: Any, limit_s: float = 90.0) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_sigkill_of_the_parent_mid_delegation_then_resume(tmp_path: Path) -> None:
    w = World(tmp_path)
    kiso_pid = w.channel / "child2-kiso.pid"
    w.child(1, _call("read_file", path="a.txt"), {"text": "child one read hello"})
    probe = f"cut -d' ' -f4 /proc/$PPID/stat > {kiso_pid}.tmp && mv {kiso_pid}.tmp {kiso_pid}"
    blocked = [
        _call("shell", command=f"{probe}; echo work > w.txt"),
        {"text": "child two done", "delay_ms": 120_000},
    ]
    w.child(2, *blocked)
    w.parent(
        _call(
            "delegate",
            tasks=[
                {"role": "explorer", "task": "read a"},
                {"role": "implementer", "task": "write w"},
            ],
        ),
        {"text": "parent done"},
    )
    parent = subprocess.Popen(
        [str(BIN), "-p", "go", "p1", "--mode", "bypass"],
        cwd=w.ws,
        env=w.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    group = parent.pid
    try:

        def ready() -> bool:
            ids = w.child_ids()
            if len(ids) < 2 or not kiso_pid.exists():
                return False
            one, two = (w.log(i) for i in ids)
            ended = any(e["type"] == "run_ended" for e in one)
            return ended and any(e["type"] == "execution_finished" for e in two)

        _wait("child 1 to end and child 2 to block", ready)
    finally:
        os.killpg(group, signal.SIGKILL)
        parent.wait()
    first, second = w.child_ids()
    pid = int(kiso_pid.read_text())
    _wait("child 2's kiso to be killed by its supervisor", lambda: not alive(pid))
    # the model answers quickly this time
    w.child(2, blocked[0], {"text": "child two done"})
    out = w.kiso("resume", "p1", "--mode", "bypass")
    assert out.returncode == 0, out.stderr
    one, two = w.log(first), w.log(second)
    assert sum(e["type"] == "run_started" for e in one) == 1  # not run again
    runs = [e for e in two if e["type"] == "run_started"]
    assert len(runs) == 1 and runs[0]["trigger"] == "subagent"  # the same run, carried on
    assert sum(e["type"] == "execution_started" for e in two) == 1  # its shell ran once
    assert [e["outcome"]["kind"] for e in two if e["type"] == "run_ended"] == ["completed"]
    delegate = [e for e in w.log("p1") if e["type"] == "execution_started"]
    assert len(delegate) == 2  # the uncertain one, and its automatic rerun
    decided = [e["decided_by"] for e in w.log("p1") if e["type"] == "execution_resolved"]
    assert decided in (["policy:idempotent"], [])
    result = w.results()[-1]
    assert "2 of 2 subagent tasks completed" in result
    assert "already finished: read from its log, not run again" in result
    assert "child one read hello" in result and "child two done" in result
    assert "resumed: its run had not ended" in result and "+work" in result


def test_an_abort_of_the_parents_run_kills_every_child_and_its_shell(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The parent is a library Agent here, so the abort is the runtime's own ``Session.abort``
    (what Esc calls in the REPL), sent while both children are blocked in a shell."""
    from kiso.kernel import ExecutionFinished, JsonlSessionStore, RunEnded
    from kiso.providers import FauxAdapter
    from kiso.runtime import Agent
    from kiso.runtime.subagents import delegate_tool
    from kiso.tools import builtin_tools

    w = World(tmp_path)
    env = w.env()  # the children inherit this process's environment
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pids = [w.channel / f"shell{n}.pid" for n in (1, 2)]
    kisos = [w.channel / f"kiso{n}.pid" for n in (1, 2)]
    for n, (pid, kiso) in enumerate(zip(pids, kisos, strict=True), start=1):
        probe = f"cut -d' ' -f4 /proc/$PPID/stat > {kiso}.tmp && mv {kiso}.tmp {kiso}"
        w.child(n, _call("shell", command=f"{probe}; echo $$ > {pid}; exec sleep 120"))
    tasks = [{"role": "implementer", "task": "block"}, {"role": "implementer", "task": "block 2"}]
    agent = Agent(
        adapter=FauxAdapter(
            [{"tool_calls": [{"name": "delegate", "input": {"tasks": tasks}}]}, {"text": "no"}]
        ),
        tools=[*builtin_tools(), delegate_tool()],
        store=JsonlSessionStore(w.home),
        workspace=w.ws,
        mode="bypass",
    )
    with agent.session("p1") as session:

        def abort_when_blocked() -> None:
            _wait("both children's shells", lambda: all(p.exists() for p in (*pids, *kisos)))
            session.abort()

        aborter = threading.Thread(target=abort_when_blocked, daemon=True)
        for ev in session.run_sync("go"):
            if ev.type == "tool_start":
                aborter.start()
        aborter.join()
        ended = session.events[-1]
        assert isinstance(ended, RunEnded) and ended.outcome.kind == "aborted"
        [finished] = [e for e in session.events if isinstance(e, ExecutionFinished)]
    assert finished.is_error and finished.error_kind == "aborted"
    assert finished.content.count("aborted with the parent's run: its processes were killed") == 2
    for path in (*pids, *kisos):
        pid = int(path.read_text())
        _wait(f"{path.name}'s process to be gone", lambda pid=pid: not alive(pid), 10.0)
    for child in w.child_ids():  # killed mid-run: open, so the same call would resume them
        assert not any(e["type"] == "run_ended" for e in w.log(child))


def _first_input(log: list[dict[str, Any]]) -> str:
    [first, *_] = [e for e in log if e["type"] == "user"]
    content = first["content"]
    return content if isinstance(content, str) else "\n\n".join(b["text"] for b in content)


def test_task_text_that_looks_like_an_option_is_the_childs_task(tmp_path: Path) -> None:
    """The prompt reaches the child on stdin, never on its command line: ``-c`` (continue),
    ``--mode=bypass`` or ``--verbose`` at the start of a task are its words, not options."""
    w = World(tmp_path)
    texts = ["--verbose flag: where?", "-c option", "--mode=bypass"]
    for n in (1, 2, 3):
        w.child(n, {"text": f"answer {n}"})
    out = w.delegate(*({"role": "explorer", "task": t} for t in texts))
    assert out.returncode == 0, out.stderr
    [result] = w.results()
    assert "3 of 3 subagent tasks completed" in result, result
    children = w.child_ids()
    assert len(children) == 3
    by_task = {int(c.split("-")[-2]): w.log(c) for c in children}
    for n, text in enumerate(texts, start=1):
        log = by_task[n]
        assert _first_input(log).splitlines()[0] == text
        assert [e["mode"] for e in log if e["type"] == "run_started"] == ["default"]
        assert [e["outcome"]["kind"] for e in log if e["type"] == "run_ended"] == ["completed"]
        assert f"answer {n}" in result
    assert list((w.home / "subagents").iterdir()) == []  # each prompt file is gone with its child


def test_a_timed_out_child_keeps_its_clean_worktree_so_it_can_be_resumed(tmp_path: Path) -> None:
    """The child was killed mid-shell: its run is open and its session belongs to the worktree,
    so the worktree stays (and is named) though nothing changed, and the hint can be followed."""
    w = World(tmp_path)
    pid = w.channel / "sleeper.pid"
    w.child(1, _call("shell", command=f"echo $$ > {pid}; exec sleep 120"), {"text": "ruled on"})
    out = w.delegate({"role": "implementer", "task": "block"}, KISO_SUBAGENT_TIMEOUT_MS="8000")
    assert out.returncode == 0, out.stderr
    [result] = w.results()
    [child] = w.child_ids()
    tree = w.home / "worktrees" / child
    assert "timed out after 8000 ms" in result
    assert f"worktree kept (its run has not ended; no changes yet): {tree}" in result
    assert f"resume it with: cd {tree} && KISO_HOME={w.home} kiso resume {child}" in result
    assert "worktree removed" not in result
    assert (tree / "a.txt").read_text() == "hello\n"
    _wait("the killed shell to be gone", lambda: not alive(int(pid.read_text())), 10.0)
    # the hint, followed: the child's session resumes in its worktree and the run ends
    ruled = subprocess.run(
        [str(BIN), "resume", child, "--resolve", "skip"],
        cwd=tree,
        env=w.env(KISO_FAUX_SCRIPT=str(w.scripts / "1.json")),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert ruled.returncode == 0, ruled.stderr
    log = w.log(child)
    assert [e["resolution"] for e in log if e["type"] == "execution_resolved"] == ["skipped"]
    assert [e["outcome"]["kind"] for e in log if e["type"] == "run_ended"] == ["completed"]


class _Idless:
    """A local server that sends no tool-call ids: every delegate call arrives as ``""`` (the
    loop names it ``call_0``), in every turn. Even turns delegate the next task; odd turns
    answer."""

    provider, model = "test", "idless"

    def __init__(self, tasks: list[str]) -> None:
        self.tasks = tasks

    async def stream(self, request: Any) -> Any:
        from kiso.kernel import TextBlock, ToolCall, Usage
        from kiso.providers import TurnDone

        if request.turn % 2:
            yield TurnDone((TextBlock("done"),), "end_turn", Usage(), self.model)
            return
        task = {"role": "explorer", "task": self.tasks[request.turn // 2]}
        call = ToolCall("", "delegate", {"tasks": [task]})
        yield TurnDone((call,), "tool_use", Usage(), self.model)


def test_two_delegations_by_a_provider_without_call_ids_get_two_children(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Before, both calls were ``call_0``, so the second delegation found the first one's
    child "already finished" and returned its stale result."""
    from kiso.kernel import ExecutionFinished, JsonlSessionStore
    from kiso.runtime import Agent
    from kiso.runtime.subagents import delegate_tool
    from kiso.tools import builtin_tools

    w = World(tmp_path)
    env = w.env()
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    w.child(1, {"text": "the answer"})
    tasks = ["Where is the retry delay computed?", "Where is the timeout read?"]
    agent = Agent(
        adapter=_Idless(tasks),
        tools=[*builtin_tools(), delegate_tool()],
        store=JsonlSessionStore(w.home),
        workspace=w.ws,
        mode="bypass",
    )
    with agent.session("p1") as session:
        for prompt in ("first", "second"):
            assert [e.type for e in session.run_sync(prompt)][-1] == "terminal"
        results = [e.content for e in session.events if isinstance(e, ExecutionFinished)]
    assert len(results) == 2
    assert not any("already finished" in r for r in results), results
    children = w.child_ids()
    assert len(children) == 2
    first_lines = sorted(_first_input(w.log(c)).splitlines()[0] for c in children)
    assert first_lines == sorted(tasks)
    for child in children:  # each ran once
        assert sum(e["type"] == "run_started" for e in w.log(child)) == 1
    for result, task in zip(results, tasks, strict=True):  # each result is its own task's
        [child] = [c for c in children if c in result]
        assert _first_input(w.log(child)).splitlines()[0] == task


def test_a_child_timed_out_before_its_first_turn_keeps_its_worktree(tmp_path: Path) -> None:
    """Killed while its first model call ran: its log has only its header, and that session
    belongs to the worktree, so the worktree stays for the next delegation to find."""
    w = World(tmp_path)
    w.child(1, {"text": "thinking", "delay_ms": 60_000})
    out = w.delegate({"role": "implementer", "task": "slow"}, KISO_SUBAGENT_TIMEOUT_MS="4000")
    assert out.returncode == 0, out.stderr
    [result] = w.results()
    assert "timed out after 4000 ms" in result
    [child] = w.child_ids()
    tree = w.home / "worktrees" / child
    assert "worktree kept (its run has not ended" in result and tree.is_dir(), result
    assert f"KISO_HOME={w.home} kiso resume {child}" in result  # the hint names the home


def test_an_acceptance_check_runs_the_childs_code_in_the_sandbox(tmp_path: Path) -> None:
    """The check runs what the child wrote: it is contained like the child's own commands."""
    w = World(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (w.home / "config.json").write_text(
        json.dumps({"subagents": {"checks": {"tests": "sh ./check.sh"}}})
    )
    w.child(
        1,
        _call("write_file", path="check.sh", content=f"echo x > {outside}/escaped\necho ran\n"),
        {"text": "wrote the check"},
    )
    out = w.delegate({"role": "implementer", "task": "write check.sh", "acceptance": "tests"})
    assert out.returncode == 0, out.stderr
    [result] = w.results()
    assert "acceptance 'tests' (sh ./check.sh)" in result and "ran" in result
    assert "Read-only file system" in result
    assert not (outside / "escaped").exists()
