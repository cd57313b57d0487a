"""The closed event union: every type validates strictly and round-trips exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiso.kernel import (
    EventError,
    ImageBlock,
    Outcome,
    ThinkingBlock,
    ToolCall,
    event_from_json,
    header_from_json,
    input_sha256,
)
from kiso.kernel.events import EVENT_TYPES, SessionHeader, dumps_line

SAMPLES: dict[str, dict[str, Any]] = {
    "run_started": {
        "seq": 1,
        "ts": 10,
        "run": "r",
        "type": "run_started",
        "trigger": "user",
        "model": {"provider": "openai", "model": "gpt-5", "profile": "work"},
        "mode": "default",
    },
    "user": {
        "seq": 2,
        "ts": 11,
        "run": "r",
        "type": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgo="},
        ],
        "source": "user",
    },
    "assistant": {
        "seq": 3,
        "ts": 12,
        "run": "r",
        "type": "assistant",
        "blocks": [
            {"type": "thinking", "text": "hmm", "signature": "sig=="},
            {"type": "text", "text": "Reading."},
            {"type": "tool_call", "call_id": "c1", "name": "read_file", "input": {"path": "a"}},
        ],
        "stop": "tool_use",
        "usage": {"input": 100, "output": 20, "cache_read": 80, "cache_write": None},
        "model": "gpt-5",
        "ms": 420,
    },
    "approval_requested": {
        "seq": 4,
        "ts": 13,
        "run": "r",
        "type": "approval_requested",
        "call_id": "c1",
        "name": "read_file",
        "input": {"path": "a"},
        "speaker": "mode:default",
    },
    "approval_decided": {
        "seq": 5,
        "ts": 14,
        "run": "r",
        "type": "approval_decided",
        "call_id": "c1",
        "decision": "approved",
        "decided_by": "rule:read_file",
        "reason": None,
        "input_sha256": input_sha256({"path": "a"}),
        "rule": "read_file:**",
    },
    "execution_started": {
        "seq": 6,
        "ts": 15,
        "run": "r",
        "type": "execution_started",
        "execution_id": "s:6",
        "call_id": "c1",
        "name": "read_file",
        "input": {"path": "a"},
    },
    "execution_finished": {
        "seq": 7,
        "ts": 16,
        "run": "r",
        "type": "execution_finished",
        "execution_id": "s:6",
        "call_id": "c1",
        "ok": False,
        "content": "boom",
        "is_error": True,
        "ms": 3,
        "error_kind": "fatal",
        "truncated": True,
    },
    "execution_resolved": {
        "seq": 8,
        "ts": 17,
        "run": "r",
        "type": "execution_resolved",
        "execution_id": "s:6",
        "call_id": "c1",
        "resolution": "skipped",
        "decided_by": "user",
    },
    "compacted": {
        "seq": 9,
        "ts": 18,
        "run": "r",
        "type": "compacted",
        "covers_to_seq": 4,
        "summary": "asked to read a",
        "trigger": "manual",
        "tokens_before": 1000,
        "tokens_after": None,
    },
    "setting_changed": {
        "seq": 10,
        "ts": 19,
        "run": None,
        "type": "setting_changed",
        "key": "model",
        "value": {"profile": "claude"},
    },
    "run_ended": {
        "seq": 11,
        "ts": 20,
        "run": "r",
        "type": "run_ended",
        "outcome": {"kind": "error", "code": "rate_limit", "message": "429", "retryable": True},
    },
}
OPTIONAL = {("approval_decided", "rule"), ("execution_finished", "error_kind"),
            ("execution_finished", "truncated")}  # fmt: skip


def test_every_type_has_a_sample() -> None:
    assert set(SAMPLES) == EVENT_TYPES


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_sample_round_trips_byte_for_byte(kind: str) -> None:
    line = json.dumps(SAMPLES[kind], ensure_ascii=False, separators=(",", ":")) + "\n"
    event = event_from_json(json.loads(line))
    assert event.type == kind
    assert dumps_line(event.to_json()).decode() == line


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_a_missing_field_is_refused_by_name(kind: str) -> None:
    for key in SAMPLES[kind]:
        if key == "type" or (kind, key) in OPTIONAL or (kind, key) == ("setting_changed", "run"):
            continue
        broken = {k: v for k, v in SAMPLES[kind].items() if k != key}
        with pytest.raises(EventError, match=repr(key)):
            event_from_json(broken)


def _wrong(value: Any) -> list[Any]:
    options: list[Any] = [{"x": 1}, [1], "text", 7, -1, True, 1.5]
    if value is None:  # nullable strings and integers: the other containers are still wrong
        return [{"x": 1}, [1], True, 1.5]
    if type(value) is int:
        return [o for o in options if type(o) is not int or o < 0]
    return [o for o in options if type(o) is not type(value)]


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_a_field_of_the_wrong_type_is_refused(kind: str) -> None:
    for key, value in SAMPLES[kind].items():
        if key == "type" or (kind, key) == ("setting_changed", "value"):
            continue
        for bad in _wrong(value):
            if key == "ts" and type(bad) is int and bad >= 0:
                continue
            if (kind, key) == ("user", "content") and type(bad) is str:
                continue  # content is text or blocks
            with pytest.raises(EventError):
                event_from_json({**SAMPLES[kind], key: bad})


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_an_unknown_field_is_refused(kind: str) -> None:
    with pytest.raises(EventError, match="unknown field"):
        event_from_json({**SAMPLES[kind], "extra": 1})


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("run_started", "trigger", "cron"),
        ("user", "source", "model"),
        ("assistant", "stop", "done"),
        ("approval_decided", "decision", "maybe"),
        ("execution_finished", "error_kind", "oops"),
        ("execution_resolved", "resolution", "retry"),
        ("compacted", "trigger", "sometimes"),
        ("compacted", "covers_to_seq", 9),  # not below its own seq
        ("compacted", "summary", "   "),
        ("run_ended", "outcome", {"kind": "finished"}),
        ("run_ended", "outcome", {"kind": "aborted"}),
        ("run_ended", "outcome", {"kind": "completed", "by": "user"}),
        ("run_started", "run", None),
        ("user", "content", []),
        ("user", "content", [{"type": "image", "media_type": "image/png"}]),
        ("user", "content", [{"type": "image", "media_type": "image/bmp", "data": "x"}]),
        (
            "assistant",
            "blocks",
            [
                {"type": "tool_call", "call_id": "a", "name": "n", "input": {}},
                {"type": "tool_call", "call_id": "a", "name": "n", "input": {}},
            ],
        ),
        ("assistant", "blocks", [{"type": "tool_call", "call_id": "a", "name": "n", "input": []}]),
        ("assistant", "usage", {"input": 1}),
        ("execution_started", "seq", 0),
    ],
)
def test_values_outside_the_contract_are_refused(kind: str, key: str, value: Any) -> None:
    with pytest.raises(EventError):
        event_from_json({**SAMPLES[kind], key: value})


def test_unknown_types_and_non_objects_are_refused() -> None:
    for bad in [{"type": "text_delta", "seq": 1, "ts": 1, "run": "r"}, [], "x", None, {"seq": 1}]:
        with pytest.raises(EventError):
            event_from_json(bad)


def test_the_header() -> None:
    raw = {"seq": 0, "type": "session", "v": 1, "id": "k9", "workspace": "/w", "created": 5,
           "kiso": "0.1.0", "parent": None}  # fmt: skip
    header = header_from_json(raw)
    assert header == SessionHeader(id="k9", workspace="/w", created=5, kiso="0.1.0")
    assert header.to_json() == raw
    with pytest.raises(EventError, match="upgrade kiso"):
        header_from_json({**raw, "v": 2})
    with pytest.raises(EventError):
        header_from_json({**raw, "seq": 1})
    with pytest.raises(EventError):
        header_from_json({**raw, "type": "user"})


def test_outcome_constructors_enforce_their_fields() -> None:
    assert Outcome.aborted("user").to_json() == {"kind": "aborted", "by": "user"}
    with pytest.raises(EventError):
        Outcome("error")
    with pytest.raises(EventError):
        Outcome("finished")  # type: ignore[arg-type]


def test_input_digest_is_canonical() -> None:
    assert input_sha256({"b": 1, "a": "é"}) == input_sha256({"a": "é", "b": 1})
    assert input_sha256({"a": 1}) != input_sha256({"a": 2})


# --------------------------------------------------------------------------- properties

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)
ids = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)


@st.composite
def blocks(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["text", "thinking", "tool_call"]))
        if kind == "text":
            out.append({"type": "text", "text": draw(st.text(max_size=40))})
        elif kind == "thinking":
            block = ThinkingBlock(draw(st.text(max_size=20)), draw(st.none() | st.text(max_size=8)))
            out.append(block.to_json())
        else:
            out.append(ToolCall(f"c{i}", draw(ids), draw(json_objects)).to_json())
    return out


@settings(max_examples=200)
@given(
    blocks=blocks(),
    seq=st.integers(1, 10**9),
    ts=st.integers(0, 2**48),
    usage=st.tuples(*[st.none() | st.integers(0, 10**7)] * 4),
)
def test_assistant_records_round_trip(
    blocks: list[dict[str, Any]], seq: int, ts: int, usage: tuple[Any, ...]
) -> None:
    raw = {
        "seq": seq, "ts": ts, "run": "r", "type": "assistant", "blocks": blocks, "stop": "end_turn",
        "usage": dict(zip(["input", "output", "cache_read", "cache_write"], usage, strict=True)),
        "model": "m", "ms": 1,
    }  # fmt: skip
    event = event_from_json(json.loads(dumps_line(raw)))
    assert event.to_json() == raw
    assert event_from_json(json.loads(dumps_line(event.to_json()))) == event


@settings(max_examples=300)
@given(st.sampled_from(sorted(SAMPLES)), json_objects)
def test_arbitrary_json_is_an_event_error_or_a_valid_event(
    kind: str, noise: dict[str, Any]
) -> None:
    candidate = {**SAMPLES[kind], **noise}
    try:
        event = event_from_json(candidate)
    except EventError:
        return
    assert event_from_json(event.to_json()) == event


def test_images_need_exactly_one_source() -> None:
    assert ImageBlock("image/png", url="https://x/y.png").to_json() == {
        "type": "image", "media_type": "image/png", "url": "https://x/y.png"
    }  # fmt: skip
