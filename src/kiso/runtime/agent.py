"""``Agent``: a model, tools, a store and a policy, configured once; sessions run on it.

    agent = Agent(model="faux", tools=[add], store=JsonlSessionStore("./sessions"))
    with agent.session(id="demo") as session:
        for ev in session.run_sync("What is 2+3?"):
            ...

Without an ``adapter``, ``model="faux"`` (or ``KISO_FAUX_SCRIPT`` in the environment) selects the
scripted model; real providers arrive as adapters.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from kiso.kernel import (
    JsonlSessionStore,
    KisoError,
    SessionNotFoundError,
    SessionStore,
    kiso_home,
)
from kiso.kernel.events import Trigger
from kiso.providers.base import Adapter, ToolSpec
from kiso.runtime.approvals import FloorPolicy, ModePolicy, Policy, RulesPolicy, check_mode
from kiso.runtime.rules import RULES_FILE, RulesFile
from kiso.runtime.session import Session
from kiso.tools.base import Tool

__all__ = ["Agent"]


class Agent:
    def __init__(
        self,
        *,
        model: str | None = None,
        tools: Sequence[Tool] = (),
        store: SessionStore | None = None,
        adapter: Adapter | None = None,
        system_prompt: str | None = None,
        mode: str = "default",
        workspace: str | os.PathLike[str] | None = None,
        profile: str | None = None,
        max_turns: int = 50,
        max_retries: int = 4,
        retry_base_delay: float = 0.5,
        idle_timeout: float = 120.0,
        policies: Sequence[Policy] = (),
        rules: RulesFile | None = None,
        floor: bool = True,
        home: str | os.PathLike[str] | None = None,
        strip_env: Iterable[str] = (),
        trigger: Trigger = "user",
    ) -> None:
        self.adapter: Adapter = adapter if adapter is not None else _default_adapter(model)
        names = [t.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise KisoError(f"two tools are named {', '.join(duplicates)}; names must be unique")
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.store: SessionStore = store if store is not None else JsonlSessionStore()
        self.system_prompt = system_prompt
        self.mode = check_mode(mode)
        self.workspace = Path(os.path.realpath(workspace if workspace is not None else os.getcwd()))
        self.profile = profile
        self.max_turns = max_turns
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.idle_timeout = idle_timeout
        self.extra_policies = tuple(policies)
        self.rules = rules if rules is not None else RulesFile(kiso_home() / RULES_FILE)
        self.floor = floor
        self.home = Path(home) if home is not None else Path.home()
        self.strip_env = tuple(strip_env)
        self.trigger: Trigger = trigger
        self._validators: dict[str, Draft202012Validator] = {}
        for tool in tools:
            try:
                Draft202012Validator.check_schema(tool.parameters)
            except SchemaError as exc:
                raise KisoError(
                    f"tool {tool.name!r}: its parameters are not a valid JSON Schema: {exc.message}"
                ) from None

    # ------------------------------------------------------------------ sessions

    def session(self, id: str | None = None) -> Session:
        """Open session ``id`` for writing (creating it if it does not exist), or a new one."""
        if id is not None:
            try:
                return Session(self, self.store.open(id))
            except SessionNotFoundError:
                pass
        return Session(self, self.store.create(str(self.workspace), session_id=id))

    # ------------------------------------------------------------------ what the loop asks

    def tool(self, name: str) -> Tool | None:
        return self.tools.get(name)

    @cached_property
    def rerunnable(self) -> frozenset[str]:
        return frozenset(name for name, tool in self.tools.items() if tool.rerunnable)

    def tool_specs(self) -> list[ToolSpec]:
        return [ToolSpec(t.name, t.description, t.parameters) for t in self.tools.values()]

    def policies(self, mode: str | None = None) -> list[Policy]:
        """The approval chain: the floor, the mode, the rules, then the host's policies."""
        return [
            FloorPolicy(self.floor),
            ModePolicy(mode or self.mode),
            RulesPolicy(self.rules),
            *self.extra_policies,
        ]

    def input_problem(self, tool: Tool, value: dict[str, Any]) -> str | None:
        """Why ``value`` does not fit the tool's schema, or None."""
        validator = self._validators.get(tool.name)
        if validator is None:
            validator = self._validators[tool.name] = Draft202012Validator(tool.parameters)
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if not errors:
            return None
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "the input"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"{where}: {first.message}{more}"

    def child_env(self) -> Mapping[str, str]:
        """The environment for children a model can drive: this process's, credentials stripped."""
        from kiso.tools.env import child_env

        return child_env(os.environ, also_strip=self.strip_env)


def _default_adapter(model: str | None) -> Adapter:
    from kiso.providers.faux import FauxAdapter

    script = os.environ.get("KISO_FAUX_SCRIPT")
    if script:
        return FauxAdapter.from_file(script)
    if model in (None, "faux"):
        raise KisoError(
            "no model adapter: pass adapter=..., or set KISO_FAUX_SCRIPT to a script file to use "
            "the scripted model"
        )
    raise KisoError(
        f"no adapter for model {model!r}: pass adapter=... (provider adapters come with kiso's "
        f"provider support), or set KISO_FAUX_SCRIPT to run the scripted model"
    )
