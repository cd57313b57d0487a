"""The five file tools in one place: reading.py has the readers, editing.py the writers, and
_filecore.py what they share (its docstring states the guarantees)."""

from __future__ import annotations

from kiso.tools._filecore import SKIPPED_DIRS, atomic_write, revision
from kiso.tools.editing import EDIT_FILE, WRITE_FILE
from kiso.tools.reading import LIST_DIR, READ_FILE, SEARCH_TEXT

__all__ = [
    "EDIT_FILE",
    "LIST_DIR",
    "READ_FILE",
    "SEARCH_TEXT",
    "SKIPPED_DIRS",
    "WRITE_FILE",
    "atomic_write",
    "revision",
]
