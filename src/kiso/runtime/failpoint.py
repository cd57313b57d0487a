"""``KISO_FAILPOINT=<event-type>[:<n>]``: die by SIGKILL right after a durable append, for tests.

With ``KISO_FAILPOINT=execution_started:2`` the process kills itself with SIGKILL immediately
after the second ``execution_started`` record of this process is on disk (``n`` defaults to 1):
right after the fsync of the batch holding it, so records staged with it die with it too.
That is a machine crash at the worst moment, on demand: tests and demos use it to prove that every
crash window resumes correctly. The variable is stripped from every child a model can drive.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence

from kiso.kernel import Event, UsageError, ascii_int
from kiso.kernel.events import EVENT_TYPES

__all__ = ["Failpoint"]


class Failpoint:
    def __init__(self, event_type: str | None, nth: int = 1) -> None:
        self.event_type = event_type
        self.nth = nth
        self._seen = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Failpoint:
        spec = (os.environ if environ is None else environ).get("KISO_FAILPOINT", "").strip()
        if not spec:
            return cls(None)
        kind, _, count = spec.partition(":")
        nth = ascii_int(count) if count else 1
        if kind not in EVENT_TYPES or nth is None or nth < 1:
            raise UsageError(
                f"KISO_FAILPOINT={spec!r}: expected <event-type>[:<n>] with an event type of "
                f"{', '.join(sorted(EVENT_TYPES))} and n >= 1"
            )
        return cls(kind, nth)

    @property
    def active(self) -> bool:
        return self.event_type is not None

    def after_durable(self, events: Sequence[Event]) -> None:
        """Called by the session's writer with each batch once it is on disk (the batch, not
        each record: a failpoint on a record dies after the whole batch holding it is durable)."""
        if self.event_type is None:
            return
        for event in events:
            if event.type == self.event_type:
                self._seen += 1
                if self._seen == self.nth:
                    os.kill(os.getpid(), signal.SIGKILL)
