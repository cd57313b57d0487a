"""Build each event's validator and serialiser from its dataclass declaration.

An event class declares its fields with ordinary type hints; :func:`compile_event` reads them and
generates two functions, the way :mod:`dataclasses` generates ``__init__``:

* ``parse(d)``: checks every field of the decoded object inline, the envelope included (presence,
  type, enumeration, no unknown keys) and builds the frozen event by setting its slots directly.
  Loading a long log runs this hundreds of thousands of times, so it is one flat function with
  no per-field calls.
* ``to_json(self)``: the object back, envelope first (``seq``, ``ts``, ``run``, ``type``), then the
  fields in declaration order.

Supported hints: ``str``, ``int`` (non-negative), ``bool``, ``dict[str, Any]`` (a JSON object),
``Any`` (any JSON value, but present), ``Literal[...]`` of strings, and each of those ``| None``.
Any other field names its own ``parse(value, where)`` and ``dump(value)`` in
``field(metadata=...)``. A field whose metadata says ``omit_none`` may be absent from the JSON and
is left out of it when ``None``; every other field must be present, even when it may be null.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

from kiso.kernel._fields import fail, only

__all__ = ["DUMP", "OMIT_NONE", "PARSE", "compile_event"]

PARSE = "parse"
DUMP = "dump"
OMIT_NONE = "omit_none"

ENVELOPE = ("seq", "ts", "run")

_CHECKS = {
    str: ("type({v}) is not str", "a string"),
    int: ("type({v}) is not int or {v} < 0", "a non-negative integer"),
    bool: ("type({v}) is not bool", "true or false"),
    dict: ("type({v}) is not dict", "an object"),
}


def _split_optional(hint: Any) -> tuple[Any, bool]:
    if get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(get_args(hint)) == 2:
            return args[0], True
    return hint, False


def compile_event(
    cls: type[Any], type_name: str
) -> tuple[Callable[..., Any], Callable[[Any], dict[str, Any]]]:
    """Generate ``(parse, to_json)`` for the dataclass ``cls`` with the wire name ``type_name``."""
    module = __import__(cls.__module__, fromlist=["_"])
    hints = typing.get_type_hints(cls, vars(module))
    fields = [f for f in dataclasses.fields(cls) if f.name not in ENVELOPE]
    env: dict[str, Any] = {
        "_new": object.__new__,
        "_cls": cls,
        "fail": fail,
        "only": only,
        "_KEYS": frozenset((*ENVELOPE, "type", *(f.name for f in fields))),
    }
    for name in (*ENVELOPE, *(f.name for f in fields)):
        env[f"_set_{name}"] = getattr(cls, name).__set__

    run_hint, run_nullable = _split_optional(hints["run"])
    assert run_hint is str
    # Every required key is read with d[key] inside one try (a subscript is several times cheaper
    # than d.get); a missing key is reported by name from the KeyError. Checks follow the reads.
    expected_of: dict[str, str] = {
        "seq": "a positive integer",
        "ts": "a non-negative integer (unix ms)",
        "run": "a run id or null" if run_nullable else "a run id",
    }
    reads = ["        seq = d['seq']", "        ts = d['ts']", "        run = d['run']"]
    checks = [
        "    if type(seq) is not int or seq < 1:",
        "        raise fail(where, 'seq', 'a positive integer', seq)",
        "    if type(ts) is not int or ts < 0:",
        "        raise fail(where, 'ts', 'a non-negative integer (unix ms)', ts)",
        (
            "    if run is not None and type(run) is not str:"
            if run_nullable
            else "    if type(run) is not str:"
        ),
        f"        raise fail(where, 'run', {expected_of['run']!r}, run)",
    ]
    dump_items = [
        "'seq': self.seq",
        "'ts': self.ts",
        "'run': self.run",
        f"'type': {type_name!r}",
    ]
    dump_optional: list[str] = []

    for f in fields:
        name, v = f.name, f"v_{f.name}"
        omit = bool(f.metadata.get(OMIT_NONE))
        custom_parse = f.metadata.get(PARSE)
        if omit:
            checks.append(f"    {v} = d.get({name!r})")
        else:
            reads.append(f"        {v} = d[{name!r}]")
        if custom_parse is not None:
            env[f"_parse_{name}"] = custom_parse
            env[f"_dump_{name}"] = f.metadata[DUMP]
            expected_of[name] = "a value"
            checks.append(f"    {v} = _parse_{name}({v}, where)")
            dump_value = f"_dump_{name}(self.{name})"
        else:
            hint, nullable = _split_optional(hints[name])
            if hint is Any:
                expected = "any JSON value"
            else:
                if get_origin(hint) is Literal:
                    allowed = frozenset(get_args(hint))
                    env[f"_ALLOWED_{name}"] = allowed
                    cond = f"type({v}) is not str or {v} not in _ALLOWED_{name}"
                    expected = "one of " + ", ".join(sorted(allowed))
                else:
                    base = get_origin(hint) or hint
                    template, expected = _CHECKS[base]
                    cond = template.format(v=v)
                if nullable:
                    cond = f"{v} is not None and ({cond})"
                    expected += " or null"
                checks += [
                    f"    if {cond}:",
                    f"        raise fail(where, {name!r}, {expected!r}, {v})",
                ]
            expected_of[name] = expected
            dump_value = f"self.{name}"
        if omit:
            dump_optional.append(
                f"    if self.{name} is not None:\n        out[{name!r}] = {dump_value}"
            )
        else:
            dump_items.append(f"{name!r}: {dump_value}")

    env["_EXPECTED"] = expected_of
    parse_lines = [
        f"    where = {type_name!r}",
        "    if not _KEYS.issuperset(d):",
        "        only(d, _KEYS, where)",
        "    try:",
        *reads,
        "    except KeyError as exc:",
        "        raise fail(where, exc.args[0], _EXPECTED[exc.args[0]]) from None",
        *checks,
    ]
    parse_lines.append("    o = _new(_cls)")
    for name in ENVELOPE:
        parse_lines.append(f"    _set_{name}(o, {name})")
    for f in fields:
        parse_lines.append(f"    _set_{f.name}(o, v_{f.name})")
    check = getattr(cls, "_check", None)
    if check is not None:
        env["_check"] = check
        parse_lines.append("    _check(o, where)")
    parse_lines.append("    return o")
    source = "def parse(d):\n" + "\n".join(parse_lines) + "\n\n"
    source += "def to_json(self):\n    out = {" + ", ".join(dump_items) + "}\n"
    source += "".join(line + "\n" for line in dump_optional) + "    return out\n"
    exec(compile(source, f"<kiso event {type_name}>", "exec"), env)
    return env["parse"], env["to_json"]
