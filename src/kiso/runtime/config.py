"""Configuration: ``$KISO_HOME/config.json`` (user) and ``<workspace>/.kiso/config.json`` (project).

Plain JSON (a pasted ``//`` comment is a clear error, not a silent misread)::

    {
      "model": "deepseek",
      "models": {
        "deepseek": {"kind": "openai-compat", "model": "deepseek-chat",
                     "apiKeyEnv": "DEEPSEEK_API_KEY", "baseUrl": "https://api.deepseek.com"},
        "claude": {"kind": "anthropic", "model": "claude-sonnet-4-5", "promptCaching": false}
      },
      "mode": "default"
    }

Precedence, highest first: flags > environment (``KISO_MODEL``, ``KISO_MODE``) > project config >
user config > defaults. Project profiles override user profiles of the same name. Three settings are
the user's alone: ``floor`` (``"off"`` turns the catastrophe floor off), ``theme`` and
``updateCheck``; in a project config any of them is an error. A broken file fails loudly, naming
the file and the key.
Credentials never live here: a profile only *names* the environment variable holding its key.

The project layer is cloned code: callers that start runs pass it through the trust gate
(:mod:`kiso.runtime.trust`) and call :func:`load_config` with ``project=False`` when it is not
trusted, or with ``project_files`` (the bytes the gate hashed) when it is.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kiso.kernel import UsageError
from kiso.runtime.approvals import MODES
from kiso.tools.sandbox import MODES as SANDBOX_MODES
from kiso.tools.sandbox import SandboxPolicy, stricter

if TYPE_CHECKING:
    from kiso.runtime.command_hooks import CommandHookSpec
from kiso.runtime.permissions import Permissions, PermissionsError, parse_config

__all__ = [
    "KINDS",
    "MAX_WINDOW",
    "MIN_WINDOW",
    "WINDOW_RULE",
    "Config",
    "ConfigError",
    "Profile",
    "load_config",
]

KINDS = ("openai-compat", "anthropic", "openai-responses")
MIN_WINDOW = 256
"""The smallest context window a person may set (a profile's ``contextWindow`` and
``KISO_CONTEXT_WINDOW`` alike): less holds no system prompt, so it can only be a typo."""
MAX_WINDOW = 100_000_000
"""The largest: no model holds a hundred million tokens, so more is a typo too."""
WINDOW_RULE = f"a whole number of tokens, from {MIN_WINDOW} to {MAX_WINDOW:,}"
_PROFILE_KEYS = {
    "kind": "one of openai-compat, anthropic, openai-responses",
    "model": "the vendor's model id",
    "apiKeyEnv": "the NAME of the environment variable holding the key",
    "baseUrl": "an http(s) URL",
    "promptCaching": "true or false",
    "contextWindow": WINDOW_RULE,
    "effort": "an effort level the model accepts",
}
_TOP_KEYS = {
    "model",
    "models",
    "mode",
    "floor",
    "theme",
    "tasks",
    "subagents",
    "autoCompact",
    "updateCheck",
    "sandbox",
    "hooks",
    "permissions",
    "shell",
}
_USER_ONLY = {
    "floor": "the catastrophe floor",
    "theme": "the terminal theme",
    "updateCheck": "the daily check for a new kiso release",
    "shell": "which credentials the shell tool keeps (shell.passEnv)",
}


class ConfigError(UsageError):
    """A config file is unreadable or invalid; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    kind: str
    model: str
    api_key_env: str | None = None
    base_url: str | None = None
    prompt_caching: bool = False
    context_window: int | None = None
    effort: str | None = None
    source: str = "config"
    """Where the profile came from: a config file's path, "flag", "environment" or "default"."""

    @property
    def origin(self) -> str:
        """scheme://host[:port] of the endpoint this profile talks to."""
        return origin_of(self.base_url or default_base_url(self.kind))


def default_base_url(kind: str) -> str:
    return "https://api.anthropic.com" if kind == "anthropic" else "https://api.openai.com/v1"


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


@dataclass(frozen=True, slots=True)
class Config:
    model: str | None = None
    """The startup profile (or ``provider/model``), after precedence."""
    models: dict[str, Profile] = field(default_factory=dict)
    mode: str = "default"
    """The approval mode for a new session, after precedence (flag > env > project > user)."""
    mode_override: str | None = None
    """The mode from ``--mode`` or ``KISO_MODE``: it outranks what a session's log recorded."""
    floor: bool = True
    theme: str | None = None
    tasks: bool = False
    """Whether the ``update_tasks`` tool is loaded (``"tasks": true``; opt-in)."""
    subagents: bool = True
    """Whether the ``delegate`` tool is offered (``"subagents": {"enabled": false}`` turns it
    off)."""
    auto_compact: bool = True
    """Context relief on its own (``"autoCompact": false`` or ``KISO_AUTO_COMPACT=0`` turns it
    off; ``/compact`` still works): docs/context.md."""
    update_check: bool = True
    """The daily check for a newer kiso, announced under the banner (``"updateCheck": false``
    or ``KISO_NO_UPDATE_CHECK=1`` turns it off): :mod:`kiso.runtime.release`. User config only."""
    subagent_checks: dict[str, str] = field(default_factory=dict)
    """``subagents.checks``: acceptance check name to command (project names override user)."""
    pass_env: tuple[str, ...] = ()
    """``shell.passEnv``: environment variables the shell tool keeps although they look like
    credentials (``SSH_AUTH_SOCK``, ``GH_TOKEN``). User config only: docs/shell.md."""
    files: tuple[str, ...] = ()
    """The config files that were read, lowest precedence first."""
    mode_source: str = "default"
    """Where ``mode`` came from: "flag", "environment", a config file's path or "default"."""
    sandbox: SandboxPolicy = field(default_factory=SandboxPolicy)
    """The OS sandbox for commands (docs/sandbox.md): ``"sandbox"`` in the user config,
    ``KISO_SANDBOX``, ``--sandbox``; a project config may only make it stricter."""
    hooks: tuple[CommandHookSpec, ...] = ()
    """``hooks``: the command hooks, the user's then the project's (docs/extensions.md)."""
    permissions: Permissions = field(default_factory=Permissions)
    """``permissions``: the user's rules, then a trusted project's (deny and ask only):
    :mod:`kiso.runtime.permissions`. The flags' rules are added when a run is prepared."""


def _read(path: Path, raw: bytes | None = None) -> dict[str, Any] | None:
    """The JSON object in ``path`` (or in ``raw``, its bytes as already read); None if absent."""
    if raw is None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        hint = ""
        if re.search(r"(^|[\s,{\[])//|/\*", text, re.MULTILINE):
            hint = (
                " It has comments: config files are plain JSON, so remove the // and /* */ lines."
            )
        raise ConfigError(f"{path}: not valid JSON ({exc}).{hint}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a JSON object")
    return data


def _profile(path: Path, name: str, raw: Any) -> Profile:
    where = f"{path}: models.{name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be an object with at least kind and model")
    for key in raw:
        if key not in _PROFILE_KEYS:
            lowered = {k.lower(): k for k in _PROFILE_KEYS}
            close = difflib.get_close_matches(str(key).lower(), list(lowered), n=1, cutoff=0.6)
            hint = (
                f"; did you mean {lowered[close[0]]}?"
                if close
                else f"; known keys: {', '.join(_PROFILE_KEYS)}"
            )
            raise ConfigError(f"{where}.{key}: unknown key{hint}")
    kind, model = raw.get("kind"), raw.get("model")
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind: must be {_PROFILE_KEYS['kind']}, got {kind!r}")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{where}.model: must be {_PROFILE_KEYS['model']}, got {model!r}")
    env = raw.get("apiKeyEnv")
    if env is not None and (not isinstance(env, str) or not re.fullmatch(r"[A-Za-z_]\w*", env)):
        raise ConfigError(
            f"{where}.apiKeyEnv: must be {_PROFILE_KEYS['apiKeyEnv']} (never the key itself)"
        )
    base = raw.get("baseUrl")
    if base is not None and (
        not isinstance(base, str) or urlsplit(base).scheme not in ("http", "https")
    ):
        raise ConfigError(f"{where}.baseUrl: must be {_PROFILE_KEYS['baseUrl']}, got {base!r}")
    caching = raw.get("promptCaching", False)
    if not isinstance(caching, bool):
        raise ConfigError(f"{where}.promptCaching: must be true or false, got {caching!r}")
    window = raw.get("contextWindow")
    if window is not None and (
        not isinstance(window, int)
        or isinstance(window, bool)
        or not MIN_WINDOW <= window <= MAX_WINDOW
    ):
        shown = json.dumps(window)
        raise ConfigError(f"{where}.contextWindow={shown}: must be {WINDOW_RULE}")
    effort = raw.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise ConfigError(f"{where}.effort: must be a string such as low, medium or high")
    return Profile(name, kind, model, env, base, caching, window, effort, str(path))


def _layer(path: Path, *, project: bool, raw: bytes | None = None) -> dict[str, Any]:
    data = _read(path, raw)
    if data is None:
        return {}
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(
                f"{path}: unknown key {key!r}; known keys: {', '.join(sorted(_TOP_KEYS))}"
            )
        if project and key in _USER_ONLY:
            raise ConfigError(
                f"{path}: {key!r} sets {_USER_ONLY[key]}, which only your user config "
                f"(~/.kiso/config.json) may set; remove it from the project config"
            )
    out: dict[str, Any] = {}
    if "model" in data:
        if not isinstance(data["model"], str) or not data["model"]:
            raise ConfigError(f"{path}: model: must be a profile name or provider/model")
        out["model"] = data["model"]
    if "mode" in data:
        if data["mode"] not in MODES:
            raise ConfigError(
                f"{path}: mode: must be one of {', '.join(MODES)}, got {data['mode']!r}"
            )
        out["mode"] = data["mode"]
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{path}: models: must be an object of profiles")
    out["models"] = {name: _profile(path, name, raw) for name, raw in models.items()}
    if "floor" in data:
        if data["floor"] not in ("on", "off", True, False):
            raise ConfigError(f'{path}: floor: must be "on" or "off"')
        out["floor"] = data["floor"] in ("on", True)
    if "theme" in data:
        if data["theme"] not in ("dark", "light"):
            raise ConfigError(f'{path}: theme: must be "dark" or "light"')
        out["theme"] = data["theme"]
    if "tasks" in data:
        if not isinstance(data["tasks"], bool):
            raise ConfigError(f"{path}: tasks: must be true or false")
        out["tasks"] = data["tasks"]
    if "subagents" in data:
        out.update(_subagents(path, data["subagents"]))
    if "autoCompact" in data:
        if not isinstance(data["autoCompact"], bool):
            raise ConfigError(f"{path}: autoCompact: must be true or false")
        out["auto_compact"] = data["autoCompact"]
    if "sandbox" in data:
        out["sandbox"] = _sandbox(path, data["sandbox"], project=project)
    if "updateCheck" in data:
        if not isinstance(data["updateCheck"], bool):
            raise ConfigError(f"{path}: updateCheck: must be true or false")
        out["update_check"] = data["updateCheck"]
    if "hooks" in data:
        from kiso.runtime.command_hooks import parse_hooks

        out["hooks"] = parse_hooks(path, data["hooks"], project=project)
    if "permissions" in data:
        try:
            out["permissions"] = parse_config(data["permissions"], str(path), project=project)
        except PermissionsError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if "shell" in data:
        out["pass_env"] = _shell(path, data["shell"])
    return out


_SANDBOX_KEYS = ("mode", "network", "writableRoots")


def _sandbox(path: Path, raw: Any, *, project: bool) -> SandboxPolicy:
    """``"sandbox": "read-only"`` or ``{"mode": ..., "network": bool, "writableRoots": [...]}``.
    A project may only tighten: no ``off``, no network, no extra writable directories."""
    if isinstance(raw, str):
        raw = {"mode": raw}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: sandbox: must be a mode ({', '.join(SANDBOX_MODES)}) or an object such as "
            f'{{"mode": "workspace-write", "network": false}}'
        )
    unknown = sorted(set(raw) - set(_SANDBOX_KEYS))
    if unknown:
        raise ConfigError(
            f"{path}: sandbox.{unknown[0]}: unknown key; known keys: {', '.join(_SANDBOX_KEYS)}"
        )
    mode = raw.get("mode", "workspace-write")
    if mode not in SANDBOX_MODES:
        raise ConfigError(
            f"{path}: sandbox.mode: must be one of {', '.join(SANDBOX_MODES)}, got {mode!r}"
        )
    network = raw.get("network", False)
    if not isinstance(network, bool):
        raise ConfigError(f"{path}: sandbox.network: must be true or false, got {network!r}")
    roots = raw.get("writableRoots", [])
    if not isinstance(roots, list) or not all(
        isinstance(r, str) and os.path.isabs(os.path.expanduser(r)) for r in roots
    ):
        raise ConfigError(
            f"{path}: sandbox.writableRoots: must be a list of absolute directory paths"
        )
    if project and (mode == "off" or network or roots):
        loosened = (
            "turns it off"
            if mode == "off"
            else "allows the network"
            if network
            else "makes more directories writable"
        )
        raise ConfigError(
            f"{path}: sandbox: a project config may only make the sandbox stricter, and this one "
            f"{loosened}; remove it there (your own config.json in KISO_HOME, KISO_SANDBOX or "
            f"--sandbox decide that)"
        )
    # a project's policy is only compared: its network is False unless it said so explicitly,
    # which _tightened reads from its source ("network" given: the project turns it off)
    source = f"{path}#network" if project and "network" in raw else str(path)
    return SandboxPolicy(mode, network, tuple(roots), source)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _shell(path: Path, raw: Any) -> tuple[str, ...]:
    """``"shell": {"passEnv": ["SSH_AUTH_SOCK", "GH_TOKEN"]}``: the names, in order, once each."""
    if not isinstance(raw, dict):
        raise ConfigError(f'{path}: shell: must be an object such as {{"passEnv": ["GH_TOKEN"]}}')
    unknown = sorted(set(raw) - {"passEnv"})
    if unknown:
        raise ConfigError(f"{path}: shell.{unknown[0]}: unknown key; known keys: passEnv")
    names = raw.get("passEnv", [])
    if not isinstance(names, list):
        raise ConfigError(
            f"{path}: shell.passEnv: must be a list of environment variable names such as "
            f'["SSH_AUTH_SOCK", "GH_TOKEN"], got {json.dumps(names)}'
        )
    for name in names:
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ConfigError(
                f"{path}: shell.passEnv: {json.dumps(name)} is not an environment variable name "
                f"(letters, digits and _, not starting with a digit); give the NAME, never a value"
            )
    return tuple(dict.fromkeys(names))


_CHECK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _subagents(path: Path, raw: Any) -> dict[str, Any]:
    """``"subagents": {"enabled": bool, "checks": {"<name>": "<command>"}}``."""
    if not isinstance(raw, dict):
        raise ConfigError(f'{path}: subagents: must be an object such as {{"checks": {{}}}}')
    unknown = sorted(set(raw) - {"enabled", "checks"})
    if unknown:
        raise ConfigError(
            f"{path}: subagents.{unknown[0]}: unknown key; known keys: checks, enabled"
        )
    out: dict[str, Any] = {}
    if "enabled" in raw:
        if not isinstance(raw["enabled"], bool):
            raise ConfigError(f"{path}: subagents.enabled: must be true or false")
        out["subagents"] = raw["enabled"]
    checks = raw.get("checks", {})
    if not isinstance(checks, dict):
        raise ConfigError(f"{path}: subagents.checks: must be an object of name to command")
    for name, command in checks.items():
        if not _CHECK_NAME.fullmatch(name):
            raise ConfigError(
                f"{path}: subagents.checks.{name}: a check name is 1-64 letters, digits, '.', "
                f"'_' or '-', starting with a letter or digit"
            )
        if not isinstance(command, str) or not command.strip() or "\x00" in command:
            raise ConfigError(
                f"{path}: subagents.checks.{name}: must be the command line to run (a "
                f"non-empty string), got {command!r}"
            )
    out["subagent_checks"] = dict(checks)
    return out


def load_config(
    home: Path,
    workspace: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    model: str | None = None,
    mode: str | None = None,
    project: bool = True,
    project_files: Mapping[str, bytes] | None = None,
    sandbox: str | None = None,
) -> Config:
    """The effective config: ``model``/``mode`` are the flags, ``environ`` the environment.

    ``sandbox``: the ``--sandbox`` flag. ``project=False``: the user layer only (the project's
    ``.kiso/`` is not trusted).
    ``project_files``: the project's ``.kiso/`` as the trust gate read it (relative path to
    bytes); the project layer is parsed from those bytes, never re-read from disk, so what
    applies is exactly what was trusted. Without either, the project file is read from disk.
    """
    env = os.environ if environ is None else environ
    layers: list[tuple[Path, dict[str, Any], bool]] = []
    user = home / "config.json"
    layers.append((user, _layer(user, project=False), user.exists()))
    if workspace is not None and project:
        path = workspace / ".kiso" / "config.json"
        if project_files is not None:
            raw = project_files.get("config.json")
            if raw is not None:
                layers.append((path, _layer(path, project=True, raw=raw), True))
        elif path.resolve() != user.resolve():
            layers.append((path, _layer(path, project=True), path.exists()))
    merged: dict[str, Any] = {"models": {}}
    files: list[str] = []
    mode_source = "default"
    tighter: SandboxPolicy | None = None  # the project's sandbox: it only tightens
    for path, layer, present in layers:
        if layer or present:
            files.append(str(path))
        if "mode" in layer:
            mode_source = str(path)
        if layer is not layers[0][1] and "sandbox" in layer:
            tighter = layer.pop("sandbox")
        merged["models"].update(layer.pop("models", {}))
        merged.setdefault("subagent_checks", {}).update(layer.pop("subagent_checks", {}))
        merged["hooks"] = (*merged.get("hooks", ()), *layer.pop("hooks", ()))
        merged["permissions"] = merged.get("permissions", Permissions()).plus(
            layer.pop("permissions", Permissions())
        )
        merged.update(layer)
    if env.get("KISO_MODEL"):
        merged["model"] = env["KISO_MODEL"]
    if env.get("KISO_MODE"):
        merged["mode"] = env["KISO_MODE"]
        mode_source = "environment"
    if model:
        merged["model"] = model
    if mode:
        merged["mode"] = mode
        mode_source = "flag"
    if merged.get("mode", "default") not in MODES:
        raise ConfigError(f"mode {merged['mode']!r} is not one of {', '.join(MODES)}")
    override = mode or env.get("KISO_MODE") or None
    merged["sandbox"] = _chosen_sandbox(merged.get("sandbox", SandboxPolicy()), env, sandbox)
    if tighter is not None:
        merged["sandbox"] = _tightened(merged["sandbox"], tighter)
    flag = env.get("KISO_AUTO_COMPACT", "").strip().lower()
    if flag:
        if flag not in ("0", "1", "on", "off", "true", "false"):
            raise ConfigError(f"KISO_AUTO_COMPACT={flag!r}: use 1/on/true or 0/off/false")
        merged["auto_compact"] = flag in ("1", "on", "true")
    return Config(
        model=merged.get("model"),
        models=merged["models"],
        mode=merged.get("mode", "default"),
        mode_override=override,
        floor=merged.get("floor", True),
        theme=merged.get("theme"),
        tasks=merged.get("tasks", False),
        subagents=merged.get("subagents", True),
        auto_compact=merged.get("auto_compact", True),
        update_check=merged.get("update_check", True),
        subagent_checks=merged.get("subagent_checks", {}),
        pass_env=merged.get("pass_env", ()),
        files=tuple(files),
        mode_source=mode_source,
        sandbox=merged["sandbox"],
        hooks=merged["hooks"],
        permissions=merged["permissions"],
    )


def _chosen_sandbox(
    policy: SandboxPolicy, env: Mapping[str, str], flag: str | None
) -> SandboxPolicy:
    """The person's sandbox: ``--sandbox`` > ``KISO_SANDBOX`` > the user config > the default."""
    for value, source in ((flag, "flag"), (env.get("KISO_SANDBOX", "").strip(), "environment")):
        if value:
            if value not in SANDBOX_MODES:
                where = "--sandbox" if source == "flag" else "KISO_SANDBOX"
                raise ConfigError(f"{where}={value!r}: must be one of {', '.join(SANDBOX_MODES)}")
            return replace(policy, mode=value, source=source)
    return policy


def _tightened(policy: SandboxPolicy, project: SandboxPolicy) -> SandboxPolicy:
    """The stricter of the person's sandbox and the project's (which never loosens)."""
    network_off = project.source.endswith("#network")
    source = project.source.removesuffix("#network")
    if policy.on and not stricter(project.mode, policy.mode):
        return replace(policy, network=False, source=source) if network_off else policy
    return replace(project, network=False, writable_roots=policy.writable_roots, source=source)
