"""Identifiers: time-ordered UUIDv7 strings, and the rule for session ids."""

from __future__ import annotations

import os
import re
import time
import uuid

from kiso.kernel.errors import UsageError

__all__ = ["SESSION_ID_PATTERN", "check_session_id", "new_id"]

SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def new_id() -> str:
    """A UUIDv7 (RFC 9562): 48 bits of unix milliseconds, then 74 random bits.

    Sorting the strings sorts by creation time, which keeps listings and execution ids readable.
    """
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a: 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b: 62 bits
    return str(uuid.UUID(int=value))


def check_session_id(session_id: str) -> str:
    """Return ``session_id`` if it is a legal file name stem, else raise :class:`UsageError`."""
    if not SESSION_ID_PATTERN.fullmatch(session_id):
        raise UsageError(
            f"invalid session id {session_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit"
        )
    return session_id
