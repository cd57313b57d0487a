"""The scripted model: each agent answers with real, valid KML for its domain, with no key.

A fresh install has no model configured; every agent then answers through :class:`ScriptedKml`,
a kiso adapter (the same contract as any provider's) that writes a plan for the request in the
persona's domain using only the persona's tools. It is deterministic: the same request gives
the same answer. Text streams in small pieces (``delay_ms`` spreads them, for demos and tests of
streaming and shutdown); usage counts are estimates (4 characters a token). Its provider cost is
unknown, so a run with it costs the minimum charge.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

from kiso.kernel import TextBlock, ToolCall, ToolResultMessage, Usage, UserMessage
from kiso.providers.base import ModelRequest, StreamEvent, TextDelta, TurnDone
from kyronix import kml
from kyronix.server.agents import Persona, asked_text

__all__ = ["ScriptedKml", "ScriptedTools", "scripted_plan"]

_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.[A-Za-z0-9]{1,6})(?![\w/])")
_URL = re.compile(r"https?://[^\s<>\"')]+")
_WORD = re.compile(r"[A-Za-z0-9]+")


def _slug(text: str, default: str = "task", words: int = 4) -> str:
    found = [w.lower() for w in _WORD.findall(text)][:words]
    return "_".join(found) or default


def _short(text: str, limit: int = 160) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _code_for(path: str, request: str) -> tuple[str, str]:
    """(file content, test command) for a file the request names."""
    ext = path.rsplit(".", 1)[-1].lower()
    note = _short(request, 200)
    if ext in ("ts", "tsx", "js", "jsx"):
        name = re.sub(r"\W", "", path.rsplit("/", 1)[-1].split(".", maxsplit=1)[0]) or "main"
        if ext in ("tsx", "jsx"):
            body = (
                f"// {note}\n"
                f"export function {name}(props: {{ children?: React.ReactNode }}) {{\n"
                f'  return <div className="{name.lower()}">{{props.children}}</div>;\n'
                f"}}\n"
            )
        else:
            body = f"// {note}\nexport const {name} = (input: string): string => input.trim();\n"
        return body, "npm test"
    if ext == "py":
        body = (
            f'"""{note}"""\n\n\ndef main() -> None:\n    print("done")\n\n\n'
            'if __name__ == "__main__":\n    main()\n'
        )
        return body, f"python3 {path}"
    if ext == "go":
        return f"// {note}\npackage main\n\nfunc main() {{}}\n", "go build ./..."
    if ext == "rs":
        return f"// {note}\nfn main() {{}}\n", "cargo build"
    if ext == "sql":
        return f"-- {note}\nSELECT 1;\n", f"sqlite3 app.db < {path}"
    return f"{note}\n", f"ls -la {path.rsplit('/', 1)[0] if '/' in path else '.'}"


def _coding(request: str) -> kml.Plan:
    m = _PATH.search(request)
    path = m.group(1) if m else f"src/{_slug(request)}.py"
    content, test = _code_for(path, request)
    return kml.Plan(
        tools=(
            kml.ToolCall("write_file", {"path": path, "content": content}, "x0"),
            kml.ToolCall("terminal", {"command": test}, "x1"),
            kml.ToolCall("git_commit", {"message": f"Add {path}: {_short(request, 60)}"}, "x2"),
        ),
        plan=f"Create {path} for the request ({_short(request)}), run the check, and commit.",
        summary=f"Wrote {path}, ran `{test}`, and committed the change.",
        status="complete",
    )


def _research(request: str) -> kml.Plan:
    m = _URL.search(request)
    url = (
        m.group(0)
        if m
        else "https://duckduckgo.com/html/?q=" + "+".join(_WORD.findall(request)[:8])
    )
    shot = f"research/{_slug(request)}.png"
    return kml.Plan(
        tools=(
            kml.ToolCall("navigate", {"url": url}, "x0"),
            kml.ToolCall("screenshot", {"path": shot}, "x1"),
            kml.ToolCall("http_request", {"url": url, "method": "GET"}, "x2"),
        ),
        plan=f"Open {url}, keep a screenshot as evidence, and fetch the page to read it in full.",
        summary=f"Collected the sources for: {_short(request)}. Evidence in {shot}.",
        status="complete",
    )


def _database(request: str) -> kml.Plan:
    slug = _slug(request, "query")
    words = {w.lower() for w in _WORD.findall(request)}
    table = next(
        (w for w in ("users", "orders", "accounts", "events", "signups") if w in words), "items"
    )
    if words & {"migration", "migrate", "create", "table", "schema", "add", "index"}:
        path = f"migrations/001_{slug}.sql"
        sql = (
            f"-- {_short(request, 200)}\n"
            "BEGIN;\n"
            f"CREATE TABLE IF NOT EXISTS {table} (\n"
            "    id INTEGER PRIMARY KEY,\n"
            "    email TEXT NOT NULL UNIQUE,\n"
            "    created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP\n"
            ");\n"
            f"CREATE INDEX IF NOT EXISTS {table}_created_at ON {table} (created_at);\n"
            "COMMIT;\n"
        )
    else:
        path = f"queries/{slug}.sql"
        sql = (
            f"-- {_short(request, 200)}\n"
            f"SELECT id, email, created_at\nFROM {table}\n"
            "WHERE created_at >= datetime('now', '-1 day')\n"
            "ORDER BY created_at DESC\nLIMIT 100;\n"
        )
    return kml.Plan(
        tools=(
            kml.ToolCall("write_file", {"path": path, "content": sql}, "x0"),
            kml.ToolCall("terminal", {"command": f"sqlite3 app.db < {path}"}, "x1"),
        ),
        plan=f"Write the SQL to {path} (explicit columns, an index for the filter), then run it.",
        summary=f"Wrote {path} and ran it against app.db.",
        status="complete",
    )


def _sales(request: str) -> kml.Plan:
    slug = _slug(request, "outreach")
    path = f"drafts/{slug}.md"
    draft = (
        f"Subject: A quick idea for your team\n\n"
        f"Hi {{first_name}},\n\n"
        f"{_short(request, 240)}\n\n"
        "Teams like yours use us to cut the busywork out of their week. Would a 15-minute call "
        "on Thursday be useful?\n\n"
        "Best,\n{sender}\n"
    )
    note = json.dumps({"type": "email_draft", "file": path, "status": "draft"})
    return kml.Plan(
        tools=(
            kml.ToolCall("write_file", {"path": path, "content": draft}, "x0"),
            kml.ToolCall(
                "http_request",
                {
                    "url": "https://crm.example.com/api/notes",
                    "method": "POST",
                    "headers": '{"Content-Type": "application/json"}',
                    "body": note,
                },
                "x1",
            ),
        ),
        plan="Draft a short, specific email with one call to action, then log it in the CRM.",
        summary=f"Drafted the outreach email in {path} and logged it in the CRM.",
        status="complete",
    )


def _custom(request: str, persona: Persona) -> kml.Plan:
    calls = []
    for i, tool in enumerate(persona.tools[:3]):
        args = {}
        for p in tool.params:
            low = p.name.lower()
            args[p.name] = "10" if low in ("limit", "count", "n", "top") else _short(request, 200)
        calls.append(kml.ToolCall(tool.name, args, f"x{i}"))
    if calls:
        summary = f"Called {', '.join(c.name for c in calls)} for: {_short(request)}"
        status = "complete"
    else:
        summary = "This agent has no enabled tools, so there is nothing to run."
        status = "needs_input"
    return kml.Plan(
        tools=tuple(calls),
        plan=f"{persona.name}: handle the request with the agent's own tools.",
        summary=summary,
        status=status,
    )


def scripted_plan(persona: Persona, request: str) -> kml.Plan:
    """The plan the scripted model answers ``request`` with."""
    if persona.custom:
        return _custom(request, persona)
    return {"coding": _coding, "research": _research, "database": _database, "sales": _sales}[
        persona.id
    ](request)


def _without_ids(text: str) -> str:
    return re.sub(r' executionId="x\d+"', "", text)


class ScriptedKml:
    """A kiso adapter that answers as the persona would, in valid KML, with no model."""

    provider = "kyronix-scripted"

    def __init__(self, persona: Persona, *, delay_ms: int = 0, piece: int = 24) -> None:
        self.persona = persona
        self.model = f"scripted:{persona.id[:16]}"
        self.delay_ms = delay_ms
        self.piece = piece

    def answer(self, request: ModelRequest) -> str:
        prompt = ""
        for message in reversed(request.messages):
            if isinstance(message, UserMessage):
                prompt = asked_text(message.content)  # not the tunnel results put in front
                break
        return _without_ids(kml.serialize(scripted_plan(self.persona, prompt)))

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        text = self.answer(request)
        pieces = [text[i : i + self.piece] for i in range(0, len(text), self.piece)]
        pause = self.delay_ms / 1000 / max(len(pieces), 1)
        for piece in pieces:
            if pause:
                await asyncio.sleep(pause)
            yield TextDelta(piece)
        seen = len(request.system or "") + sum(
            len(b.text) for m in request.messages if isinstance(m, UserMessage)
            for b in m.content if isinstance(b, TextBlock)
        )  # fmt: skip
        usage = Usage(input=max(1, seen // 4), output=max(1, len(text) // 4))
        yield TurnDone((TextBlock(text),), "end_turn", usage, self.model)


class ScriptedTools:
    """The scripted model for the server-driven loop (``"execute": "tunnel"``): it calls the
    persona's tools (the plan :func:`scripted_plan` writes, as native tool calls), and once their
    results are back it answers with a closing envelope that reports them."""

    provider = "kyronix-scripted"

    def __init__(self, persona: Persona, *, delay_ms: int = 0) -> None:
        self.persona = persona
        self.model = f"scripted:{persona.id[:16]}"
        self.delay_ms = delay_ms

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if self.delay_ms:
            await asyncio.sleep(self.delay_ms / 1000)
        last = request.messages[-1] if request.messages else None
        if isinstance(last, ToolResultMessage):
            results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
            failed = sum(1 for m in results if m.is_error)
            summary = f"ran {len(results)} tool call(s): {len(results) - failed} succeeded"
            if failed:
                summary += f", {failed} failed"
            text = kml.serialize(
                kml.Plan(summary=summary, status="complete" if not failed else "failed")
            )
            yield TextDelta(text)
            yield TurnDone(
                (TextBlock(text),),
                "end_turn",
                Usage(input=1, output=len(text) // 4 or 1),
                self.model,
            )
            return
        prompt = ""
        for message in reversed(request.messages):
            if isinstance(message, UserMessage):
                prompt = asked_text(message.content)  # not the tunnel results put in front
                break
        plan = scripted_plan(self.persona, prompt)
        note = plan.plan or "running the plan's tools"
        calls = tuple(
            ToolCall(f"call_{request.turn}_{i}", t.name, dict(t.args))
            for i, t in enumerate(plan.tools)
        )
        yield TextDelta(note)
        yield TurnDone(
            (TextBlock(note), *calls),
            "tool_use" if calls else "end_turn",
            Usage(input=max(1, len(prompt) // 4), output=max(1, len(note) // 4)),
            self.model,
        )
