"""Building a session for the CLI: the trust gate, config, model, agent, the workspace check.
Shared by print mode and the interactive session so both choose models and open sessions the
same way.

A project's ``.kiso/`` applies only once trusted (:mod:`kiso.runtime.trust`): the interactive
session passes ``ask_trust`` (a terminal prompt, before the UI starts); a headless run passes
none, and an untrusted project refuses it with the files named and ``kiso trust [--revoke]``.

Extensions (:mod:`kiso.runtime.extensions`) are loaded after the gate: built-in, then the user's,
then the project's from the gate's snapshot (only when it applies). A broken one raises
:class:`~kiso.runtime.extensions.ExtensionLoadError` and nothing starts (``kiso`` exits 2)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kiso.kernel import JsonlSessionStore, SessionNotFoundError, UsageError, ascii_int, kiso_home
from kiso.mcp import McpManager, load_configs, load_mcp
from kiso.runtime import Agent, Session
from kiso.runtime.command_hooks import CommandHooks
from kiso.runtime.config import (
    MAX_WINDOW,
    MIN_WINDOW,
    WINDOW_RULE,
    Config,
    ConfigError,
    load_config,
)
from kiso.runtime.context import LEARNED_FILE, Window
from kiso.runtime.extensions import ExtensionSet, load_cascade
from kiso.runtime.models import ResolvedModel, build_adapter, resolve_model
from kiso.runtime.permissions import Permissions
from kiso.runtime.prompt import SystemPrompt, build_system_prompt
from kiso.runtime.skills import Skill, discover_skills, read_skill_tool, skills_prompt
from kiso.runtime.subagent_role import ChildRole, child_role
from kiso.runtime.subagents import delegate_tool
from kiso.runtime.trust import AskTrust, gate
from kiso.tools import builtin_tools
from kiso.tools.ask_user import Asker, interactive_tools
from kiso.tools.sandbox import Sandbox
from kiso.tools.tasks import update_tasks_tool

from .rules_view import unscoped_notices

__all__ = ["RunOptions", "Setup", "close_setup", "open_session", "prepare"]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What the command line says about a run beyond its model and mode."""

    append_system_prompt: str | None = None
    """``--append-system-prompt TEXT``: added after the built-in system prompt."""
    system_prompt_file: str | None = None
    """``--system-prompt-file FILE``: its text replaces the built-in system prompt."""
    sandbox: str | None = None
    """``--sandbox MODE``: the OS sandbox for commands (docs/sandbox.md)."""
    permissions: Permissions = field(default_factory=Permissions)
    """``--allowed-tools`` and ``--disallowed-tools``, parsed: added to the config's rules."""
    max_turns: int | None = None
    """``--max-turns N``: a run ends with outcome ``max_turns`` after N model turns."""
    max_budget_usd: float | None = None
    """``--max-budget-usd X``: a run ends with outcome ``budget`` once it has cost X dollars."""


@dataclass(frozen=True, slots=True)
class Setup:
    agent: Agent
    config: Config
    resolved: ResolvedModel
    workspace: Path
    notices: tuple[str, ...] = ()
    """Lines the interactive banner (and the headless header) must show before the first prompt,
    e.g. that ``bypass`` comes from a project config."""
    system_prompt: SystemPrompt | None = None
    """The system prompt built for this workspace (what a new session is told)."""
    system_override: str | None = None
    """The prompt the command line asked for (``--append-system-prompt``,
    ``--system-prompt-file``): it replaces what a resumed session recorded."""
    extensions: ExtensionSet = field(default_factory=ExtensionSet)
    """The extensions loaded into the agent (its tools, hooks and system prompt)."""
    mcp: McpManager | None = None
    """The MCP servers (None when no ``mcp.json`` names any): close it when done."""
    skills: tuple[Skill, ...] = ()
    """The skills the system prompt lists (``/<name>`` runs one)."""
    options: RunOptions | None = None
    """The command line's run options (``/reload`` builds the setup again with them)."""
    flags: tuple[str | None, str | None] = (None, None)
    """The command line's ``--model`` and ``--mode`` (``/reload`` passes them again)."""
    subagent: ChildRole | None = None
    """What this process is when a parent's ``delegate`` started it (docs/subagents.md)."""


def prepare(
    *,
    model: str | None,
    mode: str | None,
    workspace: Path | None = None,
    options: RunOptions | None = None,
    ask_trust: AskTrust | None = None,
    asker: Asker | None = None,
) -> Setup:
    """The trust gate, config (flags > env > project > user), the model and its key, the agent:
    the built-in tools, the MCP servers' tools, the skills, the tasks tool (``"tasks": true``),
    ``ask_user`` (only with an ``asker``: an interactive session) and the extensions.

    ``ask_trust``: asks a person about a project's ``.kiso/`` that was never reviewed or has
    changed since; without it such a project raises
    :class:`~kiso.runtime.trust.UntrustedProjectError` and nothing starts.
    """
    ws = Path(os.path.realpath(workspace or os.getcwd()))
    home = kiso_home()
    role = child_role()  # a subagent (KISO_SUBAGENT_*): its role's tools, no delegate
    trust = gate(ws, home, ask_trust)
    config = load_config(
        home,
        ws,
        model=model,
        mode=mode,
        project=trust.applied,
        project_files=trust.project_files,
        sandbox=(options or RunOptions()).sandbox,
    )
    notices = list(trust.notices)
    sandbox = Sandbox.for_workspace(config.sandbox, ws, temp_parent=home, reachable=config.pass_env)
    project_config = str(ws / ".kiso" / "config.json")
    notices += _sandbox_notices(config, sandbox, ws, project_config)
    if config.mode == "bypass" and config.mode_source == project_config:
        notices.append(
            f"mode bypass comes from the project config {project_config}: every call runs "
            f"without asking"
        )
    resolved = resolve_model(config, home=home)
    system, explicit = _system_prompt(ws, options or RunOptions())
    tools = builtin_tools()
    found = discover_skills(home, project_files=trust.project_files, project_root=ws)
    notices += found.notices
    if found.skills:
        tools.append(read_skill_tool(found.skills))
        notices.append("skills: " + ", ".join(f"{k.name} ({k.source})" for k in found.skills))
    if config.tasks:
        tools.append(update_tasks_tool())
    run = options or RunOptions()
    if role is None and config.subagents:
        denied = [r.pattern.text for r in run.permissions.rules if r.kind == "deny"]
        tools.append(delegate_tool(checks=config.subagent_checks, model=model, disallowed=denied))
    if asker is not None:  # nobody can answer in a headless run: not offered at all
        tools += interactive_tools(asker)
    mcp = None
    if load_configs(home, ws, trust.project_files):  # no mcp.json: no thread, no child
        mcp, mcp_tools, mcp_notices = load_mcp(
            home, ws, trust.project_files, resolved.strip_env, sandbox=config.sandbox
        )
        tools += mcp_tools
        servers = ", ".join(f"{x.name} ({x.state.value})" for x in mcp.status())
        notices += [f"mcp: {servers} · {len(mcp_tools)} tools", *mcp_notices]
    try:  # a failure from here on must not leave MCP children behind
        extensions = load_cascade(
            home=home,
            workspace=ws,
            project_files=trust.project_files,
            builtin_tools=[t.name for t in tools],
        )
        notices += extensions.notices()
        text = extensions.system_prompt(system.text)
        index = skills_prompt(found.skills)
        if index:
            text = f"{text}\n\n{SKILLS_HEADER}\n{index}" if text else f"{SKILLS_HEADER}\n{index}"
        offered = [*tools, *extensions.tools()]
        permissions = config.permissions.plus(run.permissions)
        notices += permissions.unknown(t.name for t in offered)
        hooks = list(extensions.hooks())
        commands = CommandHooks(
            config.hooks, workspace=ws, strip_env=resolved.strip_env, sandbox=sandbox
        )
        hooks += commands.hooks  # config's command hooks (docs/extensions.md): constrain-only
        notices += commands.notices()
        if role is not None:  # allowed without asking: the human approved the delegation
            offered = role.restrict(offered)
            hooks.append(role.hook(offered))
        adapter = build_adapter(resolved)
        if run.max_budget_usd is not None:
            _check_priced(adapter.model, run.max_budget_usd)
        agent = Agent(
            adapter=adapter,
            tools=offered,
            store=JsonlSessionStore(home),
            workspace=ws,
            mode=config.mode,
            floor=config.floor,
            profile=resolved.profile.name if resolved.profile else None,
            strip_env=resolved.strip_env,
            pass_env=config.pass_env,
            system_prompt=text,
            hooks=hooks,
            trigger="subagent" if role is not None else "user",
            window=context_window(resolved, home),
            auto_compact=config.auto_compact,
            sandbox=sandbox,
            permissions=permissions,
            max_turns=run.max_turns or 50,
            max_budget_usd=run.max_budget_usd,
        )
        if role is None:  # rules written without a scope: said once (a subagent's parent did)
            notices += unscoped_notices(agent.rules, ws)
    except BaseException:
        if mcp is not None:
            mcp.close()
        raise
    return Setup(
        agent,
        config,
        resolved,
        ws,
        tuple(notices),
        system_prompt=system,
        system_override=text if explicit else None,
        extensions=extensions,
        mcp=mcp,
        skills=tuple(found.skills),
        options=options,
        flags=(model, mode),
        subagent=role,
    )


def _check_priced(model: str, budget: float) -> None:
    """A budget needs a price: refuse to start rather than run with a limit nobody can keep."""
    from kiso.providers.registry import lookup

    if lookup(model).price is None:
        raise UsageError(
            f"--max-budget-usd {budget:g}: the model {model} has no known price in kiso's model "
            f"registry, so its cost cannot be metered and the budget cannot be enforced; drop "
            f"--max-budget-usd or use a model with a price (--max-turns still limits the run)"
        )


def _sandbox_notices(
    config: Config, sandbox: Sandbox | None, ws: Path, project_config: str
) -> list[str]:
    """What the banner says about the sandbox when it is not the plain default."""
    policy = config.sandbox
    said: list[str] = []
    if sandbox is not None and not sandbox.available:
        said.append(f"sandbox unavailable: {sandbox.reason}; commands run unsandboxed")
    elif sandbox is None and policy.source != "default":
        said.append(f"sandbox off ({policy.source}): commands run with your full access")
    if policy.source == project_config:
        said.append(f"sandbox {policy.mode}, network off: the project config {project_config} asks")
    if sandbox is not None and policy.mode == "workspace-write" and ws == Path.home().resolve():
        said.append(
            "the workspace is your home directory: commands may write every dotfile in it "
            "(credentials stay hidden); start kiso in a project directory instead"
        )
    for root in policy.writable_roots:
        if not Path(os.path.expanduser(root)).is_dir():
            said.append(
                f"sandbox.writableRoots: {root} is not a directory; nothing is added for it"
            )
    return said


SKILLS_HEADER = (
    "Skills (read one with read_skill(name) when it fits the task; its other files with "
    "read_skill(name, file)):"
)


def context_window(resolved: ResolvedModel, home: Path) -> Window:
    """The model's window: ``KISO_CONTEXT_WINDOW``, else the profile's ``contextWindow`` (the
    person's word, so either wins over a learned window), else what an endpoint's refusal
    taught (``learned-windows.json``), else the registry's. A bad value is a broken setting,
    like a bad ``KISO_MODE``: one line naming it, exit 1 (docs/cli.md)."""
    profile = resolved.profile
    raw = os.environ.get("KISO_CONTEXT_WINDOW", "").strip()
    explicit = profile.context_window if profile is not None else None
    source = "profile"
    if raw:
        tokens = ascii_int(raw)
        if tokens is None or not MIN_WINDOW <= tokens <= MAX_WINDOW:
            raise ConfigError(f"KISO_CONTEXT_WINDOW={raw!r}: must be {WINDOW_RULE}")
        explicit, source = tokens, "KISO_CONTEXT_WINDOW"
    if profile is None:
        name = f"faux:{resolved.faux_script or 'keyless'}"
        return Window(name, explicit=explicit, explicit_source=source)
    key = f"{profile.kind} {profile.origin} {profile.model}"
    learned = home / LEARNED_FILE
    return Window(
        profile.model, explicit=explicit, key=key, learned_file=learned, explicit_source=source
    )


def close_setup(setup: Setup) -> None:
    """Stop what the setup started (the MCP servers' children)."""
    if setup.mcp is not None:
        setup.mcp.close()


def _system_prompt(ws: Path, options: RunOptions) -> tuple[SystemPrompt, bool]:
    """The built prompt, and whether the command line asked for it (then it replaces what a
    resumed session recorded)."""
    base = None
    if options.system_prompt_file is not None:
        path = Path(options.system_prompt_file).expanduser()
        try:
            base = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise UsageError(f"--system-prompt-file {path}: cannot read it ({why})") from None
    prompt = build_system_prompt(ws, base=base, append=options.append_system_prompt)
    return prompt, options.system_prompt_file is not None or bool(options.append_system_prompt)


def open_session(
    setup: Setup, session_id: str | None, *, headless: bool = False, must_exist: bool = False
) -> Session:
    """Open (or create) a session; one that started in another workspace is refused by name.

    The session continues in the mode its log last recorded unless ``--mode``/``KISO_MODE``
    overrides it (the change is recorded); ``headless``: nobody is there to answer questions.
    """
    if session_id is not None:
        store = setup.agent.store
        try:
            header = store.load(session_id).header
        except SessionNotFoundError:
            header = None
        if header is None and must_exist:
            raise SessionNotFoundError(
                f"no session {session_id!r}: `kiso sessions --all` lists them (a new session "
                f"starts with `kiso -p PROMPT {session_id}` or `kiso {session_id}`)"
            )
        if header is not None and header.workspace != str(setup.workspace):
            raise UsageError(
                f"session {session_id} belongs to {header.workspace}; a session resumes only in "
                f"its own workspace: cd {header.workspace} && kiso resume {session_id}"
            )
    return setup.agent.session(
        session_id,
        mode=setup.config.mode_override,
        headless=headless,
        system_prompt=setup.system_override,
        parent=setup.subagent.parent if setup.subagent is not None else None,
    )
