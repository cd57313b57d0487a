"""Logs written by earlier versions keep loading, and the v1 format stays byte-for-byte frozen.

Each file in tests/corpus/v1 was written by kiso 0.1.0 (the scripted session of test_recovery,
and the logs of a real `kiso demo` run: killed mid-call, torn, and recovered). Loading one and
writing its events back must give the same bytes: a changed key order or field name fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiso.kernel import parse_log, plan, summarize
from kiso.kernel.events import dumps_line
from kiso.kernel.recovery import ResolveUncertain

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "v1"
STATES = {
    "scripted-3-runs.jsonl": "ended",
    "demo-kill9-recovered.jsonl": "completed",
    "demo-killed-mid-call.jsonl": "uncertain",
    "torn-tail.jsonl": "uncertain",
}


def test_the_corpus_is_complete() -> None:
    assert {p.name for p in CORPUS.glob("*.jsonl")} == set(STATES)


@pytest.mark.parametrize("name", sorted(STATES))
def test_each_log_loads_and_rewrites_to_the_same_bytes(name: str) -> None:
    data = (CORPUS / name).read_bytes()
    log = parse_log(data, name)
    assert log.header.v == 1
    assert summarize(log).state.value == STATES[name]
    rewritten = dumps_line(log.header.to_json()) + b"".join(
        dumps_line(e.to_json()) for e in log.events
    )
    whole = data[: data.rindex(b"\n") + 1]
    assert rewritten == whole
    assert log.torn_tail == (name == "torn-tail.jsonl")


def test_the_killed_demo_names_its_one_uncertain_execution() -> None:
    log = parse_log((CORPUS / "demo-killed-mid-call.jsonl").read_bytes())
    action = plan(log.events)
    assert isinstance(action, ResolveUncertain)
    assert [(u.name, u.call_id) for u in action.executions] == [("append_file", "call_2")]
