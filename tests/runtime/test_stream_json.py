"""The JSON form of run events is a versioned contract: this test pins version 1.

Every event type of the union is produced by a real run and its ``to_json()`` checked: the exact
keys (docs/runtime.md, "Run events as JSON"), ``"v": 1``, and that every embedded record is the
log's own JSON for it. A change that drops or renames a field fails here; adding one means adding
it here and in the docs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from kiso.kernel import (
    ApprovalDecided,
    Assistant,
    ExecutionStarted,
    JsonlSessionStore,
    ModelRef,
    RunStarted,
    ToolCall,
    Usage,
    User,
    input_sha256,
)
from kiso.providers import FauxAdapter
from kiso.runtime import STREAM_VERSION, Agent, RunEvent
from kiso.tools.base import ToolContext, define_tool

KEYS: dict[str, set[str]] = {
    "text_delta": {"type", "v", "text"},
    "thinking_delta": {"type", "v", "text"},
    "retry": {"type", "v", "attempt", "delay", "error"},
    "model_turn": {"type", "v", "event"},
    "approval_request": {"type", "v", "call", "event", "offer"},
    "decision": {"type", "v", "call", "event"},
    "tool_start": {"type", "v", "call", "event"},
    "tool_output": {"type", "v", "call_id", "name", "execution_id", "text"},
    "tool_end": {"type", "v", "call", "event"},
    "uncertain": {"type", "v", "executions"},
    "ruling": {"type", "v", "event"},
    "paused": {"type", "v", "reason"},
    "terminal": {"type", "v", "outcome"},
    "compaction": {"type", "v", "event", "covered", "estimated"},
    "compaction_failed": {"type", "v", "reason", "failures", "disabled"},
}
UNCERTAIN_KEYS = {
    "execution_id",
    "call_id",
    "name",
    "input",
    "started_seq",
    "auto_rerun",
    "may_be_running",
}
OBJ = {"type": "object", "properties": {"tag": {"type": "string"}}}


def agent(tmp_path: Path, turns: list[dict[str, Any]]) -> Agent:
    def work(args: dict[str, Any], ctx: ToolContext) -> str:
        ctx.progress("half way\n")
        return f"worked {args.get('tag')}"

    return Agent(
        adapter=FauxAdapter(turns),
        tools=[define_tool("work", "Work", OBJ, work, effects="other")],
        store=JsonlSessionStore(tmp_path / "home"),
        workspace=tmp_path,
        retry_base_delay=0.001,
    )


def collect(session: Any, events: Any, answer: bool = True) -> list[RunEvent]:
    out = []
    for ev in events:
        out.append(ev)
        if ev.type == "approval_request" and answer:
            session.approve(ev.call_id)
        elif ev.type == "uncertain":
            for u in ev.executions:
                session.resolve(u.execution_id, "skipped")
    return out


def test_every_run_event_has_its_pinned_json_form(tmp_path: Path) -> None:
    turns: list[dict[str, Any]] = [
        {"error": {"status": 429, "message": "slow down"}},
        {
            "thinking": "let me see",
            "text": "Working.",
            "tool_calls": [{"name": "work", "input": {"tag": "a"}}],
        },
        {"text": "Done."},
        {"tool_calls": [{"name": "work", "input": {"tag": "b"}}]},
    ]
    a = agent(tmp_path, turns)
    seen: list[RunEvent] = []
    with a.session("j") as session:
        seen += collect(session, session.run_sync("go"))
        seen += collect(session, session.run_sync("again"), answer=False)  # paused
    # An execution that started and never reported (a crash), then a resume that rules it.
    with a.store.create(str(tmp_path), session_id="u") as log:  # type: ignore[attr-defined]
        call = ToolCall("c1", "work", {"tag": "u"})
        log.append(
            RunStarted(run="r", trigger="user", model=ModelRef("faux", "faux"), mode="default"),
            User(run="r", content="go"),
            Assistant(run="r", blocks=(call,), stop="tool_use", usage=Usage(), model="faux", ms=1),
            ApprovalDecided(
                run="r",
                call_id="c1",
                decision="approved",
                decided_by="user",
                reason=None,
                input_sha256=input_sha256(call.input),
            ),
            ExecutionStarted(
                run="r", execution_id="u:5", call_id="c1", name="work", input=call.input
            ),
        )
    with agent(tmp_path, [{"text": "(turn 1 is on disk)"}, {"text": "ok"}]).session("u") as session:
        seen += collect(session, session.resume_sync())

    # Context relief: a rejected summary (compaction_failed), then a good one (compaction).
    long = "x" * 2000
    relief = Agent(
        adapter=FauxAdapter(
            [{"text": long}, {"text": long}, {"text": "done"}],
            summaries=[{"text": ""}, {"text": "## Goal\nsay things\n## Next steps\nmore"}],
        ),
        store=JsonlSessionStore(tmp_path / "home"),
        workspace=tmp_path,
        window=1000,
    )
    with relief.session("c") as session:
        seen += collect(session, session.run_sync("talk"))
        seen += collect(session, session.run_sync("more"))
        seen += collect(session, session.run_sync("again"))

    union = {cls.type for cls in get_args(RunEvent)}
    assert {ev.type for ev in seen} == union == set(KEYS)
    records = {
        json.dumps(e.to_json(), sort_keys=True)
        for sid in ("j", "u", "c")
        for e in JsonlSessionStore(tmp_path / "home").load(sid).events
    }
    for ev in seen:
        obj = ev.to_json()
        assert set(obj) == KEYS[ev.type], ev.type
        assert obj["type"] == ev.type and obj["v"] == STREAM_VERSION == 1
        json.dumps(obj)  # plain JSON, nothing else
        if "event" in obj:  # the log's own record, exactly as it is on disk
            assert json.dumps(obj["event"], sort_keys=True) in records, ev.type
        if "call" in obj and obj["call"] is not None:
            assert set(obj["call"]) == {"call_id", "name", "input"}
    by_type = {ev.type: ev.to_json() for ev in seen}
    assert set(by_type["approval_request"]["offer"]) == {"rule", "no_rule_because", "warning"}
    assert by_type["approval_request"]["offer"]["rule"] == "work"
    (execution,) = by_type["uncertain"]["executions"]
    assert set(execution) == UNCERTAIN_KEYS
    assert execution["execution_id"] == "u:5" and execution["may_be_running"] is False
    assert by_type["tool_output"]["text"] == "half way\n"
    assert by_type["retry"]["attempt"] == 1 and by_type["retry"]["error"] == "slow down"
    assert by_type["paused"]["reason"] == "awaiting_approval"
    assert by_type["terminal"]["outcome"] == {"kind": "completed"}
    assert by_type["compaction_failed"] == {
        "type": "compaction_failed",
        "v": 1,
        "reason": "the summary was empty",
        "failures": 1,
        "disabled": False,
    }
    assert by_type["compaction"]["event"]["trigger"] == "auto"
