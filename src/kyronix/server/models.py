"""Which model the agents talk to: the scripted one, or a configured one through kiso's adapters.

``$KYRONIX_HOME/config.json`` has kiso's shapes (``{"model": "local", "models": {"local":
{"kind": "openai-compat", "model": "...", "baseUrl": "...", "apiKeyEnv": "..."}}}``) and is read
by kiso's own loader; ``KYRONIX_MODEL`` (a profile name or ``provider/model``) overrides its
``model``. With no model named, every agent uses the scripted model (:mod:`.scripted`) — even
when ``OPENAI_API_KEY`` happens to be set: a server never spends on a key nobody configured for it.

With ``kmlGrammar`` on, an ``openai-compat`` model is sent a GBNF grammar of the persona's KML
(``grammar`` in the request body, which llama.cpp's server reads), so even a tiny local model
can only write a valid envelope that calls the persona's tools with their parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiso.providers.base import Adapter, ModelRequest
from kyronix.server.agents import Persona
from kyronix.server.config import ServerConfig
from kyronix.server.scripted import ScriptedKml, ScriptedTools

if TYPE_CHECKING:
    from kiso.runtime.models import ResolvedModel

__all__ = ["ModelChoice", "choose_model", "kml_grammar"]


@dataclass(frozen=True)
class ModelChoice:
    resolved: ResolvedModel | None
    """None: the scripted model."""
    config: ServerConfig

    @property
    def scripted(self) -> bool:
        return self.resolved is None

    def describe(self) -> str:
        if self.resolved is None:
            return "scripted KML (no model configured)"
        return self.resolved.describe()

    def adapter(self, persona: Persona) -> Adapter:
        if self.resolved is None:
            return ScriptedKml(persona, delay_ms=self.config.scripted_delay_ms)
        from kiso.runtime.models import build_adapter

        profile = self.resolved.profile
        if self.config.kml_grammar and profile is not None and profile.kind == "openai-compat":
            return _grammar_adapter(self.resolved, kml_grammar(persona))
        return build_adapter(self.resolved)

    def tunnel_adapter(self, persona: Persona) -> Adapter:
        """The adapter of the server-driven loop: the model calls the persona's tools."""
        if self.resolved is None:
            return ScriptedTools(persona, delay_ms=self.config.scripted_delay_ms)
        from kiso.runtime.models import build_adapter

        return build_adapter(self.resolved)


def choose_model(config: ServerConfig) -> ModelChoice:
    """Read ``config.json`` in the Kyronix home (kiso's loader and key rules)."""
    import os

    from kiso.runtime.config import load_config
    from kiso.runtime.models import resolve_model

    environ: dict[str, str] = {k: v for k, v in os.environ.items() if k not in _KISO_ONLY}
    cfg = load_config(config.home, None, environ={}, model=config.model)
    if not cfg.model:
        return ModelChoice(None, config)
    return ModelChoice(resolve_model(cfg, home=config.home, environ=environ), config)


_KISO_ONLY = frozenset({"KISO_MODEL", "KISO_MODE", "KISO_FAUX_SCRIPT"})


def _grammar_adapter(resolved: ResolvedModel, grammar: str) -> Adapter:
    from kiso.providers.openai_compat import OpenAICompatAdapter

    class GrammarAdapter(OpenAICompatAdapter):
        """Chat Completions with a GBNF ``grammar`` in the body (llama.cpp's server)."""

        def request_params(self, request: ModelRequest) -> dict[str, Any]:
            params = super().request_params(request)
            params["extra_body"] = {"grammar": grammar}
            return params

    profile = resolved.profile
    assert profile is not None
    return GrammarAdapter(
        model=profile.model,
        api_key=resolved.api_key,
        base_url=profile.base_url,
        provider=profile.name,
        reasoning_effort=profile.effort,
    )


def _lit(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def kml_grammar(persona: Persona) -> str:
    """A GBNF grammar for the persona's envelopes: a plan, one to three tool calls of its tools
    with their parameters (required ones always, in declared order), a summary, a status."""
    rules = [
        'root ::= "<kyronix>\\n<plan>" line "</plan>\\n" call call? call? '
        '"<summary>" line "</summary>\\n<status>complete</status>\\n</kyronix>\\n"',
        "line ::= [^<\\n]{1,160}",
        "block ::= [^<]{1,600}",
    ]
    alternatives = []
    for i, tool in enumerate(persona.tools):
        parts = [_lit(f'<tool name="{tool.name}">\n')]
        for p in tool.params:
            value = "block" if p.name in ("content", "command", "body") else "line"
            if p.type == "integer":
                value = "[0-9]{1,6}"
            elif p.type == "boolean":
                value = '("true" | "false")'
            piece = f"{_lit(f'<{p.name}>')} {value} {_lit(f'</{p.name}>' + chr(10))}"
            parts.append(piece if p.required else f"({piece})?")
        parts.append(_lit("</tool>\n"))
        rules.append(f"tool{i} ::= " + " ".join(parts))
        alternatives.append(f"tool{i}")
    rules.append("call ::= " + (" | ".join(alternatives) if alternatives else '""'))
    return "\n".join(rules) + "\n"
