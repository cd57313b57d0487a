"""``KISO_FAILPOINT=<event-type>[:<n>]``: die by SIGKILL right after a durable append, for tests.

With ``KISO_FAILPOINT=execution_started:2`` the process kills itself with SIGKILL immediately
after the second ``execution_started`` record of this process is on disk (``n`` defaults to 1).
That is a machine crash at the worst moment, on demand: tests and demos use it to prove that every
crash window resumes correctly. The variable is stripped from every child a model can drive.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping

from kiso.kernel import KisoError
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
        if kind not in EVENT_TYPES or (count and (not count.isdigit() or int(count) < 1)):
            raise KisoError(
                f"KISO_FAILPOINT={spec!r}: expected <event-type>[:<n>] with an event type of "
                f"{', '.join(sorted(EVENT_TYPES))} and n >= 1"
            )
        return cls(kind, int(count) if count else 1)

    def after_append(self, types: Iterable[str]) -> None:
        """Call after every durable append with the types just written."""
        if self.event_type is None:
            return
        for kind in types:
            if kind == self.event_type:
                self._seen += 1
                if self._seen == self.nth:
                    os.kill(os.getpid(), signal.SIGKILL)
