"""Attachments in a prompt: ``@path`` brings a file's text, a path to an image brings the image.

The rules (docs/attachments.md says the same for users):

* ``@path`` (relative to the workspace, absolute, ``~/...``; ``@"a b.txt"``, ``@'a b.txt'`` or
  ``@a\\ b.txt`` for spaces) attaches the file after the prompt as a text block,
  ``<file path="src/x.py">...</file>``, cut at :data:`TEXT_CAP_LINES` lines or
  :data:`TEXT_CAP_BYTES` bytes (the block then ends ``[truncated: first N of M lines]``). A
  directory attaches its listing (up to :data:`LIST_CAP` entries); a binary file (a NUL byte in
  its first 8 KiB) attaches one line saying what it is; anything but a file or directory (a
  FIFO, a device) is not opened. ``@word`` naming nothing stays plain text (``@property``,
  ``@alice``) and a note says so. Paths outside the workspace are fine: the user typed them.
* A path to an image anywhere in the prompt (``look at shot.png``, ``'/tmp/a b.png'``, what a
  terminal leaves when a file is dragged in: absolute, backslash-escaped spaces or quotes, or a
  ``file://`` URL) is sent as an image block right after the path, the words around it kept as
  they are. An image is PNG, JPEG, GIF or WebP *by content* (its first bytes), never by its
  extension, and at most :data:`IMAGE_CAP` bytes (larger: :class:`AttachmentError`).
* ``vision=False`` (the model takes no image input): an image to attach is an
  :class:`AttachmentError` naming the model.
* Text in backticks (`` `logo.png` ``, code fences) is never an attachment: the way to mention
  a file without sending it.
* A path through a symbolic link is attached with the link's target named (``target="..."``
  in the block and in the note): nothing is read from a surprise place silently.

:func:`expand` returns the prompt and one note a line per attachment (what the REPL and print
mode show the user); :func:`expand_prompt` returns the prompt alone: ``text`` itself when it
attaches nothing, else the blocks ``Session.run`` takes.
"""

from __future__ import annotations

import base64
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from kiso.kernel import UsageError
from kiso.kernel.values import ImageBlock, TextBlock, UserBlock

__all__ = [
    "IMAGE_CAP",
    "LIST_CAP",
    "TEXT_CAP_BYTES",
    "TEXT_CAP_LINES",
    "AttachmentError",
    "Expansion",
    "expand",
    "expand_prompt",
    "image_type",
]

IMAGE_CAP = 5 * 1024 * 1024
"""Images are sent up to 5 MiB (the smallest of the providers' per-image limits)."""
TEXT_CAP_BYTES = 100 * 1024
TEXT_CAP_LINES = 2000
LIST_CAP = 200
_COUNT_CAP = 64 * 1024 * 1024  # lines are counted in files up to this size
_BINARY_PROBE = 8192
_TRAILING = ".,;:!?)]}>"
_LEADING = "([{<"
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp")


class AttachmentError(UsageError):
    """A prompt asks to send an image that cannot be sent (too large, or the model has no eyes)."""


@dataclass(frozen=True, slots=True)
class Expansion:
    prompt: str | list[UserBlock]
    """``text`` itself when nothing was attached, else the blocks in order."""
    notes: tuple[str, ...] = ()
    """One line a path: what was attached, or why a ``@path`` was left as text."""


def image_type(head: bytes) -> str | None:
    """The media type of an image by its first bytes (12 are enough), or None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(head) >= 12 and head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def expand_prompt(
    text: str, workspace: Path, *, vision: bool = True, model: str | None = None
) -> str | list[UserBlock]:
    """The prompt as the model gets it: ``text`` alone when it attaches nothing."""
    return expand(text, workspace, vision=vision, model=model).prompt


def expand(
    text: str, workspace: Path, *, vision: bool = True, model: str | None = None
) -> Expansion:
    """The prompt with its attachments, and a note for each (see the module)."""
    work = _Work(Path(workspace), vision, model)
    for token in _tokens(text):
        work.take(token)
    if not work.changed:
        return Expansion(text, tuple(work.notes))
    blocks: list[UserBlock] = []
    at = 0
    for end, image in work.images:
        blocks.append(TextBlock(text[at:end]))
        blocks.append(image)
        at = end
    blocks.append(TextBlock(text[at:]))
    blocks = [b for b in blocks if not (isinstance(b, TextBlock) and not b.text.strip())]
    blocks.extend(work.files)
    return Expansion(blocks, tuple(work.notes))


# --------------------------------------------------------------------------- reading the prompt


@dataclass(frozen=True, slots=True)
class _Token:
    end: int
    """Where the token ends in the prompt: an image goes right after it."""
    candidates: tuple[str, ...]
    """What the path may be, best first (as written, unescaped, trailing punctuation cut)."""
    at: bool
    """Written ``@path``: an explicit attachment."""


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c == "`":  # code: never an attachment
            run = len(text[i:]) - len(text[i:].lstrip("`"))
            close = text.find("`" * run, i + run)
            i = n if close < 0 else close + run
            continue
        at = c == "@"
        j = i + 1 if at else i
        while not at and j < n and text[j] in _LEADING:
            j += 1
        if j < n and text[j] in "\"'":
            close = text.find(text[j], j + 1)
            inner = text[j + 1 : close] if close > 0 else ""
            if inner and "\n" not in inner:
                out.append(_Token(close + 1, (inner,), at))
                i = close + 1
                continue
        k, chars = j, []
        while k < n and not text[k].isspace() and text[k] != "`":
            if text[k] == "\\" and k + 1 < n:
                chars.append(text[k + 1])
                k += 2
            else:
                chars.append(text[k])
                k += 1
        raw, unescaped = text[j:k], "".join(chars)
        if raw:
            out.append(_Token(k, _variants(raw, unescaped), at))
        i = max(k, i + 1)
    return out


def _variants(raw: str, unescaped: str) -> tuple[str, ...]:
    seen: list[str] = []
    for word in (raw, unescaped):
        for form in (word, word.rstrip(_TRAILING), word.rstrip(_TRAILING + "'\"")):
            if form and form not in seen:
                seen.append(form)
    return tuple(seen)


# --------------------------------------------------------------------------- attaching


@dataclass
class _Work:
    workspace: Path
    vision: bool
    model: str | None
    images: list[tuple[int, ImageBlock]] = field(default_factory=list)
    files: list[TextBlock] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)

    @property
    def changed(self) -> bool:
        return bool(self.images or self.files)

    def take(self, token: _Token) -> None:
        if not token.at and not any(_pathlike(c) for c in token.candidates):
            return
        for typed in token.candidates:
            found = self._locate(typed)
            if found is not None:
                self._attach(token, typed, *found)
                return
        if token.at:
            self.notes.append(f"@{token.candidates[0]}: no such file or directory; sent as text")

    def _locate(self, typed: str) -> tuple[Path, os.stat_result] | None:
        if typed.startswith("file://"):
            typed = unquote(urlsplit(typed).path)
        path = Path(typed).expanduser()
        if not path.is_absolute():
            path = self.workspace / path
        try:
            return path, os.stat(path)  # follows links; a dangling one is no file
        except (OSError, ValueError):
            return None

    def _attach(self, token: _Token, typed: str, path: Path, info: os.stat_result) -> None:
        real = os.path.realpath(path)
        shown = unquote(urlsplit(typed).path) if typed.startswith("file://") else typed
        link = real != os.path.abspath(path)
        via = f" (a link to {real})" if link else ""
        target = f' target="{real}"' if link else ""
        looks_like_image = typed.lower().endswith(_IMAGE_SUFFIXES)
        if stat.S_ISDIR(info.st_mode):
            if token.at and self._first(real):
                self.files.append(TextBlock(_listing(path, shown, target)))
                self.notes.append(f"attached the listing of {shown}{via}")
            return
        if not stat.S_ISREG(info.st_mode):  # a FIFO or a device: opening it could hang
            if token.at:
                self.notes.append(f"@{shown}: not a regular file; not opened, sent as text")
            return
        try:
            with open(path, "rb") as f:
                head = f.read(_BINARY_PROBE if token.at else 12)
        except OSError as exc:
            if token.at or looks_like_image:
                self.notes.append(f"{shown}: {exc.strerror or exc}; not attached")
            return
        media = image_type(head[:12])
        if media is not None:
            if self._first(real):
                self._image(token, path, shown, media=media, size=info.st_size, via=via)
        elif token.at:
            if self._first(real):
                self.files.append(TextBlock(_file_text(path, shown, target, head, info.st_size)))
                self.notes.append(f"attached {shown}{via}")
        elif looks_like_image:
            self.notes.append(
                f"{shown} is not a PNG, JPEG, GIF or WebP image by its content; sent as text"
            )

    def _image(
        self, token: _Token, path: Path, shown: str, *, media: str, size: int, via: str
    ) -> None:
        if not self.vision:
            who = self.model or "this model"
            raise AttachmentError(
                f"{shown} is an image, and {who} takes no image input. Switch to a model that "
                f"does, or write the path in backticks (`{shown}`) to mention it without "
                f"sending it."
            )
        if size > IMAGE_CAP:
            raise AttachmentError(
                f"{shown} is a {_size(size)} image; images are sent up to {_size(IMAGE_CAP)}. "
                f"Shrink or crop it, or write the path in backticks (`{shown}`) to mention it "
                f"without sending it."
            )
        data = path.read_bytes()
        if image_type(data[:12]) != media or len(data) > IMAGE_CAP:  # changed as we read
            raise AttachmentError(f"{shown} changed while it was read; try again")
        encoded = base64.b64encode(data).decode("ascii")
        self.images.append((token.end, ImageBlock(media_type=media, data=encoded)))
        kind = media.removeprefix("image/").upper()
        self.notes.append(f"attached {shown} ({kind} image, {_size(len(data))}){via}")

    def _first(self, real: str) -> bool:
        if real in self.done:
            return False
        self.done.add(real)
        return True


def _pathlike(word: str) -> bool:
    """Worth a look on disk: a path or a file name, not an ordinary word or a web address."""
    if word.startswith("file://"):
        return True
    if len(word) >= 4096 or "://" in word:
        return False
    return "/" in word or "." in word.strip(".")


def _file_text(path: Path, shown: str, target: str, head: bytes, size: int) -> str:
    if b"\0" in head:
        what = f"[a binary file of {_size(size)}: not attached]"
        return f'<file path="{shown}"{target} binary="true">{what}</file>'
    with open(path, "rb") as f:
        data = f.read(TEXT_CAP_BYTES + 1)
    cut_bytes = len(data) > TEXT_CAP_BYTES
    text = data[:TEXT_CAP_BYTES].decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    if cut_bytes and lines and not lines[-1].endswith("\n"):
        lines = lines[:-1] or lines  # cut at a line boundary when there is one
    kept = lines[:TEXT_CAP_LINES]
    body = "".join(kept)
    truncated = cut_bytes or len(lines) > TEXT_CAP_LINES
    if body and not body.endswith("\n"):
        body += "\n"
    note = ""
    if truncated:
        total = _count_lines(path, size)
        of = f"of {total} lines" if total is not None else f"lines of a {_size(size)} file"
        note = f"[truncated: first {len(kept)} {of}]\n"
    return f'<file path="{shown}"{target}>\n{body}{note}</file>'


def _count_lines(path: Path, size: int) -> int | None:
    if size > _COUNT_CAP:
        return None
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def _listing(path: Path, shown: str, target: str) -> str:
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:
        why = f"[not listed: {exc.strerror or exc}]"
        return f'<directory path="{shown}"{target}>{why}</directory>'
    names = []
    for entry in entries[:LIST_CAP]:
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        names.append(entry.name + ("/" if is_dir else ""))
    more = f"[... and {len(entries) - LIST_CAP} more]\n" if len(entries) > LIST_CAP else ""
    body = "".join(f"{name}\n" for name in names) or "[empty]\n"
    return f'<directory path="{shown}"{target}>\n{body}{more}</directory>'


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < 1024 * 1024:
        return f"{n / 1024:.0f} KB"
    return f"{n / (1024 * 1024):.1f} MB"
