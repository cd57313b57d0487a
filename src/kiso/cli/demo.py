"""``kiso demo``: a durable session, killed with SIGKILL in the middle of a tool call, recovered.

A child process drives a scripted two-call turn: it writes ``notes.txt`` (receipt recorded), then
records ``execution_started`` for an append to the same file and kills itself with SIGKILL before
the append runs, as a machine crash would. The parent then does what ``kiso resume`` does, using
only the kernel: it loads the log, asks :func:`plan` for the next action at each step and carries
it out. The first call is never run again; the interrupted one is ruled on and re-run once.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from kiso.kernel import (
    Assistant,
    CallModel,
    EndRun,
    Execute,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    JsonlSessionStore,
    ModelRef,
    ResolveUncertain,
    RunEnded,
    RunStarted,
    SessionWriter,
    TextBlock,
    ToolCall,
    Usage,
    User,
    input_sha256,
    plan,
)
from kiso.kernel.events import ApprovalDecided

RUN = "demo-run-1"
MODEL = "faux-demo"
CALLS = (
    ToolCall("call_1", "write_file", {"path": "notes.txt", "content": "first line\n"}),
    ToolCall("call_2", "append_file", {"path": "notes.txt", "content": "second line\n"}),
)


def _execute(call: ToolCall, workspace: Path) -> str:
    """The demo's two tools. Real side effects on a file in the demo's own workspace."""
    target = workspace / str(call.input["path"])
    mode = "w" if call.name == "write_file" else "a"
    with open(target, mode, encoding="utf-8") as f:
        f.write(str(call.input["content"]))
    return f"{call.name}: {target.name} now has {target.stat().st_size} bytes"


def _run_call(writer: SessionWriter, call: ToolCall, workspace: Path) -> None:
    execution_id = f"{writer.id}:{writer.next_seq}"
    writer.append(  # durable before the side effect
        ExecutionStarted(
            run=RUN,
            execution_id=execution_id,
            call_id=call.call_id,
            name=call.name,
            input=call.input,
        )
    )
    content = _execute(call, workspace)
    writer.append(
        ExecutionFinished(
            run=RUN,
            execution_id=execution_id,
            call_id=call.call_id,
            ok=True,
            content=content,
            is_error=False,
            ms=0,
        )
    )


def child(home: str, session_id: str, workspace: str) -> None:
    """The agent process that will be killed."""
    store = JsonlSessionStore(home)
    writer = store.open(session_id)
    writer.append(
        RunStarted(run=RUN, trigger="user", model=ModelRef("faux", MODEL), mode="accept-edits"),
        User(run=RUN, content="Start notes.txt, then add a second line to it."),
    )
    writer.append(
        Assistant(
            run=RUN,
            blocks=(TextBlock("I'll create the file, then append to it."), *CALLS),
            stop="tool_use",
            usage=Usage(input=120, output=48),
            model=MODEL,
            ms=5,
        )
    )
    for call in CALLS:
        writer.append(
            ApprovalDecided(
                run=RUN,
                call_id=call.call_id,
                decision="approved",
                decided_by="mode:accept-edits",
                reason="file edits are allowed in accept-edits",
                input_sha256=input_sha256(call.input),
            )
        )
    _run_call(writer, CALLS[0], Path(workspace))
    writer.append(
        ExecutionStarted(
            run=RUN,
            execution_id=f"{writer.id}:{writer.next_seq}",
            call_id=CALLS[1].call_id,
            name=CALLS[1].name,
            input=CALLS[1].input,
        )
    )
    os.kill(os.getpid(), signal.SIGKILL)  # the crash: after the durable start, before the effect


def _say(text: str = "") -> None:
    print(text, flush=True)


def _quote(text: str) -> None:
    for line in text.splitlines():
        _say(f"   | {line}")


def _describe(action: Any) -> str:
    name = type(action).__name__
    if isinstance(action, ResolveUncertain):
        ids = ", ".join(f"{u.name} ({u.execution_id})" for u in action.executions)
        return f"{name}: started with no receipt: {ids}"
    if isinstance(action, Execute):
        return f"{name}: " + ", ".join(c.name for c in action.calls)
    if isinstance(action, EndRun):
        return f"{name}: {action.outcome.kind}"
    return name


def run_demo(home: str | None, *, keep: bool = False) -> int:
    """Run the demo; its temporary folders are removed at the end unless ``keep`` or ``home``.

    ``home`` (``--home``) is the caller's folder: it and the workspace are kept, so the session
    can be inspected. Otherwise the demo makes both under ``$TMPDIR`` and removes them when it
    ends, however it ends, and says so.
    """
    kept = keep or home is not None
    made: list[str] = []
    try:
        if home is None:
            home = tempfile.mkdtemp(prefix="kiso-demo-home-")
            made.append(home)
        workspace = Path(tempfile.mkdtemp(prefix="kiso-demo-workspace-"))
        made.append(str(workspace))
        code = _demo(home, workspace)
        if kept:
            _say(f"Inspect it:  KISO_HOME={home} kiso sessions --all")
        return code
    finally:
        if not kept and made:
            for folder in made:
                shutil.rmtree(folder, ignore_errors=True)
            _say(f"Removed the demo's temporary folders ({', '.join(made)}); "
                 "kiso demo --home DIR keeps the session.")  # fmt: skip


def _demo(home: str, workspace: Path) -> int:
    store = JsonlSessionStore(home)
    with store.create(workspace) as writer:
        session_id, path = writer.id, writer.path
    _say(f"session   {session_id}")
    _say(f"log       {path}")
    _say(f"workspace {workspace}")
    _say()
    _say("1. An agent process runs a turn with two tool calls and is killed with SIGKILL")
    _say("   after the second call's execution_started is durable, before its effect.")
    proc = subprocess.run(
        [sys.executable, "-m", "kiso.cli.demo", home, session_id, str(workspace)], check=False
    )
    if proc.returncode != -signal.SIGKILL:
        _say(
            f"   the agent exited with {proc.returncode}, not by SIGKILL; the demo cannot continue"
        )
        return 1
    _say("   the agent died by SIGKILL")

    log = store.load(session_id)
    _say(f"   the log holds {len(log.events)} committed events; notes.txt holds:")
    _quote((workspace / "notes.txt").read_text())
    _say()
    _say("2. Recovery: plan(log) names one next action at a time; the driver carries it out.")
    with store.open(session_id) as writer:  # the dead agent's lock was released by the kernel
        while True:
            action = plan(writer.events)
            _say(f"   -> {_describe(action)}")
            if isinstance(action, ResolveUncertain):
                for u in action.executions:
                    probe = (workspace / "notes.txt").read_text()
                    applied = str(u.input["content"]) in probe
                    ruling: Literal["applied", "rerun"] = "applied" if applied else "rerun"
                    _say(f"      notes.txt {'has' if applied else 'lacks'} the line: rule {ruling}")
                    writer.append(
                        ExecutionResolved(
                            run=RUN,
                            execution_id=u.execution_id,
                            call_id=u.call_id,
                            resolution=ruling,
                            decided_by="demo:probe",
                        )
                    )
            elif isinstance(action, Execute):
                for call in action.calls:
                    _run_call(writer, call, workspace)
            elif isinstance(action, CallModel):
                writer.append(
                    Assistant(
                        run=RUN,
                        blocks=(TextBlock("notes.txt has both lines."),),
                        stop="end_turn",
                        usage=Usage(input=260, output=9),
                        model=MODEL,
                        ms=4,
                    )
                )
            elif isinstance(action, EndRun):
                writer.append(RunEnded(run=RUN, outcome=action.outcome))
            else:
                break
    _say()
    text = (workspace / "notes.txt").read_text()
    _say("3. Result: the first call ran once, the interrupted one once, the run completed.")
    _quote(text)
    row = next(r for r in store.list(workspace) if r.id == session_id)
    _say(f"   session state: {row.state.value}; {row.events} events")
    _say()
    ok = text == "first line\nsecond line\n" and row.state.value == "completed"
    return 0 if ok else 1


if __name__ == "__main__":
    child(*sys.argv[1:4])
