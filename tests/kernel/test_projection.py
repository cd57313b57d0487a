"""project(): the model's messages as a pure, byte-stable function of the log."""

from __future__ import annotations

import itertools
import json

from kiso.kernel import (
    AssistantMessage,
    Compacted,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    dumps_messages,
    plan,
    project,
    to_wire,
)
from kiso.kernel.messages import dumps_message
from kiso.kernel.recovery import CallModel

from .script import LogBuilder, call
from .test_recovery import scripted_session


def wire(events):  # type: ignore[no-untyped-def]
    return [to_wire(m) for m in project(events)]


def test_results_follow_their_turn_in_call_order_not_completion_order() -> None:
    b = LogBuilder()
    a, c = call("a", "read_file", path="x"), call("b", "read_file", path="y")
    b.start("r")
    b.user("read both")
    b.assistant(a, c)
    b.decide(a)
    b.decide(c)
    b.started(a, "xa")
    b.started(c, "xb")
    b.finished(c, "xb", "Y")  # b finishes first
    assert [m["role"] for m in wire(b.events)] == ["user", "assistant"]  # nothing half-done
    b.finished(a, "xa", "X")
    msgs = wire(b.events)
    assert [(m["role"], m.get("call_id")) for m in msgs] == [
        ("user", None),
        ("assistant", None),
        ("tool", "a"),
        ("tool", "b"),
    ]
    assert msgs[2]["content"] == "X" and msgs[3]["content"] == "Y"


def test_denied_and_resolved_calls_project_as_results() -> None:
    b = LogBuilder()
    rm, dep, mk = (
        call("c1", "shell", command="rm -rf /"),
        call("c2", "shell", command="./deploy"),
        call("c3", "shell", command="make"),
    )
    b.start("r")
    b.user("go")
    b.assistant(rm, dep, mk)
    b.decide(rm, "denied", by="floor", reason="rm -rf of /")
    b.decide(dep, by="user")
    b.decide(mk, by="user")
    b.started(dep, "x2")
    b.resolved(dep, "x2", "applied")
    b.started(mk, "x3")
    b.resolved(mk, "x3", "skipped")
    tools = [m for m in project(b.events) if isinstance(m, ToolResultMessage)]
    assert [(t.call_id, t.is_error) for t in tools] == [("c1", True), ("c2", False), ("c3", True)]
    assert tools[0].content == "[denied by floor] rm -rf of /"
    assert tools[1].content.startswith("[applied]")
    assert tools[2].content.startswith("[skipped]")


def test_a_rerun_projects_only_the_new_executions_result() -> None:
    b = LogBuilder()
    t = call("c", "shell", command="make")
    b.start("r")
    b.user("build")
    b.assistant(t)
    b.decide(t)
    b.started(t, "x1")
    b.resolved(t, "x1", "rerun")
    assert [m.role for m in project(b.events)] == ["user", "assistant"]
    b.started(t, "x2")
    b.finished(t, "x2", "built")
    tools = [m for m in project(b.events) if isinstance(m, ToolResultMessage)]
    assert [t.content for t in tools] == ["built"]


def test_every_call_gets_exactly_one_result_when_its_run_ends_unsettled() -> None:
    b = LogBuilder()
    a, c, d = call("a", "x", n=1), call("b", "x", n=2), call("c", "x", n=3)
    b.start("r")
    b.user("go")
    b.assistant(a, c, d)
    b.decide(a)
    b.request(c)
    b.decide(d)
    b.started(d, "xd")
    from kiso.kernel import Outcome

    b.end(Outcome.aborted("user"))
    b.start("r2")
    b.user("try again")
    msgs = project(b.events)
    tools = [m for m in msgs if isinstance(m, ToolResultMessage)]
    assert [t.call_id for t in tools] == ["a", "b", "c"]
    assert tools[0].content.startswith("[not run]")  # approved, never started
    assert tools[1].content.startswith("[not run]")  # never decided
    assert tools[2].content.startswith("[uncertain]")  # started, never finished
    assert isinstance(msgs[-1], UserMessage)
    assert isinstance(plan(b.events), CallModel)


def test_compaction_replaces_what_it_covers_and_keeps_pairs_whole() -> None:
    events, _ = scripted_session()
    cut = next(i for i, e in enumerate(events) if isinstance(e, Compacted)) + 1
    before, after = project(events[: cut - 1]), project(events[:cut])
    assert isinstance(after[0], UserMessage)
    assert "The user asked for a fix." in after[0].content[0].text  # type: ignore[union-attr]
    # covers_to_seq=11 covers run 1's first turn and its results; the second turn stays verbatim
    assert len(before) == 7 and len(after) == 1 + 3 - 1
    kept = after[1:]
    assert isinstance(kept[0], AssistantMessage)
    assert [b.call_id for b in kept[0].blocks] == ["c4"]  # type: ignore[union-attr]
    assert isinstance(kept[1], ToolResultMessage) and kept[1].content == "1 passed"
    # no result survives without its call
    declared = {
        b.call_id
        for m in after
        if isinstance(m, AssistantMessage)
        for b in m.blocks
        if isinstance(b, ToolCall)
    }
    assert {m.call_id for m in after if isinstance(m, ToolResultMessage)} == declared


def test_projection_is_byte_stable_and_prefix_stable_between_model_calls() -> None:
    events, _ = scripted_session()
    compaction_seq = next(e.seq for e in events if isinstance(e, Compacted))
    snapshots: list[tuple[int, list[bytes]]] = []
    for n in range(1, len(events) + 1):
        if isinstance(plan(events[:n]), CallModel):
            once = [dumps_message(m) for m in project(events[:n])]
            again = [dumps_message(m) for m in project(list(events[:n]))]
            assert once == again
            snapshots.append((n, once))
    assert len(snapshots) >= 6
    for (n1, earlier), (n2, later) in itertools.pairwise(snapshots):
        if n1 < compaction_seq <= n2:
            continue  # history was rewritten on purpose, by a persisted fact
        assert later[: len(earlier)] == earlier, (n1, n2)
        whole_earlier, whole_later = (
            dumps_messages(project(events[:n1])),
            dumps_messages(project(events[:n2])),
        )
        # request N+1 shares request N's bytes up to the close of N's last message
        assert whole_later.startswith(whole_earlier[:-1])


def test_every_tool_call_has_one_result_whenever_the_model_is_called() -> None:
    events, _ = scripted_session()
    for n in range(1, len(events) + 1):
        if not isinstance(plan(events[:n]), CallModel):
            continue
        msgs = [json.loads(dumps_message(m)) for m in project(events[:n])]
        declared = [
            b["call_id"]
            for m in msgs
            if m["role"] == "assistant"
            for b in m["content"]
            if b["type"] == "tool_call"
        ]
        answered = [m["call_id"] for m in msgs if m["role"] == "tool"]
        assert declared == answered, n
        # each assistant's results come straight after it
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                ids = [b["call_id"] for b in m["content"] if b["type"] == "tool_call"]
                follow = [x.get("call_id") for x in msgs[i + 1 : i + 1 + len(ids)]]
                assert follow == ids, n


def test_the_projection_of_a_known_log_is_exactly_this() -> None:
    b = LogBuilder()
    r = call("c1", "read_file", path="a.txt")
    b.start("r")
    b.user("what is in a.txt?")
    b.assistant(r, text="Reading.")
    b.decide(r)
    b.started(r, "x1")
    b.finished(r, "x1", "hello")
    b.assistant(text="It says hello.")
    assert dumps_messages(project(b.events)).decode() == (
        '[{"role":"user","content":[{"type":"text","text":"what is in a.txt?"}]},'
        '{"role":"assistant","content":[{"type":"text","text":"Reading."},'
        '{"type":"tool_call","call_id":"c1","name":"read_file","input":{"path":"a.txt"}}]},'
        '{"role":"tool","call_id":"c1","name":"read_file","content":"hello","is_error":false},'
        '{"role":"assistant","content":[{"type":"text","text":"It says hello."}]}]'
    )
