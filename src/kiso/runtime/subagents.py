"""The ``delegate`` tool: 1-8 tasks, each run by a child kiso process, at most 4 at a time.

Each child is an ordinary durable session (header ``parent`` = this session, ``run_started``
trigger ``subagent``) run headless by the kiso CLI of this interpreter, under
:func:`kiso.tools.shell.run_command`: a timeout, an abort of the parent, or the parent's death
(SIGKILL too) kills the child's whole process tree. Its id is derived from the parent session,
the model's call id, the task's position and its role (:func:`child_id`), so a rerun of the same
call finds the same children:

* a child whose log shows its last run ended is not run again: its result is read from its log;
* a child whose log has an open run is resumed (``kiso resume <id>``), never restarted;
* a child with no log (or no run yet) is started (``kiso -p - <id>``, the prompt on stdin).

That is why the tool is ``idempotent``: an uncertain delegation after the parent's kill -9 is
re-run without asking. Results come from each child's own log (the outcome, the final assistant
text, the number of tool calls), never from its output.

Implementers and testers work in a detached ``git worktree`` at ``$KISO_HOME/worktrees/<id>``;
the result carries ``git diff --stat`` and the diff against the commit it started from (new
files included); a worktree with changes is kept and named, and so is one whose child's run has
not ended (resuming the child needs its workspace); a clean one of an ended child is removed.
Explorers and reviewers read in the parent's workspace. The child side is
:mod:`kiso.runtime.subagent_role`. docs/subagents.md is the user's account.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiso.kernel import (
    Assistant,
    JsonlSessionStore,
    RunEnded,
    RunStarted,
    SessionNotFoundError,
    ascii_int,
    kiso_home,
)
from kiso.kernel.errors import KisoError
from kiso.runtime.subagent_role import READ_ONLY_ROLES, ROLES, WORKTREE_ROLES, scope_problem
from kiso.tools.base import Effects, Tool, ToolContext, ToolResult, define_tool
from kiso.tools.env import child_env
from kiso.tools.gitsafe import safe_git
from kiso.tools.sandbox import Sandbox, SandboxPolicy
from kiso.tools.shell import SupervisorError, run_command

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "DELEGATE_PARAMETERS",
    "MAX_PARALLEL",
    "MAX_TASKS",
    "call_fingerprint",
    "child_id",
    "delegate_tool",
    "worktree_path",
]

MAX_TASKS = 8
MAX_PARALLEL = 4
DEFAULT_TIMEOUT_MS = 600_000
_GIT_TIMEOUT_S = 120.0
_TEXT_LIMIT = 6_000
_DIFF_BUDGET = 48_000
_CHECK_TAIL = 2_000
_DROPPED_ENV = ("KISO_FAILPOINT", "KISO_FAUX_SCRIPT", "KISO_MODE")

DELEGATE_DESCRIPTION = f"""\
Run 1-{MAX_TASKS} tasks, each by a separate kiso subagent, at most {MAX_PARALLEL} at a time; \
returns each one's outcome and final report.
Roles: explorer and reviewer read and search the workspace (no writes, no shell); implementer \
and tester get every tool in a detached git worktree of this repository, and their changes \
come back as a diff (the worktree is kept when it has changes, and named).
"scope" (optional): path globs the task may write; a scoped task gets no shell.
"acceptance" (optional): the name of a check configured by the user (subagents.checks); it is \
run in the subagent's workspace once the subagent ends.
Give each task everything it needs: a subagent sees none of this conversation."""

DELEGATE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tasks": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_TASKS,
            "items": {
                "type": "object",
                "properties": {
                    "role": {"type": "string", "enum": list(ROLES)},
                    "task": {"type": "string", "minLength": 1, "maxLength": 20_000},
                    "scope": {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1},
                        "minItems": 1,
                        "maxItems": 64,
                    },
                    "acceptance": {"type": "string", "minLength": 1},
                },
                "required": ["role", "task"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["tasks"],
    "additionalProperties": False,
}

_ROLE_BRIEF = {
    "explorer": "Explore: read and search the workspace to answer the task. You cannot change "
    "anything.",
    "reviewer": "Review: read the code the task names and report problems, each with its file "
    "and line. You cannot change anything.",
    "implementer": "Implement: make the change in this workspace, a detached git worktree of "
    "the parent's repository made from its last commit. Your changes go back to the parent as "
    "a diff; do not commit them.",
    "tester": "Test: write and run tests in this workspace, a detached git worktree of the "
    "parent's repository made from its last commit. Your changes go back to the parent as a "
    "diff; do not commit them.",
}


@dataclass(frozen=True, slots=True)
class _Task:
    index: int
    """1-based position in the call."""
    role: str
    task: str
    scope: tuple[str, ...]
    acceptance: str | None
    id: str


def child_id(parent: str, call_id: str, index: int, role: str, call: str = "") -> str:
    """``sub-<parent>-<8 hex of sha256(call_id, call)>-<index>-<role>``, at most 128 characters
    (a long parent id is cut and tagged with 8 hex of its own hash, so ids stay distinct).

    ``call``: the call's tasks as it gave them (:func:`call_fingerprint`). The committed call
    gives the same id and the same input on every rerun, so a resumed delegation finds its
    children; hashing its tasks in too means a call id that repeats (a provider that omits ids)
    can never lead other tasks to an earlier call's children. One tag for the whole call, so a
    call's children sort in task order."""
    said = f"{call_id}\0{call}".encode("utf-8", "surrogateescape")
    tag = hashlib.sha256(said).hexdigest()[:8]
    tail = f"-{tag}-{index}-{role}"
    room = 128 - len("sub-") - len(tail)
    head = parent
    if len(head) > room:
        digest = hashlib.sha256(parent.encode("utf-8")).hexdigest()[:8]
        head = parent[: room - 9].rstrip("._-") + "-" + digest
    return f"sub-{head}{tail}"


def call_fingerprint(tasks: Sequence[object]) -> str:
    """A ``delegate`` call's tasks as canonical text (what :func:`child_id` hashes)."""
    return json.dumps(tasks, sort_keys=True, ensure_ascii=False)


def worktree_path(home: Path, child: str) -> Path:
    """Where a child's worktree lives: deterministic, so a rerun finds it."""
    return home / "worktrees" / child


def delegate_tool(
    *,
    checks: Mapping[str, str] | None = None,
    model: str | None = None,
    disallowed: Sequence[str] = (),
) -> Tool:
    """The ``delegate`` tool. ``checks``: the acceptance checks config defines (name to
    command); ``model``: the ``--model`` the parent was started with, passed to every child;
    ``disallowed``: the parent's ``--disallowed-tools`` patterns, passed on too (a child reads
    the config's ``permissions`` itself)."""
    defined = dict(checks or {})
    denied = tuple(disallowed)

    def execute(input: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return _Delegation(ctx, defined, model, denied).run(input)

    return define_tool(
        "delegate",
        DELEGATE_DESCRIPTION,
        DELEGATE_PARAMETERS,
        execute,
        effects=Effects.OTHER,
        idempotent=True,
    )


def _invalid(message: str) -> ToolResult:
    return ToolResult(message, is_error=True, error_kind="invalid_input")


def _precondition(message: str) -> ToolResult:
    return ToolResult(message, is_error=True, error_kind="precondition")


@dataclass(slots=True)
class _Report:
    text: str
    ok: bool
    timed_out: bool = False
    aborted: bool = False


class _Delegation:
    """One execution of ``delegate``."""

    def __init__(
        self,
        ctx: ToolContext,
        checks: dict[str, str],
        model: str | None,
        disallowed: tuple[str, ...] = (),
    ) -> None:
        self.ctx = ctx
        self.checks = checks
        self.model = model
        self.disallowed = disallowed
        self.home = kiso_home()
        self.git_lock = threading.Lock()
        self.fds: tuple[int, ...] = ()
        self.timeout_ms = DEFAULT_TIMEOUT_MS
        self.scripts: Path | None = None

    # ------------------------------------------------------------------ checking the call

    def _tasks(self, input: dict[str, Any]) -> list[_Task] | ToolResult:
        raw = input.get("tasks")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_TASKS:
            got = len(raw) if isinstance(raw, list) else type(raw).__name__
            return _invalid(f"tasks must be a list of 1 to {MAX_TASKS} tasks, got {got}")
        parent = self.ctx.session_id or "session"
        call = self.ctx.call_id or self.ctx.execution_id
        fingerprint = call_fingerprint(raw)
        tasks: list[_Task] = []
        for n, item in enumerate(raw, start=1):
            where = f"tasks[{n - 1}]"
            if not isinstance(item, dict):
                return _invalid(f"{where} must be an object with role and task")
            unknown = sorted(set(item) - {"role", "task", "scope", "acceptance"})
            if unknown:
                return _invalid(
                    f"{where}: unknown key(s) {', '.join(unknown)}; a task has role, task, "
                    f"scope and acceptance"
                )
            role, text = item.get("role"), item.get("task")
            if role not in ROLES:
                return _invalid(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
            if not isinstance(text, str) or not any(c.isalnum() for c in text):
                return _invalid(f"{where}.task must be a non-empty string saying what to do")
            scope = item.get("scope", [])
            if not isinstance(scope, list) or not all(isinstance(g, str) for g in scope):
                return _invalid(f"{where}.scope must be a list of path globs")
            for glob in scope:
                problem = scope_problem(glob)
                if problem is not None:
                    return _invalid(f"{where}.scope: {problem}")
            if scope and role in READ_ONLY_ROLES:
                article = "an" if role[0] in "aeiou" else "a"
                return _invalid(f"{where}: {article} {role} writes nothing, so it takes no scope")
            check = item.get("acceptance")
            if check is not None and not isinstance(check, str):
                return _invalid(f"{where}.acceptance must be the name of a configured check")
            if check is not None and check not in self.checks:
                defined = ", ".join(sorted(self.checks)) or "none"
                return _invalid(
                    f"{where}.acceptance: no check named {check!r} is configured (defined: "
                    f'{defined}). Checks are set by the user in config.json: "subagents": '
                    f'{{"checks": {{"{check}": "<command>"}}}}'
                )
            made = child_id(parent, call, n, role, fingerprint)
            tasks.append(_Task(n, role, text, tuple(scope), check, made))
        return tasks

    def _settings(self) -> ToolResult | None:
        raw = os.environ.get("KISO_SUBAGENT_TIMEOUT_MS", "").strip()
        if raw:
            ms = ascii_int(raw)
            if ms is None or ms < 1:
                return _precondition(
                    f"KISO_SUBAGENT_TIMEOUT_MS must be a positive number of milliseconds, got "
                    f"{raw!r}; fix or unset it"
                )
            self.timeout_ms = ms
        scripts = os.environ.get("KISO_SUBAGENT_SCRIPTS", "")
        self.scripts = Path(scripts) if scripts else None
        return None

    def _repository(self) -> str | ToolResult:
        """The parent workspace's HEAD commit, or why worktrees cannot be made from it."""
        ws = self.ctx.workspace
        why = (
            "implementer and tester tasks work in a detached git worktree of the workspace; "
            "nothing was started. Use explorer or reviewer tasks, or make the workspace a git "
            "repository with a commit"
        )
        try:
            top = safe_git(["rev-parse", "--show-toplevel"], ws, timeout=_GIT_TIMEOUT_S)
            if top.returncode != 0:
                detail = top.stderr.decode("utf-8", "replace").strip().splitlines()
                said = f" (git: {detail[-1]})" if detail else ""
                return _precondition(f"the workspace {ws} is not a git repository{said}: {why}")
            head = safe_git(["rev-parse", "--verify", "HEAD^{commit}"], ws, timeout=_GIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _precondition(f"git could not be run in {ws} ({exc}): {why}")
        if head.returncode != 0:
            return _precondition(f"the git repository at {ws} has no commit yet: {why}")
        return head.stdout.decode().strip()

    # ------------------------------------------------------------------ running

    def run(self, input: dict[str, Any]) -> ToolResult:
        tasks = self._tasks(input)
        if isinstance(tasks, ToolResult):
            return tasks
        problem = self._settings()
        if problem is not None:
            return problem
        base: str | None = None
        notes: list[str] = []
        if any(t.role in WORKTREE_ROLES for t in tasks):
            found = self._repository()
            if isinstance(found, ToolResult):
                return found
            base = found
            status = safe_git(
                ["status", "--porcelain", "--untracked-files=normal"],
                self.ctx.workspace,
                timeout=_GIT_TIMEOUT_S,
            )
            if status.returncode == 0 and status.stdout.strip():
                notes.append(
                    f"note: the workspace has uncommitted changes; worktrees are made from "
                    f"commit {base[:12]} and do not include them"
                )
        if self.ctx.cancelled():
            return ToolResult("aborted before any subagent started", True, "aborted")
        self.fds = self.ctx.inherit_fds  # made once, here, before the worker threads
        with ThreadPoolExecutor(MAX_PARALLEL, thread_name_prefix="kiso-delegate") as pool:
            reports = list(pool.map(lambda t: self._one(t, base, len(tasks)), tasks))
        done = sum(r.ok for r in reports)
        head = f"{done} of {len(tasks)} subagent tasks completed"
        content = "\n\n".join([head, *notes, *(r.text for r in reports)])
        if any(r.aborted for r in reports):
            return ToolResult(content, True, "aborted")
        if any(r.timed_out for r in reports):
            return ToolResult(content, True, "timeout")
        return ToolResult(content, is_error=done < len(tasks))

    def _one(self, task: _Task, base: str | None, count: int) -> _Report:
        title = f"## task {task.index} · {task.role} · session {task.id}"
        if self.ctx.cancelled():
            return _Report(f"{title}\nnot started: the delegation was aborted", False, aborted=True)
        try:
            return self._child(task, base, count, title)
        except (KisoError, OSError, subprocess.SubprocessError) as exc:
            return _Report(f"{title}\nfailed: {exc}", False)

    def _child(self, task: _Task, base: str | None, count: int, title: str) -> _Report:
        ws = self.ctx.workspace
        tree: Path | None = None
        if task.role in WORKTREE_ROLES:
            assert base is not None
            tree = self._worktree(task.id, base)
            ws = tree
        store = JsonlSessionStore(self.home)
        state = _state(store, task.id)
        lines = [title]
        code: int | None = None
        timed_out = aborted = False
        tail = ""
        if state != "ended":
            self.ctx.progress(f"subagent {task.index} ({task.role}): {state} {task.id}\n")
            argv = self._argv(task, resume=state == "open")
            command = shlex.join(argv)
            prompt = self._prompt_path(task)
            try:
                if state != "open":
                    self._write_prompt(task, prompt)
                    command += f" < {shlex.quote(str(prompt))}"
                done = run_command(
                    command,
                    cwd=ws,
                    env=self._env(task, count),
                    timeout_ms=self.timeout_ms,
                    cancelled=self.ctx.cancelled,
                    output_limit=4_000,
                    pass_fds=self.fds,
                )
            except SupervisorError as exc:
                return _Report(f"{title}\nthe subagent's supervisor was stopped: {exc}", False)
            finally:  # also a file a killed parent left (the same child's path)
                prompt.unlink(missing_ok=True)
            code, timed_out, aborted, tail = (
                done.exit_code,
                done.timed_out,
                done.cancelled,
                done.output,
            )
            if state == "open":
                lines.append("resumed: its run had not ended")
        else:
            lines.append("already finished: read from its log, not run again")
        summary = _summary(store, task.id)
        ok = False
        if summary is None:
            lines.append("the subagent did not start a session" + _why(tail, code))
        else:
            outcome, text, calls = summary
            ok = outcome == "completed"
            if timed_out:
                lines.append(
                    f"timed out after {self.timeout_ms} ms (KISO_SUBAGENT_TIMEOUT_MS): its "
                    f"processes were killed; its run is open, and delegating the same task again "
                    f"from this call resumes it"
                )
            elif aborted:
                lines.append("aborted with the parent's run: its processes were killed")
            lines.append(f"outcome: {outcome or 'not ended'} · {calls} tool call(s)")
            if outcome is None and not (timed_out or aborted):
                lines.append("its run did not end" + _why(tail, code))
            if text:
                lines += ["final report:", _cut(text, _TEXT_LIMIT)]
        if tree is not None:
            assert base is not None
            changes, dirty = self._diff(tree, base, max(4_000, _DIFF_BUDGET // count))
            if task.acceptance is not None and not (timed_out or aborted):
                passed, check_text = self._check(task, tree)
                ok = ok and passed
                lines.append(check_text)
            lines += self._keep_or_remove(task.id, tree, base, (changes, dirty), store)
        elif task.acceptance is not None and not (timed_out or aborted):
            passed, check_text = self._check(task, ws)
            ok = ok and passed
            lines.append(check_text)
        return _Report("\n".join(lines), ok, timed_out=timed_out, aborted=aborted)

    def _keep_or_remove(
        self, child: str, tree: Path, base: str, diff: tuple[str, bool], store: JsonlSessionStore
    ) -> list[str]:
        """A worktree with changes is kept; so is one whose child's run has not ended (timed
        out, aborted, stopped on an uncertain execution): the child's session belongs to that
        workspace, and resuming it (or ruling on it) needs it there. Only a clean worktree of a
        child whose run ended is removed."""
        changes, dirty = diff
        made = f"{tree}, made from commit {base[:12]}"
        state = _state(store, child)
        # open: resume it there; a log with no run yet (killed before its first turn) is found
        # there too by the next delegation of this call
        open_run = state == "open" or (state == "new" and _has_log(store, child))
        home = f"KISO_HOME={shlex.quote(str(self.home))} " if "KISO_HOME" in os.environ else ""
        resume = f"resume it with: cd {shlex.quote(str(tree))} && {home}kiso resume {child}"
        if dirty:
            why = "it has changes; its run has not ended" if open_run else "it has changes"
            apply = f"apply it with: git -C {tree} diff {base[:12]} | git apply"
            lines = [f"worktree kept ({why}): {made}; {apply}"]
            if open_run:
                lines.append(resume)
            return [*lines, "diff:", changes]
        if open_run:
            return [f"worktree kept (its run has not ended; no changes yet): {made}; {resume}"]
        self._remove(tree)
        return ["worktree removed: no changes"]

    def _argv(self, task: _Task, *, resume: bool) -> list[str]:
        argv = [sys.executable, "-P", "-m", "kiso.cli"]
        if resume:
            argv += ["resume", task.id]
        else:
            argv += ["-p", "-", task.id]  # the prompt comes on stdin: see _prompt_file
        argv += ["--mode", "default", "--output-format", "json"]
        if self.model:
            argv += ["--model", self.model]
        for pattern in self.disallowed:
            argv += ["--disallowed-tools", pattern]
        # the child's commands are contained as the parent's are (docs/sandbox.md)
        argv += ["--sandbox", self.ctx.sandbox.mode if self.ctx.sandbox is not None else "off"]
        return argv

    def _prompt_path(self, task: _Task) -> Path:
        """Where the child's prompt waits for it: ``$KISO_HOME/subagents/<child id>.prompt``,
        one path a child, so a file a killed parent left is found and removed next time."""
        return self.home / "subagents" / f"{task.id}.prompt"

    def _write_prompt(self, task: _Task, path: Path) -> None:
        """The child's prompt in a private file, read by ``kiso -p -`` from its stdin. Never on
        the command line: a task that starts with ``-`` (``--mode=bypass``) would be read as an
        option there. And piped text is sent as it came, so an ``@path`` in the model's task
        text attaches no file (a person's typed prompt does that; docs/attachments.md)."""
        where = path.parent
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = os.lstat(where)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
            raise KisoError(
                f"{where} is not a directory of this user's (a link, or someone else's); "
                f"remove it so kiso can make its own"
            )
        if found.st_mode & 0o077:
            os.chmod(where, 0o700)  # nobody else may swap a prompt in before the child reads it
        path.unlink(missing_ok=True)  # never write through a link someone put there
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(_prompt(task, self.ctx.session_id, self.checks))

    def _env(self, task: _Task, count: int) -> dict[str, str]:
        """This process's environment, credentials included on purpose (the child must reach
        the model), minus what belongs to this process alone."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _DROPPED_ENV and not k.startswith("KISO_SUBAGENT_")
        }
        env.update(
            {
                "KISO_SUBAGENT_DEPTH": "1",
                "KISO_SUBAGENT_ROLE": task.role,
                "KISO_SUBAGENT_PARENT": self.ctx.session_id,
                "KISO_SUBAGENT_SCOPE": json.dumps(list(task.scope)),
                "KISO_HOME": str(self.home),
            }
        )
        if self.scripts is not None:
            for name in (f"{task.id}.json", f"{task.index}.json"):
                if (self.scripts / name).is_file():
                    env["KISO_FAUX_SCRIPT"] = str(self.scripts / name)
                    break
        return env

    # ------------------------------------------------------------------ worktrees

    def _worktree(self, child: str, base: str) -> Path:
        tree = worktree_path(self.home, child)
        marker = tree.with_name(f"{child}.base")
        with self.git_lock:  # git's own worktree bookkeeping is not made for concurrency
            if tree.is_dir() and (tree / ".git").exists():
                return tree
            tree.parent.mkdir(parents=True, exist_ok=True)
            safe_git(["worktree", "prune"], self.ctx.workspace, timeout=_GIT_TIMEOUT_S)
            made = safe_git(
                ["worktree", "add", "--detach", str(tree), base],
                self.ctx.workspace,
                timeout=_GIT_TIMEOUT_S,
            )
            if made.returncode != 0:
                said = made.stderr.decode("utf-8", "replace").strip()
                raise OSError(f"git worktree add {tree} failed: {said[-500:]}")
            marker.write_text(base + "\n", encoding="utf-8")
        return tree

    def _diff(self, tree: Path, fallback: str, limit: int) -> tuple[str, bool]:
        """``git diff --stat`` then the diff against the worktree's starting commit, new files
        included; and whether there is anything at all."""
        marker = tree.with_name(f"{tree.name}.base")
        try:
            base = marker.read_text(encoding="utf-8").strip() or fallback
        except OSError:
            base = fallback
        untracked = safe_git(
            ["ls-files", "--others", "--exclude-standard", "-z"], tree, timeout=_GIT_TIMEOUT_S
        )
        new = [p for p in untracked.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
        if new:  # intent-to-add, so the diff shows them (in the worktree's own index)
            safe_git(["add", "--intent-to-add", "--", *new], tree, timeout=_GIT_TIMEOUT_S)
        flags = ["--no-color", "--no-ext-diff", "--no-textconv"]
        stat = safe_git(["diff", *flags, "--stat", base], tree, timeout=_GIT_TIMEOUT_S)
        patch = safe_git(["diff", *flags, base], tree, timeout=_GIT_TIMEOUT_S)
        stat_text = stat.stdout.decode("utf-8", "replace").rstrip()
        patch_text = patch.stdout.decode("utf-8", "replace")
        if not stat_text and not patch_text.strip():
            return "", False
        if len(patch_text) > limit:
            omitted = len(patch_text) - limit
            patch_text = (
                patch_text[:limit].rstrip("\n")
                + f"\n[... {omitted:,} more characters of diff; the whole change is in {tree} "
                f"(git -C {tree} diff {base[:12]}) ...]"
            )
        return f"{stat_text}\n\n{patch_text.rstrip()}", True

    def _remove(self, tree: Path) -> None:
        with self.git_lock:
            safe_git(
                ["worktree", "remove", "--force", str(tree)],
                self.ctx.workspace,
                timeout=_GIT_TIMEOUT_S,
            )
            if tree.exists():
                shutil.rmtree(tree, ignore_errors=True)
            safe_git(["worktree", "prune"], self.ctx.workspace, timeout=_GIT_TIMEOUT_S)
            tree.with_name(f"{tree.name}.base").unlink(missing_ok=True)

    # ------------------------------------------------------------------ acceptance

    def _check(self, task: _Task, where: Path) -> tuple[bool, str]:
        name = task.acceptance
        assert name is not None
        command = self.checks[name]
        env = dict(self.ctx.env) if self.ctx.env else child_env(os.environ)
        # the check runs code the child just wrote: in the sandbox the child's commands ran in
        parent = self.ctx.sandbox
        box = None
        if parent is not None:
            policy = SandboxPolicy(parent.mode, parent.network)
            box = Sandbox.for_workspace(policy, where, temp_parent=self.home)
        try:
            done = run_command(
                command,
                cwd=where,
                env=env,
                timeout_ms=self.timeout_ms,
                cancelled=self.ctx.cancelled,
                output_limit=_CHECK_TAIL * 2,
                pass_fds=self.fds,
                sandbox=box,
            )
        except OSError as exc:
            return False, f"acceptance {name!r} ({command}): could not run: {exc}"
        if done.timed_out or done.cancelled:
            why = "timed out" if done.timed_out else "aborted"
            return False, f"acceptance {name!r} ({command}): {why}"
        passed = done.exit_code == 0
        verdict = "passed" if passed else "FAILED"
        out = done.output.strip()
        tail = _cut_head(out, _CHECK_TAIL) if out else "(no output)"
        return passed, f"acceptance {name!r} ({command}): {verdict}, exit {done.exit_code}\n{tail}"


def _state(store: JsonlSessionStore, child: str) -> str:
    """``new`` (no log, or no run yet), ``open`` (its last run has not ended) or ``ended``."""
    try:
        events = store.load(child).events
    except SessionNotFoundError:
        return "new"
    runs = [e.run for e in events if isinstance(e, RunStarted)]
    if not runs:
        return "new"
    ended = {e.run for e in events if isinstance(e, RunEnded)}
    return "ended" if runs[-1] in ended else "open"


def _has_log(store: JsonlSessionStore, child: str) -> bool:
    try:
        store.load(child)
    except SessionNotFoundError:
        return False
    return True


def _summary(store: JsonlSessionStore, child: str) -> tuple[str | None, str, int] | None:
    """From the child's log: its last run's outcome (None while open), its final assistant
    text and how many tool calls it made; None when it has no session."""
    try:
        events = store.load(child).events
    except SessionNotFoundError:
        return None
    runs = [e.run for e in events if isinstance(e, RunStarted)]
    outcome = None
    for event in events:
        if isinstance(event, RunEnded) and runs and event.run == runs[-1]:
            out = event.outcome
            outcome = out.kind if out.kind != "error" else f"error ({out.code}: {out.message})"
    turns = [e for e in events if isinstance(e, Assistant)]
    text = next((t.text for t in reversed(turns) if t.text.strip()), "")
    return outcome, text, sum(len(t.calls) for t in turns)


def _prompt(task: _Task, parent: str, checks: Mapping[str, str]) -> str:
    """The child's prompt; its first line is the task's own (what ``kiso sessions`` lists)."""
    first, _, rest = task.task.strip().partition("\n")
    parts = [
        first,
        *([rest.strip()] if rest.strip() else []),
        f"You are {'an' if task.role[0] in 'aeiou' else 'a'} {task.role} subagent of kiso "
        f"session {parent}, working on the task above alone: nobody will answer questions, "
        f"and you cannot delegate.",
        _ROLE_BRIEF[task.role],
    ]
    if task.scope:
        parts.append(
            "You may write only these paths (globs relative to the workspace): "
            + ", ".join(task.scope)
            + ". Writes elsewhere are denied, and there is no shell."
        )
    if task.acceptance is not None:
        parts.append(
            f"When you finish, the parent runs the check {task.acceptance!r} "
            f"(`{checks[task.acceptance]}`) in your workspace."
        )
    parts.append("End with a short report: what you did or found, and anything left undone.")
    return "\n\n".join(parts)


def _why(tail: str, code: int | None) -> str:
    said = tail.strip()
    where = f" (exit {code})" if code is not None else ""
    return f"{where}: {_cut_head(said, 1_500)}" if said else where


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f"\n[... {len(text) - limit:,} more characters ...]"


def _cut_head(text: str, limit: int) -> str:
    """The last ``limit`` characters (an output's tail says how it ended)."""
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit:,} characters omitted ...]\n" + text[-limit:]
