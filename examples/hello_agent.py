"""The Python twin of the README's "Using it" example: an agent with one tool, a durable session.

Runs with no key: the model is scripted (kiso.providers.faux). Swap the adapter for a real one and
nothing else changes. Sessions are written under ./sessions (or $KISO_HOME when set).
"""

from __future__ import annotations

import os

from kiso import Agent, FauxAdapter, JsonlSessionStore, define_tool


def add(input: dict[str, float], ctx: object) -> str:
    return str(input["a"] + input["b"])


agent = Agent(
    model="faux",
    tools=[
        define_tool(
            "add",
            "Add two numbers",
            {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
            add,
            effects="read",
        )
    ],
    store=JsonlSessionStore(os.environ.get("KISO_HOME", "./sessions")),  # append-only JSONL
    adapter=FauxAdapter(
        [
            {
                "text": "Let me add them.",
                "tool_calls": [{"name": "add", "input": {"a": 2, "b": 3}}],
            },
            {"text": "2 + 3 = 5."},
        ]
    ),
)

with agent.session(id="demo") as session:
    for ev in session.run_sync("What is 2+3?"):
        if ev.type == "text_delta":
            print(ev.text, end="", flush=True)
        elif ev.type == "tool_end":
            print(f"\n[{ev.call.name} -> {ev.event.content}]")
        elif ev.type == "terminal":
            print("\n", ev.outcome.kind)
