"""Which executions are still running: kiso's liveness guard, kept beside the receipt store.

A ``started`` receipt says a tool began and has not reported; it does not say whether something
is still at work on it. So while a tool with effects runs, the executer holds its liveness guard
(:class:`kiso.runtime.liveness.LivenessGuard`, the one kiso's shell runner uses): a file locked
with ``flock`` in ``<store>.live/<scope>/``, whose descriptor the ``terminal`` tool hands on to
the command it starts (through the shell supervisor). As long as the executer or a process that
inherited the descriptor lives, the lock is held, and the execution is *running*, not uncertain:

- a request for it is answered ``running`` (with the pid), and nothing runs;
- ``resolve`` refuses to rule on it (:class:`~kyronix.errors.ExecutionRunningError`): nobody
  can know yet whether it applied;
- only once every holder is gone (the executer died: ``kill -9`` included, and the shell
  supervisor then kills the command's processes) does it become *uncertain*.

An in-memory receipt store keeps no guards (nothing about it outlives the process anyway).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kiso.kernel.errors import UsageError
from kiso.runtime.liveness import LivenessGuard, guard_path, may_be_running
from kyronix.errors import KyronixSignal

__all__ = ["AlreadyRunning", "Guards", "LivenessGuard"]


class Guards:
    """The liveness guards of one receipt store (``directory`` None: none are kept)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    @classmethod
    def beside(cls, store_path: Path) -> Guards:
        """The guards of the store at ``store_path`` (``receipts.sqlite3`` ->
        ``receipts.live/``); none for ``:memory:``."""
        if str(store_path) == ":memory:":
            return cls(None)
        return cls(store_path.with_name(store_path.name.split(".", 1)[0] + ".live"))

    def scope_dir(self, scope: str) -> Path | None:
        if self.directory is None:
            return None
        digest = hashlib.sha256(os.fsencode(scope)).hexdigest()[:24]
        return self.directory / digest

    def hold(self, scope: str, execution_id: str) -> LivenessGuard | None:
        """Hold the guard of ``execution_id`` under ``scope``: None when no guards are kept.
        Raises :class:`AlreadyRunning` when another holder (another process running the same
        execution, or what it started) has it."""
        where = self.scope_dir(scope)
        if where is None:
            return None
        try:
            return LivenessGuard.hold(where, execution_id)
        except UsageError:
            raise AlreadyRunning(self.holder_pid(scope, execution_id)) from None

    def running(self, scope: str, execution_id: str) -> bool:
        """Whether a live process still holds the guard of ``execution_id``."""
        where = self.scope_dir(scope)
        return where is not None and may_be_running(where, execution_id)

    def holder_pid(self, scope: str, execution_id: str) -> int | None:
        """The pid the guard file names (the executer that took it), if it can be read."""
        where = self.scope_dir(scope)
        if where is None:
            return None
        try:
            words = guard_path(where, execution_id).read_text("utf-8", "replace").split()
        except OSError:
            return None
        if len(words) >= 2 and words[0] == "pid" and words[1].isascii() and words[1].isdigit():
            return int(words[1])
        return None


class AlreadyRunning(KyronixSignal):
    """The guard is held elsewhere: caught by the executer, which answers ``running``."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(f"held by pid {pid}" if pid else "held by another process")
        self.pid = pid
