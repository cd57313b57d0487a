"""What tests ask about processes they started (by the pid they recorded, never by name)."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead and waiting to be reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")
