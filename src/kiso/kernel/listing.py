"""What a session listing shows about one session, derived from its log alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kiso.kernel.recovery import SessionState, session_state
from kiso.kernel.replay import replay
from kiso.kernel.store import SessionLog

__all__ = ["TITLE_LENGTH", "SessionInfo", "summarize"]

TITLE_LENGTH = 60


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One row of ``kiso sessions``: every field is a function of the log."""

    id: str
    workspace: str
    state: SessionState
    title: str
    created: int
    updated: int
    runs: int
    inputs: int
    events: int
    parent: str | None = None
    path: str | None = None
    error: str | None = None
    """Set when the log could not be loaded; ``state`` is then meaningless."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = self.state.value
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SessionInfo:
        return cls(**{**d, "state": SessionState(d["state"])})


def _title(text: str | None) -> str:
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"


def summarize(log: SessionLog) -> SessionInfo:
    """The listing row of a loaded session."""
    state = replay(log.events, render=False)
    return SessionInfo(
        id=log.header.id,
        workspace=log.header.workspace,
        state=session_state(state),
        title=_title(state.title),
        created=log.header.created,
        updated=state.updated or log.header.created,
        runs=state.runs,
        inputs=state.user_inputs,
        events=len(log.events),
        parent=log.header.parent,
        path=log.path,
    )
