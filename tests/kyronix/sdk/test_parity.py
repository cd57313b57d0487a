"""The sync and async SDK clients stay in step (the approach of simonw/llm's parity test).

``Kyronix``/``AsyncKyronix``, ``Session``/``AsyncSession`` and ``TextStream``/``AsyncTextStream``
are written twice, once per I/O style. Two checks keep the copies from drifting:

- the public surface: the same method and property names, the same signatures (parameter names,
  kinds, defaults, annotations once ``Async`` names are read as their sync twins), and a
  coroutine function in the async class wherever the sync one blocks on I/O;
- the bodies: the async source, with its async-ness stripped by :data:`DE_ASYNC` (a fixed list
  of textual rewrites), parses to the same AST as the sync source, method by method and for the
  module-level helpers, docstrings and messages included. Only :data:`DIFFERENT` may differ.

A change to one client that fails here is a change to make to the other one too.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
import textwrap
from types import ModuleType
from typing import Any

import pytest

import kyronix
import kyronix.client as sdk
from kyronix.client import async_, sync
from kyronix.client.async_ import AsyncKyronix, AsyncTextStream
from kyronix.client.session import AsyncSession, Session
from kyronix.client.sync import Kyronix, TextStream

PAIRS: list[tuple[type, type]] = [
    (Kyronix, AsyncKyronix),
    (Session, AsyncSession),
    (TextStream, AsyncTextStream),
]
MODULES: list[tuple[ModuleType, ModuleType]] = [(sync, async_)]
"""Modules written twice: their top-level functions and assignments are compared too."""

DE_ASYNC: list[tuple[str, str]] = [
    # the syntax
    (r"\bawait\s+", ""),
    (r"\basync\s+(def|with|for)\b", r"\1"),
    # an async stream is made by a coroutine (Python has no async __init__); see DIFFERENT
    (r"\bAsyncTextStream\.open\(", "TextStream("),
    # the SDK's own pairs (the tunnel's too: the clients hold one each)
    (r"\bAsyncKyronix\b", "Kyronix"),
    (r"\bAsyncSession\b", "Session"),
    (r"\bAsyncTextStream\b", "TextStream"),
    (r"\bAsyncTunnel\b", "SyncTunnel"),
    # httpx2's async names
    (r"\bhttpx2\.AsyncClient\b", "httpx2.Client"),
    (r"\baread\b", "read"),
    (r"\baclose\b", "close"),
    (r"\baiter_lines\b", "iter_lines"),
    # the standard library's
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\banext\(", "next("),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncGenerator\[(\w+), None\]", r"Generator[\1, None, None]"),
    (r"\b__a(enter|exit|iter|next)__\b", r"__\1__"),
]
"""Rewrites, in order, that turn the async source into what the sync source must be."""

DIFFERENT: dict[tuple[str, str], str] = {
    # Python has no async constructor. TextStream.__init__ sends the request itself;
    # AsyncTextStream.__init__ takes the already opened response, and the coroutine
    # classmethod AsyncTextStream.open sends the request and checks the reply first.
    ("TextStream", "__init__"): "the sync stream opens itself; the async one is given its reply",
    ("TextStream", "open"): "async only: the coroutine that makes an AsyncTextStream",
    # AsyncKyronix's callbacks may be coroutine functions: what they return is awaited. Every
    # callback goes through _call_back, so this is the one place the two differ.
    ("<module>", "_call_back"): "the async one awaits a coroutine callback's result",
}
"""(sync class name, or ``<module>``; sync name) -> why the two may differ."""

PLAIN_IN_BOTH = {"__init__", "__repr__", "__iter__", "get_id", "session"}
"""Public methods that do no I/O, so the async class's are plain functions too (``session``
makes a session object without a request; ``__aiter__`` must return the iterator itself)."""


def de_async(text: str) -> str:
    for pattern, replacement in DE_ASYNC:
        text = re.sub(pattern, replacement, text)
    return text


# ------------------------------------------------------------------ the public surface


def _public(cls: type) -> dict[str, Any]:
    """The public methods and properties of ``cls`` (its own and its kyronix bases')."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("kyronix."):
            continue
        for name, value in vars(klass).items():
            dunder = name.startswith("__") and name.endswith("__")
            if name.startswith("_") and not dunder:
                continue
            if isinstance(value, (property, classmethod, staticmethod)) or inspect.isfunction(
                value
            ):
                found[name] = value
    return found


def _annotation(value: object, *, returned: bool = False) -> object:
    if not isinstance(value, str):
        return value
    value = de_async(value)
    if returned:  # a plain function handing back an awaitable is an async method all the same
        value = re.sub(r"^Awaitable\[(.*)\]$", r"\1", value)
    return value


def _signature(function: Any, *, normalise: bool) -> tuple[object, ...]:
    signature = inspect.signature(function)  # annotations stay strings (postponed evaluation)

    def ann(value: object, returned: bool = False) -> object:
        return _annotation(value, returned=returned) if normalise else value

    params = tuple(
        (p.name, p.kind, p.default, ann(p.annotation)) for p in signature.parameters.values()
    )
    return params, ann(signature.return_annotation, returned=True)


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__name__)
def test_the_same_public_names(sync_cls: type, async_cls: type) -> None:
    expected = set(_public(sync_cls))
    expected |= {name for (owner, name) in DIFFERENT if owner == sync_cls.__name__}
    assert {de_async(name) for name in _public(async_cls)} == expected


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__name__)
def test_the_same_signatures_and_coroutines_where_the_sync_one_blocks(
    sync_cls: type, async_cls: type
) -> None:
    sync_members = _public(sync_cls)
    for async_name, async_attr in _public(async_cls).items():
        name = de_async(async_name)
        if (sync_cls.__name__, name) in DIFFERENT:
            continue
        sync_member, async_member = sync_members[name], async_attr
        where = f"{async_cls.__name__}.{async_name}"
        assert type(async_member) is type(sync_member), f"{where}: not a {type(sync_member)}"
        if isinstance(sync_member, property):
            sync_member, async_member = sync_member.fget, async_member.fget
        elif isinstance(sync_member, (classmethod, staticmethod)):
            sync_member, async_member = sync_member.__func__, async_member.__func__
        assert _signature(async_member, normalise=True) == _signature(
            sync_member, normalise=False
        ), where
        assert not inspect.iscoroutinefunction(sync_member), f"{sync_cls.__name__}.{name}"
        if isinstance(sync_members[name], property):
            continue
        coroutine = inspect.iscoroutinefunction(async_member)
        assert coroutine is (name not in PLAIN_IN_BOTH), f"{where}: coroutine is {coroutine}"


def test_every_async_name_of_the_sdk_has_its_pair() -> None:
    paired = {a.__name__: s.__name__ for s, a in PAIRS}
    for package in (sdk, kyronix):
        for name in package.__all__:
            if name.startswith("Async"):
                assert paired.get(name) == name.removeprefix("Async"), name
                assert name.removeprefix("Async") in package.__all__, name


# ------------------------------------------------------------------ the bodies


def _defs(body: list[ast.stmt]) -> dict[str, list[ast.AST]]:
    """Each function (every overload of it) and each assigned name, by name."""
    found: dict[str, list[ast.AST]] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node)
    return found


class _Docstrings(ast.NodeTransformer):
    """Docstrings with their whitespace collapsed: a renamed name may wrap a line elsewhere."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            doc = body[0].value
            if isinstance(doc, ast.Constant) and isinstance(doc.value, str):
                doc.value = " ".join(doc.value.split())
        return super().generic_visit(node)


def _parse(source: str) -> ast.Module:
    tree = _Docstrings().visit(ast.parse(textwrap.dedent(source)))
    assert isinstance(tree, ast.Module)
    return tree


def _class_node(source: str) -> ast.ClassDef:
    node = _parse(source).body[0]
    assert isinstance(node, ast.ClassDef)
    return node


def _body(owner: str, source: str) -> list[ast.stmt]:
    """The statements of a module's source (``<module>``) or of a class's."""
    return _parse(source).body if owner == "<module>" else _class_node(source).body


def _source(nodes: list[ast.AST]) -> str:
    return "\n".join(ast.unparse(n) for n in nodes)


def _mismatches(
    owner: str, sync_defs: dict[str, list[ast.AST]], async_defs: dict[str, list[ast.AST]]
) -> list[str]:
    """Each name defined on one side only, or whose normalised definitions differ, as a diff."""
    problems: list[str] = []
    for name in sorted(sync_defs.keys() | async_defs.keys()):
        if (owner, name) in DIFFERENT:
            continue
        mine, theirs = sync_defs.get(name), async_defs.get(name)
        if mine is None or theirs is None:
            problems.append(
                f"{owner}.{name}: only in the {'async' if mine is None else 'sync'} one"
            )
        elif [ast.dump(n) for n in mine] != [ast.dump(n) for n in theirs]:
            diff = difflib.unified_diff(
                _source(mine).splitlines(), _source(theirs).splitlines(),
                "sync", "async, de-asynced", lineterm="",
            )  # fmt: skip
            problems.append(f"{owner}.{name}:\n" + "\n".join(diff))
    return problems


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__name__)
def test_the_methods_have_the_same_bodies(sync_cls: type, async_cls: type) -> None:
    mine = _class_node(inspect.getsource(sync_cls))
    theirs = _class_node(de_async(inspect.getsource(async_cls)))
    assert theirs.name == mine.name
    assert [ast.dump(b) for b in theirs.bases] == [ast.dump(b) for b in mine.bases]
    problems = _mismatches(mine.name, _defs(mine.body), _defs(theirs.body))
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize(("sync_mod", "async_mod"), MODULES, ids=lambda m: m.__name__)
def test_the_module_helpers_have_the_same_bodies(
    sync_mod: ModuleType, async_mod: ModuleType
) -> None:
    mine = _parse(inspect.getsource(sync_mod))
    theirs = _parse(de_async(inspect.getsource(async_mod)))
    classes = [
        {n.name for n in tree.body if isinstance(n, ast.ClassDef)} for tree in (mine, theirs)
    ]
    assert classes[0] == classes[1]
    problems = _mismatches("<module>", _defs(mine.body), _defs(theirs.body))
    assert not problems, "\n\n".join(problems)


def test_the_allowed_differences_are_still_different() -> None:
    """An entry of DIFFERENT whose two sides have come to agree is to be removed."""
    sources = {s.__name__: (inspect.getsource(s), inspect.getsource(a)) for s, a in PAIRS}
    for mod_sync, mod_async in MODULES:
        sources["<module>"] = (inspect.getsource(mod_sync), inspect.getsource(mod_async))
    for owner, name in DIFFERENT:
        mine, theirs = sources[owner]
        sync_defs, async_defs = (_defs(_body(owner, text)) for text in (mine, de_async(theirs)))
        assert name in sync_defs or name in async_defs, f"{owner}.{name} is gone"
        if name in sync_defs and name in async_defs:
            assert _source(sync_defs[name]) != _source(async_defs[name]), f"{owner}.{name}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("async def f(self) -> AsyncKyronix:", "def f(self) -> Kyronix:"),
        ("async with stream:\n    async for c in stream:", "with stream:\n    for c in stream:"),
        ("await asyncio.sleep(d)", "time.sleep(d)"),
        ("s = await AsyncTextStream.open(self, call)", "s = TextStream(self, call)"),
        ("await self._http.aclose()", "self._http.close()"),
        ("def __aiter__(self) -> AsyncTextStream:", "def __iter__(self) -> TextStream:"),
        ("-> AsyncGenerator[str, None]:", "-> Generator[str, None, None]:"),
        ("await anext(self._chunks)", "next(self._chunks)"),
        ("asynchronous, awaited, Asynchronous", "asynchronous, awaited, Asynchronous"),
    ],
)
def test_de_async(source: str, expected: str) -> None:
    assert de_async(source) == expected
