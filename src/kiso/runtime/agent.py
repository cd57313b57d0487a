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
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from kiso.kernel import (
    JsonlSessionStore,
    SessionNotFoundError,
    SessionStore,
    ToolCall,
    UsageError,
    kiso_home,
)
from kiso.kernel.events import Trigger
from kiso.providers.base import Adapter, ToolSpec
from kiso.runtime.approvals import (
    FloorHook,
    ModeHook,
    RulesHook,
    SandboxHook,
    as_hooks,
    check_mode,
)
from kiso.runtime.context import Window
from kiso.runtime.hooks import Hook, HookChain, Policy
from kiso.runtime.permissions import Permissions, permission_hooks
from kiso.runtime.rules import RULES_FILE, RulesFile
from kiso.runtime.session import Session
from kiso.tools.base import Tool
from kiso.tools.sandbox import Sandbox, SandboxPolicy

if TYPE_CHECKING:
    from kiso.runtime.offers import Offer

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
        hooks: Sequence[Hook] = (),
        policies: Sequence[Policy] = (),
        rules: RulesFile | str | os.PathLike[str] | None = None,
        floor: bool = True,
        home: str | os.PathLike[str] | None = None,
        strip_env: Iterable[str] = (),
        pass_env: Iterable[str] = (),
        trigger: Trigger = "user",
        window: Window | int | None = None,
        auto_compact: bool = True,
        sandbox: SandboxPolicy | Sandbox | None = None,
        permissions: Permissions | None = None,
        max_budget_usd: float | None = None,
    ) -> None:
        self.adapter: Adapter = adapter if adapter is not None else _default_adapter(model)
        names = [t.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise UsageError(f"two tools are named {', '.join(duplicates)}; names must be unique")
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.store: SessionStore = store if store is not None else JsonlSessionStore()
        self.system_prompt = system_prompt
        self.mode = check_mode(mode)
        self.workspace = Path(os.path.realpath(workspace if workspace is not None else os.getcwd()))
        self.profile = profile
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise UsageError(f"max_turns must be a positive whole number, not {max_turns!r}")
        self.max_turns = max_turns
        if max_budget_usd is not None and not 0 < max_budget_usd < float("inf"):
            raise UsageError(f"max_budget_usd must be a positive number, not {max_budget_usd!r}")
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.idle_timeout = idle_timeout
        if rules is None:
            self.rules = RulesFile(kiso_home() / RULES_FILE)
        elif isinstance(rules, RulesFile):
            self.rules = rules
        elif isinstance(rules, str | os.PathLike):
            self.rules = RulesFile(Path(rules))
        else:
            raise UsageError(
                f"rules must be a RulesFile or the path of a rules file, not {type(rules).__name__}"
            )
        self.floor = floor
        self.permissions = permissions or Permissions()
        """The ``permissions`` rules (allow, ask, deny): :mod:`kiso.runtime.permissions`."""
        self.max_budget_usd = max_budget_usd
        """A run ends with outcome ``budget`` once its cost reaches this (checked between turns)."""
        self.hooks = HookChain(
            [
                FloorHook(floor),
                ModeHook(),
                RulesHook(self.rules),
                SandboxHook(lambda: self.sandbox),
                *permission_hooks(self.permissions),
                *as_hooks(policies),
                *hooks,
            ]
        )
        """Every hook point's hooks: the floor, the mode, the rules and the permissions first,
        then the agent's."""
        self._specs = [  # a tool denied whole is not offered (a call to it is still denied)
            ToolSpec(t.name, t.description, t.parameters)
            for t in tools
            if not self.permissions.hides(t.name)
        ]
        self.home = Path(home) if home is not None else Path.home()
        self.strip_env = tuple(strip_env)
        self.pass_env = tuple(pass_env)
        """Names kept in the children's environment although a rule strips them
        (``shell.passEnv``): :func:`kiso.tools.env.child_env`'s ``keep``."""
        self.trigger: Trigger = trigger
        if isinstance(window, Window):
            self.window = window
        else:
            self.window = Window(self.adapter.model, explicit=window, explicit_source="agent")
        """The model's context window: explicit, the registry's, or learned from a refusal."""
        if isinstance(sandbox, SandboxPolicy):
            sandbox = Sandbox.for_workspace(sandbox, self.workspace)
        self.sandbox: Sandbox | None = sandbox
        """The OS sandbox ``shell`` runs commands in (docs/sandbox.md); None: none. A call with
        ``outside_sandbox`` is always put to a person (:class:`SandboxHook`)."""
        self.auto_compact = auto_compact
        """Whether context relief compacts on its own (docs/context.md); ``/compact`` always can."""
        self._validators: dict[str, Draft202012Validator] = {}
        for tool in tools:
            try:
                Draft202012Validator.check_schema(tool.parameters)
            except SchemaError as exc:
                raise UsageError(
                    f"tool {tool.name!r}: its parameters are not a valid JSON Schema: {exc.message}"
                ) from None

    # ------------------------------------------------------------------ sessions

    def session(
        self,
        id: str | None = None,
        *,
        mode: str | None = None,
        headless: bool = False,
        system_prompt: str | None = None,
        parent: str | None = None,
    ) -> Session:
        """Open session ``id`` for writing (creating it if it does not exist), or a new one.

        ``mode`` overrides the mode the session's log recorded (a ``--mode`` flag): the change
        is recorded. Without it the session continues in its recorded mode, else the agent's.
        ``headless``: nobody can answer questions, so an ask is denied by ``headless``.
        ``system_prompt`` likewise replaces the prompt the log recorded (the change is
        recorded); without it the session keeps its recorded prompt, else the agent's.
        ``parent``: the session that delegated to this one (a new session's header records it).
        """
        if mode is not None:
            check_mode(mode)
        writer = None
        if id is not None:
            try:
                writer = self.store.open(id)
            except SessionNotFoundError:
                writer = None
        if writer is None:
            writer = self.store.create(str(self.workspace), session_id=id, parent=parent)
        try:
            return Session(self, writer, mode=mode, headless=headless, system_prompt=system_prompt)
        except BaseException:
            writer.close()
            raise

    # ------------------------------------------------------------------ what the loop asks

    def tool(self, name: str) -> Tool | None:
        return self.tools.get(name)

    @cached_property
    def rerunnable(self) -> frozenset[str]:
        return frozenset(name for name, tool in self.tools.items() if tool.rerunnable)

    def tool_specs(self) -> list[ToolSpec]:
        return list(self._specs)

    @cached_property
    def specs_tokens(self) -> int:
        """The tool schemas' estimated size in tokens (what they cost every request)."""
        from kiso.runtime.context import specs_tokens

        return specs_tokens(self._specs)

    def offer(self, call: ToolCall) -> Offer:
        """What an approval of ``call`` may offer: the one place that decides it."""
        from dataclasses import replace

        from kiso.runtime.offers import approval_offer
        from kiso.runtime.rules import project_of

        tool = self.tool(call.name)
        offer = approval_offer(call, tool, self.workspace, self.home)
        offer = replace(offer, project=project_of(self.workspace))
        asks = self.permissions.first("ask", call, tool, self.workspace, self.home)
        if asks is not None and offer.rule is not None:  # a rule could never stop the asking
            why = f"the permission rule {asks.pattern.text} ({asks.said}) always asks"
            return replace(offer, rule=None, no_rule_because=why)
        return offer

    def input_problem(self, tool: Tool, value: dict[str, Any]) -> str | None:
        """Why ``value`` does not fit the tool's schema, or None."""
        validator = self._validators.get(tool.name)
        if validator is None:
            validator = self._validators[tool.name] = Draft202012Validator(tool.parameters)
        if validator.is_valid(value):
            return None
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "the input"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"{where}: {_said(first)}{more}"

    def child_env(self) -> Mapping[str, str]:
        """The environment for children a model can drive: this process's, credentials stripped
        but for the names the user chose to pass (``pass_env``)."""
        from kiso.tools.env import child_env

        return child_env(os.environ, also_strip=self.strip_env, keep=self.pass_env)


_BOUNDS = {
    "maxItems": ("at most", "items"),
    "minItems": ("at least", "items"),
    "maxLength": ("at most", "characters"),
    "minLength": ("at least", "characters"),
}


def _said(error: Any) -> str:
    """A schema error in a line: a size bound says the bound and the size, not the value (the
    value of a too-long list is the whole list)."""
    bound = _BOUNDS.get(error.validator)
    if bound is not None and isinstance(error.instance, list | str):
        return f"{bound[0]} {error.validator_value} {bound[1]} (got {len(error.instance)})"
    return str(error.message)


def _default_adapter(model: str | None) -> Adapter:
    from kiso.providers.faux import FauxAdapter

    script = os.environ.get("KISO_FAUX_SCRIPT")
    if script:
        return FauxAdapter.from_file(script)
    if model in (None, "faux"):
        raise UsageError(
            "no model adapter: pass adapter=..., or set KISO_FAUX_SCRIPT to a script file to use "
            "the scripted model"
        )
    raise UsageError(
        f"no adapter for model {model!r}: pass adapter=... (provider adapters come with kiso's "
        f"provider support), or set KISO_FAUX_SCRIPT to run the scripted model"
    )
