"""The ``kiso`` command.

Startup stays light: this module imports only click and the standard library at import time;
each command imports what it needs when it runs, and provider SDKs are never imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from kiso._version import __version__

if TYPE_CHECKING:
    from kiso.cli.print_mode import PromptInput
    from kiso.cli.setup import RunOptions


class _KisoGroup(click.Group):
    """``kiso <sessionId>`` means ``kiso chat <sessionId>``: a first word that is not a command
    is a session id (or, when it is several words, the first prompt)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "chat", self.commands["chat"], args
        return super().resolve_command(ctx, args)


F = TypeVar("F", bound=Callable[..., object])
OUTPUT_FORMATS = click.Choice(["text", "json", "stream-json"])
RESOLUTIONS = click.Choice(["rerun", "skip", "applied"])
SANDBOXES = click.Choice(["workspace-write", "read-only", "off"])
SANDBOX_HELP = "The OS sandbox for commands (default workspace-write; docs/sandbox.md)."
PROMPT_FILE = click.Path(exists=True, dir_okay=False, readable=True, resolve_path=True)
STDIN_WAIT = 3.0
"""Seconds ``kiso -p PROMPT`` waits for the first byte of a piped stdin before it runs without
it (``kiso -p -`` waits as long as it takes)."""

PRINT_HELP = "Run one prompt with no UI. A bare -p, or -p -, reads the prompt from stdin."
APPEND_HELP = "Text added after the built-in system prompt."
SYSTEM_FILE_HELP = "A file whose text replaces the built-in system prompt."
CONTINUE_HELP = "Continue the most recent session of this directory."
ALLOWED_HELP = (
    "Tool patterns allowed without asking, comma- or space-separated, repeatable: "
    '"shell(npm test),shell(git diff:*) edit_file(src/**)".'
)
DISALLOWED_HELP = "Tool patterns denied in every mode (a whole tool is not offered at all)."
MAX_TURNS_HELP = "End a run with outcome max_turns after N model turns (default 50)."
MAX_BUDGET_HELP = "End a run with outcome budget once it has cost X US dollars."


class _Budget(click.ParamType):  # type: ignore[type-arg]
    """A positive, finite number of US dollars."""

    name = "USD"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            number = float(str(value))
        except ValueError:
            number = float("nan")
        if not 0 < number < float("inf"):
            self.fail(f"must be a positive number of US dollars, such as 0.50; got {value!r}")
        return number


BUDGET = _Budget()
TURNS = click.IntRange(min=1)


@click.group(
    cls=_KisoGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
)
@click.version_option(__version__, "-v", "--version", prog_name="kiso")
@click.option(
    "-p", "--print", "prompt", metavar="PROMPT", is_flag=False, flag_value="-", help=PRINT_HELP
)
@click.option("-c", "--continue", "resume_latest", is_flag=True, help=CONTINUE_HELP)
@click.option("--model", default=None, help="A profile name, or provider/model.")
@click.option("--mode", default=None, help="default, accept-edits, plan, dontAsk or bypass.")
@click.option(
    "--output-format",
    type=OUTPUT_FORMATS,
    default="text",
    show_default=True,
    help="Print mode: plain text, one JSON result, or one JSON event per line.",
)
@click.option(
    "--resolve",
    type=RESOLUTIONS,
    default=None,
    help="Headless runs: how to rule on uncertain executions (otherwise they stop the run).",
)
@click.option("--append-system-prompt", metavar="TEXT", default=None, help=APPEND_HELP)
@click.option("--system-prompt-file", type=PROMPT_FILE, default=None, help=SYSTEM_FILE_HELP)
@click.option("--sandbox", type=SANDBOXES, default=None, help=SANDBOX_HELP)
@click.option(
    "--allowed-tools", "--allowedTools", "allowed_tools", multiple=True, help=ALLOWED_HELP
)
@click.option(
    "--disallowed-tools",
    "--disallowedTools",
    "disallowed_tools",
    multiple=True,
    help=DISALLOWED_HELP,
)
@click.option("--max-turns", "max_turns", type=TURNS, default=None, help=MAX_TURNS_HELP)
@click.option("--max-budget-usd", "max_budget_usd", type=BUDGET, default=None, help=MAX_BUDGET_HELP)
@click.pass_context
def cli(
    ctx: click.Context,
    *,
    prompt: str | None,
    resume_latest: bool,
    model: str | None,
    mode: str | None,
    output_format: str,
    resolve: str | None,
    append_system_prompt: str | None,
    system_prompt_file: str | None,
    sandbox: str | None,
    allowed_tools: tuple[str, ...] = (),
    disallowed_tools: tuple[str, ...] = (),
    max_turns: int | None = None,
    max_budget_usd: float | None = None,
) -> None:
    """kiso: a durable coding agent. Every approval, tool result and event is on disk before it
    is acted on, so a session that is interrupted, crashes or is killed resumes where it was.

    \b
    kiso [sessionId]               interactive session (`kiso chat` is the same)
    kiso "fix the failing tests"   interactive session, starting with that prompt
    kiso -c                        continue the latest session of this directory
    kiso -p "prompt" [sessionId]   one prompt, no UI; exit 0 only if the run completed
    cat f | kiso -p "explain"      piped stdin is added to the prompt (-p - reads it all)
    kiso resume                    pick a session to continue
    kiso resume <id> [prompt]      continue a session (headless when stdin is not a terminal)
    kiso sessions [--all]          durable sessions and the state each resumes into
    kiso doctor <id>               repair a damaged log; nothing with a receipt runs again

    Exit codes: 0 done, 1 the run failed or did not complete, 2 a usage error.
    Sessions live in $KISO_HOME/projects (KISO_HOME defaults to ~/.kiso).
    """
    _check_usage(None, mode)  # `kiso --mode yolo <any command>` is a usage error
    ctx.obj = {
        "prompt": prompt,
        "continue": resume_latest,
        "model": model,
        "mode": mode,
        "output_format": output_format,
        "resolve": resolve,
        "append_system_prompt": append_system_prompt,
        "system_prompt_file": system_prompt_file,
        "sandbox": sandbox,
        "allowed_tools": allowed_tools,
        "disallowed_tools": disallowed_tools,
        "max_turns": max_turns,
        "max_budget_usd": max_budget_usd,
    }
    if ctx.invoked_subcommand is None:
        ctx.invoke(chat, session_id=None)


def _run_options(f: F) -> F:
    """The flags a subcommand takes too, so they work after a session id as well as before."""
    for option in reversed(
        (
            click.option(
                "--model", "model_here", default=None, help="A profile name, or provider/model."
            ),
            click.option("--mode", "mode_here", default=None, help="The approval mode."),
            click.option("--output-format", "format_here", type=OUTPUT_FORMATS, default=None),
            click.option("--resolve", "resolve_here", type=RESOLUTIONS, default=None),
            click.option(
                "--append-system-prompt",
                "append_here",
                metavar="TEXT",
                default=None,
                help=APPEND_HELP,
            ),
            click.option(
                "--system-prompt-file",
                "system_file_here",
                type=PROMPT_FILE,
                default=None,
                help=SYSTEM_FILE_HELP,
            ),
            click.option(
                "--sandbox", "sandbox_here", type=SANDBOXES, default=None, help=SANDBOX_HELP
            ),
            click.option(
                "--allowed-tools",
                "--allowedTools",
                "allowed_here",
                multiple=True,
                help=ALLOWED_HELP,
            ),
            click.option(
                "--disallowed-tools",
                "--disallowedTools",
                "disallowed_here",
                multiple=True,
                help=DISALLOWED_HELP,
            ),
            click.option(
                "--max-turns", "turns_here", type=TURNS, default=None, help=MAX_TURNS_HELP
            ),
            click.option(
                "--max-budget-usd", "budget_here", type=BUDGET, default=None, help=MAX_BUDGET_HELP
            ),
        )
    ):
        f = option(f)
    return f


class _Run:
    """What the command line says about a run: a subcommand's flag wins over the group's."""

    def __init__(
        self, ctx: click.Context, here: dict[str, str | None], limits: _Limits | None = None
    ) -> None:
        opts = dict(ctx.obj or {})
        self.model = here.get("model") or _str(opts.get("model"))
        self.mode = here.get("mode") or _str(opts.get("mode"))
        self.output_format = here.get("format") or str(opts.get("output_format") or "text")
        self.resolve = here.get("resolve") or _str(opts.get("resolve"))
        self.prompt = _str(opts.get("prompt")) if here.get("prompt") is None else here["prompt"]
        self.resume_latest = bool(opts.get("continue"))
        append = here.get("append")
        if append is None:
            append = _str(opts.get("append_system_prompt"))
        system_file = here.get("system_file") or _str(opts.get("system_prompt_file"))
        sandbox = here.get("sandbox") or _str(opts.get("sandbox"))
        self.options = _options(append, system_file, _Limits.of(opts).then(limits), sandbox)

    def headless(
        self,
        prompt: str | PromptInput | None,
        session_id: str | None,
        *,
        must_exist: bool = False,
    ) -> int:
        from kiso.cli.print_mode import fail, run_headless
        from kiso.runtime.extensions import ExtensionLoadError

        try:
            return run_headless(
                prompt,
                session_id=session_id,
                model=self.model,
                mode=self.mode,
                output_format=self.output_format,
                resolve=self.resolve,
                must_exist=must_exist,
                options=self.options,
            )
        except ExtensionLoadError as exc:  # a broken extension: nothing started (exit 2)
            fail(self.output_format, str(exc))
            return 2

    def interactive(
        self, session_id: str | None, prompt: str | None, *, must_exist: bool = False
    ) -> int:
        if sys.stdout.isatty():  # a pipe never hears of new releases
            from kiso.runtime.release import start_check

            start_check()  # in the background: the banner says so when a newer kiso is out
        from kiso.cli.repl import run_interactive
        from kiso.runtime.extensions import ExtensionLoadError

        try:
            return run_interactive(
                session_id=session_id,
                model=self.model,
                mode=self.mode,
                prompt=prompt,
                must_exist=must_exist,
                options=self.options,
            )
        except ExtensionLoadError as exc:  # a broken extension: nothing started (exit 2)
            click.echo(f"kiso: {exc}", err=True)
            return 2

    def fail(self, message: str, *, headless: bool) -> int:
        """Exit 1 with one line (a JSON result too, when print mode was asked for JSON)."""
        if headless:
            from kiso.cli.print_mode import fail

            return fail(self.output_format, message)
        click.echo(f"kiso: {message}", err=True)
        return 1


class _Limits:
    """``--allowed-tools``, ``--disallowed-tools``, ``--max-turns``, ``--max-budget-usd``: the
    patterns given before and after the command add up; a limit given after it wins."""

    def __init__(
        self,
        allowed: tuple[str, ...] = (),
        disallowed: tuple[str, ...] = (),
        max_turns: int | None = None,
        max_budget_usd: float | None = None,
    ) -> None:
        self.allowed, self.disallowed = allowed, disallowed
        self.max_turns, self.max_budget_usd = max_turns, max_budget_usd

    @classmethod
    def of(cls, opts: dict[str, object]) -> _Limits:
        allowed, disallowed = opts.get("allowed_tools"), opts.get("disallowed_tools")
        turns, budget = opts.get("max_turns"), opts.get("max_budget_usd")
        return cls(
            tuple(str(v) for v in allowed) if isinstance(allowed, tuple) else (),
            tuple(str(v) for v in disallowed) if isinstance(disallowed, tuple) else (),
            turns if isinstance(turns, int) else None,
            budget if isinstance(budget, float) else None,
        )

    def then(self, later: _Limits | None) -> _Limits:
        if later is None:
            return self
        return _Limits(
            self.allowed + later.allowed,
            self.disallowed + later.disallowed,
            later.max_turns or self.max_turns,
            later.max_budget_usd or self.max_budget_usd,
        )

    def given(self) -> bool:
        return bool(self.allowed or self.disallowed) or (
            self.max_turns is not None or self.max_budget_usd is not None
        )


def _options(
    append: str | None, system_file: str | None, limits: _Limits, sandbox: str | None
) -> RunOptions | None:
    if append is None and system_file is None and not limits.given() and sandbox is None:
        return None
    from kiso.cli.setup import RunOptions
    from kiso.runtime.permissions import PermissionsError, parse_flags

    try:
        permissions = parse_flags(limits.allowed, limits.disallowed)
    except PermissionsError as exc:
        raise click.UsageError(str(exc)) from None
    return RunOptions(
        append_system_prompt=append,
        system_prompt_file=system_file,
        permissions=permissions,
        max_turns=limits.max_turns,
        max_budget_usd=limits.max_budget_usd,
        sandbox=sandbox,
    )


@cli.command()
@click.argument("session_id", required=False)
@click.option(
    "-p",
    "--print",
    "prompt_here",
    metavar="PROMPT",
    is_flag=False,
    flag_value="-",
    help=PRINT_HELP,
)
@click.option("-c", "--continue", "continue_here", is_flag=True, help=CONTINUE_HELP)
@_run_options
@click.pass_context
def chat(
    ctx: click.Context,
    *,
    session_id: str | None,
    prompt_here: str | None = None,
    continue_here: bool = False,
    model_here: str | None = None,
    mode_here: str | None = None,
    format_here: str | None = None,
    resolve_here: str | None = None,
    append_here: str | None = None,
    system_file_here: str | None = None,
    sandbox_here: str | None = None,
    allowed_here: tuple[str, ...] = (),
    disallowed_here: tuple[str, ...] = (),
    turns_here: int | None = None,
    budget_here: float | None = None,
) -> None:
    """The interactive session (or print mode with -p). SESSION_ID may be the first prompt
    instead, when it is several words."""
    run = _Run(
        ctx,
        {
            "prompt": prompt_here,
            "model": model_here,
            "mode": mode_here,
            "format": format_here,
            "resolve": resolve_here,
            "append": append_here,
            "system_file": system_file_here,
            "sandbox": sandbox_here,
        },
        _Limits(allowed_here, disallowed_here, turns_here, budget_here),
    )
    latest = continue_here or run.resume_latest
    first_prompt = None
    if run.prompt is None and session_id is not None and _is_words(session_id):
        first_prompt, session_id = session_id, None  # `kiso "fix the failing tests"`
    if latest and session_id is not None:
        raise click.UsageError(
            f"--continue picks the latest session itself; give {session_id!r} or -c, not both"
        )
    _check_usage(session_id, run.mode)
    headless = run.prompt is not None
    prompt = None
    if headless:
        prompt = _prompt_text(str(run.prompt))
    elif not sys.stdin.isatty():
        raise click.UsageError(
            'the interactive session needs a terminal; use `kiso -p "prompt"` for one '
            "prompt without a terminal"
        )
    problem = _home_problem()
    if problem is not None:
        sys.exit(run.fail(problem, headless=headless))
    if latest:
        session_id = _latest_session()
        if session_id is None:
            sys.exit(
                run.fail(
                    f"no session to continue in {os.getcwd()}: `kiso` starts one "
                    "(`kiso sessions --all` lists those of other directories)",
                    headless=headless,
                )
            )
    if headless:
        sys.exit(run.headless(prompt, session_id, must_exist=latest))
    sys.exit(run.interactive(session_id, first_prompt, must_exist=latest))


@cli.command()
@click.argument("session_id", required=False)
@click.argument("prompt", required=False)
@_run_options
@click.pass_context
def resume(
    ctx: click.Context,
    *,
    session_id: str | None,
    prompt: str | None,
    model_here: str | None,
    mode_here: str | None,
    format_here: str | None,
    resolve_here: str | None,
    append_here: str | None,
    system_file_here: str | None,
    sandbox_here: str | None = None,
    allowed_here: tuple[str, ...] = (),
    disallowed_here: tuple[str, ...] = (),
    turns_here: int | None = None,
    budget_here: float | None = None,
) -> None:
    """Continue a session: with no id, pick one; headless when stdin is not a terminal. A
    PROMPT of - reads the prompt from stdin, as -p - does."""
    run = _Run(
        ctx,
        {
            "model": model_here,
            "mode": mode_here,
            "format": format_here,
            "resolve": resolve_here,
            "append": append_here,
            "system_file": system_file_here,
            "sandbox": sandbox_here,
        },
        _Limits(allowed_here, disallowed_here, turns_here, budget_here),
    )
    _check_usage(session_id, run.mode)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    if session_id is None and not interactive:
        raise click.UsageError(
            "kiso resume needs a session id when not on a terminal; `kiso sessions` lists them"
        )
    problem = _home_problem()
    if problem is not None:
        sys.exit(run.fail(problem, headless=not interactive))
    if session_id is None:
        from kiso.cli.picker import pick_session
        from kiso.kernel import JsonlSessionStore

        session_id = pick_session(JsonlSessionStore(), Path(os.getcwd()))
        if session_id is None:
            return
    if prompt == "-":  # as with `-p -`: the prompt is all of stdin (so stdin is no terminal)
        given = _stdin_prompt(
            f"`kiso resume {session_id} -` reads the prompt from stdin, and stdin is a "
            f"terminal; pipe it: `kiso resume {session_id} - < prompt.txt`"
        )
        sys.exit(run.headless(given, session_id, must_exist=True))
    if interactive:
        sys.exit(run.interactive(session_id, prompt, must_exist=True))
    sys.exit(run.headless(prompt, session_id, must_exist=True))


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _is_words(arg: str) -> bool:
    """Several words: a prompt, never a session id (ids have no whitespace)."""
    return bool(arg.strip()) and any(c.isspace() for c in arg.strip())


def _check_usage(session_id: str | None, mode: str | None) -> None:
    """A malformed session id or an unknown --mode is a usage error (exit 2), said in one line."""
    from kiso.kernel import UsageError
    from kiso.kernel.ids import check_session_id
    from kiso.runtime.approvals import check_mode

    try:
        if session_id is not None:
            check_session_id(session_id)
        if mode is not None:
            check_mode(mode)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None


def _prompt_text(value: str) -> PromptInput:
    """The prompt of ``-p``: ``-`` (or a bare ``-p``) reads all of stdin; a prompt given with a
    piped stdin gets the stdin text after a blank line (``cat f | kiso -p "explain"``). Only the
    typed part has its attachments read: piped text is sent as it is."""
    from kiso.cli.print_mode import PromptInput

    stdin = sys.stdin
    piped = stdin is not None and not stdin.isatty()
    if value == "-":
        return _stdin_prompt(
            'print mode needs a prompt: `kiso -p "prompt"`, or pipe it: `kiso -p - < prompt.txt`'
        )
    if not value.strip():
        raise click.UsageError('the prompt is empty: `kiso -p "prompt"`')
    if not piped:
        return PromptInput(value)
    extra = _read_stdin(STDIN_WAIT)
    if extra is None:
        click.echo(
            f"kiso: nothing arrived on stdin in {STDIN_WAIT:g}s; running the prompt without it "
            "(`< /dev/null` skips the wait, `kiso -p -` waits for stdin)",
            err=True,
        )
        return PromptInput(value)
    return PromptInput(value, extra) if extra.strip() else PromptInput(value)


def _stdin_prompt(no_pipe: str) -> PromptInput:
    """A prompt of ``-``: all of stdin, sent as it came (no attachments are read from piped
    text). ``no_pipe``: the usage error when stdin is a terminal (nothing would ever end it)."""
    from kiso.cli.print_mode import PromptInput

    stdin = sys.stdin
    if stdin is None or stdin.isatty():
        raise click.UsageError(no_pipe)
    text = _read_stdin(None)
    if text is None or not text.strip():
        raise click.UsageError("the prompt read from stdin is empty")
    return PromptInput("", text)


def _read_stdin(wait: float | None) -> str | None:
    """All of stdin as text (invalid UTF-8 replaced), or None when nothing arrived within
    ``wait`` seconds (None: wait as long as it takes)."""
    import select

    stdin = sys.stdin
    if stdin is None:
        return None
    if wait is not None:
        try:
            ready, _, _ = select.select([stdin.fileno()], [], [], wait)
        except (OSError, ValueError):  # not selectable: read it as it is
            ready = [stdin]
        if not ready:
            return None
    try:
        data = stdin.buffer.read()
    except OSError as exc:
        raise click.UsageError(f"cannot read the prompt from stdin: {exc.strerror}") from None
    return data.decode("utf-8", errors="replace")


def _home_problem() -> str | None:
    """Why ``$KISO_HOME`` cannot hold sessions, or None. It checks without creating anything: a
    home that does not exist yet is fine when it could be created."""
    from kiso.kernel import kiso_home

    home = kiso_home().absolute()
    target = home / "projects"
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == target:
        what = f"the session folder {target}"
    elif existing == home:
        what = f"KISO_HOME {home}"
    else:
        what = f"KISO_HOME {home} does not exist and cannot be created:"
        what += f" {existing}"
    if not existing.is_dir():
        return f"{what} is not a directory; point KISO_HOME at a writable directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return (
            f"{what} is read-only, so kiso cannot keep its sessions there; make it writable or "
            "point KISO_HOME at a writable directory"
        )
    return None


def _latest_session() -> str | None:
    """The id of this directory's most recently updated session."""
    from kiso.kernel import JsonlSessionStore, StoreError

    try:
        rows = JsonlSessionStore().list(os.getcwd())
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    return max(rows, key=lambda r: (r.updated, r.id)).id if rows else None


@cli.command()
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    default=None,
    help="KISO_HOME for the demo session (default: a new temporary folder).",
)
@click.option("--keep", is_flag=True, help="Keep the demo's temporary folders.")
def demo(home: str | None, keep: bool) -> None:
    """Run a durable session, kill it with SIGKILL mid-tool-call, and recover it.

    Needs no key and no network: the model's turns are scripted. Nothing outside the temporary
    folders it prints is touched.
    """
    from kiso.cli.demo import run_demo

    sys.exit(run_demo(home, keep=keep))


@cli.command()
@click.option("--all", "scope", flag_value="all", help="Sessions of every workspace.")
@click.option(
    "--current",
    "scope",
    flag_value="current",
    default=True,
    help="Sessions that started in this directory (the default).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, for scripts.")
def sessions(scope: str, as_json: bool) -> None:
    """List durable sessions with the state each would resume into.

    States: completed, ended (error, aborted, max_turns, budget), interrupted (a run is open),
    uncertain (an execution may or may not have applied: a human rules first), awaiting_approval
    (a question nobody answered), empty (no run yet), corrupt (the log does not load).
    """
    from kiso.kernel import JsonlSessionStore, StoreError

    store = JsonlSessionStore()
    try:
        rows = store.list(None if scope == "all" else os.getcwd())
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        for row in rows:
            click.echo(json.dumps(row.to_json(), ensure_ascii=False))
        return
    if not sys.stdout.isatty():  # stable, script-friendly: tab-separated, no relative ages
        for row in rows:
            updated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.updated / 1000))
            title = " ".join(row.title.split())
            click.echo(f"{row.id}\t{row.state.value}\t{updated}\t{row.workspace}\t{title}")
            if row.error:
                click.echo(f"{row.id}: {row.error}", err=True)
        if not rows:
            click.echo(
                f"no sessions {'anywhere' if scope == 'all' else 'in this directory'}", err=True
            )
        return
    if not rows:
        where = "anywhere" if scope == "all" else "in this directory"
        hint = "" if scope == "all" else " (`kiso sessions --all` lists every workspace)"
        click.echo(f"no sessions {where}{hint}")
        return
    now = time.time() * 1000
    width = max(len(r.id) for r in rows)
    for row in rows:
        line = (
            f"{row.id:<{width}}  {row.state.value:<17}  {_age(now - row.updated):>4}  "
            f"{row.title or '(no prompt yet)'}"
        )
        if scope == "all":
            line += f"  [{row.workspace or '?'}]"
        if row.error:
            line += f"\n  {row.error}"
        click.echo(line)


@cli.command()
@click.argument("session_id")
def doctor(session_id: str) -> None:
    """Repair a damaged session log without running again anything that has a receipt.

    Keeps the damaged log as <id>.jsonl.damaged-<time>, writes a log that loads in its place
    and says what it did: lines dropped, executions kept as finished, calls left for a human to
    rule on. Holds the session's writer lock while it works. Exit 0 when repaired or when there
    was nothing to repair, 1 when it could not repair.
    """
    from kiso.kernel import JsonlSessionStore, KisoError, UsageError
    from kiso.kernel.doctor import RepairStatus, repair_session

    try:
        result = repair_session(JsonlSessionStore(), session_id)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    except KisoError as exc:
        click.echo(f"kiso doctor: {exc}", err=True)
        sys.exit(1)
    refused = result.status is RepairStatus.REFUSED
    for line in result.report():
        click.echo(line, err=refused)
    sys.exit(1 if refused else 0)


@cli.command()
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option("--revoke", is_flag=True, help="Forget the trust given to this project.")
def trust(path: str | None, revoke: bool) -> None:
    """Trust (or, with --revoke, stop trusting) a project's .kiso/ directory.

    A project's .kiso/ (config.json, and later extensions, skills and mcp.json) is code that came
    with the repository. kiso applies nothing in it until you trust it: this lists what is there
    and records your verdict with the files' digest under $KISO_HOME; a change to any file asks
    again. PATH defaults to the current directory.
    """
    from kiso.cli.trust import trust_command

    sys.exit(trust_command(path, revoke=revoke))


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("provider")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def login(provider: str, extra: tuple[str, ...]) -> None:
    """Store an API key for PROVIDER (anthropic, openai, deepseek, zai), or sign in to chatgpt.

    The key is read hidden from the terminal, or from stdin when piped; never from the command
    line. It is only ever sent to that provider's own API. `kiso login chatgpt` is the ChatGPT
    subscription sign-in: a browser round trip (the URL is printed too; paste the address the
    browser lands on if it cannot reach this machine), no key. Both go to ~/.kiso/auth.json.
    """
    from kiso.cli import login as impl

    impl.login(provider, extra)


@cli.command()
@click.argument("provider")
def logout(provider: str) -> None:
    """Remove the stored key for PROVIDER.

    `kiso logout chatgpt` removes the ChatGPT sign-in.
    """
    from kiso.cli import login as impl

    impl.logout(provider)


@cli.command()
def auth() -> None:
    """Show stored credentials (masked) and which key variables are set."""
    from kiso.cli import login as impl

    impl.show()


@cli.command()
def update() -> None:
    """Upgrade kiso the way it was installed (pipx, uv tool or pip).

    Prints the command it runs and the version before and after; the installer gets your
    environment and terminal. Exits with the installer's status when it fails, and 1 (saying
    what to run instead) when it cannot tell how kiso was installed.
    """
    from kiso.cli.update import update_command

    sys.exit(update_command())


def _age(ms: float) -> str:
    seconds = max(ms, 0) / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def main() -> None:
    cli(prog_name="kiso")


if __name__ == "__main__":
    main()
