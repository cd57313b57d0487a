"""plan(): the recovery table, checked after every record of a scripted session."""

from __future__ import annotations

from typing import Any

import pytest

from kiso.kernel import (
    AwaitApproval,
    CallModel,
    Decide,
    EndRun,
    Event,
    Execute,
    Idle,
    Outcome,
    ResolveUncertain,
    plan,
)
from kiso.kernel.recovery import Action

from .script import LogBuilder, call


def describe(action: Action) -> tuple[Any, ...]:
    """A compact, comparable form of an action."""
    if isinstance(action, Idle):
        return ("idle",)
    if isinstance(action, CallModel):
        return ("call_model",)
    if isinstance(action, EndRun):
        o = action.outcome
        return ("end", o.kind if o.kind != "error" else f"error:{o.code}")
    if isinstance(action, Decide):
        return ("decide", *(c.call_id for c in action.calls))
    if isinstance(action, Execute):
        return ("execute", *(c.call_id for c in action.calls))
    if isinstance(action, AwaitApproval):
        return ("await", *(r.call_id for r in action.requests))
    if isinstance(action, ResolveUncertain):
        return (
            "uncertain",
            *(f"{u.execution_id}{'/auto' if u.auto_rerun else ''}" for u in action.executions),
        )
    raise AssertionError(action)


def scripted_session() -> tuple[list[Event], list[tuple[Any, ...]]]:
    """Three runs: tool calls, approvals (policy, human, denied, stale), uncertain executions
    ruled every way, a compaction, and each kind of run end. Returns the log and, for each
    record, the action plan() must name once that record is the last one on disk."""
    b = LogBuilder()
    want: list[tuple[Any, ...]] = []

    def step(expected: tuple[Any, ...]) -> None:
        want.append(expected)

    read = call("c1", "read_file", path="app.py")
    edit = call("c2", "edit_file", path="app.py", edits=[{"oldText": "a", "newText": "b"}])
    rm = call("c3", "shell", command="rm -rf ~")
    test = call("c4", "shell", command="pytest -q")

    # run 1
    b.start("run-1")
    step(("end", "error:no_input"))  # run_started alone: its input never arrived
    b.user("fix the failing test in app.py")
    step(("call_model",))
    b.assistant(read, edit, rm, text="Let me look.")
    step(("decide", "c1", "c2", "c3"))
    b.decide(read)
    step(("decide", "c2", "c3"))
    b.request(edit)
    step(("await", "c2"))
    b.decide(edit, by="user")
    step(("decide", "c3"))
    b.decide(rm, "denied", by="floor", reason="rm -rf of your home directory")
    step(("execute", "c1", "c2"))
    b.started(read, "x1")
    step(("uncertain", "x1/auto"))
    b.finished(read, "x1", "def app(): ...")
    step(("execute", "c2"))
    b.started(edit, "x2")
    step(("uncertain", "x2"))
    b.finished(edit, "x2", "edited app.py")
    step(("call_model",))
    b.assistant(test)
    step(("decide", "c4"))
    b.decide(test, by="rule:shell:pytest")
    step(("execute", "c4"))
    b.started(test, "x3")
    step(("uncertain", "x3"))
    b.resolved(test, "x3", "rerun")
    step(("execute", "c4"))
    b.started(test, "x4")
    step(("uncertain", "x4"))
    b.finished(test, "x4", "1 passed")
    step(("call_model",))
    b.compact(covers_to_seq=11)
    step(("call_model",))
    b.assistant(text="Fixed: the test passes.")
    step(("end", "completed"))
    b.end()
    step(("idle",))

    # run 2: a call id the provider repeats from run 1, a skipped and an auto-rerun execution
    write = call("c1", "write_file", path="NOTES.md", content="done")
    look = call("c5", "read_file", path="NOTES.md")
    b.start("run-2")
    step(("end", "error:no_input"))
    b.user("write it down")
    step(("call_model",))
    b.assistant(write)
    step(("decide", "c1"))
    b.request(write)
    step(("await", "c1"))
    b.decide(write, by="user")
    step(("execute", "c1"))
    b.started(write, "x5")
    step(("uncertain", "x5"))
    b.resolved(write, "x5", "skipped")
    step(("call_model",))
    b.assistant(look)
    step(("decide", "c5"))
    b.decide(look)
    step(("execute", "c5"))
    b.started(look, "x6")
    step(("uncertain", "x6/auto"))
    b.resolved(look, "x6", "rerun", by="policy:idempotent")
    step(("execute", "c5"))
    b.started(look, "x7")
    step(("uncertain", "x7/auto"))
    b.finished(look, "x7", "done")
    step(("call_model",))
    b.assistant(text="I ran out of room", stop="max_tokens")
    step(("end", "error:max_tokens"))
    b.end(Outcome.error("max_tokens", "the reply hit its output token limit"))
    step(("idle",))

    # run 3: a setting between runs, a verdict for a different input, an "applied" ruling
    deploy = call("c6", "shell", command="./deploy.sh")
    b.setting("mode", "accept-edits")
    step(("idle",))
    b.start("run-3")
    step(("end", "error:no_input"))
    b.user("deploy")
    step(("call_model",))
    b.assistant(deploy)
    step(("decide", "c6"))
    b.decide(deploy, digest="0" * 64)  # bound to another input: authorises nothing
    step(("decide", "c6"))
    b.decide(deploy, by="user")
    step(("execute", "c6"))
    b.started(deploy, "x8")
    step(("uncertain", "x8"))
    b.resolved(deploy, "x8", "applied")
    step(("call_model",))
    b.assistant(text="Deployed.")
    step(("end", "completed"))
    b.end(Outcome.aborted("user"))
    step(("idle",))
    return b.events, want


def test_every_cut_of_the_scripted_session_names_the_right_action() -> None:
    events, want = scripted_session()
    assert len(events) == len(want)
    assert describe(plan([])) == ("idle",)
    got = [describe(plan(events[:n], rerunnable={"read_file"})) for n in range(1, len(events) + 1)]
    mismatches = [
        (n, events[n - 1].type, w, g)
        for n, (w, g) in enumerate(zip(want, got, strict=True), 1)
        if w != g
    ]
    assert not mismatches, mismatches


def test_execute_uses_the_persisted_input() -> None:
    b = LogBuilder()
    edit = call("c1", "edit_file", path="a.py", edits=[{"oldText": "x", "newText": "y"}])
    b.start("r")
    b.user("go")
    b.assistant(edit)
    b.decide(edit)
    action = plan(b.events)
    assert isinstance(action, Execute)
    assert action.calls[0].input == {"path": "a.py", "edits": [{"oldText": "x", "newText": "y"}]}


def test_a_rerun_executes_the_input_its_start_recorded() -> None:
    # A loadable log cannot hold a start whose input differs from its call (the loader refuses
    # it as corruption); the fold still takes the rerun's input from the start, never elsewhere.
    b = LogBuilder()
    make = call("c1", "shell", command="make")
    b.start("r")
    b.user("go")
    b.assistant(make)
    b.decide(make)
    b.started(call("c1", "shell", command="make -j4"), "r:5")
    b.resolved(make, "r:5", "rerun")
    action = plan(b.events)
    assert isinstance(action, Execute)
    assert action.calls[0].input == {"command": "make -j4"}


def settled_calls(events: list[Event]) -> set[tuple[int, str]]:
    """An oracle written apart from the kernel: (declaring seq, call id) of every call that has
    a receipt, a denial, or a skipped/applied ruling."""
    declared: dict[str, int] = {}
    by_execution: dict[str, tuple[int, str]] = {}
    settled: set[tuple[int, str]] = set()
    for e in events:
        j = e.to_json()
        if e.type == "assistant":
            for block in j["blocks"]:
                if block["type"] == "tool_call":
                    declared[block["call_id"]] = e.seq
        elif e.type == "approval_decided" and j["decision"] == "denied":
            settled.add((declared[j["call_id"]], j["call_id"]))
        elif e.type == "execution_started":
            by_execution[j["execution_id"]] = (declared[j["call_id"]], j["call_id"])
        elif e.type == "execution_finished" or (
            e.type == "execution_resolved" and j["resolution"] != "rerun"
        ):
            settled.add(by_execution[j["execution_id"]])
    return settled


def declaring_seq(events: list[Event], call_id: str) -> int:
    return max(
        e.seq
        for e in events
        if e.type == "assistant" and any(b.get("call_id") == call_id for b in e.to_json()["blocks"])
    )


def test_a_settled_call_is_never_executed_again() -> None:
    events, _ = scripted_session()
    for n in range(1, len(events) + 1):
        prefix = events[:n]
        action = plan(prefix)
        if isinstance(action, Execute):
            done = settled_calls(prefix)
            for c in action.calls:
                assert (declaring_seq(prefix, c.call_id), c.call_id) not in done, (n, c)


def test_uncertain_outranks_everything_else() -> None:
    b = LogBuilder()
    a, c = call("a", "shell", command="make"), call("b", "shell", command="make install")
    b.start("r")
    b.user("build and install")
    b.assistant(a, c)
    b.decide(a)
    b.started(a, "xa")
    b.request(c)
    action = plan(b.events)
    assert describe(action) == ("uncertain", "xa")


def test_stops_other_than_end_turn_end_the_run_honestly() -> None:
    for stop, outcome in [
        ("end_turn", "completed"),
        ("stop_sequence", "completed"),
        ("refusal", "error:refusal"),
        ("content_filter", "error:content_filter"),
        ("tool_use", "error:tool_use"),
    ]:
        b = LogBuilder()
        b.start("r")
        b.user("hi")
        b.assistant(text="...", stop=stop)
        assert describe(plan(b.events)) == ("end", outcome), stop
    b = LogBuilder()
    b.start("r")
    b.user("hi")
    b.assistant(text="working on it", stop="pause_turn")
    assert describe(plan(b.events)) == ("call_model",)


def test_resume_trigger_after_settled_results_calls_the_model() -> None:
    """A new run opened on a session whose last messages are tool results continues it."""
    b = LogBuilder()
    t = call("c", "shell", command="ls")
    b.start("r1")
    b.user("list")
    b.assistant(t)
    b.decide(t)
    b.started(t, "x")
    b.finished(t, "x", "a b c")
    b.end(Outcome.error("network", "connection reset", retryable=True))
    b.start("r2", trigger="resume")
    assert describe(plan(b.events)) == ("call_model",)


@pytest.mark.parametrize("stale_first", [True, False])
def test_only_a_verdict_for_the_exact_input_authorises(stale_first: bool) -> None:
    b = LogBuilder()
    t = call("c", "shell", command="ls")
    b.start("r")
    b.user("list")
    b.assistant(t)
    if stale_first:
        b.decide(t, "approved", digest="f" * 64)
        assert describe(plan(b.events)) == ("decide", "c")
    b.decide(t, "denied", by="user", reason="no")
    assert describe(plan(b.events)) == ("call_model",)
