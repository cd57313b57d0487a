"""Who may do what: permission policies, the two stock policy sets, and the path sandbox check.

A :class:`Policy` names an action pattern (``tool:write_file``, ``tool:*``, ``net:private``), an
effect (allow or deny) and optionally path patterns. :meth:`PermissionManager.check` finds every
policy whose action and paths match: any deny wins, else any allow, else the call is refused.
Nothing is allowed by default except tools the user registered (registering a tool is consent);
a policy that names a registered tool still applies to it.

Path patterns are ``fnmatch`` globs (a pattern equal to the target always matches, so
``[::1]:443`` needs no escaping). A pattern without ``/`` matches any single component of the
path (``.git`` matches ``a/.git/config``; ``.env*`` matches ``config/.env.local``); a pattern
with ``/`` matches the whole path relative to the base. A **deny** matches regardless of case
(``.git`` denies ``.GIT/config``, ``id_rsa*`` denies ``ID_RSA``: on a case-insensitive
filesystem they are the same file, and a deny too broad is safe); an allow matches exactly (an
allow too narrow is safe too). The executer passes base-relative paths.

Actions the executer checks:

- ``tool:<name>`` for every tool call, once per path argument (both ends of a move or copy), or
  once with no path for a tool without one (``terminal``, ``http_request``, ``navigate``);
- ``net:private`` before a network tool reaches a loopback, private, link-local, or cloud
  metadata address.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from kiso.tools.paths import PathOutsideWorkspace, resolve_in_workspace
from kyronix.errors import KyronixTypeError, KyronixUsageError
from kyronix.executer.tools import files as file_tools

__all__ = [
    "READ_TOOLS",
    "ROOT_POLICIES",
    "SAFE_POLICIES",
    "WRITE_TOOLS",
    "Decision",
    "PermissionManager",
    "Policy",
    "Sandbox",
    "allow",
    "allow_in_base",
    "deny",
]

READ_TOOLS: tuple[str, ...] = tuple(s.name for s in file_tools.TOOLS if s.read_only)
"""The file tools that declare ``read_only`` (read_file, list_dir, read_lines): ``SAFE_POLICIES``
let them read anywhere inside the base, protected files included."""
WRITE_TOOLS: tuple[str, ...] = tuple(s.name for s in file_tools.TOOLS if not s.read_only)
"""The other file tools: ``SAFE_POLICIES`` let them change files inside the base, except the
protected ones."""

# Files an agent must not write under SAFE_POLICIES: the repository's internals, environment files
# and private keys (matched against each path component).
PROTECTED_PATTERNS = (
    ".git",
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    ".npmrc",
    ".pypirc",
)


@dataclass(frozen=True, slots=True)
class Policy:
    """Allow or deny ``action`` (an fnmatch pattern), optionally only for some paths."""

    action: str
    effect: Literal["allow", "deny"] = "allow"
    paths: tuple[str, ...] | None = None
    """Path patterns; None matches every call, with or without a path."""
    reason: str = ""
    within_base: bool = False
    """Match only a path inside the base: relative, not climbing out with ``..`` (the executer
    passes base-relative paths; an absolute path matches only through a manager's ``base``)."""

    def __post_init__(self) -> None:
        if self.effect not in ("allow", "deny"):
            raise KyronixUsageError(f"a policy's effect is 'allow' or 'deny', not {self.effect!r}")
        if not isinstance(self.action, str) or not self.action:
            raise KyronixUsageError("a policy needs an action pattern such as 'tool:write_file'")

    def matches(self, action: str, path: str | None) -> bool:
        return fnmatchcase(action, self.action) and self.applies_to(path)

    def applies_to(self, path: str | None) -> bool:
        """Whether the path part of this policy covers ``path`` (the action aside). A deny's
        patterns match regardless of case; an allow's exactly."""
        if self.within_base and (path is None or not _inside(path)):
            return False
        if self.paths is None:
            return True
        if path is None:
            return False
        if self.effect == "deny":
            folded = path.casefold()
            return any(_path_matches(pattern.casefold(), folded) for pattern in self.paths)
        return any(_path_matches(pattern, path) for pattern in self.paths)


def _inside(path: str) -> bool:
    posix = os.path.normpath(path.replace(os.sep, "/"))
    return not os.path.isabs(posix) and posix != ".." and not posix.startswith("../")


def allow(action: str, *paths: str, reason: str = "") -> Policy:
    return Policy(action, "allow", paths or None, reason)


def allow_in_base(action: str, *paths: str, reason: str = "") -> Policy:
    """Allow ``action`` only on paths inside the base (as ``SAFE_POLICIES`` do)."""
    return Policy(action, "allow", paths or None, reason, within_base=True)


def deny(action: str, *paths: str, reason: str = "") -> Policy:
    return Policy(action, "deny", paths or None, reason)


def _path_matches(pattern: str, path: str) -> bool:
    if pattern == path:  # literal first: "[::1]:443" is a target, not a character class
        return True
    posix = path.replace(os.sep, "/")
    if "/" in pattern:
        return fnmatchcase(posix.lstrip("/"), pattern.lstrip("/")) or fnmatchcase(posix, pattern)
    return any(fnmatchcase(part, pattern) for part in posix.split("/") if part)


ROOT_POLICIES: tuple[Policy, ...] = (
    Policy("*", "allow", reason="ROOT_POLICIES allow every action"),
)
"""Every tool, the shell and every network address (paths are still kept inside the base)."""

SAFE_POLICIES: tuple[Policy, ...] = (
    *(
        Policy(f"tool:{t}", reason="SAFE_POLICIES allow reading inside the base", within_base=True)
        for t in READ_TOOLS
    ),
    *(
        Policy(
            f"tool:{t}",
            reason="SAFE_POLICIES allow editing files inside the base",
            within_base=True,
        )
        for t in WRITE_TOOLS
    ),
    *(
        Policy(
            f"tool:{t}",
            "deny",
            PROTECTED_PATTERNS,
            reason="SAFE_POLICIES protect .git/, .env files and key files",
        )
        for t in WRITE_TOOLS
    ),
)
"""Read and edit files inside the base, except ``.git/``, ``.env*`` and key files. The shell,
git, the browser and the network are refused until a policy allows them."""


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    policy: Policy | None = None


class PermissionManager:
    """``PermissionManager(policies)``: decide whether an action on a path is allowed.

    The executer asks with base-relative paths it resolved itself (:meth:`decide_relative`).
    Called directly, :meth:`check` and :meth:`decide` judge a relative path exactly as the same
    path made absolute: with ``base``, both are resolved (``realpath``) against it and judged by
    where they really are, relative to the base when inside it; without one, ``..`` is collapsed
    in a relative path, and an absolute path is never "inside the base", so ``SAFE_POLICIES``
    refuse it.
    """

    def __init__(
        self,
        policies: Iterable[Policy] = SAFE_POLICIES,
        *,
        registered: Iterable[str] = (),
        base: str | os.PathLike[str] | None = None,
    ) -> None:
        self.policies: tuple[Policy, ...] = tuple(policies)
        self.base = os.path.realpath(base) if base is not None else None
        for p in self.policies:
            if not isinstance(p, Policy):
                raise KyronixTypeError(
                    f"PermissionManager takes Policy objects (see ROOT_POLICIES, SAFE_POLICIES, "
                    f"allow() and deny()), got {type(p).__name__}"
                )
        self._registered: set[str] = set(registered)
        self._by_action: dict[str, tuple[Policy, ...]] = {}

    def with_policies(self, *extra: Policy) -> PermissionManager:
        """A copy with more policies (``manager.with_policies(allow("tool:terminal"))``)."""
        return PermissionManager(
            (*self.policies, *extra), registered=self._registered, base=self.base
        )

    def register_tool(self, name: str) -> None:
        """Mark a user-registered tool: allowed unless a policy denies it."""
        self._registered.add(name)

    def check(self, action: str, path: str | os.PathLike[str] | None = None) -> bool:
        """True when ``action`` (on ``path``, if given) is allowed."""
        return self.decide(action, path).allowed

    def decide(self, action: str, path: str | os.PathLike[str] | None = None) -> Decision:
        """The decision on ``action`` (on ``path``, if given) and the reason for it."""
        return self.decide_relative(action, self._target(path))

    def _target(self, path: str | os.PathLike[str] | None) -> str | None:
        """``path`` as policies see it: base-relative when it is inside the base."""
        if path is None:
            return None
        raw = os.fspath(path)
        if not isinstance(raw, str):
            raise KyronixTypeError(f"a path must be text, not {type(raw).__name__}")
        if self.base is None:
            return raw if os.path.isabs(raw) else os.path.normpath(raw.replace(os.sep, "/"))
        real = os.path.realpath(os.path.join(self.base, raw))
        if real == self.base:
            return "."
        if os.path.commonpath((self.base, real)) == self.base:
            return os.path.relpath(real, self.base)
        return real

    def decide_relative(self, action: str, target: str | None) -> Decision:
        """:meth:`decide` for a path already resolved and made relative to the base (what the
        executer passes), judged as it is."""
        relevant = self._by_action.get(action)
        if relevant is None:
            relevant = tuple(p for p in self.policies if fnmatchcase(action, p.action))
            self._by_action[action] = relevant
        allowed_by: Policy | None = None
        for policy in relevant:
            if not policy.applies_to(target):
                continue
            if policy.effect == "deny":
                why = policy.reason or f"a policy denies {policy.action}"
                return Decision(False, f"{action} is denied{_on(target)}: {why}", policy)
            allowed_by = allowed_by or policy
        if allowed_by is not None:
            return Decision(True, allowed_by.reason or "allowed", allowed_by)
        if action.startswith("tool:") and action[5:] in self._registered:
            return Decision(True, "a registered tool is allowed unless a policy denies it")
        hint = (
            f"to allow it, pass permissions=PermissionManager(ROOT_POLICIES) or add "
            f"allow({action!r}) to the policies (on the command line: --allow {action}, or "
            f"--root)"
        )
        return Decision(False, f"{action} is not allowed{_on(target)} by any policy; {hint}")


def _on(path: str | None) -> str:
    return f" on {path!r}" if path is not None else ""


class _OnBase:
    """A function of ``(base, path, ...)`` usable as ``Sandbox.f(base, path)`` on the class and
    as ``Sandbox(base).f(path)`` on an instance (which supplies its base)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Sandbox | None, owner: type | None = None) -> Callable[..., Any]:
        if obj is None:
            return self.fn
        return functools.partial(self.fn, obj.base)


def _resolve(base: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """The real absolute path, or :class:`~kiso.tools.paths.PathOutsideWorkspace`."""
    raw = os.fspath(path)
    if not isinstance(raw, str):
        raise KyronixTypeError(f"a path must be text, not {type(raw).__name__}")
    return resolve_in_workspace(Path(os.fspath(base)), raw)


def _is_path_safe(base: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """True when ``path`` (relative to ``base``, or absolute) really lies inside ``base``.

    NUL bytes are refused; the deepest existing ancestor is resolved with ``realpath`` (so a
    symlink, or a symlinked parent directory, that leaves the base is refused); containment is
    compared by path components, never string prefixes (``/base-evil`` is outside ``/base``).
    """
    try:
        _resolve(base, path)
    except (PathOutsideWorkspace, OSError, TypeError, ValueError):
        return False
    return True


def _check_all(base: str | os.PathLike[str], paths: Sequence[str]) -> bool:
    """True when every path (both ends of a move or copy) is safe."""
    return all(_is_path_safe(base, p) for p in paths)


class Sandbox:
    """The executer's path sandbox: :func:`kiso.tools.paths.resolve_in_workspace` underneath.

    ``Sandbox.is_path_safe(base, path)``, or bound to a base: ``Sandbox(base).is_path_safe(path)``.
    """

    def __init__(self, base: str | os.PathLike[str]) -> None:
        self.base = base

    is_path_safe = _OnBase(_is_path_safe)
    resolve = _OnBase(_resolve)
    check_all = _OnBase(_check_all)
