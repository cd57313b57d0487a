"""The exception tree of kiso: one root, a few families, every message actionable.

::

    KisoError                        root of everything kiso raises on purpose
     +-- UsageError                  misuse: a bad argument, value, file or call order
     |    +-- EventError             a JSON value is not a valid event
     |    +-- ConfigError            a config file is invalid          (kiso.runtime.config)
     |    +-- RulesError             the rules file is malformed       (kiso.runtime.rules)
     |    +-- AuthError              a credential problem              (kiso.runtime.auth)
     |    +-- ScriptError            a faux script is malformed        (kiso.providers.faux)
     +-- StoreError                  the session store refused or could not do something
     |    +-- CorruptLogError        a log line is malformed, invalid or out of sequence
     |    +-- SessionLockedError     another process holds the session's writer lock
     |    +-- SessionNotFoundError   no log with that id
     |    +-- SessionExistsError     create() named an id that is taken
     |    +-- AppendError            an append was refused or failed (closed writer, full disk)
     +-- RunError                    a run or an operation on it could not go on
     |    +-- ProviderError          a model request failed            (kiso.providers.base)
     +-- RefusedError                refused by policy: the floor, a mode, a rule, the sandbox
     |    +-- PathOutsideWorkspace   a path leaves the workspace       (kiso.tools.paths)
     +-- ControlSignal               control flow, not failure: the run must stop here
          +-- Aborted                the run was asked to stop (esc, Session.abort)

A caller that only wants to report kiso's errors catches :class:`KisoError`; one that wants to
tell misuse from a failure catches the family. Nothing else (no bare ``ValueError``,
``TypeError`` or ``KeyError``) is raised on purpose where a user can see it. Every message says
what happened, to what, and what to do about it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = [
    "Aborted",
    "AppendError",
    "ControlSignal",
    "CorruptLogError",
    "EventError",
    "KisoError",
    "RefusedError",
    "RunError",
    "SessionExistsError",
    "SessionLockedError",
    "SessionNotFoundError",
    "StoreError",
    "UsageError",
    "describe_os_error",
]


class KisoError(Exception):
    """Root of every error kiso raises on purpose."""


class UsageError(KisoError, ValueError):
    """Misuse: an argument, a value, a file's content or the order of calls is wrong."""


class RunError(KisoError):
    """A run, or an operation it needs, could not go on (the message says why and what next)."""


class RefusedError(KisoError):
    """A policy refused: the catastrophe floor, an approval mode, a rule, the path sandbox."""


class ControlSignal(KisoError):
    """Control flow rather than failure: whoever catches it stops what it was doing."""


class Aborted(ControlSignal):
    """The run was asked to stop; ``by`` says who asked."""

    def __init__(self, by: str = "user") -> None:
        super().__init__(f"the run was aborted by {by}")
        self.by = by


class EventError(UsageError):
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
    """An append was refused or failed; what was not committed is named in the message."""


def describe_os_error(path: Path | str, exc: OSError, doing: str) -> str:
    """One sentence for an operating-system error while ``doing`` something to ``path``.

    A full disk (or quota) names the file system to free space on; anything else names the
    error. Used wherever the store writes, so every caller says the same thing.
    """
    where = os.fspath(path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"could not {doing} {where}: the disk holding it is full ({exc.strerror}); free "
            f"some space there and try again"
        )
    if exc.errno == errno.EROFS:
        return f"could not {doing} {where}: the file system is read-only"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"could not {doing} {where}: permission denied ({exc.strerror})"
    return f"could not {doing} {where}: {exc.strerror or exc}"
