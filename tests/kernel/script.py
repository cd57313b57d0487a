"""A small builder for session logs in tests: each helper appends one stamped event."""

from __future__ import annotations

import dataclasses
from typing import Any

from kiso.kernel import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    Compacted,
    Event,
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
    input_sha256,
)


def call(call_id: str, name: str, **input: Any) -> ToolCall:
    return ToolCall(call_id, name, dict(input))


class LogBuilder:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.run = "r0"

    def add(self, event: Event) -> Event:
        seq = len(self.events) + 1
        stamped = dataclasses.replace(event, seq=seq, ts=1_000 + seq)
        self.events.append(stamped)
        return stamped

    def start(self, run: str, trigger: str = "user") -> Event:
        self.run = run
        return self.add(
            RunStarted(
                run=run,
                trigger=trigger,  # type: ignore[arg-type]
                model=ModelRef("faux", "faux-1"),
                mode="default",
            )
        )

    def user(self, text: str, source: str = "user") -> Event:
        return self.add(User(run=self.run, content=text, source=source))  # type: ignore[arg-type]

    def assistant(self, *calls: ToolCall, text: str = "", stop: str | None = None) -> Event:
        blocks: tuple[Any, ...] = ((TextBlock(text),) if text else ()) + calls
        return self.add(
            Assistant(
                run=self.run,
                blocks=blocks,
                stop=stop or ("tool_use" if calls else "end_turn"),
                usage=Usage(input=100, output=10, cache_read=0, cache_write=None),
                model="faux-1",
                ms=7,
            )
        )

    def request(self, c: ToolCall, speaker: str = "mode:default") -> Event:
        return self.add(
            ApprovalRequested(
                run=self.run, call_id=c.call_id, name=c.name, input=c.input, speaker=speaker
            )
        )

    def decide(
        self,
        c: ToolCall,
        decision: str = "approved",
        by: str = "mode:default",
        reason: str | None = None,
        digest: str | None = None,
    ) -> Event:
        return self.add(
            ApprovalDecided(
                run=self.run,
                call_id=c.call_id,
                decision=decision,  # type: ignore[arg-type]
                decided_by=by,
                reason=reason,
                input_sha256=digest or input_sha256(c.input),
            )
        )

    def started(self, c: ToolCall, execution_id: str) -> Event:
        return self.add(
            ExecutionStarted(
                run=self.run,
                execution_id=execution_id,
                call_id=c.call_id,
                name=c.name,
                input=c.input,
            )
        )

    def finished(
        self, c: ToolCall, execution_id: str, content: str = "ok", is_error: bool = False
    ) -> Event:
        return self.add(
            ExecutionFinished(
                run=self.run,
                execution_id=execution_id,
                call_id=c.call_id,
                ok=not is_error,
                content=content,
                is_error=is_error,
                ms=3,
            )
        )

    def resolved(self, c: ToolCall, execution_id: str, resolution: str, by: str = "user") -> Event:
        return self.add(
            ExecutionResolved(
                run=self.run,
                execution_id=execution_id,
                call_id=c.call_id,
                resolution=resolution,  # type: ignore[arg-type]
                decided_by=by,
            )
        )

    def compact(self, covers_to_seq: int, summary: str = "The user asked for a fix.") -> Event:
        return self.add(
            Compacted(
                run=self.run,
                covers_to_seq=covers_to_seq,
                summary=summary,
                trigger="auto",
                tokens_before=90_000,
                tokens_after=4_000,
            )
        )

    def setting(self, key: str, value: Any, run: str | None = None) -> Event:
        return self.add(SettingChanged(key=key, value=value, run=run))

    def end(self, outcome: Outcome | None = None) -> Event:
        return self.add(RunEnded(run=self.run, outcome=outcome or Outcome.completed()))
