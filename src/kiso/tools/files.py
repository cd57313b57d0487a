"""The five file tools in one place: reading.py has the readers, editing.py the writers, and
_filecore.py what they share (its docstring states the guarantees). ``atomic_write`` lives in the
public :mod:`kiso.tools.atomic` and is re-exported here."""

from __future__ import annotations

from kiso.tools._filecore import SKIPPED_DIRS, revision
from kiso.tools.atomic import atomic_write
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
