"""Words and targets: a shell word as the floor reads it, and what it names on disk.

A word is pieces of quoted text, unquoted text and values only known when the command runs;
its target is found lexically (``~``, ``$HOME``, braces, wildcards, relative paths), then judged
against the protected :mod:`places <kiso.runtime.floor.places>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from itertools import pairwise, product
from typing import Literal

from tree_sitter import Node

from kiso.runtime.floor.places import (
    ANY_NAME,
    PROTECTED_IN_HOME,
    RANK,
    Places,
    join,
    strictly_inside,
)

__all__ = [
    "Cwds",
    "Location",
    "Unknown",
    "Word",
    "WordReader",
    "judge",
    "resolve_target",
    "token_word",
]


# --------------------------------------------------------------------------------------------
# Words: a shell word as pieces of quoted text, unquoted text and unknown values

_Kind = Literal["lit", "raw", "var"]
"""``lit``: quoted text; ``raw``: unquoted (wildcards and ``~`` active); ``var``: unknown."""
_Piece = tuple[_Kind, str]
_UNKNOWN_REF = "${KISO_FLOOR_UNKNOWN}"
"""How an unknown value is written back when a string is parsed again as a script."""


@dataclass(frozen=True, slots=True)
class Word:
    text: str
    """The word as written."""
    pieces: tuple[_Piece, ...]

    @property
    def value(self) -> str | None:
        """The word after quote removal, if nothing in it is unknown."""
        if any(kind == "var" for kind, _ in self.pieces):
            return None
        return "".join(text for _, text in self.pieces)

    @property
    def script(self) -> str:
        """The word's value as shell source, unknown parts kept as a variable reference."""
        return "".join(_UNKNOWN_REF if kind == "var" else text for kind, text in self.pieces)

    def plus(self, kind: _Kind, text: str) -> Word:
        return Word(self.text, (*self.pieces, (kind, text)))


def _merge(pieces: Iterable[_Piece]) -> tuple[_Piece, ...]:
    """Join neighbouring pieces of the same kind (unknown values stay apart); drop empty ones."""
    merged: list[tuple[_Kind, list[str]]] = []
    for kind, text in pieces:
        if merged and kind != "var" and merged[-1][0] == kind:
            merged[-1][1].append(text)
        elif text or kind == "var":
            merged.append((kind, [text]))
    return tuple((kind, "".join(texts)) for kind, texts in merged)


def _known_variable(name: str, home: str) -> str | None:
    """The variables the floor follows: ``HOME``, and ``TMPDIR`` as a temporary directory."""
    return {"HOME": home, "TMPDIR": "/tmp"}.get(name)


def _unquoted(text: str) -> list[_Piece]:
    """Unquoted text: a backslash quotes the next character."""
    pieces: list[_Piece] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            if text[i + 1] != "\n":  # a backslash-newline joins lines
                pieces.append(("lit", text[i + 1]))
            i += 2
        else:
            pieces.append(("raw", text[i]))
            i += 1
    return pieces


def _double_quoted(text: str) -> str:
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m[1] == "\n" else m[1], text)


def token_word(token: str, home: str) -> Word:
    """A word from the fallback tokenizer (quotes already removed, so all of it is unquoted)."""
    pieces: list[_Piece] = []
    pattern = r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*)|\{[^}]*\}?|[0-9@*#?$!-]|\(|\[)"
    pos = 0
    for match in re.finditer(pattern, token):
        pieces.append(("raw", token[pos : match.start()]))
        value = _known_variable(match[1] or match[2] or "", home)
        pieces.append(("var", match[0]) if value is None else ("lit", value))
        pos = match.end()
    pieces.append(("raw", token[pos:]))
    return Word(token, _merge(pieces))


class WordReader:
    """Turns tree-sitter word nodes into :class:`Word`."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.source = b""
        """The script being read: node text is taken from here (see :func:`parse`)."""

    def text(self, node: Node) -> str:
        return self.source[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def word(self, node: Node) -> Word:
        return Word(self.text(node), _merge(self.pieces(node)))

    def pieces(self, node: Node) -> list[_Piece]:
        kind = node.type
        text = self.text(node)
        if kind in ("word", "number", "brace_expression", "extglob_pattern"):
            return _unquoted(text)
        if kind in ("command_name", "concatenation"):
            return [piece for child in node.children for piece in self.pieces(child)]
        if kind == "raw_string":
            return [("lit", text[1:-1] if len(text) > 1 and text.endswith("'") else text[1:])]
        if kind in ("string", "translated_string"):
            return self._string(node)
        if kind in ("simple_expansion", "expansion"):
            return [self._expansion(node)]
        # command and process substitution, arithmetic, $'...', errors: only known when it runs
        return [("var", text)]

    def _string(self, node: Node) -> list[_Piece]:
        raw = self.source[node.start_byte : node.end_byte]
        start = raw.find(b'"') + 1
        end = len(raw) - 1 if len(raw) > start and raw.endswith(b'"') else len(raw)
        pieces: list[_Piece] = []
        pos = start
        for child in node.children:
            lo, hi = child.start_byte - node.start_byte, child.end_byte - node.start_byte
            if lo < start or hi > end:
                continue  # the quotes themselves
            if lo > pos:
                pieces.append(("lit", _double_quoted(raw[pos:lo].decode("utf-8", "replace"))))
            if child.type == "string_content" or not child.is_named:
                pieces.append(("lit", _double_quoted(self.text(child))))
            elif child.type in ("simple_expansion", "expansion"):
                pieces.append(self._expansion(child))
            else:
                pieces.append(("var", self.text(child)))
            pos = max(pos, hi)
        if pos < end:
            pieces.append(("lit", _double_quoted(raw[pos:end].decode("utf-8", "replace"))))
        return pieces

    def _expansion(self, node: Node) -> _Piece:
        """``$NAME``, ``${NAME}``, ``${NAME:-default}``: known for HOME and TMPDIR only."""
        named = node.named_children
        operators = [
            c.type for c in node.children if not c.is_named and c.type not in ("$", "${", "}")
        ]
        if named and named[0].type == "variable_name":
            value = _known_variable(self.text(named[0]), self.home)
            plain = not operators and len(named) == 1
            if value is not None and (plain or operators in ([":-"], ["-"])):
                return ("lit", value)
        return ("var", self.text(node))


# --------------------------------------------------------------------------------------------
# Targets: what a word names on disk


@dataclass(frozen=True, slots=True)
class _Component:
    name: str
    pattern: str | None
    """An fnmatch pattern when the component is a wildcard, else ``None``."""


@dataclass(frozen=True, slots=True)
class Location:
    base: str
    """The absolute path up to the first wildcard component."""
    rest: tuple[_Component, ...]
    """The components from the first wildcard on (empty for an exact path)."""


@dataclass(frozen=True, slots=True)
class Unknown:
    why: str
    """Completes "its target X ...": why the target cannot be known before the command runs."""


Cwds = frozenset[str] | None
"""The directories a command may run in; ``None`` when they cannot be known."""

_NOT_PLAIN = frozenset({"..", ".git", *PROTECTED_IN_HOME})
_MAX_BRACE_WORDS = 64
_MAX_WILDCARDS = 16
_RUNTIME_VALUE = "starts with a value that is only known when the command runs"


def _expand_braces(text: str) -> list[str] | None:
    """Bash brace expansion (``a{b,c}``) of unquoted text; ``None`` if it is too large to follow."""
    if text.count("{") > 16:
        return None
    start = text.find("{")
    while start != -1:
        depth, end = 0, -1
        commas: list[int] = []
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    end = i
                    break
            elif text[i] == "," and depth == 1:
                commas.append(i)
        if end == -1:
            return [text]
        if commas:
            words: list[str] = []
            for a, b in pairwise([start, *commas, end]):
                more = _expand_braces(text[:start] + text[a + 1 : b] + text[end + 1 :])
                if more is None or len(words) + len(more) > _MAX_BRACE_WORDS:
                    return None
                words.extend(more)
            return words
        start = text.find("{", start + 1)
    return [text]


def _alternatives(pieces: tuple[_Piece, ...]) -> list[tuple[_Piece, ...]] | None:
    choices: list[list[_Piece]] = []
    for kind, text in pieces:
        expanded = _expand_braces(text) if kind == "raw" else [text]
        if expanded is None:
            return None
        choices.append([(kind, alternative) for alternative in expanded])
    total = 1
    for options in choices:
        total *= len(options)
    if total > _MAX_BRACE_WORDS:
        return None
    return [_merge(combination) for combination in product(*choices)]


def _escape(char: str) -> str:
    return f"[{char}]" if char in "*?[" else char


def _path_chars(pieces: tuple[_Piece, ...], home: str) -> list[tuple[str, bool]] | Unknown:
    """The path as characters, each flagged when it is an active wildcard character."""
    kind, text = pieces[0]
    if kind == "var":
        return Unknown(_RUNTIME_VALUE)
    chars: list[tuple[str, bool]] = []
    if kind == "raw" and text.startswith("~"):
        prefix, slash, tail = text.partition("/")
        if prefix != "~":
            return Unknown(f"starts with {prefix}, a directory the floor cannot resolve")
        chars.extend((c, False) for c in home)
        pieces = (("raw", slash + tail), *pieces[1:])
    for kind, text in pieces:
        if kind == "var":
            chars.append(("*", True))  # an unknown value inside a word may be anything
        else:
            chars.extend((c, kind == "raw") for c in text)
    return chars


def _components(chars: list[tuple[str, bool]]) -> list[_Component]:
    parts: list[list[tuple[str, bool]]] = [[]]
    for char, active in chars:
        if char == "/":
            parts.append([])
        else:
            parts[-1].append((char, active))
    components = []
    for part in parts:
        name = "".join(c for c, _ in part)
        if not name or name == ".":
            continue
        wild = any(active and c in "*?[" for c, active in part)
        pattern = "".join(c if active else _escape(c) for c, active in part) if wild else None
        components.append(_Component(name, pattern))
    return components


def resolve_target(word: Word, cwds: Cwds, home: str) -> list[Location] | Unknown:
    """Where ``word`` points: one location per brace alternative and possible directory.

    Lexical only: ``~``, ``$HOME`` and ``${HOME}`` become ``home``, ``$TMPDIR`` a temporary
    directory, relative paths are joined to each of ``cwds`` and normalised with
    :func:`posixpath.normpath`. Symlinks are not followed. A word that starts with any other
    expansion is :class:`Unknown`; an unknown value later in a word acts as a ``*``. When the
    directory is unknown (``cwds`` is ``None``), a relative path is :class:`Unknown` unless it
    is a plain name (``build/out``: no ``.``, ``..`` or wildcard, no protected name first), which
    is left out: below an unknown directory it reaches nothing the floor protects by name.
    """
    alternatives = _alternatives(word.pieces)
    if alternatives is None:
        return Unknown("has a brace expansion too large to follow")
    locations: list[Location] = []
    for pieces in alternatives:
        if not pieces:
            continue  # an empty argument names nothing
        chars = _path_chars(pieces, home)
        if isinstance(chars, Unknown):
            return chars
        components = _components(chars)
        if sum(c.pattern is not None for c in components) > _MAX_WILDCARDS:
            return Unknown("has too many wildcards to follow")
        absolute = chars[0][0] == "/"
        if not absolute and cwds is None:
            plain = bool(components) and components[0].name not in _NOT_PLAIN
            if not plain or any(c.pattern is not None or c.name == ".." for c in components):
                return Unknown("is relative to a directory only known when the command runs")
            continue
        wild = next((i for i, c in enumerate(components) if c.pattern is not None), None)
        head = "/".join(c.name for c in components[:wild])
        rest = () if wild is None else tuple(components[wild:])
        for start in ["/"] if absolute else sorted(cwds or ()):
            locations.append(Location(join(start, head), rest))
    return locations


_ANY_NAMES = ("a", "src", "Makefile", "README.md", "x_y-z.1")
"""Names a wildcard must match all of to count as matching anything (``*``, ``?*``)."""


def _wildcard_matches(name: str, pattern: str, dots: bool) -> bool:
    """Bash's default: a leading dot is only matched explicitly (or with ``dotglob``)."""
    hidden = name.startswith(".") and not dots and not pattern.startswith((".", "["))
    return not hidden and fnmatchcase(name, pattern)


def judge(places: Places, location: Location, dots: bool) -> str | None:
    """Describe something unrecoverable that ``location`` may name, or ``None``.

    Wildcards match as in bash: a leading dot only explicitly unless ``dots`` (``dotglob``),
    and ``**`` may stand for any number of directories. A wildcard is followed into every
    protected name it can match and into one stand-in for "any other name"; a last component
    that matches any name at all deletes everything in its directory.
    """
    stack = [(location.base, 0)]
    seen: set[tuple[str, int]] = set()
    rest = location.rest
    while stack:
        path, i = stack.pop()
        literal = i
        while literal < len(rest) and rest[literal].pattern is None:
            literal += 1
        if literal > i:
            path, i = join(path, "/".join(c.name for c in rest[i:literal])), literal
        if (path, i) in seen:
            continue
        seen.add((path, i))
        found = places.classify(path)
        if i == len(rest):
            if found is not None:
                return found
            continue
        pattern = rest[i].pattern or ""
        last = i == len(rest) - 1
        if found is not None and last and all(fnmatchcase(n, pattern) for n in _ANY_NAMES):
            return f"everything in {found}"
        below = [s[len(path) :].lstrip("/") for s in places.sensitive if strictly_inside(s, path)]
        if pattern == "**":
            visible = (r for r in below if dots or not any(p.startswith(".") for p in r.split("/")))
            following = [path, *(join(path, r) for r in sorted(visible))]
        else:
            names = sorted({r.split("/")[0] for r in below}, key=lambda n: (RANK.get(n, 99), n))
            following = [join(path, n) for n in names if _wildcard_matches(n, pattern, dots)]
        following.append(join(path, ANY_NAME))
        stack.extend((p, i + 1) for p in reversed(following))
    return None
