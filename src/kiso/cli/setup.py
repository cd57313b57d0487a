"""Building a session for the CLI: the trust gate, config, model, agent, the workspace check.
Shared by print mode and the interactive session so both choose models and open sessions the
same way.

A project's ``.kiso/`` applies only once trusted (:mod:`kiso.runtime.trust`): the interactive
session passes ``ask_trust`` (a terminal prompt, before the UI starts); a headless run passes
none, and an untrusted project refuses it with the files named and ``kiso trust [--revoke]``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kiso.kernel import JsonlSessionStore, SessionNotFoundError, UsageError, kiso_home
from kiso.runtime import Agent, Session
from kiso.runtime.config import Config, load_config
from kiso.runtime.models import ResolvedModel, build_adapter, resolve_model
from kiso.runtime.prompt import SystemPrompt, build_system_prompt
from kiso.runtime.trust import AskTrust, gate
from kiso.tools import builtin_tools

__all__ = ["RunOptions", "Setup", "open_session", "prepare"]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What the command line says about a run beyond its model and mode."""

    append_system_prompt: str | None = None
    """``--append-system-prompt TEXT``: added after the built-in system prompt."""
    system_prompt_file: str | None = None
    """``--system-prompt-file FILE``: its text replaces the built-in system prompt."""


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


def prepare(
    *,
    model: str | None,
    mode: str | None,
    workspace: Path | None = None,
    options: RunOptions | None = None,
    ask_trust: AskTrust | None = None,
) -> Setup:
    """The trust gate, config (flags > env > project > user), the model and its key, the agent.

    ``ask_trust``: asks a person about a project's ``.kiso/`` that was never reviewed or has
    changed since; without it such a project raises
    :class:`~kiso.runtime.trust.UntrustedProjectError` and nothing starts.
    """
    ws = Path(os.path.realpath(workspace or os.getcwd()))
    home = kiso_home()
    trust = gate(ws, home, ask_trust)
    config = load_config(
        home,
        ws,
        model=model,
        mode=mode,
        project=trust.applied,
        project_files=trust.project_files,
    )
    notices = list(trust.notices)
    project_config = str(ws / ".kiso" / "config.json")
    if config.mode == "bypass" and config.mode_source == project_config:
        notices.append(
            f"mode bypass comes from the project config {project_config}: every call runs "
            f"without asking"
        )
    resolved = resolve_model(config, home=home)
    system, explicit = _system_prompt(ws, options or RunOptions())
    agent = Agent(
        adapter=build_adapter(resolved),
        tools=builtin_tools(),
        store=JsonlSessionStore(home),
        workspace=ws,
        mode=config.mode,
        floor=config.floor,
        profile=resolved.profile.name if resolved.profile else None,
        strip_env=resolved.strip_env,
        system_prompt=system.text,
    )
    return Setup(
        agent,
        config,
        resolved,
        ws,
        tuple(notices),
        system_prompt=system,
        system_override=system.text if explicit else None,
    )


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
    )
