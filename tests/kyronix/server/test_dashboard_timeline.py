"""The dashboard's pure parts: a session's events as timeline entries, spend per day as SVG."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from typing import Any

from kiso.kernel import (
    Assistant,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    ModelRef,
    Outcome,
    RunEnded,
    RunStarted,
    SettingChanged,
    TextBlock,
    ToolCall,
    Usage,
    User,
)
from kyronix import kml
from kyronix.server.agents import RESULTS_HEADER, finalize
from kyronix.server.dashboard.chart import DAY_MS, credits_text, daily_spend, spend_svg
from kyronix.server.dashboard.timeline import timeline

EXEC = "exec_" + "c" * 32


def stamped(*events: Any) -> list[Any]:
    """Events as the store gives them back: seq from 1, a time each."""
    return [
        dataclasses.replace(ev, seq=n, ts=1_700_000_000_000 + n)
        for n, ev in enumerate(events, start=1)
    ]


def test_inputs_kml_tool_calls_receipts_and_rulings() -> None:
    entry = {"tool": "execute_sql", "result": {"success": True, "output": "3 rows",
             "executionId": EXEC}}  # fmt: skip
    events = stamped(
        RunStarted(run="r", trigger="api", model=ModelRef("kyronix", "scripted"), mode="tunnel"),
        User(run="r", content=(TextBlock(f"{RESULTS_HEADER}:\n- x"), TextBlock("count users"))),
        Assistant(
            run="r",
            blocks=(TextBlock("<kyronix/>"), ToolCall("c1", "execute_sql", {"sql_query": "q"})),
            stop="tool_use", usage=Usage(input=10, output=4), model="m", ms=2,
        ),
        ExecutionStarted(run="r", execution_id="k1", call_id="c1", name="execute_sql",
                         input={"sql_query": "q"}),
        ExecutionFinished(run="r", execution_id="k1", call_id="c1", ok=True,
                          content=json.dumps(entry), is_error=False, ms=1),
        ExecutionStarted(run="r", execution_id="k2", call_id="c2", name="execute_sql",
                         input={"sql_query": "drop"}),
        ExecutionResolved(run="r", execution_id="k2", call_id="c2", resolution="rerun",
                          decided_by="carol"),
        RunEnded(run="r", outcome=Outcome("error", code="boom", message="it failed",
                                          retryable=False)),
    )  # fmt: skip
    entries = timeline(events, {EXEC: "run_1234"})
    kinds = [e.kind for e in entries]
    assert kinds == [
        "run_started", "user", "assistant", "tool_call", "receipt", "tool_call", "resolved",
        "run_ended",
    ]  # fmt: skip
    assert [e.seq for e in entries] == list(range(1, 9))
    user, assistant = entries[1], entries[2]
    assert user.text == "count users" and user.css == "user"  # the results block left out
    assert assistant.text == "<kyronix/>"
    assert ("prompt tokens", "10") in assistant.facts
    assert assistant.items[0].title == "execute_sql"
    first_call, receipt, second_call, ruling = entries[3], entries[4], entries[5], entries[6]
    assert first_call.css == "" and "uncertain" not in first_call.label
    assert ("executionId", EXEC) in receipt.facts and ("issued by run", "run_1234") in receipt.facts
    assert receipt.text is not None and "3 rows" in receipt.text and receipt.css == "result"
    assert receipt.label == "Receipt: execute_sql"
    assert second_call.css == "uncertain" and "uncertain" in second_call.label
    assert ("decided by", "carol") in ruling.facts and ruling.css == "uncertain"
    assert entries[-1].label == "Run ended: error" and entries[-1].text == "it failed"


def test_executer_results_outcomes_and_other_settings() -> None:
    events = stamped(
        SettingChanged(key="kyronix.results", run=None, value={"requestId": "req_9", "results": [
            {"tool": "a", "args": {"p": "1"}, "result": {"success": True, "output": "fine",
                                                        "executionId": EXEC}},
            {"tool": "b", "result": {"success": False, "uncertain": True,
                                     "executionId": "exec_" + "d" * 32}},
            "not an entry",
        ]}),
        SettingChanged(key="kyronix.result", value={"runId": "run_1", "status": "completed",
                                                    "executionIds": [EXEC]}),
        SettingChanged(key="model", value="groq/x"),
    )  # fmt: skip
    results, outcome, other = timeline(events)
    assert results.kind == "results" and results.css == "uncertain"
    assert ("request", "req_9") in results.facts
    a, b, junk = results.items
    assert (a.title, a.text, a.uncertain) == ("a", "fine", False)
    assert ("executionId", EXEC) in a.facts and ("state", "succeeded") in a.facts
    assert b.uncertain and ("state", "uncertain: started, never finished") in b.facts
    assert junk.title.startswith("(an entry")
    assert outcome.kind == "outcome" and ("executionIds", EXEC) in outcome.facts
    assert other.kind == "setting" and other.text == "groq/x"  # a string reads as text


def test_a_plan_runs_outcome_names_each_tool_with_the_execution_id_it_was_given() -> None:
    plan = kml.parse(
        '<kyronix><tool name="write_file"><path>a.py</path></tool>'
        '<tool name="run_command"><command>pytest</command></tool></kyronix>'
    )
    response, ids = finalize(plan, "run_key_1")
    events = stamped(
        SettingChanged(key="kyronix.result", value={"runId": "run_1", "status": "completed",
                                                    "response": response, "executionIds": ids}),
        SettingChanged(key="kyronix.result", value={"runId": "run_2", "response": "<not kml"}),
    )  # fmt: skip
    outcome, broken = timeline(events, {ids[1]: "run_1"})
    first, second = outcome.items
    assert (first.title, second.title) == ("write_file", "run_command")
    assert ("executionId", ids[0]) in first.facts and ("executionId", ids[1]) in second.facts
    assert ("issued by run", "run_1") in second.facts
    assert first.text is not None and "a.py" in first.text
    assert broken.items == ()  # a response that is not KML lists nothing, and does not fail


def test_a_receipt_says_in_one_word_how_the_tool_ended() -> None:
    def receipt(**kw: Any) -> Any:
        fields = {"ok": True, "is_error": False, **kw}
        events = stamped(
            ExecutionStarted(run="r", execution_id="k", call_id="c", name="t", input={}),
            ExecutionFinished(run="r", execution_id="k", call_id="c", content="x", ms=1, **fields),
        )
        return dict(timeline(events)[1].facts)["result"]

    assert receipt() == "ok"
    assert receipt(is_error=True, error_kind="timeout") == "error (timeout)"
    assert receipt(ok=False, is_error=True, error_kind="fatal") == "failed (fatal)"


def test_an_empty_log_is_an_empty_timeline() -> None:
    assert timeline([]) == []


# --------------------------------------------------------------------------- the chart


def ms(day: str, hour: int = 12) -> int:
    return int(datetime.fromisoformat(f"{day}T{hour:02d}:00:00+00:00").timestamp() * 1000)


def test_daily_spend_counts_charges_less_refunds_per_utc_day() -> None:
    rows = [
        (ms("2025-03-01", 0), "settle", -1500),
        (ms("2025-03-01", 23), "settle", -500),
        (ms("2025-03-01", 23), "refund", 250),
        (ms("2025-03-02"), "hold", -9000),  # holds and releases are not spending
        (ms("2025-03-02"), "release", 9000),
        (ms("2025-03-02"), "grant", 100_000),
        (ms("2025-03-03"), "settle", -1),
        (ms("2025-02-01"), "settle", -7),  # before the window
    ]
    series = daily_spend(rows, today_ms=ms("2025-03-03"), days=3)
    assert series == [("2025-03-01", 1750), ("2025-03-02", 0), ("2025-03-03", 1)]
    assert len(daily_spend([], today_ms=ms("2025-03-03"))) == 14
    assert daily_spend([], today_ms=ms("2025-03-03"))[-1][0] == "2025-03-03"
    assert ms("2025-03-02") - ms("2025-03-01") == DAY_MS
    assert datetime.fromtimestamp(ms("2025-03-01") / 1000, UTC).day == 1


def test_the_svg_is_valid_labelled_and_escaped() -> None:
    series = [("2025-03-01", 1750), ("2025-03-02", 0), ("<b>&", 500)]
    svg = spend_svg(series, title='Spend "per" <day>')
    root = ET.fromstring(svg)  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg" and root.get("role") == "img"
    assert root.find(f"{ns}title").text == 'Spend "per" <day>'  # type: ignore[union-attr]
    desc = root.find(f"{ns}desc").text  # type: ignore[union-attr]
    assert desc is not None and "2.25 credits" in desc and "2025-03-01" in desc
    assert "Spend" in (root.get("aria-label") or "")
    bars = root.findall(f"{ns}rect")
    assert len(bars) == 3
    heights = [float(b.get("height") or 0) for b in bars]
    assert heights[0] > heights[2] > heights[1] == 0
    assert bars[0].find(f"{ns}title").text == "2025-03-01: 1.75 credits"  # type: ignore[union-attr]
    assert "<b>" not in svg and "&lt;b&gt;&amp;" in svg
    assert ET.fromstring(spend_svg([])).find(f"{ns}desc").text == "No days to show."  # type: ignore[union-attr]


def test_credits_text() -> None:
    assert [credits_text(v) for v in (0, 1000, 1500, 1234567, 1)] == [
        "0", "1", "1.5", "1,234.567", "0.001",
    ]  # fmt: skip
