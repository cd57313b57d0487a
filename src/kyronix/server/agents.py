"""The agents: four built-in personas and the custom agents of a project, and what their KML may
say.

A :class:`Persona` is a system prompt plus the tools its KML may call. Built-ins take their tools
from the executer's 20 (``kyronix.executer.tools``), so a parameter the executer does not have
can never be asked for:

==========  ==================================================================================
coding      the file tools, terminal, git_clone / git_commit / git_branch
research    navigate, click, type, screenshot, http_request
database    the file tools and terminal, with SQL guidance (migrations as files, sqlite3/psql)
sales       http_request, and write_file / read_file for drafts
==========  ==================================================================================

A custom agent's tools are its own (``{name, description, params, disabled}``); they are written
into its instructions, and a disabled tool is neither offered nor accepted.

:func:`check_plan` validates the tool calls of a parsed answer against the persona: an unknown
tool, an unknown parameter, a missing required one, a value that is not of its type. The runner
sends the problems back to the model once, then fails the run. :func:`finalize` gives the answer
its server-assigned execution ids (``exec_`` + 32 hex digits derived from the kiso run id and the
tool's index: unique, and the same every time the log is read) and serializes the envelope.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from kiso.kernel import TextBlock
from kyronix import kml

__all__ = [
    "AGENTS",
    "ParamDef",
    "Persona",
    "ToolDef",
    "builtin_persona",
    "check_plan",
    "custom_persona",
    "finalize",
    "issued_by",
]

AGENTS = ("coding", "research", "database", "sales")

_TOOLSETS: dict[str, tuple[str, ...]] = {
    "coding": ("files", "terminal", "git"),
    "research": ("browser", "network"),
    "database": ("files", "terminal"),
    "sales": ("network", "write_file", "read_file"),
}
"""Each built-in agent's tools: groups of the executer's built-ins (``builtin_groups``, derived
from the executer's own specs) or single tools."""
_DESCRIPTIONS = {
    "coding": "Software engineering, debugging, and architecture",
    "research": "Deep dive web research and synthesis",
    "database": "SQL generation and database querying",
    "sales": "Lead qualification and outreach",
}
_GUIDANCE = {
    "coding": (
        "You are Kyronix's coding agent: software development, refactoring, bug fixes, terminal "
        "commands and file edits. Prefer small, reviewable changes: read before you edit, write "
        "whole files with write_file, run the project's tests with terminal, and commit with "
        "git_commit when the change is complete."
    ),
    "research": (
        "You are Kyronix's research agent: web research, documentation inspection and "
        "summarization. Open pages with navigate, interact with click and type, capture "
        "evidence with screenshot, and call APIs with http_request. Put your synthesis in "
        "<summary>, citing the URLs you used."
    ),
    "database": (
        "You are Kyronix's database agent: SQL generation, schema inspection, query "
        "optimization and migrations. Write SQL to files (migrations/NNN_name.sql, "
        "queries/name.sql) with write_file, and run it with terminal through the database's "
        "own client (sqlite3 app.db < file.sql, psql -f file.sql). Write portable, explicit "
        "SQL: name columns, add the indexes a query needs, wrap migrations in a transaction, "
        "and never run a destructive statement (DROP, DELETE without WHERE) unless asked."
    ),
    "sales": (
        "You are Kyronix's sales agent: lead qualification, outreach and email copy. Draft "
        "messages into files (drafts/<name>.md) with write_file, read prior material with "
        "read_file, and talk to CRM or enrichment APIs with http_request. Keep copy short, "
        "specific to the lead, with one clear call to action."
    ),
}


RESULTS_HEADER = "Results of the tools of your previous plan"
"""How the block of tunnel results put in front of a session's next input begins."""


def asked_text(blocks: Sequence[object]) -> str:
    """The text of a user input without the tunnel results block put in front of it."""
    texts = [b.text for b in blocks if isinstance(b, TextBlock)]
    if len(texts) > 1 and texts[0].startswith(RESULTS_HEADER):
        texts = texts[1:]
    return "\n\n".join(texts)


@dataclass(frozen=True)
class ParamDef:
    name: str
    type: str = "string"
    required: bool = False
    description: str = ""


@dataclass(frozen=True)
class ToolDef:
    name: str
    description: str
    params: tuple[ParamDef, ...]

    def param(self, name: str) -> ParamDef | None:
        for p in self.params:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True)
class Persona:
    id: str
    """The agent slug (``coding``) or the custom agent's 64-hex id."""
    name: str
    description: str
    tools: tuple[ToolDef, ...]
    guidance: str
    custom: bool = False

    def tool(self, name: str) -> ToolDef | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None

    @property
    def tunnel_instructions(self) -> str:
        """The system prompt of the server-driven loop: the persona, its tools as real tools."""
        return (
            f"{self.guidance}\n\nYou work through tools that run on the user's machine: call "
            f"them (one call per step, in the order they must run), read each result, and go on "
            f"until the task is done; then answer with a short KML envelope: <kyronix><summary>"
            f"what was done</summary><status>complete</status></kyronix> (status failed if it "
            f"could not be done). A result marked uncertain started and never finished: do not "
            f"call it again, say that a person must check it."
        )

    @property
    def instructions(self) -> str:
        """The system prompt: the persona, the KML contract, the tools."""
        lines = [
            self.guidance,
            "",
            "Answer every request with exactly one KML envelope and nothing else:",
            "<kyronix>",
            "  <plan>what you will do and why, in a few sentences</plan>",
            '  <tool name="TOOL">',
            "    <param>value</param>",
            "  </tool>",
            "  <summary>what the tools will have done</summary>",
            "  <status>complete</status>",
            "</kyronix>",
            "",
            "Rules: one <tool> element per call, in the order they must run; each child element "
            "is one parameter (its text is taken literally, so write code as is, or inside "
            "<![CDATA[ ... ]]>); use only the tools and parameters listed below; status is one "
            "of complete, in_progress, needs_input, failed. Do not add executionId attributes: "
            "the platform assigns them.",
            "",
            "Tools:",
        ]
        for t in self.tools:
            params = ", ".join(
                f"{p.name}{'' if p.required else '?'}"
                + (f" ({p.type})" if p.type not in ("string", "path", "dir") else "")
                for p in t.params
            )
            lines.append(f"- {t.name}({params}): {t.description}")
        return "\n".join(lines)


@cache
def _executer_tools() -> dict[str, ToolDef]:
    from kyronix.executer.tools import builtin_tools

    out: dict[str, ToolDef] = {}
    for name, spec in builtin_tools().items():
        out[name] = ToolDef(
            name,
            spec.description,
            tuple(ParamDef(p.name, p.type, p.required, p.description) for p in spec.params),
        )
    return out


def builtin_names() -> frozenset[str]:
    from kyronix.executer.tools import BUILTIN_NAMES

    return frozenset(BUILTIN_NAMES)


def toolset(agent: str) -> tuple[str, ...]:
    """The names of a built-in agent's tools, from the executer's specs."""
    from kyronix.executer.tools import builtin_groups

    groups = builtin_groups()
    return tuple(n for part in _TOOLSETS[agent] for n in groups.get(part, (part,)))


@cache
def builtin_persona(agent: str) -> Persona:
    tools = _executer_tools()
    return Persona(
        id=agent,
        name=agent,
        description=_DESCRIPTIONS[agent],
        tools=tuple(tools[name] for name in toolset(agent)),
        guidance=_GUIDANCE[agent],
    )


def custom_persona(
    agent_id: str, name: str, description: str, tools: Sequence[dict[str, Any]]
) -> Persona:
    defs = tuple(
        ToolDef(t["name"], t.get("description", ""), tuple(ParamDef(p) for p in t["params"]))
        for t in tools
        if not t.get("disabled", False)
    )
    guidance = (
        f"You are {name!r}, a custom Kyronix agent. {description}".strip()
        + " Your tools are run by the user's own executer: call them with the parameters "
        "they declare."
    )
    return Persona(agent_id, name, description, defs, guidance, custom=True)


def check_plan(plan: kml.Plan, persona: Persona) -> list[str]:
    """Why the plan's tool calls do not fit the persona's tools (empty: they do)."""
    problems: list[str] = []
    names = ", ".join(t.name for t in persona.tools) or "none"
    for i, call in enumerate(plan.tools, 1):
        tool = persona.tool(call.name)
        where = f"tool {i} ({call.name!r})"
        if tool is None:
            problems.append(f"{where}: there is no such tool; the tools are: {names}")
            continue
        allowed = ", ".join(p.name for p in tool.params) or "none"
        for arg, value in call.args.items():
            param = tool.param(arg)
            if param is None:
                problems.append(f"{where}: unknown parameter <{arg}>; its parameters: {allowed}")
            elif param.type == "integer" and not _is_int(value):
                problems.append(f"{where}: <{arg}> must be an integer, got {value[:40]!r}")
            elif param.type == "boolean" and value.strip().lower() not in _BOOLS:
                problems.append(f"{where}: <{arg}> must be true or false, got {value[:40]!r}")
            elif param.type == "object" and not _is_object(value):
                problems.append(f"{where}: <{arg}> must be a JSON object")
        for param in tool.params:
            if param.required and param.name not in call.args:
                problems.append(f"{where}: missing the required parameter <{param.name}>")
    return problems


_BOOLS = frozenset({"true", "false", "1", "0", "yes", "no"})


def _is_int(value: str) -> bool:
    try:
        int(value.strip())
    except ValueError:
        return False
    return True


def _is_object(value: str) -> bool:
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False


def execution_id(run_key: str, index: int, key: bytes = b"") -> str:
    """``exec_`` + 32 hex digits: 16 from the run and the tool's place in it (the same when the
    run is answered again), and 16 that sign those with the server's ``key``, so the server tells
    the ids of its own plans from any other without looking anything up (:func:`issued_by`)."""
    body = hashlib.sha256(f"{run_key}:{index}".encode()).hexdigest()[:16]
    return "exec_" + body + _signature(body, key)


def _signature(body: str, key: bytes) -> str:
    return hmac.new(key, b"plan\x00" + body.encode(), hashlib.sha256).hexdigest()[:16]


def issued_by(execution_id: str, key: bytes) -> bool:
    """Whether a plan of the server holding ``key`` gave this id."""
    if len(execution_id) != 37 or not execution_id.startswith("exec_"):
        return False
    body, signature = execution_id[5:21], execution_id[21:]
    return hmac.compare_digest(signature, _signature(body, key))


def finalize(plan: kml.Plan, run_key: str, key: bytes = b"") -> tuple[str, list[str]]:
    """The envelope the client gets (server-assigned execution ids, signed with ``key``, and a
    status) and its ids."""
    tools = tuple(
        replace(call, execution_id=execution_id(run_key, i, key), assigned=False)
        for i, call in enumerate(plan.tools)
    )
    final = replace(plan, tools=tools, status=plan.status or "complete")
    return kml.serialize(final), [t.execution_id for t in tools]
