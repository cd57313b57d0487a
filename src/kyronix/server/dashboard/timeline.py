"""A session's timeline: its kiso log (and the server's rows about it) as entries a person reads.

Pure: :func:`timeline` takes the events of ``store.load(session_id).events`` and what the
server knows beside them (which run issued each tool ``executionId``: ``kx_executions``) and
returns one :class:`Entry` per event worth showing, in ``seq`` order, each labelled with its kind,
time and seq:

* ``user`` — what was asked (the tunnel results put in front of a follow-up input are left out:
  they are their own entries); a ``system`` input is the server asking the model again.
* ``assistant`` — the model's KML (each assistant record's text) and the tool calls it made.
* ``tool_call`` / ``receipt`` — a tool the server ran for a server-driven run
  (``execution_started``, then ``execution_finished`` with the executer's result and its
  ``executionId``); a start never followed by its receipt is **uncertain**.
* ``resolved`` — who ruled on an uncertain execution (``decided_by``) and how.
* ``results`` — what an executer answered for a plan (``setting_changed kyronix.results``):
  each tool with its ``executionId`` and result (an ``uncertain`` one is marked so).
* ``outcome`` — the run's recorded outcome (``kyronix.result``): status, run id, execution ids.
* ``approval_requested`` / ``approval_decided``, ``compacted``, ``run_started`` / ``run_ended``,
  ``setting`` (any other setting).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiso.kernel.events import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    Compacted,
    Event,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    RunEnded,
    RunStarted,
    SettingChanged,
    User,
)
from kyronix import kml
from kyronix.server.sessions import RESULT_KEY, RESULTS_KEY, asked

__all__ = ["Entry", "Fact", "Item", "timeline"]

Fact = tuple[str, str]


@dataclass(frozen=True)
class Item:
    title: str
    facts: tuple[Fact, ...] = ()
    text: str | None = None
    uncertain: bool = False


@dataclass(frozen=True)
class Entry:
    seq: int
    ts: int
    kind: str
    """A fixed word: user, assistant, tool_call, receipt, resolved, results, outcome, …"""
    label: str
    """What a person reads as the entry's heading."""
    css: str = ""
    """The timeline's class: ``user``, ``result``, ``uncertain`` or nothing."""
    text: str | None = None
    """Preformatted text: the input, the KML, a result."""
    facts: tuple[Fact, ...] = ()
    items: tuple[Item, ...] = field(default=())
    """The tool calls of a turn, or the tools of a results record."""


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _result_item(entry: Any, issued: Mapping[str, str]) -> Item:
    if not isinstance(entry, dict):
        return Item("(an entry that is not an object)", text=_json(entry))
    raw = entry.get("result")
    result: dict[str, Any] = raw if isinstance(raw, dict) else {}
    exec_id = str(result.get("executionId") or "")
    uncertain = bool(result.get("uncertain"))
    state = (
        "uncertain: started, never finished"
        if uncertain
        else "succeeded"
        if result.get("success") is True
        else "failed"
    )
    facts: list[Fact] = [("executionId", exec_id or "(none)"), ("state", state)]
    if exec_id and exec_id in issued:
        facts.append(("issued by run", issued[exec_id]))
    if result.get("errorType"):
        facts.append(("error type", str(result["errorType"])))
    if isinstance(entry.get("args"), dict) and entry["args"]:
        facts.append(("args", json.dumps(entry["args"], ensure_ascii=False, sort_keys=True)))
    body = result.get("output", result.get("error"))
    text = body if isinstance(body, str) else (_json(body) if body is not None else None)
    return Item(str(entry.get("tool") or "(tool)"), tuple(facts), text, uncertain)


def _verdict(ev: ExecutionFinished) -> str:
    """How the tool ended, in a word: ``ok``; ``error`` (it answered with an error), or
    ``failed`` (its handler itself failed: ``ok`` false), each with its kind when known."""
    if not ev.is_error and ev.ok:
        return "ok"
    kind = f" ({ev.error_kind})" if ev.error_kind else ""
    return ("error" if ev.ok else "failed") + kind


def _receipt(ev: ExecutionFinished, issued: Mapping[str, str]) -> tuple[tuple[Fact, ...], str]:
    """The receipt's facts (the executer's executionId when its content is a result entry) and
    its content, pretty when it is JSON."""
    facts: list[Fact] = [
        ("kiso execution", ev.execution_id),
        ("call", ev.call_id),
        ("result", _verdict(ev)),
        ("took", f"{ev.ms} ms"),
    ]
    text = ev.content
    try:
        parsed = json.loads(ev.content)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        result = parsed.get("result")
        if isinstance(result, dict) and result.get("executionId"):
            exec_id = str(result["executionId"])
            facts.insert(0, ("executionId", exec_id))
            if exec_id in issued:
                facts.append(("issued by run", issued[exec_id]))
        text = _json(parsed)
    return tuple(facts), text


def timeline(events: Sequence[Event], issued: Mapping[str, str] | None = None) -> list[Entry]:
    """The session's entries, in ``seq`` order. ``issued``: executionId → the run that issued
    it (the server's ``kx_executions``)."""
    issued = issued or {}
    finished = {ev.execution_id for ev in events if isinstance(ev, ExecutionFinished)}
    calls: dict[str, str] = {}  # call id -> tool name, from the assistant records
    out: list[Entry] = []
    for ev in events:
        if isinstance(ev, User):
            system = ev.source != "user"
            out.append(
                Entry(
                    ev.seq,
                    ev.ts,
                    "user",
                    "User input" if not system else f"{ev.source} input",
                    "user" if not system else "",
                    asked(ev),
                    (("run", ev.run),),
                )
            )
        elif isinstance(ev, Assistant):
            items = []
            for call in ev.calls:
                calls[call.call_id] = call.name
                items.append(Item(call.name, (("call", call.call_id),), _json(call.input)))
            facts: tuple[Fact, ...] = (
                ("model", ev.model),
                ("stop", ev.stop),
                ("prompt tokens", str(ev.usage.input if ev.usage.input is not None else "?")),
                (
                    "completion tokens",
                    str(ev.usage.output if ev.usage.output is not None else "?"),
                ),
                ("took", f"{ev.ms} ms"),
                ("run", ev.run),
            )
            out.append(
                Entry(ev.seq, ev.ts, "assistant", "Model (KML)", "", ev.text, facts, tuple(items))
            )
        elif isinstance(ev, ExecutionStarted):
            uncertain = ev.execution_id not in finished
            out.append(
                Entry(
                    ev.seq,
                    ev.ts,
                    "tool_call",
                    f"Tool call: {ev.name}" + (" — uncertain (no receipt)" if uncertain else ""),
                    "uncertain" if uncertain else "",
                    _json(ev.input),
                    (("kiso execution", ev.execution_id), ("call", ev.call_id), ("run", ev.run)),
                )
            )
        elif isinstance(ev, ExecutionFinished):
            facts, text = _receipt(ev, issued)
            name = calls.get(ev.call_id, "")
            out.append(
                Entry(
                    ev.seq,
                    ev.ts,
                    "receipt",
                    "Receipt" + (f": {name}" if name else ""),
                    "result",
                    text,
                    facts,
                )
            )
        elif isinstance(ev, ExecutionResolved):
            out.append(
                Entry(
                    ev.seq,
                    ev.ts,
                    "resolved",
                    f"Uncertain execution ruled: {ev.resolution}",
                    "uncertain",
                    None,
                    (
                        ("decided by", ev.decided_by),
                        ("resolution", ev.resolution),
                        ("kiso execution", ev.execution_id),
                        ("call", ev.call_id),
                    ),
                )
            )
        elif isinstance(ev, ApprovalRequested):
            out.append(
                Entry(
                    ev.seq,
                    ev.ts,
                    "approval_requested",
                    f"Approval requested: {ev.name}",
                    "",
                    _json(ev.input),
                    (("asked by", ev.speaker), ("call", ev.call_id)),
                )
            )
        elif isinstance(ev, ApprovalDecided):
            facts = (("decided by", ev.decided_by), ("call", ev.call_id))
            if ev.rule:
                facts += (("rule", ev.rule),)
            out.append(
                Entry(
                    ev.seq,
                    ev.ts,
                    "approval_decided",
                    f"Approval {ev.decision}",
                    "result" if ev.decision == "approved" else "uncertain",
                    ev.reason,
                    facts,
                )
            )
        elif isinstance(ev, Compacted):
            out.append(
                Entry(
                    ev.seq,
                    ev.ts,
                    "compacted",
                    "Compacted",
                    "",
                    ev.summary,
                    (
                        ("covers up to seq", str(ev.covers_to_seq)),
                        ("trigger", ev.trigger),
                        ("tokens before", str(ev.tokens_before or "?")),
                        ("tokens after", str(ev.tokens_after or "?")),
                    ),
                )
            )
        elif isinstance(ev, SettingChanged):
            out.append(_setting(ev, issued))
        elif isinstance(ev, RunStarted):
            out.append(
                Entry(
                    ev.seq,
                    ev.ts,
                    "run_started",
                    "Run started",
                    "",
                    None,
                    (
                        ("run", ev.run),
                        ("trigger", ev.trigger),
                        ("model", f"{ev.model.provider}/{ev.model.model}"),
                        ("mode", ev.mode),
                    ),
                )
            )
        elif isinstance(ev, RunEnded):
            o = ev.outcome
            facts = (("run", ev.run), ("outcome", o.kind))
            if o.code:
                facts += (("code", o.code),)
            out.append(
                Entry(ev.seq, ev.ts, "run_ended", f"Run ended: {o.kind}", "", o.message, facts)
            )
    return out


def _issued_tools(response: object, issued: Mapping[str, str]) -> tuple[Item, ...]:
    """Each tool of the plan the client was given, with the ``executionId`` the server put on
    it (the executer's receipt for it comes back under that id)."""
    if not isinstance(response, str) or not response:
        return ()
    try:
        plan = kml.parse(response)
    except kml.KmlError:
        return ()
    items = []
    for tool in plan.tools:
        facts: list[Fact] = [("executionId", tool.execution_id)]
        if tool.execution_id in issued:
            facts.append(("issued by run", issued[tool.execution_id]))
        args = json.dumps(tool.args, ensure_ascii=False) if tool.args else None
        items.append(Item(tool.name, tuple(facts), args))
    return tuple(items)


def _setting(ev: SettingChanged, issued: Mapping[str, str]) -> Entry:
    value = ev.value
    if ev.key == RESULTS_KEY and isinstance(value, dict):
        results = value.get("results") or []
        items = tuple(
            _result_item(r, issued) for r in (results if isinstance(results, list) else [])
        )
        doubtful = any(i.uncertain for i in items)
        return Entry(
            ev.seq,
            ev.ts,
            "results",
            "Executer results",
            "uncertain" if doubtful else "result",
            None,
            (("request", str(value.get("requestId") or "")),),
            items,
        )
    if ev.key == RESULT_KEY and isinstance(value, dict):
        facts: list[Fact] = [("status", str(value.get("status", "completed")))]
        if value.get("runId"):
            facts.append(("run", str(value["runId"])))
        ids = value.get("executionIds")
        if isinstance(ids, list) and ids:
            facts.append(("executionIds", ", ".join(str(i) for i in ids)))
        error = value.get("error")
        text = _json(error) if error else None
        return Entry(
            ev.seq, ev.ts, "outcome", "Run outcome", "", text, tuple(facts),
            _issued_tools(value.get("response"), issued),
        )  # fmt: skip
    return Entry(
        ev.seq,
        ev.ts,
        "setting",
        f"Setting changed: {ev.key}",
        "",
        value if isinstance(value, str) else _json(value),  # a prompt reads as text
        (("run", ev.run or "(between runs)"),),
    )
