"""``kiso doctor``: a damaged log is repaired without running again anything that has a receipt.

The logs here are written by a real agent process (tests/e2e/driver.py: the SDK, the scripted
model and an ``effect`` tool that appends to effects.log), then damaged line by line. Every repair
must load, keep the valid prefix byte for byte, keep every readable receipt, and leave recovery
nothing to execute that had started; end to end, resuming a repaired session never repeats an
effect that had a receipt.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import (
    Assistant,
    Compacted,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    JsonlSessionStore,
    ModelRef,
    RunStarted,
    SessionLockedError,
    ToolCall,
    Usage,
    User,
    parse_log,
    plan,
    replay,
)
from kiso.kernel.doctor import DOCTOR, RepairStatus, repair_log, repair_session
from kiso.kernel.events import ApprovalDecided, input_sha256
from kiso.kernel.lock import SessionLock
from kiso.kernel.messages import ToolResultMessage
from kiso.kernel.recovery import EndRun, Execute, Idle, ResolveUncertain
from tests.e2e.test_crash import driver

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "e2e" / "driver.py"
KISO = Path(sys.executable).parent / "kiso"
NOW = 1_800_000_000_000

SCRIPT = {
    "turns": [
        {
            "text": "Two things.",
            "tool_calls": [
                {"name": "effect", "input": {"tag": "a"}},
                {"name": "peek", "input": {"tag": "p"}},
            ],
        },
        {"tool_calls": [{"name": "effect", "input": {"tag": "b"}}]},
        {"tool_calls": [{"name": "effect", "input": {"tag": "c"}}]},
        {"text": "Done."},
        {"text": "Nothing more to do."},  # the next run's one turn
    ]
}


def doctor(home: Path, session_id: str = "s") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KISO), "doctor", session_id],
        env={**os.environ, "KISO_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def effects(ws: Path) -> list[str]:
    log = ws / "effects.log"
    return log.read_text().splitlines() if log.exists() else []


class Setup:
    def __init__(self, root: Path) -> None:
        self.home, self.ws, self.script = root / "home", root / "ws", root / "script.json"
        self.ws.mkdir(parents=True)
        self.script.write_text(json.dumps(SCRIPT))

    @property
    def log(self) -> Path:
        return JsonlSessionStore(self.home).path_of("s")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real finished session: three effects and a read, each with its receipt."""
    s = Setup(tmp_path_factory.mktemp("finished"))
    out = driver(s.home, s.ws, s.script, "run", "go")
    assert out.returncode == 0, out.stderr
    assert effects(s.ws) == ["a", "b", "c"]
    return s.log.read_bytes()


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real session killed by SIGKILL right after effect c's execution_started."""
    s = Setup(tmp_path_factory.mktemp("interrupted"))
    out = driver(s.home, s.ws, s.script, "run", "go", failpoint="execution_started:4")
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert effects(s.ws) == ["a", "b"]
    return s.log.read_bytes()


# --------------------------------------------------------------------------- damage


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")[:-1]


def _join(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def garble(line: bytes) -> bytes:
    """Bytes overwritten in the middle of a line (the ends, and most keys, survive)."""
    return line[:30] + b"\x00\x00garbage\x00" + line[42:]


def unreadable(line: bytes) -> bytes:
    """A line with nothing left to read."""
    return b"\x00" * len(line)


def invalid_event(line: bytes) -> bytes:
    """Valid JSON that is not a valid event (an unknown key)."""
    return line[:-1] + b',"extra":1}'


DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "garbled": garble,
    "unreadable": unreadable,
    "invalid-event": invalid_event,
}


def damaged(data: bytes, number: int, how: str) -> bytes:
    lines = _lines(data)
    if how == "deleted":
        del lines[number - 1]
    elif how == "duplicated":
        lines.insert(number, lines[number - 1])
    else:
        lines[number - 1] = DAMAGES[how](lines[number - 1])
    return _join(lines)


def receipts(data: bytes) -> dict[str, int]:
    """Execution id -> the line of its receipt or ruling, in a log's readable lines."""
    out: dict[str, int] = {}
    for number, line in enumerate(_lines(data), 1):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if obj.get("type") in ("execution_finished", "execution_resolved"):
            out.setdefault(obj["execution_id"], number)
    return out


def starts(data: bytes) -> dict[str, str]:
    """Call id -> execution id, for every execution_started of a log."""
    return {
        obj["call_id"]: obj["execution_id"]
        for obj in (json.loads(line) for line in _lines(data))
        if obj.get("type") == "execution_started"
    }


def check_repair(original: bytes, broken: bytes, number: int) -> Any:
    """The invariants every repair keeps; returns the repaired log."""
    result = repair_log(broken, "/x/s.jsonl", "s", now=NOW)
    assert result.status is RepairStatus.REPAIRED, result.report()
    assert result.data is not None
    log = parse_log(result.data, "/x/s.jsonl", session_id="s")  # it loads, contract and all
    assert [e.seq for e in log.events] == list(range(1, len(log.events) + 1))
    prefix = _join(_lines(broken)[: result.damaged_line - 1])
    assert result.data.startswith(prefix)  # the valid prefix, byte for byte
    assert result.damaged_line <= number + 1
    kept = {e.execution_id for e in log.events if isinstance(e, ExecutionFinished)}
    ruled = {e.execution_id for e in log.events if isinstance(e, ExecutionResolved)}
    for execution_id, line in receipts(original).items():
        if line == number:  # this receipt is the damaged line itself
            continue
        assert execution_id in kept | ruled, (execution_id, result.report())
    assert set(result.finished) == kept and set(result.ruled) == ruled - kept
    # the model is shown every call that started (or it is in the open turn, whose results are
    # shown together once all are settled): none looks undone
    state = replay(log.events)
    shown = {m.call_id for m in state.messages if isinstance(m, ToolResultMessage)}
    pending = {cs.call.call_id for cs in state.turn or ()}
    assert set(starts(original)) <= shown | pending, result.report()
    # nothing that started is executed again by recovery
    action = plan(log.events, rerunnable={"peek"})
    if isinstance(action, Execute):
        assert not {c.call_id for c in action.calls} & set(starts(original)), action
    return log


def _cases(n: int) -> list[tuple[int, str]]:
    return [(line, how) for line in range(2, n + 1) for how in (*DAMAGES, "deleted", "duplicated")]


def test_every_line_of_a_finished_session_damaged_every_way(finished: bytes) -> None:
    n = len(_lines(finished))
    for number, how in _cases(n):
        broken = damaged(finished, number, how)
        if how == "deleted" and number == n:
            assert repair_log(broken, "/x/s.jsonl", "s", now=NOW).status is RepairStatus.HEALTHY
            continue
        log = check_repair(finished, broken, number)
        action = plan(log.events)
        assert isinstance(action, Idle | EndRun), (number, how, action)


def test_every_line_of_an_interrupted_session_damaged_every_way(interrupted: bytes) -> None:
    n = len(_lines(interrupted))
    for number, how in _cases(n):
        broken = damaged(interrupted, number, how)
        if how == "deleted" and number == n:
            continue  # the log loads (its last start is simply gone: nothing ran)
        log = check_repair(interrupted, broken, number)
        action = plan(log.events, rerunnable={"peek"})
        # effect c started and has no receipt: whatever was damaged, a human rules on it; so
        # on any execution whose receipt was the damaged line (nothing can tell if it ran)
        assert isinstance(action, ResolveUncertain), (number, how, action)
        # (a receipt still readable enough to name its execution is ruled applied instead)
        gone = how in ("unreadable", "deleted")
        lost = {x for x, line in receipts(interrupted).items() if line == number and gone}
        expected = {"call_2_0"} | {c for c, x in starts(interrupted).items() if x in lost}
        assert {u.call_id for u in action.executions} == expected, (number, how)


def test_a_healthy_log_needs_nothing(finished: bytes, interrupted: bytes) -> None:
    for data in (finished, interrupted, finished + b'{"seq":99,"ts"'):
        result = repair_log(data, "/x/s.jsonl", "s", now=NOW)
        assert result.status is RepairStatus.HEALTHY and result.data is None
    torn = repair_log(finished + b'{"seq":9', "/x/s.jsonl", "s", now=NOW)
    assert "torn" in torn.report()[0] and "nothing to repair" in torn.report()[0]


def test_a_damaged_header_is_refused(finished: bytes) -> None:
    lines = _lines(finished)
    for header in (garble(lines[0]), lines[0].replace(b'"id":"s"', b'"id":"other"')):
        result = repair_log(_join([header, *lines[1:]]), "/x/s.jsonl", "s", now=NOW)
        assert result.status is RepairStatus.REFUSED and result.data is None
        assert "line 1, the header" in result.report()[0]


def test_receipts_after_the_damage_are_kept(finished: bytes) -> None:
    """The first assistant is lost: every record after it is kept, and the turn is rebuilt from
    its calls' records, so the model is shown that a, p were done."""
    lines = _lines(finished)
    first = next(i for i, line in enumerate(lines, 1) if b'"type":"assistant"' in line)
    result = repair_log(damaged(finished, first, "unreadable"), "/x/s.jsonl", "s", now=NOW)
    assert result.status is RepairStatus.REPAIRED and result.data is not None
    log = parse_log(result.data)
    assert len(result.finished) == 4  # a, p, b, c
    (rebuilt,) = [a for a in result.added if a.type == "assistant"]
    turn = log.events[rebuilt.seq - 1]
    assert isinstance(turn, Assistant) and turn.model == DOCTOR
    assert [(c.name, c.input) for c in turn.calls] == [
        ("effect", {"tag": "a"}),
        ("peek", {"tag": "p"}),
    ]
    assert len(log.events) == len(lines) - 1  # one lost, one rebuilt
    text = "\n".join(result.report())
    assert f"dropped line {first}" in text and "kept as finished" in text


def test_a_damaged_receipt_is_ruled_applied(finished: bytes) -> None:
    lines = _lines(finished)
    number = next(i for i, line in enumerate(lines, 1) if b'"execution_finished"' in line)
    execution_id = json.loads(lines[number - 1])["execution_id"]
    result = repair_log(damaged(finished, number, "garbled"), "/x/s.jsonl", "s", now=NOW)
    assert result.data is not None
    (ruling,) = [e for e in parse_log(result.data).events if isinstance(e, ExecutionResolved)]
    assert ruling.execution_id == execution_id
    assert (ruling.resolution, ruling.decided_by) == ("applied", DOCTOR)
    assert result.ruled == (execution_id,)


def test_a_lost_line_after_an_approval_makes_the_call_uncertain() -> None:
    """assistant, approval, then one unreadable line: it may have been the call's start, so the
    call is not executed but handed to a human."""
    call = ToolCall("c1", "effect", {"tag": "x"})
    events: list[Any] = [
        RunStarted(run="r", trigger="user", model=ModelRef("faux", "m"), mode="default"),
        User(run="r", content="go"),
        Assistant(run="r", blocks=(call,), stop="tool_use", usage=Usage(), model="m", ms=1),
        ApprovalDecided(
            run="r",
            call_id="c1",
            decision="approved",
            decided_by="user",
            reason=None,
            input_sha256=input_sha256(call.input),
        ),
    ]
    data = _serialize(events) + b"\x00\x00\x00\n"
    assert isinstance(plan(parse_log(_serialize(events)).events), Execute)  # as it stood
    result = repair_log(data, "/x/s.jsonl", "s", now=NOW)
    assert result.data is not None
    action = plan(parse_log(result.data).events)
    assert isinstance(action, ResolveUncertain), action
    (u,) = action.executions
    assert (u.call_id, u.name, u.input) == ("c1", "effect", {"tag": "x"})
    assert result.uncertain == (u.execution_id,) and DOCTOR in u.execution_id
    # a line known to be something else (a user record) is no such doubt
    known = repair_log(
        _serialize(events) + b'{"seq":5,"ts":1,"run":"r","type":"user","content":\x00}\n',
        "/x/s.jsonl",
        "s",
        now=NOW,
    )
    assert known.data is not None and isinstance(plan(parse_log(known.data).events), Execute)


def test_an_execution_whose_input_differs_is_repaired_with_the_calls_input(
    finished: bytes,
) -> None:
    lines = _lines(finished)
    number = next(i for i, line in enumerate(lines, 1) if b'"execution_started"' in line)
    lines[number - 1] = lines[number - 1].replace(b'{"tag":"a"}', b'{"tag":"EVIL"}')
    result = repair_log(_join(lines), "/x/s.jsonl", "s", now=NOW)
    assert result.damaged_line == number and "differs" in result.reason
    assert result.data is not None
    started = [e for e in parse_log(result.data).events if isinstance(e, ExecutionStarted)]
    assert next(e.input for e in started) == {"tag": "a"}  # the approved input, the receipt kept
    assert len(result.finished) == 4


def test_a_lost_run_started_is_rebuilt(finished: bytes) -> None:
    result = repair_log(damaged(finished, 2, "unreadable"), "/x/s.jsonl", "s", now=NOW)
    assert result.data is not None
    log = parse_log(result.data)
    first = log.events[0]
    assert isinstance(first, RunStarted) and first.trigger == "resume"
    assert result.added[0].type == "run_started"


def test_compaction_follows_its_records() -> None:
    events: list[Any] = [
        RunStarted(run="r", trigger="user", model=ModelRef("faux", "m"), mode="default"),
        User(run="r", content="one"),
        User(run="r", content="two"),
        User(run="r", content="three"),
        Compacted(
            run="r",
            covers_to_seq=4,
            summary="three inputs",
            trigger="manual",
            tokens_before=None,
            tokens_after=None,
        ),
    ]
    lines = _lines(_serialize(events))
    lines[2] = unreadable(lines[2])  # "one" (seq 2) is lost: seq 3, 4 become 2, 3
    result = repair_log(_join(lines), "/x/s.jsonl", "s", now=NOW)
    assert result.data is not None
    log = parse_log(result.data)
    compacted = log.events[-1]
    assert isinstance(compacted, Compacted) and compacted.covers_to_seq == 3 == compacted.seq - 1


def _event(seq: int, event: Any) -> bytes:
    import dataclasses

    from kiso.kernel.events import dumps_line

    return dumps_line(dataclasses.replace(event, seq=seq, ts=event.ts or NOW).to_json())


def _serialize(events: list[Any]) -> bytes:
    header = b'{"seq":0,"type":"session","v":1,"id":"s","workspace":"/w","created":1,"kiso":"x","parent":null}\n'  # noqa: E501
    return header + b"".join(_event(i, e) for i, e in enumerate(events, 1))


# --------------------------------------------------------------------------- on disk


def test_repair_session_keeps_the_damaged_log_and_holds_the_lock(
    tmp_path: Path, finished: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Setup(tmp_path)
    store = JsonlSessionStore(s.home)
    store.create(s.ws, session_id="s").close()
    path = store.path_of("s")
    broken = damaged(finished, 9, "garbled")
    path.write_bytes(broken)
    os.chmod(path, 0o644)
    inode = path.stat().st_ino
    # while another writer holds the session, the doctor refuses
    lock = SessionLock.acquire(path, "s")  # the log does not load: hold its lock directly
    with pytest.raises(SessionLockedError):
        repair_session(store, "s")
    lock.release()
    assert path.read_bytes() == broken
    # and the doctor holds the lock while it works
    seen: list[str] = []
    real_rename = os.rename

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        with pytest.raises(SessionLockedError) as info:
            SessionLock.acquire(path, "s")
        seen.append(str(info.value))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    result = repair_session(store, "s", clock=lambda: NOW)
    monkeypatch.undo()
    assert result.status is RepairStatus.REPAIRED and len(seen) == 1
    assert f"pid {os.getpid()}" in seen[0]
    assert result.copy is not None
    copy = Path(result.copy)
    assert copy.name == "s.jsonl.damaged-20270115T080000Z"
    assert copy.read_bytes() == broken and copy.stat().st_ino == inode  # the very same file
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert path.read_bytes() == result.data and path.stat().st_ino != inode
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(path.parent.glob(".*.tmp"))
    assert [r.id for r in store.list()] == ["s"]  # the copy is not a session
    assert store.list()[0].state.value == "completed"
    again = repair_session(store, "s")  # idempotent: nothing left to do
    assert again.status is RepairStatus.HEALTHY and again.copy is None


# --------------------------------------------------------------------------- end to end


def _line_of(data: bytes, kind: str, nth: int = 1) -> int:
    found = [i for i, line in enumerate(_lines(data), 1) if f'"type":"{kind}"'.encode() in line]
    return found[nth - 1]


E2E = [
    ("assistant", 2, "garbled"),  # effect b's turn: its receipt is after the damage
    ("assistant", 1, "unreadable"),  # the first turn, read and effect a after it
    ("execution_started", 1, "garbled"),  # effect a's start, its receipt after it
    ("execution_finished", 1, "garbled"),  # effect a's receipt itself
    ("approval_decided", 2, "unreadable"),
    ("user", 1, "garbled"),
    ("execution_finished", 2, "deleted"),  # the read's receipt is gone: it is read again
]


@pytest.mark.parametrize(("kind", "nth", "how"), E2E, ids=[f"{k}:{n}:{h}" for k, n, h in E2E])
def test_an_interrupted_session_repaired_and_resumed_runs_no_effect_twice(
    tmp_path: Path, kind: str, nth: int, how: str
) -> None:
    s = Setup(tmp_path)
    crashed = driver(s.home, s.ws, s.script, "run", "go", failpoint="execution_started:4")
    assert crashed.returncode == -signal.SIGKILL
    assert effects(s.ws) == ["a", "b"]
    before = s.log.read_bytes()
    broken = damaged(before, _line_of(before, kind, nth), how)
    s.log.write_bytes(broken)
    refused = driver(s.home, s.ws, s.script, "resume", "rerun")
    assert refused.returncode != 0 and "kiso doctor s" in refused.stderr
    assert s.log.read_bytes() == broken
    fixed = doctor(s.home)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "repaired" in fixed.stdout and "Traceback" not in fixed.stderr
    resumed = driver(s.home, s.ws, s.script, "resume", "rerun")
    assert resumed.returncode == 0, resumed.stderr
    final = JsonlSessionStore(s.home).load("s")
    assert final.events[-1].type == "run_ended"
    assert effects(s.ws) == ["a", "b", "c"]  # c ruled rerun, ran once; a and b never again
    started = Counter(e.call_id for e in final.events if isinstance(e, ExecutionStarted))
    assert started["call_0_0"] == 1 and started["call_1_0"] == 1  # a, b: never started again


@pytest.mark.parametrize(
    ("kind", "nth", "how"), E2E[:4], ids=[f"{k}:{n}:{h}" for k, n, h in E2E[:4]]
)
def test_a_finished_session_repaired_and_run_again_runs_no_effect_twice(
    tmp_path: Path, kind: str, nth: int, how: str
) -> None:
    s = Setup(tmp_path)
    assert driver(s.home, s.ws, s.script, "run", "go").returncode == 0
    before = s.log.read_bytes()
    s.log.write_bytes(damaged(before, _line_of(before, kind, nth), how))
    fixed = doctor(s.home)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert driver(s.home, s.ws, s.script, "resume").returncode == 0  # nothing to do
    again = driver(s.home, s.ws, s.script, "run", "anything else?")
    assert again.returncode == 0, again.stderr
    assert effects(s.ws) == ["a", "b", "c"]
    final = JsonlSessionStore(s.home).load("s")
    assert (
        isinstance(final.events[-2], Assistant) and final.events[-2].text == "Nothing more to do."
    )
