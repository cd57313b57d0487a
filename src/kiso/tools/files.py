"""The five file tools: read_file, list_dir, search_text, write_file, edit_file.

Every tool resolves its paths with :func:`kiso.tools.paths.resolve_in_workspace`, so nothing outside
the workspace is read, listed, searched or written, whether it is named directly, through ``..``
or through a symlink. Every refusal is an error result the model can act on (never an exception):
bad input and refused paths are ``invalid_input``, a stale ``expectedRevision`` is
``precondition``.

A file's revision is the first 16 hex digits of the SHA-256 of its bytes. read_file, write_file and
edit_file end their result with ``[rev:<revision>]``; edit_file refuses to write when it is given
an ``expectedRevision`` that no longer matches, so an edit is never made against stale text.
Writes are atomic: a temporary file in the same directory, fsync, ``os.replace``, fsync of the
directory. A reader sees the old bytes or the new, never a mix, and a crash leaves one or the other.
"""

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
