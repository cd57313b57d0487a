"""Command hooks: shell commands from config that run at three hook points of a run.

``hooks`` in ``$KISO_HOME/config.json`` and in a trusted project's ``.kiso/config.json``::

    "hooks": {
      "before_tool": [{"matcher": "shell", "command": "./scripts/check.sh", "timeout": 10}],
      "after_tool": [{"matcher": "edit_file|write_file",
                      "command": "ruff format \\"$KISO_TOOL_PATH\\""}],
      "run_end": [{"command": "notify-send 'kiso is done'"}]
    }

Each entry is a ``command`` (run as ``bash -c command``, ``sh`` without bash, in the workspace),
an optional ``matcher`` (a regular expression that must match the *whole* tool name; absent,
``""`` or ``"*"`` matches every tool; ``run_end`` has none) and an optional ``timeout`` in
seconds (default 60, at most 600). The user's hooks run first, then the project's; both run.

A hook is given the event as JSON on stdin, and the environment of the ``shell`` tool (credentials
stripped, :func:`kiso.tools.env.child_env`) plus ``KISO_HOOK_EVENT``, ``KISO_SESSION_ID``,
``KISO_RUN_ID``, ``KISO_WORKSPACE`` and, for the tool events, ``KISO_TOOL_NAME``,
``KISO_CALL_ID`` and ``KISO_TOOL_PATH`` (the input's ``path``, when it has one).

What a hook says (Claude Code's protocol):

=============================  =================================================================
exit 0                         abstain; for ``before_tool`` stdout may be JSON
                               ``{"decision": "deny"|"ask", "reason": "..."}``; for
                               ``after_tool`` stdout (up to 8 KiB) is added to the tool result
exit 2                         ``before_tool``: deny, stderr is the reason the model is told;
                               ``after_tool``: stderr is added to the tool result
any other exit, or a timeout   a loud failure: reported, recorded, and for ``before_tool`` an ask
=============================  =================================================================

A hook never allows: ``{"decision": "allow"}`` is refused loudly and counts as nothing, and every
command hook is ``constrain_only`` (:func:`kiso.runtime.approvals.compose`), so it can ask about
or deny what the floor, the mode or a rule would allow, never the reverse. A ``before_tool``
hook is named ``hook:before_tool[<i>]:<command head>`` (``decided_by`` of its verdicts); it runs
once per call (a call with a verdict on disk is never put to the hooks again). An ``after_tool``
hook never changes whether the result is an error. A ``run_end`` hook runs once ``run_ended`` is
durable; what it does never changes the outcome.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from kiso.kernel import Outcome, ToolCall
from kiso.runtime.config import ConfigError
from kiso.runtime.hooks import CallContext, Hook, RunInfo, Verdict
from kiso.tools.base import ToolResult
from kiso.tools.env import child_env
from kiso.tools.sandbox import Sandbox
from kiso.tools.shell import run_command

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EVENTS",
    "MAX_TIMEOUT_S",
    "OUTPUT_LIMIT",
    "CommandHookSpec",
    "CommandHooks",
    "HookRun",
    "after_tool_text",
    "before_tool_verdict",
    "describe_hooks",
    "parse_hooks",
    "route_reports",
]

Event = Literal["before_tool", "after_tool", "run_end"]
EVENTS: tuple[Event, ...] = ("before_tool", "after_tool", "run_end")
DEFAULT_TIMEOUT_S = 60
MAX_TIMEOUT_S = 600
OUTPUT_LIMIT = 8192
"""What of a hook's stdout (and stderr) is kept: the head and the tail, 8 KiB in all."""
_REASON_LIMIT = 2000
_ENTRY_KEYS = {
    "command": "the command line to run (a non-empty string)",
    "matcher": "a regular expression matching the whole tool name (absent or * for every tool)",
    "timeout": f"seconds, more than 0 and at most {MAX_TIMEOUT_S} (default {DEFAULT_TIMEOUT_S})",
    "sandbox": "true (the default: the session's OS sandbox) or false (your own config only)",
}


@dataclass(frozen=True, slots=True)
class CommandHookSpec:
    """One entry of ``hooks`` in a config file."""

    event: Event
    command: str
    matcher: str | None = None
    """A regular expression the whole tool name must match; None matches every tool."""
    timeout: float = DEFAULT_TIMEOUT_S
    source: str = ""
    """The config file it came from."""
    sandbox: bool = True
    """Run in the session's OS sandbox (docs/sandbox.md): a hook often runs a script of the
    workspace, which the model can rewrite. ``false`` only in the user's own config."""

    def matches(self, tool: str) -> bool:
        return self.matcher is None or re.fullmatch(self.matcher, tool) is not None


# ----------------------------------------------------------------------------------- parsing


def parse_hooks(path: Path, raw: Any, *, project: bool = False) -> tuple[CommandHookSpec, ...]:
    """The ``hooks`` of the config file ``path``; anything wrong is a :class:`ConfigError`
    naming the file and the key. ``project``: a project's config, whose hooks stay sandboxed."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f'{path}: hooks: must be an object such as {{"before_tool": [{{"command": "..."}}]}}'
        )
    specs: list[CommandHookSpec] = []
    for event, entries in raw.items():
        if event not in EVENTS:
            close = difflib.get_close_matches(str(event), EVENTS, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(EVENTS)}"
            raise ConfigError(f"{path}: hooks.{event}: unknown hook event; {hint}")
        if not isinstance(entries, list):
            raise ConfigError(
                f'{path}: hooks.{event}: must be a list of hooks such as [{{"command": "..."}}]'
            )
        for i, entry in enumerate(entries):
            specs.append(_entry(path, event, i, entry, project))
    return tuple(specs)


def _entry(path: Path, event: Event, i: int, raw: Any, project: bool) -> CommandHookSpec:
    where = f"{path}: hooks.{event}[{i}]"
    if not isinstance(raw, dict):
        raise ConfigError(f'{where}: must be an object such as {{"command": "..."}}')
    known = [k for k in _ENTRY_KEYS if not (event == "run_end" and k == "matcher")]
    for key in raw:
        if key == "matcher" and event == "run_end":
            raise ConfigError(f"{where}.matcher: run_end hooks have no matcher; remove it")
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(known)}"
            raise ConfigError(f"{where}.{key}: unknown key; {hint}")
    command = raw.get("command")
    if not isinstance(command, str) or not command.strip() or "\x00" in command:
        raise ConfigError(f"{where}.command: must be {_ENTRY_KEYS['command']}, got {command!r}")
    matcher = raw.get("matcher")
    if matcher is not None:
        if not isinstance(matcher, str):
            raise ConfigError(f"{where}.matcher: must be {_ENTRY_KEYS['matcher']}")
        if matcher.strip() in ("", "*"):
            matcher = None
        else:
            try:
                re.compile(matcher)
            except re.error as exc:
                raise ConfigError(
                    f"{where}.matcher: {matcher!r} is not a regular expression ({exc}); "
                    f"use e.g. edit_file|write_file"
                ) from None
    timeout = raw.get("timeout", DEFAULT_TIMEOUT_S)
    if (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or not 0 < timeout <= MAX_TIMEOUT_S
    ):
        raise ConfigError(
            f"{where}.timeout: must be {_ENTRY_KEYS['timeout']}, got {json.dumps(timeout)}"
        )
    sandboxed = raw.get("sandbox", True)
    if not isinstance(sandboxed, bool):
        raise ConfigError(f"{where}.sandbox: must be {_ENTRY_KEYS['sandbox']}")
    if project and not sandboxed:
        raise ConfigError(
            f"{where}.sandbox: a project's hook always runs in the sandbox; remove the key "
            f"(only your own config may run a hook outside it)"
        )
    return CommandHookSpec(event, command, matcher, float(timeout), str(path), sandboxed)


def describe_hooks(raw: bytes) -> list[str]:
    """The commands a config file's bytes would run as hooks, one line each (for the trust
    question); nothing when it holds none or is not valid (loading it says why)."""
    try:
        data = json.loads(raw.decode("utf-8"))
        specs = parse_hooks(Path("config.json"), data["hooks"]) if isinstance(data, dict) else ()
    except (ValueError, KeyError, ConfigError):
        return []
    return [f"{s.event}{f' ({s.matcher})' if s.matcher else ''}: {s.command}" for s in specs]


# ----------------------------------------------------------------------------------- deciding


@dataclass(frozen=True, slots=True)
class HookRun:
    """What one hook command did."""

    exit_code: int | None
    """None when it was killed (timeout) or could not start."""
    stdout: str
    stderr: str
    timed_out: bool = False
    error: str | None = None
    """Why it could not start."""


def _failure(run: HookRun, timeout: float, ok: tuple[int, ...] = (0, 2)) -> str | None:
    """How the run failed (a timeout, no start, an exit not in ``ok``), or None."""
    if run.error is not None:
        return f"could not start ({run.error})"
    if run.timed_out:
        return f"timed out after {_seconds(timeout)}s and was killed"
    if run.exit_code not in ok:
        said = _bounded(run.stderr.strip(), _REASON_LIMIT) or _bounded(run.stdout.strip(), 500)
        return f"failed (exit {run.exit_code})" + (f": {said}" if said else "")
    return None


def before_tool_verdict(
    name: str, run: HookRun, timeout: float
) -> tuple[Verdict | None, str | None]:
    """A ``before_tool`` hook's verdict (None: it abstains) and a warning for the person, if
    something about it must be loud (a failure, an allow it may not give, bad JSON)."""
    failed = _failure(run, timeout)
    if failed is not None:
        said = f"{failed}; it counts as an ask"
        return Verdict("ask", name, f"the hook {said}"), f"{name} {said}"
    if run.exit_code == 2:
        why = _bounded(run.stderr.strip(), _REASON_LIMIT)
        return Verdict("deny", name, why or f"denied by the hook {name} (exit 2)"), None
    out = run.stdout.strip()
    if not out.startswith("{"):
        return None, None
    try:
        said = json.loads(out)
    except ValueError as exc:  # it meant to say something and the words are broken
        problem = f"its output starts like JSON and is not ({exc})"
        return Verdict("ask", name, f"the hook failed: {problem}; it counts as an ask"), (
            f"{name} failed: {problem}; it counts as an ask"
        )
    if not isinstance(said, dict) or "decision" not in said:
        return None, None
    decision, reason = said.get("decision"), said.get("reason")
    reason = _bounded(reason.strip(), _REASON_LIMIT) if isinstance(reason, str) else None
    if decision == "allow":
        return None, f"{name} said allow, which a hook may never do; it counts as no opinion"
    if decision in ("deny", "ask"):
        return Verdict(decision, name, reason or f"the hook {name} said {decision}"), None
    problem = f'its decision {json.dumps(decision)} is not "deny" or "ask"'
    return Verdict("ask", name, f"the hook failed: {problem}; it counts as an ask"), (
        f"{name} failed: {problem}; it counts as an ask"
    )


def after_tool_text(name: str, run: HookRun, timeout: float) -> tuple[str | None, str | None]:
    """What an ``after_tool`` hook adds to the tool result (marked as the hook's), and a warning
    for the person when it failed."""
    failed = _failure(run, timeout)
    if failed is not None:
        return f"[{name} {failed}]", f"{name} {failed} (noted in the tool result)"
    said = (run.stderr if run.exit_code == 2 else run.stdout).strip()
    if not said:
        return None, None
    return f"[{name} said]\n{_bounded(said, OUTPUT_LIMIT)}", None


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


def _seconds(t: float) -> str:
    return str(int(t)) if t == int(t) else str(t)


def _head(command: str, limit: int = 40) -> str:
    line = " ".join(command.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ----------------------------------------------------------------------------------- running


Report = Callable[[str], None]


def _stderr_report(message: str) -> None:
    print(f"kiso: {message}", file=sys.stderr, flush=True)


class _Runner:
    """Runs hook commands: the event on stdin, the child environment, the workspace."""

    def __init__(
        self,
        workspace: Path,
        strip_env: Iterable[str],
        environ: Mapping[str, str] | None,
        report: Report,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.workspace = workspace
        self.strip_env = tuple(strip_env)
        self.environ = environ
        self.report = report
        self.shell = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"

    def run(self, spec: CommandHookSpec, event: dict[str, Any], extra: dict[str, str]) -> HookRun:
        env = child_env(
            os.environ if self.environ is None else self.environ,
            self.strip_env,
            extra={"KISO_HOOK_EVENT": spec.event, "KISO_WORKSPACE": str(self.workspace), **extra},
        )
        with tempfile.TemporaryDirectory(prefix="kiso-hook-") as private:  # mode 0700
            stdin, stderr = Path(private) / "event.json", Path(private) / "stderr"
            stdin.write_text(json.dumps(event, ensure_ascii=False), encoding="utf-8")
            wrapped = (
                f"exec {self.shell} -c {shlex.quote(spec.command)} "
                f"< {shlex.quote(str(stdin))} 2> {shlex.quote(str(stderr))}"
            )
            box = self.sandbox if spec.sandbox else None
            if box is not None:  # the event and stderr files are the hook's, even read-only
                box = replace(box, writable=(*box.writable, Path(os.path.realpath(private))))
            try:
                done = run_command(
                    wrapped,
                    cwd=self.workspace,
                    env=env,
                    timeout_ms=max(1, int(spec.timeout * 1000)),
                    output_limit=OUTPUT_LIMIT,
                    sandbox=box,
                )
            except OSError as exc:
                return HookRun(None, "", "", error=str(exc))
            err = _read_bounded(stderr)
        return HookRun(done.exit_code, done.output, err, timed_out=done.timed_out)


def _read_bounded(path: Path) -> str:
    try:
        with path.open("rb") as f:
            head = f.read(OUTPUT_LIMIT // 2)
            size = os.fstat(f.fileno()).st_size
            if size <= OUTPUT_LIMIT:
                data = head + f.read()
            else:
                f.seek(size - OUTPUT_LIMIT // 2)
                omitted = size - OUTPUT_LIMIT
                data = head + f"\n[... {omitted} bytes omitted ...]\n".encode() + f.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def _tool_vars(call: ToolCall) -> dict[str, str]:
    out = {"KISO_TOOL_NAME": call.name, "KISO_CALL_ID": call.call_id}
    path = call.input.get("path")
    if isinstance(path, str) and "\x00" not in path:
        out["KISO_TOOL_PATH"] = path
    return out


class _CommandHook(Hook):
    constrain_only = True

    def __init__(self, spec: CommandHookSpec, index: int, runner: _Runner) -> None:
        self.spec = spec
        self.runner = runner
        self.name = f"hook:{spec.event}[{index}]:{_head(spec.command)}"


class BeforeToolHook(_CommandHook):
    """A ``before_tool`` command: deny, ask or abstain (never allow)."""

    def __init__(self, spec: CommandHookSpec, index: int, runner: _Runner) -> None:
        super().__init__(spec, index, runner)
        self._said: dict[tuple[str, str], Verdict | None] = {}
        """What it said per call: the chain may be composed again for the same call (the modes
        that would allow it, for a headless denial), and a hook runs once per call."""

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        call = ctx.call
        if not self.spec.matches(call.name):
            return None
        key = (call.call_id, json.dumps(call.input, sort_keys=True, default=str))
        if key in self._said:
            return self._said[key]
        event = {
            "event": "before_tool",
            "session_id": ctx.session_id,
            "run_id": ctx.run_id,
            "workspace": str(ctx.workspace),
            "mode": ctx.mode,
            "tool": call.name,
            "input": call.input,
            "call_id": call.call_id,
        }
        extra = {"KISO_SESSION_ID": ctx.session_id, "KISO_RUN_ID": ctx.run_id, **_tool_vars(call)}
        run = self.runner.run(self.spec, event, extra)
        verdict, warning = before_tool_verdict(self.name, run, self.spec.timeout)
        if warning is None and verdict is not None and verdict.decision == "ask":
            warning = f"{self.name} asks about this {call.name} call: {verdict.reason}"
        if warning is not None:  # the question's panel has no room for why: said beside it
            self.runner.report(warning)
        if len(self._said) >= 256:
            self._said.clear()
        self._said[key] = verdict
        return verdict


class AfterToolHook(_CommandHook):
    """An ``after_tool`` command: what it says is added to the tool result."""

    def after_tool(self, call: ToolCall, result: ToolResult, run: RunInfo) -> ToolResult | None:
        if not self.spec.matches(call.name):
            return None
        event = {
            "event": "after_tool",
            "session_id": run.session_id,
            "run_id": run.run_id,
            "workspace": str(run.workspace),
            "mode": run.mode,
            "tool": call.name,
            "input": call.input,
            "call_id": call.call_id,
            "result": {"content": result.content, "is_error": result.is_error},
        }
        extra = {"KISO_SESSION_ID": run.session_id, "KISO_RUN_ID": run.run_id, **_tool_vars(call)}
        done = self.runner.run(self.spec, event, extra)
        text, warning = after_tool_text(self.name, done, self.spec.timeout)
        if warning is not None:
            self.runner.report(warning)
        if text is None:
            return None
        joined = f"{result.content}\n\n{text}" if result.content else text
        return dataclasses.replace(result, content=joined)


class RunEndHook(_CommandHook):
    """A ``run_end`` command: told the outcome; a failure is reported, never raised."""

    def on_run_end(self, outcome: Outcome, run: RunInfo) -> None:
        event = {
            "event": "run_end",
            "session_id": run.session_id,
            "run_id": run.run_id,
            "workspace": str(run.workspace),
            "mode": run.mode,
            "outcome": outcome.to_json(),
        }
        extra = {"KISO_SESSION_ID": run.session_id, "KISO_RUN_ID": run.run_id}
        done = self.runner.run(self.spec, event, extra)
        failed = _failure(done, self.spec.timeout, ok=(0,))  # nothing to deny: 2 is a failure
        if failed is not None:
            self.runner.report(f"{self.name} {failed} (the run's outcome stands)")


def route_reports(hooks: Iterable[Hook], report: Report) -> None:
    """Send what the command hooks among ``hooks`` say out loud to ``report`` from now on (the
    interactive session shows it above its prompt instead of on stderr)."""
    for hook in hooks:
        if isinstance(hook, _CommandHook):
            hook.runner.report = report


_KINDS: dict[str, type[_CommandHook]] = {
    "before_tool": BeforeToolHook,
    "after_tool": AfterToolHook,
    "run_end": RunEndHook,
}


class CommandHooks:
    """The config's command hooks as runtime hooks (:mod:`kiso.runtime.hooks`), in order."""

    def __init__(
        self,
        specs: Sequence[CommandHookSpec],
        *,
        workspace: Path,
        strip_env: Iterable[str] = (),
        environ: Mapping[str, str] | None = None,
        report: Report | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.specs = tuple(specs)
        runner = _Runner(workspace, strip_env, environ, report or _stderr_report, sandbox)
        counts: dict[str, int] = {}
        self.hooks: list[Hook] = []
        for spec in self.specs:
            index = counts.get(spec.event, 0)
            counts[spec.event] = index + 1
            self.hooks.append(_KINDS[spec.event](spec, index, runner))

    def notices(self) -> list[str]:
        """``hooks: before_tool 1, run_end 1 (from …)``: what runs, and from which files."""
        if not self.specs:
            return []
        counts: dict[str, int] = {}
        for spec in self.specs:
            counts[spec.event] = counts.get(spec.event, 0) + 1
        sources = sorted({s.source for s in self.specs})
        return [
            "hooks: "
            + ", ".join(f"{event} {n}" for event, n in counts.items())
            + f" (from {', '.join(sources)})"
        ]
