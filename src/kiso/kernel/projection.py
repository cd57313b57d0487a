"""``project(events) -> messages``: the conversation the model sees, as a pure function of the log.

See :mod:`kiso.kernel.replay` for the rules (call order, pair atomicity, closing unsettled turns,
compaction). The projection is byte-stable: the same events always give the same messages, and a
projection taken earlier in a session is a prefix of a later one unless a ``compacted`` event
rewrote history in between.
"""

from __future__ import annotations

from collections.abc import Iterable

from kiso.kernel.events import Event
from kiso.kernel.messages import Message
from kiso.kernel.replay import replay

__all__ = ["project"]


def project(events: Iterable[Event]) -> list[Message]:
    """The model's messages for the log ``events`` (the events after the header)."""
    return replay(events, render=True).messages
