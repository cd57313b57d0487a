"""The walk over a command line: every simple command in it, and where the shell is when it runs.

``cd`` is followed through lists, conditions and loops; child shells keep their ``cd`` inside.
What the parser cannot read is scanned again token by token.

The same walk answers two questions. By default it stops at the first :class:`Refusal`; made with
``collect=True`` it goes through the whole line and records every destructive command in it,
whatever its target (:attr:`Checker.found`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tree_sitter import Node

from kiso.runtime.floor.commands import CHECKED, Call, check_call, command_name, leading_options
from kiso.runtime.floor.destruction import Destruction
from kiso.runtime.floor.parse import SEPARATORS, parse, tolerant_tokens
from kiso.runtime.floor.places import Places
from kiso.runtime.floor.refusal import Refusal
from kiso.runtime.floor.words import Cwds, Unknown, Word, WordReader, resolve_target, token_word

__all__ = ["Checker"]


@dataclass(frozen=True, slots=True)
class _Outcome:
    """The directories the shell may be in after a command succeeded, and after it failed."""

    ok: Cwds
    fail: Cwds

    @property
    def after(self) -> Cwds:
        return _union(self.ok, self.fail)

    @staticmethod
    def same(cwds: Cwds) -> _Outcome:
        return _Outcome(cwds, cwds)


def _union(a: Cwds, b: Cwds) -> Cwds:
    if a is None or b is None:
        return None
    both = a | b
    return both if len(both) <= 16 else None


_DIRECTORY_COMMANDS = frozenset({"cd", "pushd", "popd"})

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


class Checker:
    """Walks one command line (and the scripts inside it) looking for a refusal.

    With ``collect``, it looks for every destructive command instead: nothing stops the walk,
    and each one found is in :attr:`found`.
    """

    def __init__(self, places: Places, dots: bool, *, collect: bool = False) -> None:
        self.places = places
        self.dots = dots
        """Wildcards may match a leading dot: the line turns on ``dotglob`` or the like."""
        self.reader = WordReader(places.home)
        self.nesting = 0
        self.depth = 0
        self.collecting = collect
        self.found: list[Destruction] = []
        """The destructive commands recorded so far, in the order they were met (collecting)."""
        self._seen: set[tuple[str, tuple[str, ...]]] = set()

    def record(self, destruction: Destruction) -> None:
        """Note a destructive command (collecting only); the same kind on the same targets once.

        The targets are compared without their quotes, so the walk and the fallback scan, which
        reads quotes away, do not report one command twice.
        """
        if not self.collecting:
            return
        key = (destruction.kind, tuple(_bare(t) for t in destruction.targets))
        if key not in self._seen:
            self._seen.add(key)
            self.found.append(destruction)

    @contextmanager
    def aside(self) -> Iterator[list[Destruction]]:
        """Record into a list of its own while the block runs, not into :attr:`found`."""
        outer = self.found, self._seen
        self.found, self._seen = [], set()
        try:
            yield self.found
        finally:
            self.found, self._seen = outer

    def unreadable(self, command: str, why: str) -> None:
        """What the floor cannot read may delete anything: say so, conservatively."""
        self.record(Destruction("unreadable", command, (), True, f"{why}: it may delete anything"))

    # -- scripts -----------------------------------------------------------------------------

    def script(self, source: str, cwds: Cwds, via: Call | None) -> Refusal | None:
        """Check a whole script; ``via`` is the command that runs it, if any."""
        if self.nesting >= _MAX_NESTING and via is not None:
            self.unreadable(via.text, "shells nested too deeply for the floor to read")
            return Refusal(
                f"{via.display} nests shells too deeply for the floor to read, so it was refused",
                via.text,
                via.words[0].text,
            )
        self.nesting += 1
        outer, self.reader.source = self.reader.source, source.encode("utf-8", "surrogatepass")
        try:
            tree = parse(self.reader.source)
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

    def _scan_tokens(self, source: str, cwds: Cwds) -> Refusal | None:
        """The conservative fallback for what the parser could not read.

        Every token that names a command we check starts one, up to the next operator; ``cd``
        only ever adds a possible directory. A dangling quote may hide a command, so the text is
        scanned once more with its quotes taken out.
        """
        refusal = self._scan(source, cwds)
        unquoted = source.replace('"', "").replace("'", "")
        if (refusal is None or self.collecting) and unquoted != source:
            refusal = refusal or self._scan(unquoted, cwds)
        return refusal

    def _scan(self, source: str, cwds: Cwds) -> Refusal | None:
        segments: list[list[str]] = [[]]
        for token in tolerant_tokens(source):
            if token and all(c in SEPARATORS for c in token):
                segments.append([])
            else:
                segments[-1].append(token)
        budget = _SCAN_BUDGET
        for segment in segments:
            words = tuple(token_word(token, self.places.home) for token in segment)
            for i, word in enumerate(words):
                name = command_name(word)
                if name in _DIRECTORY_COMMANDS:
                    cwds = _union(cwds, self._cd(words[i:], cwds).ok)
                elif name in CHECKED:
                    budget -= len(words) - i
                    if budget < 0:
                        self.unreadable(
                            source, "the command is too long and garbled for the floor to read"
                        )
                        return Refusal(
                            "the command is too long and garbled for the floor to read, so it"
                            " was refused",
                            " ".join(segment[i:]),
                            segment[i],
                        )
                    refusal = check_call(self, Call(words[i:], cwds, " ".join(segment[i:])))
                    if refusal is not None and not self.collecting:
                        return refusal
        return None

    # -- the tree ----------------------------------------------------------------------------

    def _sequence(self, nodes: Iterable[Node], cwds: Cwds) -> _Outcome:
        outcome = _Outcome.same(cwds)
        for node in nodes:
            if node.is_named and node.type != "comment":
                outcome = self._walk(node, outcome.after)
        return outcome

    def _walk(self, node: Node, cwds: Cwds) -> _Outcome:
        if self.depth >= _MAX_TREE_DEPTH:
            raise _TooDeep
        self.depth += 1
        try:
            return self._walk_node(node, cwds)
        finally:
            self.depth -= 1

    def _walk_node(self, node: Node, cwds: Cwds) -> _Outcome:
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

    def _list(self, node: Node, cwds: Cwds) -> _Outcome:
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

    def _if(self, node: Node, cwds: Cwds) -> _Outcome:
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

    def _redirected(self, node: Node, cwds: Cwds) -> _Outcome:
        body = node.child_by_field_name("body")
        extra: list[Word] = []
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
        cwds: Cwds,
        extra: tuple[Word, ...],
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
            and command_name(words[0]) in ("builtin", "command")
            and command_name(words[1]) in _DIRECTORY_COMMANDS
        ):
            words = words[1:]
        if command_name(words[0]) in _DIRECTORY_COMMANDS:
            return self._cd(words, cwds)
        refusal = check_call(self, Call(words, cwds, text, stdin))
        if refusal is not None and not self.collecting:
            raise _Found(refusal)
        return _Outcome.same(cwds)

    # -- directories -------------------------------------------------------------------------

    def directory(self, word: Word | None, cwds: Cwds) -> Cwds:
        """The directory ``word`` names, relative to ``cwds``; ``None`` if unknown."""
        if word is None:
            return None
        found = resolve_target(word, cwds, self.places.home)
        if isinstance(found, Unknown) or not found or any(loc.rest for loc in found):
            return None
        return frozenset(loc.base for loc in found)

    def _cd(self, words: Sequence[Word], cwds: Cwds) -> _Outcome:
        """``cd``/``pushd``/``popd``: where the shell is if it succeeds, and if it fails."""
        name = command_name(words[0])
        _, i = leading_options(words, 1)
        operand = words[i] if i < len(words) else None
        if name == "popd" or (operand is None and name == "pushd"):
            return _Outcome(None, cwds)
        if operand is None:
            return _Outcome(frozenset({self.places.home}), cwds)
        if operand.value is not None and operand.value[:1] in ("-", "+"):
            return _Outcome(None, cwds)  # cd -, pushd +1: the directory stack
        return _Outcome(self.directory(operand, cwds), cwds)


def _bare(text: str) -> str:
    return text.replace('"', "").replace("'", "").replace("\\", "")
