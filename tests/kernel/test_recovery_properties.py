"""Generated logs: plan() never raises, and never asks to execute a call that has a receipt."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
    event_from_json,
    plan,
    project,
    to_wire,
)

from .script import LogBuilder, call
from .test_recovery import declaring_seq, settled_calls

TOOLS = ["read_file", "shell", "write_file", "edit_file"]
RERUNNABLE = {"read_file"}


def simulate(data: st.DataObject) -> list[Event]:
    """A runtime with random choices at every step, following plan() as kiso's driver does,
    crashing (leaving an execution open) and aborting at random."""
    b = LogBuilder()
    draw = data.draw
    executions = 0
    for r in range(draw(st.integers(1, 3), label="runs")):
        if draw(st.booleans()):
            b.setting("mode", draw(st.sampled_from(["default", "plan", "bypass"])))
        b.start(f"run-{r}", draw(st.sampled_from(["user", "resume", "api"])))
        b.user(f"task {r}")
        turns = draw(st.integers(0, 4), label="turns")
        for _ in range(60):
            action = plan(b.events, rerunnable=RERUNNABLE)
            if isinstance(action, Idle):
                break
            if draw(st.integers(0, 30)) == 0 and not isinstance(action, ResolveUncertain):
                b.end(Outcome.aborted("user"))
                break
            if isinstance(action, CallModel):
                if draw(st.integers(0, 6)) == 0 and len(b.events) > 3:
                    b.compact(draw(st.integers(1, len(b.events) - 1)))
                if turns == 0:
                    b.assistant(text="done", stop=draw(st.sampled_from(["end_turn", "max_tokens"])))
                else:
                    turns -= 1
                    n = draw(st.integers(0, 3))
                    calls = [
                        call(f"c{i}", draw(st.sampled_from(TOOLS)), arg=draw(st.integers(0, 3)))
                        for i in range(n)
                    ]
                    b.assistant(*calls, text="working")
            elif isinstance(action, Decide):
                for c in action.calls[: draw(st.integers(1, len(action.calls)))]:
                    choice = draw(st.sampled_from(["allow", "deny", "ask", "stale"]))
                    if choice == "allow":
                        b.decide(c)
                    elif choice == "deny":
                        b.decide(c, "denied", by="floor", reason="unrecoverable target")
                    elif choice == "ask":
                        b.request(c)
                    else:
                        b.decide(c, digest="e" * 64)  # a verdict for another input
            elif isinstance(action, AwaitApproval):
                for req in action.requests[: draw(st.integers(1, len(action.requests)))]:
                    c = call(req.call_id, req.name, **req.input)
                    b.decide(c, draw(st.sampled_from(["approved", "denied"])), by="user")
            elif isinstance(action, Execute):
                for c in action.calls[: draw(st.integers(1, len(action.calls)))]:
                    executions += 1
                    xid = f"x{executions}"
                    b.started(c, xid)
                    if draw(st.integers(0, 4)) == 0:
                        break  # crash: the execution stays open
                    b.finished(c, xid, "out", is_error=draw(st.booleans()))
            elif isinstance(action, ResolveUncertain):
                for u in action.executions:
                    c = call(u.call_id, u.name, **u.input)
                    ruling = (
                        "rerun"
                        if u.auto_rerun
                        else draw(st.sampled_from(["rerun", "skipped", "applied"]))
                    )
                    b.resolved(c, u.execution_id, ruling)
            elif isinstance(action, EndRun):
                b.end(action.outcome)
        else:
            raise AssertionError("the simulated run did not settle in 60 steps")
    return b.events


def check_prefix(prefix: list[Event]) -> None:
    action = plan(prefix, rerunnable=RERUNNABLE)
    messages = [to_wire(m) for m in project(prefix)]
    if isinstance(action, Execute):
        done = settled_calls(prefix)
        for c in action.calls:
            assert (declaring_seq(prefix, c.call_id), c.call_id) not in done
        started_open = {
            e.to_json()["execution_id"] for e in prefix if e.type == "execution_started"
        } - {
            e.to_json()["execution_id"]
            for e in prefix
            if e.type in ("execution_finished", "execution_resolved")
        }
        assert not started_open, "execute while an execution is still uncertain"
    elif isinstance(action, ResolveUncertain):
        closed = {
            e.to_json()["execution_id"]
            for e in prefix
            if e.type in ("execution_finished", "execution_resolved")
        }
        assert action.executions
        assert all(u.execution_id not in closed for u in action.executions)
    elif isinstance(action, AwaitApproval):
        for req in action.requests:
            later = [
                e for e in prefix
                if e.seq > req.seq and e.type == "approval_decided"
                and e.to_json()["call_id"] == req.call_id
                and e.to_json()["decision"] == "denied"
            ]  # fmt: skip
            assert not later
    elif isinstance(action, CallModel):
        declared = [
            b["call_id"] for m in messages if m["role"] == "assistant" for b in m["content"]
            if b["type"] == "tool_call"
        ]  # fmt: skip
        assert declared == [m["call_id"] for m in messages if m["role"] == "tool"]


@settings(max_examples=150)
@given(st.data())
def test_plan_on_every_prefix_of_simulated_sessions(data: st.DataObject) -> None:
    events = simulate(data)
    for n in range(len(events) + 1):
        check_prefix(events[:n])
    # the log a simulated session wrote always loads back as the same events
    for e in events:
        assert event_from_json(json.loads(json.dumps(e.to_json()))) == e


# --------------------------------------------------------------------------- arbitrary valid logs

RUNS, CALL_IDS, EXEC_IDS = ["a", "b"], ["c0", "c1", "c2"], ["x0", "x1", "x2", "x3"]


@st.composite
def any_event(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from([
        "run_started", "user", "assistant", "approval_requested", "approval_decided",
        "execution_started", "execution_finished", "execution_resolved", "compacted",
        "setting_changed", "run_ended",
    ]))  # fmt: skip
    run = draw(st.sampled_from(RUNS))
    cid, xid = draw(st.sampled_from(CALL_IDS)), draw(st.sampled_from(EXEC_IDS))
    inp = {"n": draw(st.integers(0, 1))}
    body: dict[str, Any] = {
        "run_started": {"trigger": "user", "model": {"provider": "p", "model": "m",
                        "profile": None}, "mode": "default"},
        "user": {"content": "hi", "source": "user"},
        "assistant": {
            "blocks": [{"type": "tool_call", "call_id": c, "name": "t", "input": inp}
                       for c in draw(st.lists(st.sampled_from(CALL_IDS), unique=True,
                                              max_size=3))],
            "stop": draw(st.sampled_from(["end_turn", "tool_use", "max_tokens", "pause_turn"])),
            "usage": {"input": 1, "output": 1, "cache_read": None, "cache_write": None},
            "model": "m", "ms": 1,
        },
        "approval_requested": {"call_id": cid, "name": "t", "input": inp, "speaker": "mode"},
        "approval_decided": {
            "call_id": cid, "decision": draw(st.sampled_from(["approved", "denied"])),
            "decided_by": "user", "reason": None,
            "input_sha256": __import__("kiso.kernel").kernel.input_sha256(inp),
        },
        "execution_started": {"execution_id": xid, "call_id": cid, "name": "t", "input": inp},
        "execution_finished": {"execution_id": xid, "call_id": cid, "ok": True, "content": "o",
                               "is_error": False, "ms": 1},
        "execution_resolved": {"execution_id": xid, "call_id": cid, "decided_by": "user",
                               "resolution": draw(st.sampled_from(["rerun", "skipped",
                                                                   "applied"]))},
        "compacted": {"covers_to_seq": 0, "summary": "s", "trigger": "auto",
                      "tokens_before": None, "tokens_after": None},
        "setting_changed": {"key": "mode", "value": "plan"},
        "run_ended": {"outcome": {"kind": "completed"}},
    }[kind]  # fmt: skip
    return {"ts": 1, "run": run, "type": kind, **body}


@settings(max_examples=300)
@given(st.lists(any_event(), max_size=40), st.data())
def test_plan_and_project_never_raise_on_any_loadable_log(
    raw: list[dict[str, Any]], data: st.DataObject
) -> None:
    events: list[Event] = []
    for seq, obj in enumerate(raw, 1):
        fixed = dict(obj, seq=seq)
        if obj["type"] == "compacted":
            fixed["covers_to_seq"] = data.draw(st.integers(0, seq - 1))
        events.append(event_from_json(fixed))
    for n in range(len(events) + 1):
        action = plan(events[:n], rerunnable=RERUNNABLE)
        assert isinstance(
            action, Idle | ResolveUncertain | AwaitApproval | Decide | Execute | CallModel | EndRun
        )
        project(events[:n])
        if isinstance(action, Execute):
            have = receipted_calls(events[:n])
            for c in action.calls:
                assert (declaring_seq(events[:n], c.call_id), c.call_id) not in have


def receipted_calls(events: list[Event]) -> set[tuple[int, str]]:
    """(declaring seq, call id) of every call with an execution_finished for one of its
    executions: the receipt that must never be followed by another execution."""
    declared: dict[str, int] = {}
    started: dict[str, tuple[int, str]] = {}
    out: set[tuple[int, str]] = set()
    for e in events:
        j = e.to_json()
        if e.type == "assistant":
            for b in j["blocks"]:
                declared[b["call_id"]] = e.seq
        elif e.type == "execution_started" and j["call_id"] in declared:
            started[j["execution_id"]] = (declared[j["call_id"]], j["call_id"])
        elif e.type == "execution_finished" and j["execution_id"] in started:
            out.add(started[j["execution_id"]])
    return out


def test_dataclass_replace_keeps_events_frozen() -> None:
    b = LogBuilder()
    e = b.start("r")
    try:
        e.seq = 5  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        return
    raise AssertionError("events must be immutable")
