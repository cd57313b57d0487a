"""Path globs, the one implementation: ``*`` and ``?`` stay inside one path segment, ``**``
spans any number of them. Used by the "don't ask again" rules and by a subagent's write scope."""

from __future__ import annotations

import re

__all__ = ["glob_regex"]


def glob_regex(pattern: str, *, any_depth: bool = False) -> re.Pattern[str]:
    """The regular expression a whole relative path must match (``fullmatch``) for ``pattern``.

    ``any_depth``: ``**/`` also matches no directory at all (``src/**/a.py`` matches
    ``src/a.py``), as in ``.gitignore``; without it ``**`` is simply "anything", slashes too."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if any_depth and pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))
