"""``kiso doctor``: repair a damaged session log without running again anything that has a receipt.

A log that does not load is never changed by the store, and cutting it by hand at the damaged line
would also cut every receipt after it: resuming would run those effects again. The doctor instead
writes a new log that obeys the event contract (a header, then valid events of contiguous
``seq``) and keeps, from the damaged one:

* the valid prefix (every line before the first bad one), byte for byte;
* every readable record after it, in file order, renumbered (a ``compacted`` record's
  ``covers_to_seq`` follows its records). Dropped: the unreadable lines, a line that repeats an
  earlier one byte for byte, and a torn last line (as any open would). So every receipt
  (``execution_finished``) and ruling (``execution_resolved``) in the file is kept, before or after
  the damage: none of those executions runs again.

Where a dropped line leaves the records after it incomplete, the doctor adds what they imply, each
added record recognisable by ``doctor`` in it (``decided_by``, ``model``, ``mode``, or the
execution id):

* a receipt or ruling whose ``execution_started`` was lost gets one right before it (the call's
  name and input from its ``assistant``), so the call counts as executed, not as approved-and-
  pending;
* records of calls that no kept ``assistant`` declares (the ``assistant`` itself was lost) get an
  ``assistant`` holding those calls, rebuilt from their ``execution_started`` or
  ``approval_requested`` (the turn's text is lost), so the model is shown what ran and does not
  decide to do it again;
* records of a run whose ``run_started`` was lost get one (trigger ``resume``, the model of the
  previous run);
* an execution whose receipt is the damaged line (it still names the execution id and
  ``execution_finished``) is ruled ``applied`` by ``doctor``: it ran, its output is lost;
* a call of the open turn that a damaged line after it could have started (a line of unknown type,
  or an ``execution_started`` that names no execution) gets an ``execution_started``, so it is
  *uncertain*: resume asks a human to rule on it (rerun / skip / applied) instead of running it.

:func:`repair_log` is the pure part (bytes in, repaired bytes and a :class:`Repair` report out);
:func:`repair_session` does the file handling: it takes the session's writer lock, keeps the
damaged log as ``<id>.jsonl.damaged-<UTC time>`` (0600) and puts the repaired one in its place
atomically (temporary file, fsync, rename, fsync of the folder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiso.kernel._fields import ascii_int
from kiso.kernel.errors import CorruptLogError, EventError, StoreError, describe_os_error
from kiso.kernel.events import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    Compacted,
    Event,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    ModelRef,
    RunStarted,
    ToolCall,
    Usage,
    User,
    dumps_line,
    event_from_json,
)
from kiso.kernel.lock import SessionLock
from kiso.kernel.recovery import ResolveUncertain, plan_replay
from kiso.kernel.replay import CallStatus, replay
from kiso.kernel.store import Clock, wall_clock_ms

if TYPE_CHECKING:
    from kiso.kernel.jsonl import JsonlSessionStore

__all__ = [
    "DOCTOR",
    "Added",
    "Dropped",
    "Repair",
    "RepairStatus",
    "repair_log",
    "repair_session",
]

DOCTOR = "doctor"
"""Who records the doctor adds name as their author (``decided_by``, ``model``, ``mode``)."""


class RepairStatus(StrEnum):
    HEALTHY = "healthy"
    """The log loads: nothing to do."""
    REPAIRED = "repaired"
    """A repaired log was written (or, from :func:`repair_log`, is ready to be)."""
    REFUSED = "refused"
    """The log cannot be repaired (its header is damaged or names another session)."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """A line of the damaged log that is not in the repaired one."""

    line: int
    reason: str
    what: str
    """What the line seems to have been, as far as it can still be read."""


@dataclass(frozen=True, slots=True)
class Added:
    """A record the doctor wrote that the damaged log did not have."""

    seq: int
    type: str
    subject: str
    why: str


@dataclass(frozen=True, slots=True)
class Repair:
    """What :func:`repair_log` found and did."""

    status: RepairStatus
    path: str
    session_id: str
    data: bytes | None = None
    """The repaired log (only when ``status`` is ``repaired``)."""
    reason: str = ""
    """Why the log is damaged (the loader's error), or why it cannot be repaired."""
    damaged_line: int = 0
    """The first line that does not load."""
    salvaged: int = 0
    """Readable records after the damage that the repaired log keeps (renumbered)."""
    dropped: tuple[Dropped, ...] = ()
    missing: tuple[str, ...] = ()
    """Where readable lines are not contiguous (lines lost from the file), and which seqs."""
    added: tuple[Added, ...] = ()
    finished: tuple[str, ...] = ()
    """Executions with a receipt in the repaired log: they never run again."""
    ruled: tuple[str, ...] = ()
    """Executions with a ruling (rerun / skipped / applied) in the repaired log."""
    uncertain: tuple[str, ...] = ()
    """Executions of the open run with neither: resume asks a human to rule on them."""
    events: int = 0
    """Events in the repaired log (after its header)."""
    copy: str | None = None
    """Where :func:`repair_session` kept the damaged log."""

    def report(self) -> list[str]:
        """The repair in words, one line per fact, for a person."""
        sid = self.session_id
        if self.status is RepairStatus.HEALTHY:
            return [f"session {sid}: {self.reason or 'the log loads'}; nothing to repair"]
        if self.status is RepairStatus.REFUSED:
            return [f"session {sid}: could not repair {self.path}: {self.reason}"]
        out = [f"session {sid}: repaired {self.path}"]
        out.append(f"  damaged: line {self.damaged_line}: {self.reason}")
        if self.copy:
            out.append(f"  the damaged log is kept, unchanged, as {self.copy}")
        prefix = self.damaged_line - 1
        out.append(
            f"  kept lines 1-{prefix} as they were, and {self.salvaged} readable record(s) from "
            f"after the damage, renumbered: {self.events} event(s) in all"
        )
        for d in self.dropped:
            out.append(f"  dropped line {d.line} ({d.what}): {d.reason}")
        for m in self.missing:
            out.append(f"  missing {m} (lines lost from the file; what follows is renumbered)")
        for a in self.added:
            out.append(f"  added seq {a.seq} {a.type} ({a.subject}): {a.why}")
        if self.finished:
            out.append(
                f"  kept as finished, never run again: {', '.join(self.finished)}"
                if len(self.finished) <= 12
                else f"  kept as finished, never run again: {len(self.finished)} executions"
            )
        if self.ruled:
            out.append(f"  kept as ruled on, never asked again: {', '.join(self.ruled)}")
        if self.uncertain:
            out.append(
                f"  uncertain, never run again unasked: {', '.join(self.uncertain)} (a read-only "
                f"or idempotent tool is re-run by itself; for any other `kiso resume {sid}` "
                f"asks a human; headless: --resolve rerun|skip|applied)"
            )
        out.append(f"  next: `kiso resume {sid}`")
        return out


# --------------------------------------------------------------------------- the pure part


@dataclass(slots=True)
class _Line:
    number: int
    raw: bytes
    event: Event | None = None
    reason: str = ""
    kind: str | None = None
    execution_id: str | None = None
    call_id: str | None = None


_HINT = re.compile(rb'"(type|execution_id|call_id)"\s*:\s*"([^"\\]{1,200})"')


def _read_line(number: int, raw: bytes) -> _Line:
    """Parse one line on its own; when it is not a valid event, read what can still be read."""
    line = _Line(number, raw)
    obj: Any = None
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        line.event = event_from_json(obj)
        return line
    except UnicodeDecodeError:
        line.reason = "not UTF-8 text"
    except RecursionError:
        line.reason = "not a valid event: nested too deeply to read"
    except ValueError as exc:  # json.JSONDecodeError and EventError are both ValueErrors
        line.reason = (
            f"not a valid event: {exc}" if isinstance(exc, EventError) else "not valid JSON"
        )
    hints: dict[str, str] = {}
    if isinstance(obj, dict):
        hints = {k: v for k, v in obj.items() if isinstance(v, str)}
    else:
        for key, value in _HINT.findall(raw):
            hints.setdefault(key.decode(), value.decode("utf-8", "replace"))
    line.kind = hints.get("type")
    line.execution_id = hints.get("execution_id")
    line.call_id = hints.get("call_id")
    return line


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _describe(line: _Line) -> str:
    if line.event is not None:
        ev = line.event
        subject = getattr(ev, "execution_id", None) or getattr(ev, "call_id", None)
        return f"{ev.type} {subject}" if subject else ev.type
    if line.kind is None:
        return "unreadable"
    subject = line.execution_id or line.call_id
    return f"seems to be {line.kind}{f' {subject}' if subject else ''}"


class _Assembler:
    """Builds the repaired event list after the valid prefix, tracking what it implies."""

    def __init__(self, sid: str, prefix: tuple[Event, ...], now: int) -> None:
        self.sid = sid
        self.now = now
        self.events: list[Event] = list(prefix)
        self.origin: list[int] = [e.seq for e in prefix]  # each event's seq in the damaged log
        self.calls: dict[str, ToolCall] = {}  # the calls of the last assistant
        self.turn_run: str | None = None  # and its run
        self.started: dict[str, ExecutionStarted] = {}
        self.closed: set[str] = set()
        self.runs: set[str] = set()
        self.last_start: RunStarted | None = None
        self.modes: dict[str, str] = {}  # run -> the mode its verdicts name
        self.ids: set[str] = set()
        self.added: list[Added] = []
        self.dropped: list[Dropped] = []
        self.damage_in_turn: list[int] = []  # lines after the last assistant that may be a start
        self.missing: list[str] = []  # seq numbers missing between two readable lines
        self.last_seq = prefix[-1].seq if prefix else 0
        self.salvaged = 0
        for ev in prefix:
            self._track(ev)

    # -- bookkeeping

    def _track(self, ev: Event) -> None:
        if isinstance(ev, Assistant):
            self.calls = {c.call_id: c for c in ev.calls}
            self.turn_run = ev.run
            self.damage_in_turn = []
        elif isinstance(ev, ExecutionStarted):
            self.started[ev.execution_id] = ev
            self.ids.add(ev.execution_id)
        elif isinstance(ev, ExecutionFinished | ExecutionResolved):
            self.closed.add(ev.execution_id)
        elif isinstance(ev, RunStarted):
            self.runs.add(ev.run)
            self.last_start = ev
        elif isinstance(ev, User):
            self.damage_in_turn = []

    def _emit(self, ev: Event, origin: int = 0) -> Event:
        seq = len(self.events) + 1
        if isinstance(ev, Compacted):
            covered = [new for new, old in enumerate(self.origin, 1) if 0 < old <= ev.covers_to_seq]
            ev = dataclasses.replace(ev, covers_to_seq=max(covered, default=0))
        # A record added in the middle takes the time of the one before it.
        ts = ev.ts or (self.events[-1].ts if self.events else self.now)
        ready = dataclasses.replace(ev, seq=seq, ts=ts)
        self.events.append(ready)
        self.origin.append(origin)
        self._track(ready)
        return ready

    def _add(self, ev: Event, subject: str, why: str) -> Event:
        ready = self._emit(ev)
        self.added.append(Added(ready.seq, ready.type, subject, why))
        return ready

    def _drop(self, line: _Line, reason: str) -> None:
        self.dropped.append(Dropped(line.number, reason, _describe(line)))

    def _new_execution_id(self) -> str:
        n = len(self.events) + 1
        while f"{self.sid}:{DOCTOR}-{n}" in self.ids:
            n += 1
        return f"{self.sid}:{DOCTOR}-{n}"

    def _start_for(
        self, run: str, execution_id: str, call_id: str, ts: int, why: str
    ) -> ExecutionStarted:
        call = self.calls.get(call_id)
        name, given = (call.name, call.input) if call is not None else ("unknown", {})
        ev = ExecutionStarted(
            run=run, execution_id=execution_id, call_id=call_id, name=name, input=given, ts=ts
        )
        added = self._add(ev, f"{execution_id} {name}", why)
        assert isinstance(added, ExecutionStarted)
        return added

    def _ensure_run(self, ev: Event) -> None:
        if not isinstance(ev, RunStarted) and ev.run is not None:
            self._ensure_run_id(ev.run, ev.ts)

    def _ensure_run_id(self, run: str, ts: int) -> None:
        if run in self.runs:
            return
        last = self.last_start
        model = last.model if last is not None else ModelRef(DOCTOR, "unknown")
        if run in self.modes:
            mode, said = self.modes[run], "the mode its own verdicts name"
        elif last is not None:
            mode, said = last.mode, "the previous run's mode"
        else:
            mode, said = "default", "no record names its mode, so the default (asks the most)"
        self._add(
            RunStarted(run=run, trigger="resume", model=model, mode=mode, ts=ts),
            f"run {run}",
            f"its own run_started was lost with the damage; the run's records follow; mode "
            f"{mode}: {said}",
        )

    # -- the lines after the prefix

    def take(self, line: _Line, following: list[_Line], receipted: set[str]) -> None:
        ev = line.event
        if ev is None:
            self._damaged(line, following, receipted)
            return
        expected = self.last_seq + 1
        if ev.seq > expected:  # lines are missing here: as if an unreadable line were
            gap = _Line(line.number, b"", reason=f"seq {expected}-{ev.seq - 1}")
            self.missing.append(f"before line {line.number}: seq {expected}-{ev.seq - 1}")
            self._lost(gap, [line, *following], receipted)
        if ev.seq >= expected:
            self.last_seq = ev.seq
        if isinstance(ev, ExecutionStarted):
            call = self.calls.get(ev.call_id)
            if call is not None and call.input != ev.input:
                line.reason = (
                    f"its input differs from the one its call {ev.call_id} has in the assistant "
                    f"record"
                )
                line.event, line.kind = None, ev.type
                line.execution_id, line.call_id = ev.execution_id, ev.call_id
                self._damaged(line, following, receipted)
                return
        self._ensure_run(ev)
        if isinstance(ev, ExecutionFinished | ExecutionResolved) and (
            ev.execution_id not in self.started
        ):
            self._start_for(
                ev.run,
                ev.execution_id,
                ev.call_id,
                ev.ts,
                f"its {'receipt' if isinstance(ev, ExecutionFinished) else 'ruling'} on line "
                f"{line.number} survives but its start was lost; restored so that it counts",
            )
        self._emit(ev, ev.seq)
        self.salvaged += 1

    def _damaged(self, line: _Line, following: list[_Line], receipted: set[str]) -> None:
        self._drop(line, line.reason)
        self.last_seq += 1  # it held a seq of its own
        self._lost(line, following, receipted)

    def _lost(self, line: _Line, following: list[_Line], receipted: set[str]) -> None:
        """Add what the records after a lost line imply (see the module's docstring)."""
        kind, xid, cid = line.kind, line.execution_id, line.call_id
        if kind in (None, "assistant") and self._rebuild_turn(line, following):
            return
        if kind is None or (kind == "execution_started" and xid is None):
            self.damage_in_turn.append(line.number)
            return
        if xid is None or xid in receipted:
            return  # nothing names an execution, or a readable receipt of it is kept anyway
        if kind == "execution_started" and xid not in self.started and cid in self.calls:
            assert cid is not None
            self._start_for(
                self._turn_run(),
                xid,
                cid,
                0,
                f"line {line.number} was its start and has no receipt: it may have run",
            )
        elif kind == "execution_finished":
            start = self.started.get(xid)
            if start is None and cid in self.calls:
                assert cid is not None
                start = self._start_for(
                    self._turn_run(),
                    xid,
                    cid,
                    0,
                    f"line {line.number} was its receipt, and its start was lost",
                )
            if start is not None and xid not in self.closed:
                self._add(
                    ExecutionResolved(
                        run=start.run,
                        execution_id=xid,
                        call_id=start.call_id,
                        resolution="applied",
                        decided_by=DOCTOR,
                    ),
                    f"{xid} {start.name}",
                    f"line {line.number} was its receipt (damaged): it ran, its output is lost, "
                    f"and it must not run again",
                )

    def _turn_run(self) -> str:
        """The run of the last assistant (whose calls a damaged line may refer to)."""
        return self.turn_run or (self.last_start.run if self.last_start else DOCTOR)

    def _rebuild_turn(self, line: _Line, following: list[_Line]) -> bool:
        """If records after a lost line refer to calls no kept assistant declares, the line was
        their assistant: declare them again (name and input from their start or request)."""
        found: dict[str, ToolCall] = {}
        run: str | None = None
        for nxt in following:
            ev = nxt.event
            if ev is None:
                continue
            if isinstance(ev, Assistant | User | RunStarted):
                break
            if isinstance(
                ev,
                ApprovalRequested
                | ApprovalDecided
                | ExecutionStarted
                | ExecutionFinished
                | ExecutionResolved,
            ):
                if ev.call_id in self.calls:
                    continue
                run = run or ev.run
                if isinstance(ev, ExecutionStarted | ApprovalRequested):
                    if ev.call_id not in found or found[ev.call_id].name == "unknown":
                        found[ev.call_id] = ToolCall(ev.call_id, ev.name, ev.input)
                elif isinstance(ev, ExecutionFinished | ExecutionResolved):
                    found.setdefault(ev.call_id, ToolCall(ev.call_id, "unknown", {}))
        if not found or run is None:
            return False
        calls = tuple(found.values())
        self._ensure_run_id(run, 0)
        self._add(
            Assistant(
                run=run,
                blocks=calls,
                stop="tool_use",
                usage=Usage(),
                model=DOCTOR,
                ms=0,
            ),
            ", ".join(f"{c.call_id} {c.name}" for c in calls),
            f"line {line.number} was the assistant turn that made these calls (its text is lost); "
            f"the model is shown what they did, so it does not make them again",
        )
        return True

    def finish(self) -> None:
        """Calls of the open turn that a lost line may have started become uncertain."""
        if not self.damage_in_turn:
            return
        state = replay(self.events, render=False)
        if state.open_run is None or not isinstance(state.last_in_run, Assistant):
            return
        lines = ", ".join(str(n) for n in self.damage_in_turn)
        for cs in state.turn or ():
            if cs.status in (CallStatus.SETTLED, CallStatus.UNCERTAIN):
                continue
            xid = self._new_execution_id()
            self._add(
                ExecutionStarted(
                    run=state.open_run,
                    execution_id=xid,
                    call_id=cs.call.call_id,
                    name=cs.call.name,
                    input=cs.call.input,
                    ts=self.now,
                ),
                f"{xid} {cs.call.name}",
                f"damaged line(s) {lines} after its turn may have been its start: it is "
                f"uncertain, so a human rules before it runs",
            )


def repair_log(data: bytes, path: str, session_id: str, *, now: int) -> Repair:
    """Repair the bytes of a damaged log. Pure: no I/O; ``now`` stamps the records it adds.

    Returns a :class:`Repair`: ``healthy`` when the log loads as it is, ``refused`` when it
    cannot be repaired (its header), ``repaired`` with the new bytes otherwise. The new bytes
    always load (:func:`~kiso.kernel.jsonl.parse_log`), keep the valid prefix byte for byte, and
    keep every readable receipt and ruling of the old ones.
    """
    from kiso.kernel.jsonl import parse_log

    try:
        log = parse_log(data, path, session_id=session_id)
    except CorruptLogError as exc:
        error = exc
    else:
        note = "the log loads"
        if log.torn_tail:
            note += " (its last line is a torn write, which the next open cuts off as usual)"
        return Repair(RepairStatus.HEALTHY, path, session_id, reason=note, events=len(log.events))
    if error.line <= 1:
        return _header_refused(path, session_id, error)
    starts = [0]
    for i, byte in enumerate(data):
        if byte == 0x0A:
            starts.append(i + 1)
    # starts[k] is where line k+1 begins; the last entry is the end of the last whole line
    while True:  # the loader checks UTF-8 first: an earlier line may be bad in another way
        cut = starts[error.line - 1]
        try:
            prefix = parse_log(data[:cut], path, session_id=session_id)
            break
        except CorruptLogError as exc:
            error = exc
            if error.line <= 1:
                return _header_refused(path, session_id, error)
    tail: list[_Line] = []
    for k in range(error.line - 1, len(starts) - 1):
        tail.append(_read_line(k + 1, data[starts[k] : starts[k + 1] - 1]))
    torn = data[starts[-1] :]
    receipted = {
        ev.execution_id
        for ev in (*prefix.events, *(t.event for t in tail if t.event is not None))
        if isinstance(ev, ExecutionFinished | ExecutionResolved)
    }
    seen = set(data[starts[k] : starts[k + 1] - 1] for k in range(error.line - 1))
    asm = _Assembler(session_id, prefix.events, now)
    for line in tail:  # a lost run_started's mode, as the run's own verdicts name it
        ev = line.event
        if isinstance(ev, ApprovalDecided) and ev.decided_by.startswith("mode:") and ev.run:
            asm.modes.setdefault(ev.run, ev.decided_by.removeprefix("mode:"))
    for i, line in enumerate(tail):
        if line.event is not None and line.raw in seen:
            asm._drop(line, "it repeats an earlier line byte for byte")
            continue
        seen.add(line.raw)
        asm.take(line, tail[i + 1 :], receipted)
    if torn:
        asm.dropped.append(
            Dropped(len(starts), "a torn write with no newline, cut off as any open would", "torn")
        )
    asm.finish()
    out = data[:cut] + b"".join(dumps_line(ev.to_json()) for ev in asm.events[len(prefix.events) :])
    try:
        repaired = parse_log(out, path, session_id=session_id)
    except CorruptLogError as exc:  # a bug here, never a reason to write a bad log
        return Repair(
            RepairStatus.REFUSED,
            path,
            session_id,
            reason=f"the repaired log would not load ({exc.reason} at line {exc.line}); nothing "
            f"was written",
            damaged_line=error.line,
        )
    kept = _executions(repaired.events)
    lost = sorted(receipted - kept[0] - kept[1])
    if lost:  # by construction impossible; checked because it is the whole point
        return Repair(
            RepairStatus.REFUSED,
            path,
            session_id,
            reason=f"the repaired log would lose the receipts of {', '.join(lost)}; nothing was "
            f"written",
            damaged_line=error.line,
        )
    state = replay(repaired.events, render=False)
    action = plan_replay(state)
    uncertain = (
        tuple(u.execution_id for u in action.executions)
        if isinstance(action, ResolveUncertain)
        else ()
    )
    return Repair(
        RepairStatus.REPAIRED,
        path,
        session_id,
        data=out,
        reason=error.reason,
        damaged_line=error.line,
        salvaged=asm.salvaged,
        dropped=tuple(asm.dropped),
        missing=tuple(asm.missing),
        added=tuple(asm.added),
        finished=tuple(sorted(kept[0], key=_by_seq)),
        ruled=tuple(sorted(kept[1], key=_by_seq)),
        uncertain=uncertain,
        events=len(repaired.events),
    )


def _header_refused(path: str, session_id: str, error: CorruptLogError) -> Repair:
    return Repair(
        RepairStatus.REFUSED,
        path,
        session_id,
        reason=f"line 1, the header, is damaged ({error.reason}); without it the session's "
        f"workspace is unknown, so nothing was changed. If the header names another session, "
        f"the file was copied or renamed: give it back its own name",
        damaged_line=1,
    )


def _executions(events: Iterable[Event]) -> tuple[set[str], set[str]]:
    finished: set[str] = set()
    ruled: set[str] = set()
    for ev in events:
        if isinstance(ev, ExecutionFinished):
            finished.add(ev.execution_id)
        elif isinstance(ev, ExecutionResolved):
            ruled.add(ev.execution_id)
    return finished, ruled - finished


def _by_seq(execution_id: str) -> tuple[int, str]:
    seq = ascii_int(execution_id.rsplit(":", 1)[-1])
    return (seq, execution_id) if seq is not None else (1 << 62, execution_id)


# --------------------------------------------------------------------------- the file handling


def repair_session(
    store: JsonlSessionStore, session_id: str, *, clock: Clock = wall_clock_ms
) -> Repair:
    """Repair session ``session_id`` of ``store`` in place, holding its writer lock throughout.

    When the log loads (or cannot be repaired) nothing is written. Otherwise the damaged log is
    kept as ``<id>.jsonl.damaged-<UTC time>`` (a hard link to the very same file, so its bytes
    are exactly what they were; mode 0600) and the repaired log takes its path atomically. Raises
    :class:`~kiso.kernel.errors.SessionLockedError` while another process writes the session,
    and :class:`StoreError` when the disk refuses (nothing is changed then).
    """
    path = store.path_of(session_id)
    lock = SessionLock.acquire(path, session_id)
    try:
        try:
            data = _read_all(lock.fileno())
        except OSError as exc:
            raise StoreError(describe_os_error(path, exc, "read")) from exc
        result = repair_log(data, str(path), session_id, now=clock())
        if result.status is not RepairStatus.REPAIRED:
            return result
        assert result.data is not None
        copy = _write_repaired(lock, path, session_id, result.data, clock())
        return dataclasses.replace(result, copy=str(copy))
    finally:
        lock.release()


def _write_repaired(lock: SessionLock, path: Path, session_id: str, data: bytes, now: int) -> Path:
    folder = path.parent
    tmp = folder / f".{session_id}.doctor.{os.getpid()}.tmp"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now / 1000))
    copy = folder / f"{path.name}.damaged-{stamp}"
    n = 1
    while copy.exists():
        n += 1
        copy = folder / f"{path.name}.damaged-{stamp}-{n}"
    fd = -1
    new_lock: SessionLock | None = None
    doing, target = "write the repaired log to", tmp
    renamed = False
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        view = memoryview(data)
        written = 0
        while written < len(data):
            written += os.write(fd, view[written:])
        os.fsync(fd)
        # Lock the repaired log before it is at the path: no writer can slip in between.
        new_lock = SessionLock.adopt(fd, path, session_id, record=False)
        if not lock.still_at_path():
            raise StoreError(
                f"{path} was replaced while it was being repaired; nothing was changed. Run "
                f"`kiso doctor {session_id}` again"
            )
        doing, target = "keep a copy of the damaged log as", copy
        os.link(path, copy)
        with contextlib.suppress(OSError):
            os.chmod(copy, 0o600)
        doing, target = "put the repaired log in place of", path
        os.rename(tmp, path)
        renamed = True
        doing, target = "make durable the folder holding", path
        dirfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
    except OSError as exc:
        outcome = (
            f"; the repaired log of session {session_id} is in place but may not survive a "
            f"power loss: run `kiso doctor {session_id}` again"
            if renamed
            else f"; the log of session {session_id} was not changed"
        )
        raise StoreError(describe_os_error(target, exc, doing) + outcome) from exc
    finally:
        if new_lock is not None:
            new_lock.release()
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return copy


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
