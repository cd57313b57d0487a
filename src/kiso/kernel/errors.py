"""The exception tree of kiso: one root, a few families, every message actionable.

::

    KisoError                        root of everything kiso raises on purpose
     +-- UsageError                  misuse: a bad argument, value, file or call order
     |    +-- EventError             a JSON value is not a valid event
     |    +-- ConfigError            a config file is invalid          (kiso.runtime.config)
     |    +-- RulesError             the rules file is malformed       (kiso.runtime.rules)
     |    +-- AuthError              a credential problem              (kiso.runtime.auth)
     |    +-- ScriptError            a faux script is malformed        (kiso.providers.faux)
     |    +-- TrustError             the trust store is unreadable     (kiso.runtime.trust)
     +-- StoreError                  the session store refused or could not do something
     |    +-- CorruptLogError        a log line is malformed, invalid or out of sequence
     |    +-- SessionLockedError     another process holds the session's writer lock
     |    +-- SessionNotFoundError   no log with that id
     |    +-- SessionExistsError     create() named an id that is taken
     |    +-- AppendError            an append was refused or failed (closed writer, full disk)
     |         +-- InvalidEventError  an event that would not load back was refused
     +-- RunError                    a run or an operation on it could not go on
     |    +-- ProviderError          a model request failed            (kiso.providers.base)
     +-- RefusedError                refused by policy: the floor, a mode, a rule, the sandbox
     |    +-- PathOutsideWorkspace   a path leaves the workspace       (kiso.tools.paths)
     |    +-- UntrustedProjectError  a project's .kiso/ was not trusted (kiso.runtime.trust)
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
    "InvalidEventError",
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
    """A log line that is not a torn tail failed to parse, validate or follow its predecessor.

    The message never advises cutting the log: removing a line and everything after it would
    also remove the receipts after it, and resuming would run those effects again. It points to
    ``kiso doctor``, which keeps every receipt.
    """

    def __init__(
        self, path: Path | str, line: int, reason: str, *, session_id: str | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        name = os.path.basename(self.path)
        if session_id is None and name.endswith(".jsonl") and len(name) > len(".jsonl"):
            session_id = name[: -len(".jsonl")]
        self.session_id = session_id
        command = f"kiso doctor {session_id}" if session_id else "kiso doctor <session id>"
        super().__init__(
            f"{self.path}, line {line}: {reason}. The session log is damaged and was not "
            f"changed. Do not cut lines off it by hand: that would also drop the receipts after "
            f"them, and resuming would run those effects again. Run `{command}`: it keeps a copy "
            f"of the damaged log and writes one that resumes without running again anything that "
            f"has a receipt."
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


class InvalidEventError(AppendError):
    """An event was refused before anything was written: it would not load back."""


def describe_os_error(path: str | os.PathLike[str], exc: OSError, doing: str) -> str:
    """One sentence for an operating-system error while ``doing`` something to ``path``.

    A full disk (or a used-up quota) names the file system to free space on, by its mount point;
    a read-only file system and a refused permission say so; anything else names the error. Used
    wherever the store touches the disk, so every caller says the same thing. Never raises.
    """
    where = os.fspath(path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        mount = _mount_point(where)
        disk = f"the file system mounted at {mount}" if mount else "the disk holding it"
        full = "is full" if exc.errno == errno.ENOSPC else "has no quota left for you"
        return (
            f"could not {doing} {where}: {disk} {full} ({exc.strerror}); free some space there "
            f"and try again"
        )
    if exc.errno == errno.EROFS:
        mount = _mount_point(where)
        at = f" mounted at {mount}" if mount else ""
        return f"could not {doing} {where}: the file system{at} is read-only"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"could not {doing} {where}: permission denied ({exc.strerror})"
    if exc.errno == errno.EIO:
        return (
            f"could not {doing} {where}: an input/output error ({exc.strerror}); the disk may be "
            f"failing: check it before trying again"
        )
    return f"could not {doing} {where}: {exc.strerror or exc}"


def _mount_point(path: str) -> str | None:
    """The mount point of the file system holding ``path`` (or its nearest existing parent)."""
    try:
        current = os.path.abspath(path)
        while not os.path.lexists(current):
            parent = os.path.dirname(current)
            if parent == current:
                return None
            current = parent
        dev = os.lstat(current).st_dev
        while True:
            parent = os.path.dirname(current)
            if parent == current or os.lstat(parent).st_dev != dev:
                return current
            current = parent
    except (OSError, ValueError):
        return None
