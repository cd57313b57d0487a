"""The exception tree of the kernel.

::

    KisoError                      root of everything kiso raises on purpose
     +-- EventError                a JSON value is not a valid event (also a ValueError)
     +-- StoreError                the session store refused or could not do something
          +-- CorruptLogError      a log line is malformed, invalid or out of sequence
          +-- SessionLockedError   another process holds the session's writer lock
          +-- SessionNotFoundError no log with that id
          +-- SessionExistsError   create() named an id that is taken
          +-- AppendError          an append was refused (wrong seq, closed writer, file changed)

Every message says what happened, to what, and what to do about it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "AppendError",
    "CorruptLogError",
    "EventError",
    "KisoError",
    "SessionExistsError",
    "SessionLockedError",
    "SessionNotFoundError",
    "StoreError",
]


class KisoError(Exception):
    """Root of every error kiso raises on purpose."""


class EventError(KisoError, ValueError):
    """A JSON value is not a valid event of the closed union."""


class StoreError(KisoError):
    """The session store refused an operation or could not complete it."""


class CorruptLogError(StoreError):
    """A log line that is not a torn tail failed to parse, validate or follow its predecessor."""

    def __init__(self, path: Path | str, line: int, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        super().__init__(
            f"{self.path}, line {line}: {reason}. The session log is damaged and was not changed; "
            f"keep a copy, then remove line {line} and everything after it to resume from the "
            f"last good record."
        )


class SessionLockedError(StoreError):
    """Another live process holds the single-writer lock of a session."""

    def __init__(self, session_id: str, holder: str) -> None:
        self.session_id = session_id
        self.holder = holder
        super().__init__(
            f"session {session_id} is open for writing by {holder}; close it there (or wait for "
            f"that process to exit) and try again"
        )


class SessionNotFoundError(StoreError):
    """No session log exists with the given id."""


class SessionExistsError(StoreError):
    """A session with the requested id already exists."""


class AppendError(StoreError):
    """An append was refused; nothing was written."""
