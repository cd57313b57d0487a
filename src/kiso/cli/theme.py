"""The terminal's palette: dark or light, and who said so.

Decided once, when the interactive session starts; the first that answers wins:

1. ``KISO_THEME`` (``dark`` or ``light``), for one run;
2. ``theme`` in the user config (``~/.kiso/config.json``; a project config may not set it: a
   terminal belongs to the person at it, so config.py refuses it loudly there);
3. the terminal itself, asked for its background colour (OSC 11) when stdin and stdout are both
   terminals and colour is allowed (no ``NO_COLOR``, not a pipe), with a ~100 ms limit;
4. ``COLORFGBG``, which some terminals export;
5. nothing: ``unknown``, a supported outcome rather than a failure.

The interface stays monochrome whatever the answer; the theme only picks the shades of the three
colours that mean something (red errors, yellow warnings, green additions): the bright shades on
a dark background, the plain ones on a light or unknown one.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kiso.kernel import UsageError, ascii_int

__all__ = [
    "THEMES",
    "UNKNOWN",
    "Palette",
    "choose_theme",
    "from_colorfgbg",
    "palette",
    "parse_background",
    "query_background",
    "shade",
]

THEMES = ("dark", "light")
QUERY = b"\x1b]11;?\x07"
"""OSC 11 with ``?``: "what is your background colour?"."""
DA1 = b"\x1b[c"
"""Primary device attributes: nearly every terminal answers it, after anything asked before it,
so its answer says the terminal has nothing more to say (no need to wait out the limit)."""
_DA1_REPLY = re.compile(rb"\x1b\[\?[0-9;]*c")
_BACKGROUND = re.compile(
    rb"\x1b\]11;rgba?:([0-9a-fA-F]{1,4})/([0-9a-fA-F]{1,4})/([0-9a-fA-F]{1,4})"
)


@dataclass(frozen=True, slots=True)
class Palette:
    """The shades of the three colours, as rich colour names, and where the theme came from."""

    name: str
    """``dark``, ``light`` or ``unknown``."""
    source: str
    error: str
    warning: str
    added: str

    @property
    def rich_styles(self) -> dict[str, str]:
        return {"kiso.error": self.error, "kiso.warning": self.warning, "kiso.added": self.added}

    @property
    def toolkit(self) -> dict[str, str]:
        """The same shades as prompt_toolkit style names."""
        return {
            "error": "ansi" + self.error.replace("_", ""),
            "warning": "ansi" + self.warning.replace("_", ""),
        }

    def describe(self) -> str:
        return self.name if self.name == "unknown" else f"{self.name} ({self.source})"


def palette(name: str, source: str) -> Palette:
    if name == "dark":
        return Palette(name, source, "bright_red", "bright_yellow", "bright_green")
    return Palette(name, source, "red", "yellow", "green")


UNKNOWN = palette("unknown", "the terminal did not say")


def parse_background(data: bytes) -> tuple[float, float, float] | None:
    """The background colour in an OSC 11 answer (``rgb:RRRR/GGGG/BBBB``), each part 0..1."""
    match = _BACKGROUND.search(data)
    if match is None:
        return None
    parts = [int(g, 16) / (16 ** len(g) - 1) for g in match.groups()]
    return parts[0], parts[1], parts[2]


def shade(rgb: tuple[float, float, float]) -> str:
    """``dark`` or ``light``: the colour's luminance (Rec. 709 weights) below or above half."""
    r, g, b = rgb
    return "dark" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else "light"


def from_colorfgbg(value: str | None) -> str | None:
    """``COLORFGBG`` (``"15;0"``: foreground;background as ANSI colour numbers) -> a theme."""
    if not value:
        return None
    bg = ascii_int(value.rsplit(";", 1)[-1])
    if bg is None:
        return None
    return "light" if bg == 7 or 9 <= bg <= 15 else "dark"


def query_background(fd_in: int, fd_out: int, timeout: float = 0.1) -> str | None:
    """Ask the terminal on ``fd_in``/``fd_out`` for its background; ``dark``, ``light`` or None
    (no answer within ``timeout`` seconds). An answer that arrives too late is flushed, so it
    can never turn into typed input."""
    import termios

    try:
        saved = termios.tcgetattr(fd_in)
    except (termios.error, OSError):
        return None
    raw = list(saved)
    raw[3] &= ~(termios.ICANON | termios.ECHO)
    cc = list(saved[6])
    cc[termios.VMIN], cc[termios.VTIME] = 0, 0
    raw[6] = cc
    got = b""
    try:
        termios.tcsetattr(fd_in, termios.TCSANOW, raw)
        os.write(fd_out, QUERY + DA1)
        deadline = time.monotonic() + timeout
        while _DA1_REPLY.search(got) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd_in], [], [], left)
            if not ready:
                break
            chunk = os.read(fd_in, 1024)
            if not chunk:
                break
            got += chunk
        if _DA1_REPLY.search(got) is None:
            termios.tcflush(fd_in, termios.TCIFLUSH)
    except (termios.error, OSError):
        return None
    finally:
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(fd_in, termios.TCSANOW, saved)
    rgb = parse_background(got)
    return None if rgb is None else shade(rgb)


def choose_theme(
    *,
    configured: str | None,
    environ: Mapping[str, str],
    ask: Callable[[], str | None] | None,
) -> Palette:
    """The palette: ``KISO_THEME`` > the user config's ``theme`` > the terminal's answer (``ask``,
    None when it may not be asked) > ``COLORFGBG`` > unknown."""
    forced = environ.get("KISO_THEME", "").strip()
    if forced:
        if forced not in THEMES:
            raise UsageError(
                f"KISO_THEME={forced!r}: must be dark or light (unset it to follow the terminal)"
            )
        return palette(forced, "KISO_THEME")
    if configured is not None and configured in THEMES:
        return palette(configured, "~/.kiso/config.json")
    if ask is not None:
        found = ask()
        if found is not None:
            return palette(found, "the terminal's background")
    fgbg = from_colorfgbg(environ.get("COLORFGBG"))
    if fgbg is not None:
        return palette(fgbg, "COLORFGBG")
    return UNKNOWN
