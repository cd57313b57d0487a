"""The catastrophe floor: refuse shell commands that would destroy what cannot be recovered.

:func:`check_command` reads a shell command line and returns a :class:`Refusal` when some simple
command in it is destructive *and* aims at something that cannot be recovered; otherwise ``None``.
It runs in every approval mode, ``bypass`` included, so it only ever says no.

What it guarantees, for the command line as written:

* Every simple command anywhere in the parse tree is checked: lists, pipelines, subshells,
  groups, ``$( )`` and backticks, process substitution, ``if``/``while``/``for``/``case``
  bodies and function bodies. Wrappers are seen through (``sudo``, ``doas``, ``env``,
  ``nice``, ``nohup``, ``time``, ``timeout``, ``command``, ``builtin``, ``exec``, ``busybox``,
  ``xargs``, ``find -exec``), and ``sh -c``/``bash -c``/``eval`` strings and here-documents fed
  to a shell are parsed in turn.
* The destructive commands are ``rm`` (recursive or not), ``git clean -f``,
  ``git reset --hard``, ``git checkout`` of paths or with ``-f``, ``git restore``,
  ``git switch -f``, and a ``find -delete`` or ``find -exec rm`` that selects nothing (so
  deletes everything under its starting points). The git ones are refused when run in the
  workspace, or above it, or somewhere unknown.
* The unrecoverable targets are ``/``; the system directories and anything in them (temporary
  directories excepted); the home directory and its ancestors; ``~/.ssh``, ``~/.gnupg``,
  ``~/.aws``, ``~/.config``, ``~/.kiso``; the workspace root and its ancestors; the workspace's
  ``.git``. A wildcard is refused when its expansion could reach any of those or everything in
  one of them (``rm -rf *`` at the workspace root), and so is a target that starts with a value
  known only when the command runs (``$DIR``, ``$(pwd)``). ``~``, ``$HOME`` and ``${HOME}`` are
  the home directory, ``$TMPDIR`` a temporary directory.
* ``cd`` is followed through the command line: ``cd /tmp/x && rm -rf *`` is allowed, while
  ``cd /tmp/x; rm -rf *`` is not (if the ``cd`` fails, ``rm`` runs where the line started).
* Input the parser cannot fully read is also scanned token by token, conservatively, and no
  input makes :func:`check_command` raise.

What it does not do: the floor reads the command line; it is not a sandbox. It does not look at
the file system (no symlinks, no existence checks), does not know what a script file, a function
or an alias does, does not follow other variables (even ones set earlier on the same line), and
does not read other interpreters (``python -c``, ``perl -e``, ``su -c``). A determined program
can always destroy files; the floor stops the plausible accident.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from itertools import pairwise, product
from pathlib import Path
from typing import Literal

import tree_sitter_bash
from tree_sitter import Language, Node, Parser, Tree

__all__ = ["Refusal", "check_command"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A destructive command the floor will not let run."""

    reason: str
    """One sentence for the model and the human: what was refused and why."""
    command: str
    """The simple command (as text) that was refused."""
    target: str
    """The offending argument as written."""


def check_command(
    command: str, *, workspace: Path, home: Path, cwd: Path | None = None
) -> Refusal | None:
    """Return why ``command`` must not run, or ``None`` if the floor has no objection.

    ``workspace`` and ``home`` should be absolute; ``cwd`` (default: the workspace) is where the
    command starts, and may be relative to the workspace. Pure: nothing is read from the file
    system or the environment. Never raises: should the floor itself fail, it refuses.
    """
    try:
        places = _Places.of(workspace, home)
        start = places.workspace if cwd is None else _join(places.workspace, str(cwd))
        options = command.lower().replace("_", "")
        dots = any(o in options for o in ("dotglob", "globdots", "globignore"))
        return _Checker(places, dots).script(command, frozenset({start}), via=None)
    except Exception:  # the floor must answer; failing closed is the safe answer
        return Refusal(
            reason="the command could not be analysed by the safety floor, so it was refused",
            command=command,
            target="",
        )


# --------------------------------------------------------------------------------------------
# Places: what is unrecoverable

_SYSTEM_ROOTS = (
    *("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root"),
    *("/run", "/sbin", "/srv", "/sys", "/usr", "/var", "/home"),
    *("/Users", "/System", "/Library", "/Applications", "/private"),  # macOS
)
_TEMP_DIRS = ("/tmp", "/var/tmp", "/private/tmp", "/private/var/tmp")
_PROTECTED_IN_HOME = {
    ".ssh": "your SSH keys",
    ".gnupg": "your GnuPG keys",
    ".aws": "your AWS credentials",
    ".config": "your configuration",
    ".kiso": "kiso's own state",
}
_RANK = {
    name: rank
    for rank, name in enumerate([*(r[1:] for r in _SYSTEM_ROOTS), ".git", *_PROTECTED_IN_HOME])
}
"""The order in which a wildcard's matches are reported: the most telling first."""
_ANY_NAME = "\0"
"""A path component standing for "any other name" when a wildcard is followed."""


def _norm(path: str) -> str:
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/") if path.startswith("//") else path


def _join(base: str, path: str) -> str:
    return _norm(posixpath.join(base, path))


def _inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _strictly_inside(path: str, root: str) -> bool:
    return path != root and _inside(path, root)


def _is_temp(path: str) -> bool:
    if any(_inside(path, temp) for temp in _TEMP_DIRS):
        return True
    parts = path.split("/")[1:]
    if parts[:1] == ["private"]:
        parts = parts[1:]
    # macOS per-user temporary directories: /var/folders/xx/yyyy/T
    return len(parts) >= 5 and parts[:2] == ["var", "folders"] and parts[4] == "T"


@dataclass(frozen=True, slots=True)
class _Places:
    workspace: str
    home: str
    sensitive: frozenset[str]
    """Every path a wildcard must not reach, closed under ancestors (so one level suffices)."""

    @classmethod
    def of(cls, workspace: Path, home: Path) -> _Places:
        ws, hm = _join("/", str(workspace)), _join("/", str(home))
        sensitive = {"/", *_SYSTEM_ROOTS, _join(ws, ".git")}
        sensitive.update(_join(hm, name) for name in _PROTECTED_IN_HOME)
        for start in (ws, hm):
            path = start
            while path != "/":
                sensitive.add(path)
                path = posixpath.dirname(path)
        return cls(ws, hm, frozenset(sensitive))

    def classify(self, path: str) -> str | None:
        """Describe ``path`` if deleting it cannot be undone; ``None`` if it can."""
        found = self._classify(path)
        return None if found is None else found.replace(_ANY_NAME, "*")

    def _classify(self, path: str) -> str | None:
        ws, home = self.workspace, self.home
        git = _join(ws, ".git")
        if path == "/":
            return "the whole file system (/)"
        if path == ws:
            return f"the workspace root ({ws})"
        if path == home:
            return f"your home directory ({home})"
        if _inside(path, git):
            return f"the workspace's git history ({path})"
        if _strictly_inside(ws, path):
            return f"{path} (it holds the workspace)"
        if _strictly_inside(home, path):
            return f"{path} (it holds your home directory)"
        for name, label in _PROTECTED_IN_HOME.items():
            if _inside(path, _join(home, name)):
                return f"{label} ({path})"
        if any(_inside(path, place) for place in (ws, home) if place != "/") or _is_temp(path):
            return None
        for root in _SYSTEM_ROOTS:
            if path == root:
                return f"the system directory {root}"
            if _inside(path, root):
                return f"{path} (in the system directory {root})"
        return None


# --------------------------------------------------------------------------------------------
# Words: a shell word as pieces of quoted text, unquoted text and unknown values

_Kind = Literal["lit", "raw", "var"]
"""``lit``: quoted text; ``raw``: unquoted (wildcards and ``~`` active); ``var``: unknown."""
_Piece = tuple[_Kind, str]
_UNKNOWN_REF = "${KISO_FLOOR_UNKNOWN}"
"""How an unknown value is written back when a string is parsed again as a script."""


@dataclass(frozen=True, slots=True)
class _Word:
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

    def plus(self, kind: _Kind, text: str) -> _Word:
        return _Word(self.text, (*self.pieces, (kind, text)))


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


def _token_word(token: str, home: str) -> _Word:
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
    return _Word(token, _merge(pieces))


class _WordReader:
    """Turns tree-sitter word nodes into :class:`_Word`."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.source = b""
        """The script being read: node text is taken from here (see :func:`_parse`)."""

    def text(self, node: Node) -> str:
        return self.source[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def word(self, node: Node) -> _Word:
        return _Word(self.text(node), _merge(self.pieces(node)))

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
class _Location:
    base: str
    """The absolute path up to the first wildcard component."""
    rest: tuple[_Component, ...]
    """The components from the first wildcard on (empty for an exact path)."""


@dataclass(frozen=True, slots=True)
class _Unknown:
    why: str
    """Completes "its target X ...": why the target cannot be known before the command runs."""


_Cwds = frozenset[str] | None
"""The directories a command may run in; ``None`` when they cannot be known."""

_NOT_PLAIN = frozenset({"..", ".git", *_PROTECTED_IN_HOME})
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


def _path_chars(pieces: tuple[_Piece, ...], home: str) -> list[tuple[str, bool]] | _Unknown:
    """The path as characters, each flagged when it is an active wildcard character."""
    kind, text = pieces[0]
    if kind == "var":
        return _Unknown(_RUNTIME_VALUE)
    chars: list[tuple[str, bool]] = []
    if kind == "raw" and text.startswith("~"):
        prefix, slash, tail = text.partition("/")
        if prefix != "~":
            return _Unknown(f"starts with {prefix}, a directory the floor cannot resolve")
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


def _resolve_target(word: _Word, cwds: _Cwds, home: str) -> list[_Location] | _Unknown:
    """Where ``word`` points: one location per brace alternative and possible directory.

    Lexical only: ``~``, ``$HOME`` and ``${HOME}`` become ``home``, ``$TMPDIR`` a temporary
    directory, relative paths are joined to each of ``cwds`` and normalised with
    :func:`posixpath.normpath`. Symlinks are not followed. A word that starts with any other
    expansion is :class:`_Unknown`; an unknown value later in a word acts as a ``*``. When the
    directory is unknown (``cwds`` is ``None``), a relative path is :class:`_Unknown` unless it
    is a plain name (``build/out``: no ``.``, ``..`` or wildcard, no protected name first), which
    is left out: below an unknown directory it reaches nothing the floor protects by name.
    """
    alternatives = _alternatives(word.pieces)
    if alternatives is None:
        return _Unknown("has a brace expansion too large to follow")
    locations: list[_Location] = []
    for pieces in alternatives:
        if not pieces:
            continue  # an empty argument names nothing
        chars = _path_chars(pieces, home)
        if isinstance(chars, _Unknown):
            return chars
        components = _components(chars)
        if sum(c.pattern is not None for c in components) > _MAX_WILDCARDS:
            return _Unknown("has too many wildcards to follow")
        absolute = chars[0][0] == "/"
        if not absolute and cwds is None:
            plain = bool(components) and components[0].name not in _NOT_PLAIN
            if not plain or any(c.pattern is not None or c.name == ".." for c in components):
                return _Unknown("is relative to a directory only known when the command runs")
            continue
        wild = next((i for i, c in enumerate(components) if c.pattern is not None), None)
        head = "/".join(c.name for c in components[:wild])
        rest = () if wild is None else tuple(components[wild:])
        for start in ["/"] if absolute else sorted(cwds or ()):
            locations.append(_Location(_join(start, head), rest))
    return locations


_ANY_NAMES = ("a", "src", "Makefile", "README.md", "x_y-z.1")
"""Names a wildcard must match all of to count as matching anything (``*``, ``?*``)."""


def _wildcard_matches(name: str, pattern: str, dots: bool) -> bool:
    """Bash's default: a leading dot is only matched explicitly (or with ``dotglob``)."""
    hidden = name.startswith(".") and not dots and not pattern.startswith((".", "["))
    return not hidden and fnmatchcase(name, pattern)


def _judge(places: _Places, location: _Location, dots: bool) -> str | None:
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
            path, i = _join(path, "/".join(c.name for c in rest[i:literal])), literal
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
        below = [s[len(path) :].lstrip("/") for s in places.sensitive if _strictly_inside(s, path)]
        if pattern == "**":
            visible = (r for r in below if dots or not any(p.startswith(".") for p in r.split("/")))
            following = [path, *(_join(path, r) for r in sorted(visible))]
        else:
            names = sorted({r.split("/")[0] for r in below}, key=lambda n: (_RANK.get(n, 99), n))
            following = [_join(path, n) for n in names if _wildcard_matches(n, pattern, dots)]
        following.append(_join(path, _ANY_NAME))
        stack.extend((p, i + 1) for p in reversed(following))
    return None


# --------------------------------------------------------------------------------------------
# Commands: one simple command, after its wrappers


@dataclass(frozen=True, slots=True)
class _Call:
    words: tuple[_Word, ...]
    """The command name first, then its arguments."""
    cwds: _Cwds
    text: str
    """The simple command as written."""
    stdin: tuple[str, ...] = ()
    """Here-documents and here-strings given to it: the script, should it be a shell."""

    @property
    def display(self) -> str:
        text = " ".join(self.text.split())
        return text if len(text) <= 100 else text[:97] + "..."


@dataclass(frozen=True, slots=True)
class _Outcome:
    """The directories the shell may be in after a command succeeded, and after it failed."""

    ok: _Cwds
    fail: _Cwds

    @property
    def after(self) -> _Cwds:
        return _union(self.ok, self.fail)

    @staticmethod
    def same(cwds: _Cwds) -> _Outcome:
        return _Outcome(cwds, cwds)


def _union(a: _Cwds, b: _Cwds) -> _Cwds:
    if a is None or b is None:
        return None
    both = a | b
    return both if len(both) <= 16 else None


def _command_name(word: _Word) -> str | None:
    value = word.value
    return None if value is None else value.rsplit("/", 1)[-1]


def _options(
    words: Sequence[_Word], start: int, with_arg: str = "", long_with_arg: Iterable[str] = ()
) -> tuple[list[tuple[str, _Word | None]], int]:
    """Parse leading options: ``(flag, value)`` pairs and the index of the first operand.

    Short flags are split (``-iu root`` gives ``-i`` and ``-u root``); ``with_arg`` lists the
    short flags, ``long_with_arg`` the long ones, that take a value.
    """
    found: list[tuple[str, _Word | None]] = []
    i = start
    while i < len(words):
        text = words[i].value
        if text is None or text == "-" or not text.startswith("-"):
            break
        i += 1
        if text == "--":
            break
        if text.startswith("--"):
            name, eq, value = text.partition("=")
            if eq:
                found.append((name, _Word(value, (("raw", value),))))
            elif name in long_with_arg:
                found.append((name, words[i] if i < len(words) else None))
                i += 1
            else:
                found.append((name, None))
            continue
        for k, char in enumerate(text[1:], start=2):
            if char not in with_arg:
                found.append(("-" + char, None))
                continue
            attached = text[k:]
            if attached:
                found.append(("-" + char, _Word(attached, (("raw", attached),))))
            else:
                found.append(("-" + char, words[i] if i < len(words) else None))
                i += 1
            break
    return found, i


_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")


def _skip_assignments(words: Sequence[_Word], i: int) -> int:
    while i < len(words) and _ASSIGNMENT.match(words[i].text):
        i += 1
    return i


_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh"})
_DIRECTORY_COMMANDS = frozenset({"cd", "pushd", "popd"})
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_FIND_SELECTORS = frozenset(
    {
        *("-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex"),
        *("-type", "-xtype", "-lname", "-ilname", "-newer", "-anewer", "-cnewer", "-used"),
        *("-mtime", "-mmin", "-atime", "-amin", "-ctime", "-cmin", "-size", "-empty", "-user"),
        *("-group", "-uid", "-gid", "-nouser", "-nogroup", "-perm", "-links", "-inum"),
        *("-samefile", "-fstype", "-readable", "-writable", "-executable", "-context"),
    }
)
_XARGS_INPUT = _Word("<xargs input>", (("raw", "*"),))
"""What xargs adds to its command: names read from its input, taken as anything in cwd."""

_MAX_NESTING = 8
_SCAN_BUDGET = 100_000
"""How many words the fallback scan may hand to checks before it gives up (and refuses)."""
_MAX_TREE_DEPTH = 120


class _Found(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.reason)
        self.refusal = refusal


class _TooDeep(Exception):
    pass


_Unwrap = Callable[["_Checker", _Call], "_Call | None"]


class _Checker:
    """Walks one command line (and the scripts inside it) looking for a refusal."""

    def __init__(self, places: _Places, dots: bool) -> None:
        self.places = places
        self.dots = dots
        """Wildcards may match a leading dot: the line turns on ``dotglob`` or the like."""
        self.reader = _WordReader(places.home)
        self.nesting = 0
        self.depth = 0

    # -- scripts -----------------------------------------------------------------------------

    def script(self, source: str, cwds: _Cwds, via: _Call | None) -> Refusal | None:
        """Check a whole script; ``via`` is the command that runs it, if any."""
        if self.nesting >= _MAX_NESTING and via is not None:
            return Refusal(
                f"{via.display} nests shells too deeply for the floor to read, so it was refused",
                via.text,
                via.words[0].text,
            )
        self.nesting += 1
        outer, self.reader.source = self.reader.source, source.encode("utf-8", "surrogatepass")
        try:
            tree = _parse(self.reader.source)
            root = tree.root_node
            try:
                self._sequence(root.children, cwds)
                readable = not root.has_error
            except _TooDeep:
                readable = False
            except _Found as found:
                return found.refusal
            return None if readable else self._scan_tokens(source, cwds)
        finally:
            self.nesting -= 1
            self.reader.source = outer

    def _scan_tokens(self, source: str, cwds: _Cwds) -> Refusal | None:
        """The conservative fallback for what the parser could not read.

        Every token that names a command we check starts one, up to the next operator; ``cd``
        only ever adds a possible directory. A dangling quote may hide a command, so the text is
        scanned once more with its quotes taken out.
        """
        refusal = self._scan(source, cwds)
        unquoted = source.replace('"', "").replace("'", "")
        if refusal is None and unquoted != source:
            refusal = self._scan(unquoted, cwds)
        return refusal

    def _scan(self, source: str, cwds: _Cwds) -> Refusal | None:
        segments: list[list[str]] = [[]]
        for token in _tolerant_tokens(source):
            if token and all(c in _SEPARATORS for c in token):
                segments.append([])
            else:
                segments[-1].append(token)
        budget = _SCAN_BUDGET
        for segment in segments:
            words = tuple(_token_word(token, self.places.home) for token in segment)
            for i, word in enumerate(words):
                name = _command_name(word)
                if name in _DIRECTORY_COMMANDS:
                    cwds = _union(cwds, self._cd(words[i:], cwds).ok)
                elif name in _CHECKED:
                    budget -= len(words) - i
                    if budget < 0:
                        return Refusal(
                            "the command is too long and garbled for the floor to read, so it"
                            " was refused",
                            " ".join(segment[i:]),
                            segment[i],
                        )
                    refusal = self.check(_Call(words[i:], cwds, " ".join(segment[i:])))
                    if refusal is not None:
                        return refusal
        return None

    # -- the tree ----------------------------------------------------------------------------

    def _sequence(self, nodes: Iterable[Node], cwds: _Cwds) -> _Outcome:
        outcome = _Outcome.same(cwds)
        for node in nodes:
            if node.is_named and node.type != "comment":
                outcome = self._walk(node, outcome.after)
        return outcome

    def _walk(self, node: Node, cwds: _Cwds) -> _Outcome:
        if self.depth >= _MAX_TREE_DEPTH:
            raise _TooDeep
        self.depth += 1
        try:
            return self._walk_node(node, cwds)
        finally:
            self.depth -= 1

    def _walk_node(self, node: Node, cwds: _Cwds) -> _Outcome:
        kind = node.type
        if kind == "command":
            return self._command(node, cwds, (), (), self.reader.text(node))
        if kind == "redirected_statement":
            return self._redirected(node, cwds)
        if kind == "list":
            return self._list(node, cwds)
        if kind == "negated_command":
            inner = self._sequence(node.children, cwds)
            return _Outcome(inner.fail, inner.ok)
        if kind in ("program", "compound_statement", "do_group", "ERROR"):
            return _Outcome.same(self._sequence(node.children, cwds).after)
        if kind == "if_statement":
            return self._if(node, cwds)
        if kind in ("while_statement", "for_statement", "c_style_for_statement"):
            once = self._sequence(node.children, cwds).after
            twice = self._sequence(node.children, _union(cwds, once)).after
            return _Outcome.same(_union(cwds, twice))
        if kind == "case_statement":
            after = cwds
            for child in node.named_children:
                if child.type == "case_item":
                    after = _union(after, self._sequence(child.children, cwds).after)
                else:
                    self._walk(child, cwds)
            return _Outcome.same(after)
        if kind in ("subshell", "command_substitution", "process_substitution"):
            self._sequence(node.children, cwds)  # a child shell: its cd stays inside
            return _Outcome.same(cwds)
        # pipelines, function definitions, words, tests, redirects: whatever runs in them runs
        # in a child shell, or later, or does not move this one
        for child in node.named_children:
            self._walk(child, cwds)
        return _Outcome.same(cwds)

    def _list(self, node: Node, cwds: _Cwds) -> _Outcome:
        outcome: _Outcome | None = None
        operator = ";"
        for child in node.children:
            if not child.is_named:
                operator = child.type
            elif child.type == "comment":
                continue
            elif outcome is None:
                outcome = self._walk(child, cwds)
            elif operator == "&&":
                then = self._walk(child, outcome.ok)
                outcome = _Outcome(then.ok, _union(outcome.fail, then.fail))
            elif operator == "||":
                then = self._walk(child, outcome.fail)
                outcome = _Outcome(_union(outcome.ok, then.ok), then.fail)
            else:
                outcome = self._walk(child, outcome.after)
        return outcome or _Outcome.same(cwds)

    def _if(self, node: Node, cwds: _Cwds) -> _Outcome:
        conditions: list[Node] = []
        bodies: list[Node] = []
        clauses: list[Node] = []
        for i, child in enumerate(node.children):
            if node.field_name_for_child(i) == "condition":
                conditions.append(child)
            elif child.type in ("elif_clause", "else_clause"):
                clauses.append(child)
            else:
                bodies.append(child)
        tested = self._sequence(conditions, cwds)
        after = _union(self._sequence(bodies, tested.ok).after, tested.fail)
        for clause in clauses:
            after = _union(after, self._sequence(clause.children, tested.after).after)
        return _Outcome.same(after)

    def _redirected(self, node: Node, cwds: _Cwds) -> _Outcome:
        body = node.child_by_field_name("body")
        extra: list[_Word] = []
        stdin: list[str] = []
        for redirect in node.children_by_field_name("redirect"):
            self._walk(redirect, cwds)
            if redirect.type == "file_redirect":
                # `rm x 2>/dev/null y`: the parser hangs `y` on the redirect; it is an argument
                extra.extend(
                    map(self.reader.word, redirect.children_by_field_name("destination")[1:])
                )
            elif redirect.type == "heredoc_redirect":
                stdin.extend(
                    self.reader.text(c) for c in redirect.children if c.type == "heredoc_body"
                )
            elif redirect.type == "herestring_redirect":
                stdin.extend(self.reader.word(c).script for c in redirect.named_children)
        if body is None:
            return _Outcome.same(cwds)
        if body.type == "command":
            return self._command(body, cwds, tuple(extra), tuple(stdin), self.reader.text(node))
        return self._walk(body, cwds)

    def _command(
        self,
        node: Node,
        cwds: _Cwds,
        extra: tuple[_Word, ...],
        stdin: tuple[str, ...],
        text: str,
    ) -> _Outcome:
        for child in node.named_children:  # substitutions in the words run first
            self._walk(child, cwds)
        name = node.child_by_field_name("name")
        if name is None:
            return _Outcome.same(cwds)
        words = (
            self.reader.word(name),
            *map(self.reader.word, node.children_by_field_name("argument")),
            *extra,
        )
        for redirect in node.children_by_field_name("redirect"):
            if redirect.type == "herestring_redirect":
                stdin += tuple(self.reader.word(c).script for c in redirect.named_children)
        if (
            len(words) > 1
            and _command_name(words[0]) in ("builtin", "command")
            and _command_name(words[1]) in _DIRECTORY_COMMANDS
        ):
            words = words[1:]
        if _command_name(words[0]) in _DIRECTORY_COMMANDS:
            return self._cd(words, cwds)
        refusal = self.check(_Call(words, cwds, text, stdin))
        if refusal is not None:
            raise _Found(refusal)
        return _Outcome.same(cwds)

    # -- directories -------------------------------------------------------------------------

    def directory(self, word: _Word | None, cwds: _Cwds) -> _Cwds:
        """The directory ``word`` names, relative to ``cwds``; ``None`` if unknown."""
        if word is None:
            return None
        found = _resolve_target(word, cwds, self.places.home)
        if isinstance(found, _Unknown) or not found or any(loc.rest for loc in found):
            return None
        return frozenset(loc.base for loc in found)

    def _cd(self, words: Sequence[_Word], cwds: _Cwds) -> _Outcome:
        """``cd``/``pushd``/``popd``: where the shell is if it succeeds, and if it fails."""
        name = _command_name(words[0])
        _, i = _options(words, 1)
        operand = words[i] if i < len(words) else None
        if name == "popd" or (operand is None and name == "pushd"):
            return _Outcome(None, cwds)
        if operand is None:
            return _Outcome(frozenset({self.places.home}), cwds)
        if operand.value is not None and operand.value[:1] in ("-", "+"):
            return _Outcome(None, cwds)  # cd -, pushd +1: the directory stack
        return _Outcome(self.directory(operand, cwds), cwds)

    # -- one simple command ------------------------------------------------------------------

    def check(self, call: _Call) -> Refusal | None:
        """The refusal for one simple command, seen through its wrappers, or ``None``."""
        through_xargs = False
        for _ in range(32):
            if not call.words:
                return None
            name = _command_name(call.words[0])
            unwrap = _WRAPPERS.get(name or "")
            if unwrap is None:
                break
            inner = unwrap(self, call)
            if inner is None:
                return None
            through_xargs = through_xargs or name == "xargs"
            call = inner
        if not call.words:
            return None
        if through_xargs:
            call = replace(call, words=(*call.words, _XARGS_INPUT))
        name = _command_name(call.words[0])
        if name == "rm":
            return self._rm(call)
        if name == "git":
            return self._git(call)
        if name == "find":
            return self._find(call)
        if name in _SHELLS:
            return self._shell(call)
        if name == "eval":
            return self.script(" ".join(w.script for w in call.words[1:]), call.cwds, call)
        return None

    def _target(self, call: _Call, word: _Word) -> Refusal | None:
        """Refuse deleting ``word`` if it may name something unrecoverable."""
        found = _resolve_target(word, call.cwds, self.places.home)
        if isinstance(found, _Unknown):
            return Refusal(
                f"{call.display} was refused: its target {word.text} {found.why}, so it could"
                " name something that cannot be recovered",
                call.text,
                word.text,
            )
        for location in found:
            what = _judge(self.places, location, self.dots)
            if what is not None:
                modal = "could" if location.rest else "would"
                return Refusal(
                    f"{call.display} {modal} delete {what}, which cannot be recovered",
                    call.text,
                    word.text,
                )
        return None

    # -- rm ----------------------------------------------------------------------------------

    def _rm(self, call: _Call) -> Refusal | None:
        """``rm``, recursive or not: each operand is a target (GNU rm takes options anywhere)."""
        words = call.words
        end = next((i for i, w in enumerate(words) if w.value == "--"), len(words))
        operands = [
            w
            for w in words[1:end]
            if w.value is None or w.value == "-" or not w.value.startswith("-")
        ]
        for word in (*operands, *words[end + 1 :]):
            refusal = self._target(call, word)
            if refusal is not None:
                return refusal
        return None

    # -- git ---------------------------------------------------------------------------------

    def _git(self, call: _Call) -> Refusal | None:
        """Commands that discard work git cannot give back, run in or above the workspace."""
        words, cwds, i = call.words, call.cwds, 1
        while i < len(words):
            value = words[i].value
            if value is None or not value.startswith("-"):
                break
            following = words[i + 1] if i + 1 < len(words) else None
            if value in ("-C", "--work-tree"):
                cwds, i = self.directory(following, cwds), i + 2
            elif value.startswith("--work-tree="):
                path = value.partition("=")[2]
                cwds, i = self.directory(_Word(path, (("raw", path),)), cwds), i + 1
            elif value in ("-c", "--git-dir", "--namespace", "--super-prefix", "--config-env"):
                i += 2
            else:
                i += 1
        if i >= len(words):
            return None
        offence = _git_offence(words[i], words[i + 1 :])
        if offence is None:
            return None
        target, what = offence
        where = self._repository_at_risk(cwds)
        if where is None:
            return None
        return Refusal(
            f"{call.display} would discard {what} in {where}, which git cannot recover",
            call.text,
            target,
        )

    def _repository_at_risk(self, cwds: _Cwds) -> str | None:
        workspace = self.places.workspace
        if cwds is None:
            return "a directory only known when the command runs, which may be the workspace"
        for cwd in sorted(cwds):
            if _inside(cwd, workspace):
                return f"the workspace ({workspace})"
            if _inside(workspace, cwd):
                return f"the repository at {cwd} (it may hold the workspace)"
        return None

    # -- find --------------------------------------------------------------------------------

    def _find(self, call: _Call) -> Refusal | None:
        """``find -delete``/``-exec``: refused when nothing selects, so all would go."""
        words = call.words
        i = 1
        while i < len(words) and _is_find_option(words[i].value or ""):
            i += 2 if words[i].value == "-D" else 1
        starts: list[_Word] = []
        while i < len(words):
            value = words[i].value
            if value is not None and value[:1] in ("-", "(", "!", ")", ","):
                break
            starts.append(words[i])
            i += 1
        starts = starts or [_Word(".", (("raw", "."),))]
        selective, deletes = False, False
        commands: list[Sequence[_Word]] = []
        while i < len(words):
            value = words[i].value or ""
            i += 1
            if value in _FIND_EXEC:
                end = next((j for j in range(i, len(words)) if words[j].value in (";", "+")), None)
                commands.append(words[i:end])
                i = len(words) if end is None else end + 1
            elif value == "-delete":
                deletes = True
            elif value in _FIND_SELECTORS or value.startswith("-newer"):
                selective = True
        for command in commands:
            # `{}` is a file find selected: harmless when something selects, else anything
            rest = tuple(w for w in command if "{}" not in w.text)
            refusal = self.check(replace(call, words=rest))
            if refusal is not None:
                return refusal
            if selective:
                continue
            for start in starts:
                everything = (start, start.plus("raw", "/*"))
                each = tuple(a for w in command for a in (everything if "{}" in w.text else (w,)))
                refusal = self.check(replace(call, words=each))
                if refusal is not None:
                    return refusal
        if deletes and not selective:
            for start in starts:
                for target in (start, start.plus("raw", "/*")):
                    refusal = self._target(call, target)
                    if refusal is not None:
                        return refusal
        return None

    # -- shells ------------------------------------------------------------------------------

    def _shell(self, call: _Call) -> Refusal | None:
        """``sh -c SCRIPT`` (and here-documents fed to a shell): the script is checked too."""
        words, i, has_c = call.words, 1, False
        while i < len(words):
            value = words[i].value
            if value is None or value[:1] not in ("-", "+") or value in ("-", "+"):
                break
            i += 1
            if value == "--":
                break
            if value.startswith("--"):
                i += value in ("--rcfile", "--init-file")
                continue
            for char in value[1:]:
                has_c = has_c or char == "c"
                i += char in "oO"
        if has_c:
            return self.script(words[i].script, call.cwds, call) if i < len(words) else None
        if i < len(words):
            return None  # a script file: the floor does not read files
        for source in call.stdin:
            refusal = self.script(source, call.cwds, call)
            if refusal is not None:
                return refusal
        return None


def _is_find_option(value: str) -> bool:
    return value in ("-H", "-L", "-P", "-D") or value.startswith("-O")


def _git_offence(sub: _Word, args: Sequence[_Word]) -> tuple[str, str] | None:
    """The offending argument and what is lost, if this git subcommand discards work."""
    name = sub.value
    dashdash = next((i for i, w in enumerate(args) if w.value == "--"), len(args))
    options = [w for w in args[:dashdash] if (w.value or "").startswith("-")]

    def short_flag(flag: str, stops: str) -> _Word | None:
        for word in options:
            value = word.value or ""
            if value.startswith("--"):
                continue
            for char in value[1:]:
                if char == flag:
                    return word
                if char in stops:
                    break
        return None

    def long_flag(*flags: str) -> _Word | None:
        return next((w for w in options if w.value in flags), None)

    if name == "clean":
        force = long_flag("--force") or short_flag("f", "e")
        dry = long_flag("--dry-run") or short_flag("n", "e")
        return (force.text, "untracked files") if force and not dry else None
    if name == "reset":
        hard = long_flag("--hard")
        return (hard.text, "uncommitted changes") if hard else None
    if name == "restore":
        return (sub.text, "uncommitted changes")
    if name == "switch":
        force = long_flag("--force", "--discard-changes") or short_flag("f", "cC")
        return (force.text, "uncommitted changes") if force else None
    if name != "checkout":
        return None
    force = long_flag("--force", "--ours", "--theirs") or short_flag("f", "bB")
    if force is None:
        force = next((w for w in options if (w.value or "").startswith("--pathspec-from")), None)
    if force is not None:
        return (force.text, "uncommitted changes")
    if dashdash + 1 < len(args):
        return (args[dashdash].text, "uncommitted changes to those paths")
    creating = long_flag("--orphan") or short_flag("b", "") or short_flag("B", "")
    operands = [w for w in args[:dashdash] if not (w.value or "x").startswith("-")]
    for k, word in enumerate(operands):
        value = word.value or ""
        pathlike = (
            value in (".", "..")
            or value.startswith(("./", "../", ":"))
            or any(c in value for c in "*?[")
        )
        if pathlike or (k >= 1 and creating is None):
            return (word.text, "uncommitted changes to those paths")
    return None


# --------------------------------------------------------------------------------------------
# Wrappers: commands that run another command


def _unwrap_sudo(checker: _Checker, call: _Call) -> _Call | None:
    options, i = _options(
        call.words,
        1,
        "CDgpRrtTUu",
        {"--chdir", "--chroot", "--close-from", "--command-timeout", "--group", "--host"}
        | {"--other-user", "--prompt", "--role", "--type", "--user"},
    )
    cwds = call.cwds
    for flag, value in options:
        if flag in ("-i", "--login"):
            cwds = None  # a login shell starts in the target user's home
        elif flag in ("-D", "--chdir"):
            cwds = checker.directory(value, cwds)
    return replace(call, words=call.words[_skip_assignments(call.words, i) :], cwds=cwds)


def _unwrap_env(checker: _Checker, call: _Call) -> _Call | None:
    options, i = _options(call.words, 1, "uCSP", ("--unset", "--chdir", "--split-string"))
    cwds = call.cwds
    split: tuple[_Word, ...] = ()
    for flag, value in options:
        if flag in ("-C", "--chdir"):
            cwds = checker.directory(value, cwds)
        elif flag in ("-S", "--split-string") and value is not None:
            home = checker.places.home
            split = tuple(_token_word(t, home) for t in _tolerant_tokens(value.script))
    words = split + call.words[_skip_assignments(call.words, i) :]
    return replace(call, words=words, cwds=cwds)


def _simple_wrapper(
    with_arg: str = "", long_with_arg: Iterable[str] = (), skip: int = 0
) -> _Unwrap:
    def unwrap(checker: _Checker, call: _Call) -> _Call | None:
        _, i = _options(call.words, 1, with_arg, long_with_arg)
        return replace(call, words=call.words[i + skip :])

    return unwrap


def _unwrap_command(checker: _Checker, call: _Call) -> _Call | None:
    options, i = _options(call.words, 1)
    if any(flag in ("-v", "-V") for flag, _ in options):
        return None  # only describes the command
    return replace(call, words=call.words[i:])


_WRAPPERS: dict[str, _Unwrap] = {
    "sudo": _unwrap_sudo,
    "doas": _simple_wrapper("Cu"),
    "env": _unwrap_env,
    "nice": _simple_wrapper("n", ("--adjustment",)),
    "nohup": _simple_wrapper(),
    "time": _simple_wrapper("fo", ("--format", "--output")),
    "timeout": _simple_wrapper("ks", ("--kill-after", "--signal"), skip=1),
    "command": _unwrap_command,
    "builtin": _simple_wrapper(),
    "exec": _simple_wrapper("a"),
    "busybox": _simple_wrapper(),
    "xargs": _simple_wrapper(
        "adEILnPsJRS",
        {"--arg-file", "--delimiter", "--max-args", "--max-chars", "--max-procs"}
        | {"--process-slot-var"},
    ),
}
_CHECKED = frozenset({*_WRAPPERS, *_SHELLS, "rm", "git", "find", "eval"})


# --------------------------------------------------------------------------------------------
# The fallback tokenizer

_SEPARATORS = "();<>|&`\n"


def _tolerant_tokens(source: str) -> list[str]:
    """Split into words and operator characters as the shell would, never failing.

    Quotes and backslashes are honoured; a quote left open runs to the end. Each character of
    :data:`_SEPARATORS` outside quotes is a token of its own.
    """
    tokens: list[str] = []
    word: list[str] = []
    quote = ""
    quoted = False  # the word so far had quotes, so is a word even when empty
    i = 0
    while i < len(source):
        char = source[i]
        following = source[i + 1] if i + 1 < len(source) else ""
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"' and following and following in '"\\$`':
                word.append(following)
                i += 1
            else:
                word.append(char)
        elif char == "\\":
            if following != "\n":
                word.append(following)
            i += 1
        elif char in "'\"":
            quote, quoted = char, True
        elif char in " \t\r" or char in _SEPARATORS:
            if word or quoted:
                tokens.append("".join(word))
            word, quoted = [], False
            if char in _SEPARATORS:
                tokens.append(char)
        else:
            word.append(char)
        i += 1
    if word or quoted:
        tokens.append("".join(word))
    return tokens


_LANGUAGE = Language(tree_sitter_bash.language())


def _parse(source: bytes) -> Tree:
    """Parse with tree-sitter-bash, every non-ASCII byte read as ``x``.

    tree-sitter-bash 0.25 can crash the process on ``{`` followed by a 4-byte UTF-8 character
    (tree-sitter/tree-sitter-bash#337). Bash gives no non-ASCII character a meaning of its own,
    so reading each such byte as a letter keeps the parse, and the byte offsets, the same; the
    text of every node is then taken from the real source.
    """
    ascii_only = source.translate(_ASCII_ONLY)
    return Parser(_LANGUAGE).parse(ascii_only)


_ASCII_ONLY = bytes(range(128)) + b"x" * 128
