"""Building a session for the CLI: config, model, agent, the workspace check. Shared by print
mode and the interactive session so both choose models and open sessions the same way."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kiso.kernel import JsonlSessionStore, SessionNotFoundError, UsageError, kiso_home
from kiso.runtime import Agent, Session
from kiso.runtime.config import Config, load_config
from kiso.runtime.models import ResolvedModel, build_adapter, resolve_model
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


def prepare(
    *,
    model: str | None,
    mode: str | None,
    workspace: Path | None = None,
    options: RunOptions | None = None,
) -> Setup:
    """Config (flags > env > project > user), the model and its key, and the agent."""
    ws = Path(os.path.realpath(workspace or os.getcwd()))
    home = kiso_home()
    config = load_config(home, ws, model=model, mode=mode)
    resolved = resolve_model(config, home=home)
    agent = Agent(
        adapter=build_adapter(resolved),
        tools=builtin_tools(),
        store=JsonlSessionStore(home),
        workspace=ws,
        mode=config.mode,
        floor=config.floor,
        profile=resolved.profile.name if resolved.profile else None,
        strip_env=resolved.strip_env,
    )
    return Setup(agent, config, resolved, ws)


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
    return setup.agent.session(session_id, mode=setup.config.mode_override, headless=headless)
