"""Readers for the fields of decoded JSON objects, used by the event validators.

Each takes the object, the key and the name of the thing being read, and returns the value with
its static type or raises :class:`EventError` naming the field. They are small and called once per
field. The events' own validators are generated (:mod:`kiso.kernel._codec`); these serve the
nested values and the header, and report errors in the same words.

:func:`ascii_int` is kiso's one reader of a whole number written as text (an environment
variable, a config value, a typed answer, a number inside an id): every layer may use it, so it
lives here, at the bottom.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeAlias, cast

from kiso.kernel.errors import EventError

JsonObject: TypeAlias = dict[str, Any]


def ascii_int(text: str) -> int | None:
    """The whole number ``text`` spells in ASCII digits (nothing else: no sign, no space), or
    None. ``str.isdigit`` is no test for this: it is true for a superscript two, which ``int``
    then rejects with a traceback, and for Arabic-Indic or fullwidth digits, which ``int`` reads
    as numbers nobody meant to type."""
    return int(text) if text.isascii() and text.isdigit() else None


def fail(where: str, key: str, expected: str, value: Any = ...) -> EventError:
    if value is ...:
        return EventError(f"{where}: missing field {key!r} ({expected})")
    shown = json.dumps(value, ensure_ascii=False)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return EventError(f"{where}: field {key!r} must be {expected}, got {shown}")


def read_str(d: Mapping[str, Any], key: str, where: str) -> str:
    v = d.get(key, ...)
    if type(v) is not str:
        raise fail(where, key, "a string", v)
    return v


def read_opt_str(d: Mapping[str, Any], key: str, where: str) -> str | None:
    v = d.get(key)
    if v is None or type(v) is str:
        return v
    raise fail(where, key, "a string or null", v)


def read_int(d: Mapping[str, Any], key: str, where: str) -> int:
    v = d.get(key, ...)
    if type(v) is not int or v < 0:
        raise fail(where, key, "a non-negative integer", v)
    return v


def read_opt_int(d: Mapping[str, Any], key: str, where: str) -> int | None:
    v = d.get(key)
    if v is None or (type(v) is int and v >= 0):
        return v
    raise fail(where, key, "a non-negative integer or null", v)


def read_bool(d: Mapping[str, Any], key: str, where: str) -> bool:
    v = d.get(key, ...)
    if type(v) is not bool:
        raise fail(where, key, "true or false", v)
    return v


def read_obj(d: Mapping[str, Any], key: str, where: str) -> JsonObject:
    v = d.get(key, ...)
    if type(v) is not dict:
        raise fail(where, key, "an object", v)
    return cast(JsonObject, v)


def read_enum(d: Mapping[str, Any], key: str, where: str, allowed: frozenset[str]) -> Any:
    v = d.get(key, ...)
    if type(v) is not str or v not in allowed:
        raise fail(where, key, "one of " + ", ".join(sorted(allowed)), v)
    return v


def only(d: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    if not d.keys() <= allowed:
        extra = sorted(set(d) - allowed)
        raise EventError(f"{where}: unknown field(s) {', '.join(map(repr, extra))}")
