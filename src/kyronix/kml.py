"""KML, version 1: the Kyronix markup a model writes to call tools.

A small stdlib scanner over known tag names, not an XML parser: models write unescaped ``<`` and
``&`` in file contents, put prose and markdown fences around the envelope, and sometimes stop
mid-plan. There is no DTD and no entity expansion, so entity bombs and XXE stay literal text.

Grammar (see the design note, "KML, version 1"):

- The first ``<kyronix>`` ... ``</kyronix>`` envelope is parsed; text around it is ignored.
  Without an envelope, top-level ``<tool>`` elements are accepted (text between them ignored);
  a text with neither is an error.
- Envelope children: ``<plan>``, ``<summary>``, ``<status>`` at most once each (a section ends at
  its first closing tag outside CDATA), ``<tool>`` any number of times, only whitespace between.
- ``<tool name="..." executionId="...">``: ``name`` required and non-empty, either quote style,
  entities in attribute values decoded with :func:`html.unescape`. A missing or empty
  ``executionId`` is assigned (``exec_`` + 32 random hex digits, ``assigned=True``); a
  duplicate id is an error.
- Each child element of a tool is one string argument; its text is raw (no entity decoding).
  It ends at the first ``</name>`` that is followed, after optional whitespace and comments, by
  another argument's opening tag (``<x>`` or ``<x/>``) or by ``</tool>``. A ``<![CDATA[...]]>``
  section is opaque to that search (a ``</name>`` inside it ends nothing). A value made only of
  CDATA sections (and whitespace between them) is exactly their concatenation, so
  ``]]]]><![CDATA[>`` splits rejoin; a CDATA section inside raw text is part of that text and
  is kept verbatim, markers included (an SVG's ``<script><![CDATA[...]]></script>``).
- XML comments (``<!-- ... -->``) between the envelope's children, between a tool's arguments,
  and around the envelope are ignored; inside an argument's raw text they are text. A ``<tool``
  or ``<kyronix`` inside a comment outside the envelope is not an element.
- Block arguments (``content``, ``command``, ``body``): one line break right after the opening
  tag is dropped, and spaces/tabs after the last line break before the closing tag; everything
  else, including the final newline, is kept. Other arguments are stripped (``str.strip``).
  These rules touch raw text only, never CDATA.

Errors are :class:`KmlError` (:mod:`kyronix.errors`, the misuse family, also a ``ValueError``)
with ``offset`` and ``expected``. The scanner is linear: every
search moves forward, and the next-CDATA position is cached for the whole document.
"""

from __future__ import annotations

import html
import re
import uuid
from dataclasses import dataclass, field
from typing import TypedDict

from kyronix.errors import KmlError, KyronixUsageError

__all__ = [
    "BLOCK_ARGS",
    "STATUSES",
    "KmlError",
    "KmlNode",
    "Plan",
    "ToolCall",
    "parse",
    "serialize",
    "to_ast",
]

BLOCK_ARGS = frozenset({"content", "command", "body"})
STATUSES = frozenset({"complete", "in_progress", "needs_input", "failed"})
_SECTIONS = ("plan", "summary", "status")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_WS = re.compile(r"[ \t\r\n]*")
_CDATA_OPEN = "<![CDATA["
_CDATA_CLOSE = "]]>"
_COMMENT_OPEN = "<!--"
_COMMENT_CLOSE = "-->"
_TAG_END = frozenset(" \t\r\n>/")


@dataclass(frozen=True)
class ToolCall:
    """One tool call. ``args`` keeps document order. ``execution_id`` is the call's
    ``executionId``: the wire form of :data:`kiso.kernel.execution.ExecutionId`, the key of its
    receipt (kept a plain ``str`` here so the parser needs nothing but the standard library).

    ``assigned`` is True when the id was generated because the tool had none. It is excluded
    from equality: a serialized plan always carries its ids, so they parse back as given
    (``assigned=False``) and ``parse(serialize(p)) == p`` still holds.
    """

    name: str
    args: dict[str, str]
    execution_id: str
    assigned: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Plan:
    tools: tuple[ToolCall, ...] = ()
    plan: str | None = None
    summary: str | None = None
    status: str | None = None


class KmlNode(TypedDict):
    """The document's AST node: ``{tag, attributes, children}``."""

    tag: str
    attributes: dict[str, str]
    children: list[KmlNode | str]


def _node(tag: str, attributes: dict[str, str], children: list[KmlNode | str]) -> KmlNode:
    return {"tag": tag, "attributes": attributes, "children": children}


# A value is a list of (is_cdata, text) segments.
_Segments = list[tuple[bool, str]]


def _assemble(segments: _Segments, block: bool) -> str:
    if any(c for c, _ in segments) and all(c or not s.strip() for c, s in segments):
        return "".join(s for c, s in segments if c)
    # Raw text with CDATA inside it: the sections are part of the text, markers and all.
    parts = [_CDATA_OPEN + s + _CDATA_CLOSE if c else s for c, s in segments]
    last = len(parts) - 1
    if block:
        if not segments[last][0]:
            s = parts[last]
            i = s.rfind("\n")
            if i >= 0 and not s[i + 1 :].strip(" \t"):
                parts[last] = s[: i + 1]
        if not segments[0][0]:
            s = parts[0]
            if s.startswith("\r\n"):
                parts[0] = s[2:]
            elif s.startswith("\n"):
                parts[0] = s[1:]
    else:
        if not segments[0][0]:
            parts[0] = parts[0].lstrip()
        if not segments[last][0]:
            parts[last] = parts[last].rstrip()
    return "".join(parts)


class _Next:
    """``text.find(needle, pos)`` for positions that only move forward: one search serves every
    later query up to the match it found, so a scan asks for each stretch of text once."""

    __slots__ = ("_at", "_from", "needle", "text")

    def __init__(self, text: str, needle: str) -> None:
        self.text = text
        self.needle = needle
        self._at = -2  # the first match at or after _from (-1: none)
        self._from = 0

    def at(self, pos: int) -> int:
        if self._at == -2 or pos < self._from or 0 <= self._at < pos:
            self._at = self.text.find(self.needle, pos)
            self._from = pos
        return self._at


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.ids: set[str] = set()
        self._cdata = _Next(text, _CDATA_OPEN)
        self._comment_end = _Next(text, _COMMENT_CLOSE)
        self._comments_close = True  # False once a "<!--" is known to have no "-->" after it
        self._finders: dict[str, _Next] = {}

    def ws(self, pos: int) -> int:
        m = _WS.match(self.text, pos)
        return m.end() if m else pos

    def next_cdata(self, pos: int) -> int:
        return self._cdata.at(pos)

    def comment_end(self, start: int) -> int:
        """The offset after the comment opening at ``start``, or -1 when it never closes."""
        end = self._comment_end.at(start + len(_COMMENT_OPEN))
        return end + len(_COMMENT_CLOSE) if end >= 0 else -1

    def skip(self, pos: int) -> int:
        """Past whitespace and complete comments; an unclosed comment is an error (truncated)."""
        p = self.ws(pos)
        while self.text.startswith(_COMMENT_OPEN, p):
            end = self.comment_end(p)
            if end < 0:
                raise KmlError(self.n, _COMMENT_CLOSE, "truncated comment")
            p = self.ws(end)
        return p

    def skip_quietly(self, pos: int) -> int:
        """Past whitespace and complete comments; stops at an unclosed one (no error)."""
        p = self.ws(pos)
        while self.text.startswith(_COMMENT_OPEN, p):
            end = self.comment_end(p)
            if end < 0:
                return p
            p = self.ws(end)
        return p

    # -- pieces -------------------------------------------------------------------------------

    def attributes(self, pos: int, tag: str) -> tuple[dict[str, str], int, bool]:
        """Attributes from ``pos`` (just after the tag name) to ``>``; (attrs, after, empty)."""
        text = self.text
        attrs: dict[str, str] = {}
        while True:
            p = self.ws(pos)
            if p >= self.n:
                raise KmlError(self.n, f"> closing <{tag}>", "truncated")
            if text[p] == ">":
                return attrs, p + 1, False
            if text.startswith("/>", p):
                return attrs, p + 2, True
            m = _NAME.match(text, p)
            if not m:
                raise KmlError(p, f"an attribute or > in <{tag}>")
            name = m.group()
            p = self.ws(m.end())
            if p >= self.n or text[p] != "=":
                raise KmlError(p, f"= after attribute {name}")
            p = self.ws(p + 1)
            if p >= self.n or text[p] not in "\"'":
                raise KmlError(p, f"a quoted value for attribute {name}")
            end = text.find(text[p], p + 1)
            if end < 0:
                raise KmlError(self.n, f"closing {text[p]} of attribute {name}", "truncated")
            if name in attrs:
                raise KmlError(m.start(), "a unique attribute", f"duplicate {name!r}")
            attrs[name] = html.unescape(text[p + 1 : end])
            pos = end + 1

    def arg_end(self, after: int) -> bool:
        text = self.text
        p = self.ws(after)
        if text.startswith(_COMMENT_OPEN, p):
            p = self.skip_quietly(p)
        if text.startswith("</tool>", p):
            return True
        if p < self.n and text[p] == "<":
            m = _NAME.match(text, p + 1)
            if m and (text.startswith(">", m.end()) or text.startswith("/>", m.end())):
                return True
        return False

    def value(self, start: int, name: str, args: bool) -> tuple[_Segments, int]:
        """Scan a value from ``start``; return its segments and the offset after its close."""
        text, close = self.text, f"</{name}>"
        cdata_at = self._cdata.at
        segments: _Segments = []
        seg = pos = start
        cand = text.find(close, pos)
        last_cand = -1
        while True:
            if cand >= 0 and cand < pos:
                cand = text.find(close, pos)
            cd = cdata_at(pos)
            if cd >= 0 and (cand < 0 or cd < cand):
                body = cd + len(_CDATA_OPEN)
                end = text.find(_CDATA_CLOSE, body)
                if end < 0:
                    raise KmlError(self.n, _CDATA_CLOSE, "truncated CDATA section")
                segments.append((False, text[seg:cd]))
                segments.append((True, text[body:end]))
                seg = pos = end + len(_CDATA_CLOSE)
                continue
            if cand < 0:
                break
            after = cand + len(close)
            if not args or self.arg_end(after):
                segments.append((False, text[seg:cand]))
                return segments, after
            last_cand = after
            pos = after
        if last_cand >= 0:
            p = self.skip_quietly(last_cand)
            raise KmlError(p, "</tool>", f"after </{name}>: another argument or the tool's end")
        raise KmlError(self.n, close, "truncated")

    def tool(self, start: int) -> tuple[KmlNode, int]:
        """Parse ``<tool ...>...</tool>`` at ``start``; return its node and the offset after."""
        text = self.text
        attrs, p, empty = self.attributes(start + len("<tool"), "tool")
        if not attrs.get("name"):
            raise KmlError(start, 'a name="..." attribute on <tool>')
        eid = attrs.get("executionId")
        if eid:
            if eid in self.ids:
                raise KmlError(start, "a unique executionId", f"duplicate {eid!r}")
            self.ids.add(eid)
        node = _node("tool", attrs, [])
        if empty:
            return node, p
        seen: set[str] = set()
        while True:
            p = self.ws(p)
            if text.startswith(_COMMENT_OPEN, p):
                p = self.skip(p)
            if p >= self.n:
                raise KmlError(self.n, "</tool>", "truncated")
            if text.startswith("</tool>", p):
                return node, p + len("</tool>")
            m = _NAME.match(text, p + 1) if text[p] == "<" else None
            if not m:
                raise KmlError(p, "</tool>", "or an argument's opening tag")
            name, q = m.group(), m.end()
            if name in seen:
                raise KmlError(p, "a unique argument name", f"duplicate <{name}>")
            seen.add(name)
            if text.startswith("/>", q):
                value, p = "", q + 2
            elif text.startswith(">", q):
                segments, p = self.value(q + 1, name, True)
                value = _assemble(segments, name in BLOCK_ARGS)
            else:
                raise KmlError(q, f"> after <{name}")
            node["children"].append(_node(name, {}, [value]))

    def section(self, start: int, name: str) -> tuple[KmlNode, int]:
        body = start + len(name) + 2
        segments, p = self.value(body, name, False)
        value = _assemble(segments, False)
        if name == "status" and value not in STATUSES:
            raise KmlError(body, "one of " + ", ".join(sorted(STATUSES)), f"got {value!r}")
        return _node(name, {}, [value]), p

    # -- documents ----------------------------------------------------------------------------

    def find_tag(self, tag: str, pos: int) -> int:
        """The next ``<tag`` followed by whitespace, ``>`` or ``/``, outside complete comments,
        or -1. (An unclosed ``<!--`` is prose: it hides nothing.)"""
        needle, text = "<" + tag, self.text
        tags = self._finders.get(needle)
        if tags is None:
            tags = self._finders[needle] = _Next(text, needle)
        while True:
            i = tags.at(pos)
            if i < 0:
                return -1
            # Only the stretch before the tag is searched for a comment, and the search moves
            # past what it read: linear.
            c = text.find(_COMMENT_OPEN, pos, i) if self._comments_close else -1
            if c >= 0:
                end = self.comment_end(c)
                if end >= 0:
                    pos = end
                    continue
                self._comments_close = False  # none closes after this one: none hides anything
            j = i + len(needle)
            if j < self.n and text[j] in _TAG_END:
                return i
            pos = j

    def document(self) -> KmlNode:
        text = self.text
        start = self.find_tag("kyronix", 0)
        if start < 0:
            root = _node("kyronix", {}, [])
            pos = 0
            while (i := self.find_tag("tool", pos)) >= 0:
                node, pos = self.tool(i)
                root["children"].append(node)
            if not root["children"]:
                raise KmlError(self.n, "<kyronix> or <tool>", "no KML found")
            return root
        attrs, p, empty = self.attributes(start + len("<kyronix"), "kyronix")
        root = _node("kyronix", attrs, [])
        if empty:
            return root
        seen: set[str] = set()
        while True:
            p = self.ws(p)
            if text.startswith(_COMMENT_OPEN, p):
                p = self.skip(p)
            if p >= self.n:
                raise KmlError(self.n, "</kyronix>", "truncated")
            if text.startswith("</kyronix>", p):
                return root
            if text.startswith("<tool", p) and p + 5 < self.n and text[p + 5] in _TAG_END:
                node, p = self.tool(p)
                root["children"].append(node)
                continue
            for name in _SECTIONS:
                if text.startswith(f"<{name}>", p):
                    if name in seen:
                        raise KmlError(p, f"at most one <{name}>")
                    seen.add(name)
                    node, p = self.section(p, name)
                    root["children"].append(node)
                    break
            else:
                raise KmlError(p, "</kyronix>", "or <tool>, <plan>, <summary>, <status>")


def to_ast(text: str) -> dict[str, KmlNode]:
    """The document's AST: ``{"root": {"tag", "attributes", "children"}}``.

    The root is always tagged ``kyronix`` (synthesized for bare ``<tool>`` elements). Argument
    and section nodes hold their decoded text as their single child. Ids are not assigned here.
    """
    return {"root": _Scanner(text).document()}


def parse(text: str) -> Plan:
    """Parse a model's KML answer into a :class:`Plan`; raise :class:`KmlError` if malformed."""
    root = _Scanner(text).document()
    tools: list[ToolCall] = []
    sections: dict[str, str] = {}
    for child in root["children"]:
        assert not isinstance(child, str)
        if child["tag"] != "tool":
            value = child["children"][0]
            assert isinstance(value, str)
            sections[child["tag"]] = value
            continue
        args: dict[str, str] = {}
        for arg in child["children"]:
            assert not isinstance(arg, str)
            value = arg["children"][0]
            assert isinstance(value, str)
            args[arg["tag"]] = value
        eid = child["attributes"].get("executionId")
        name = child["attributes"]["name"]
        if eid:
            tools.append(ToolCall(name, args, eid, assigned=False))
        else:
            tools.append(ToolCall(name, args, f"exec_{uuid.uuid4().hex}", assigned=True))
    return Plan(tuple(tools), sections.get("plan"), sections.get("summary"), sections.get("status"))


def _cdata(value: str) -> str:
    return _CDATA_OPEN + value.replace("]]>", "]]]]><![CDATA[>") + _CDATA_CLOSE


def _text(value: str) -> str:
    """Raw when it reads back unchanged (no ``<``, already stripped), else CDATA."""
    return value if "<" not in value and value == value.strip() else _cdata(value)


def _attr(value: str) -> str:
    return html.escape(value, quote=True)


def serialize(plan: Plan) -> str:
    """Emit a ``<kyronix>`` envelope such that ``parse(serialize(plan)) == plan``.

    Block arguments are always CDATA; other values are raw only when they read back unchanged,
    so even unstripped scalars round-trip. The plan must be valid: non-empty tool names and ids,
    unique ids, argument names matching ``[A-Za-z_][A-Za-z0-9_.-]*``, a known status
    (:class:`~kyronix.errors.KyronixUsageError`, a ``ValueError``, otherwise). ``assigned`` is
    not kept: every id is written, so it parses back as given (``ToolCall`` equality ignores
    ``assigned``).
    """
    out = ["<kyronix>\n"]
    if plan.plan is not None:
        out.append(f"  <plan>{_text(plan.plan)}</plan>\n")
    ids: set[str] = set()
    for t in plan.tools:
        if not t.name or not t.execution_id:
            raise KyronixUsageError(
                "a tool needs a non-empty name and execution_id to be written as KML"
            )
        if t.execution_id in ids:
            raise KyronixUsageError(
                f"duplicate execution_id {t.execution_id!r}: an id names one execution; give "
                f"each tool call its own"
            )
        ids.add(t.execution_id)
        out.append(f'  <tool name="{_attr(t.name)}" executionId="{_attr(t.execution_id)}">\n')
        for k, v in t.args.items():
            if not _NAME.fullmatch(k):
                raise KyronixUsageError(
                    f"invalid argument name {k!r}: a KML argument name is letters, digits, "
                    f"'_', '.' and '-', starting with a letter or '_'"
                )
            out.append(f"    <{k}>{_cdata(v) if k in BLOCK_ARGS else _text(v)}</{k}>\n")
        out.append("  </tool>\n")
    if plan.summary is not None:
        out.append(f"  <summary>{_text(plan.summary)}</summary>\n")
    if plan.status is not None:
        if plan.status not in STATUSES:
            raise KyronixUsageError(
                f"unknown status {plan.status!r}; a plan's status is one of "
                + ", ".join(sorted(STATUSES))
            )
        out.append(f"  <status>{plan.status}</status>\n")
    out.append("</kyronix>\n")
    return "".join(out)
