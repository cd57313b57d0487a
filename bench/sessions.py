"""A deterministic, realistic session: prompts, tool-calling turns, approvals and receipts of
varied sizes."""

from __future__ import annotations

import random
from collections.abc import Iterator

from kiso.kernel import (
    ApprovalDecided,
    Assistant,
    Event,
    ExecutionFinished,
    ExecutionStarted,
    ModelRef,
    Outcome,
    RunEnded,
    RunStarted,
    TextBlock,
    ToolCall,
    Usage,
    User,
    input_sha256,
)

WORDS = [
    "the",
    "parser",
    "returns",
    "a",
    "node",
    "for",
    "each",
    "token",
    "and",
    "the",
    "checker",
    "walks",
    "them",
    "in",
    "order",
]


def _text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def _code(rng: random.Random, lines: int) -> str:
    return "\n".join(
        f"{i:>4}  def f{i}(x):  # {_text(rng, rng.randint(10, 50))}" for i in range(1, lines + 1)
    )


def turn_events(rng: random.Random, run: str, turn: int) -> list[Event]:
    """One model turn with one tool call, its verdict, its start and its receipt."""
    kind = rng.choice(["read_file", "read_file", "shell", "edit_file", "search_text"])
    if kind == "read_file":
        args: dict[str, object] = {"path": f"src/pkg/module_{turn % 37}.py", "offset": 0}
        out = _code(rng, rng.randint(5, 40))
    elif kind == "shell":
        args = {"command": f"pytest -q tests/test_{turn % 11}.py", "timeout_ms": 120000}
        out = f"{rng.randint(1, 90)} passed in 0.{rng.randint(10, 99)}s\n" + _text(rng, 120)
    elif kind == "edit_file":
        args = {
            "path": f"src/pkg/module_{turn % 37}.py",
            "edits": [{"oldText": _text(rng, 40), "newText": _text(rng, 60)}],
        }
        out = f"edited src/pkg/module_{turn % 37}.py (1 edit)\n[rev:{rng.getrandbits(64):016x}]"
    else:
        args = {"pattern": rng.choice(WORDS), "path": "src"}
        out = "\n".join(f"src/pkg/module_{i}.py:{i * 7}: {_text(rng, 60)}" for i in range(8))
    call = ToolCall(f"call_{turn}", kind, args)
    xid = f"s:{turn}"
    return [
        Assistant(
            run=run,
            blocks=(TextBlock(_text(rng, rng.randint(20, 160))), call),
            stop="tool_use",
            usage=Usage(
                input=2000 + 40 * turn,
                output=rng.randint(20, 200),
                cache_read=1800,
                cache_write=None,
            ),
            model="faux-bench",
            ms=rng.randint(300, 4000),
        ),
        ApprovalDecided(
            run=run,
            call_id=call.call_id,
            decision="approved",
            decided_by="mode:default",
            reason=None,
            input_sha256=input_sha256(args),
        ),
        ExecutionStarted(run=run, execution_id=xid, call_id=call.call_id, name=kind, input=args),
        ExecutionFinished(
            run=run,
            execution_id=xid,
            call_id=call.call_id,
            ok=True,
            content=out,
            is_error=False,
            ms=rng.randint(1, 900),
        ),
    ]


def session_events(turns: int, *, seed: int = 7, turns_per_run: int = 10) -> Iterator[Event]:
    """A session of ``turns`` tool-calling turns in runs of ``turns_per_run``."""
    rng = random.Random(seed)
    for turn in range(turns):
        run = f"run-{turn // turns_per_run}"
        if turn % turns_per_run == 0:
            yield RunStarted(
                run=run, trigger="user", model=ModelRef("faux", "faux-bench"), mode="default"
            )
            yield User(run=run, content=_text(rng, rng.randint(40, 300)))
        yield from turn_events(rng, run, turn)
        if turn % turns_per_run == turns_per_run - 1:
            yield Assistant(
                run=run,
                blocks=(TextBlock(_text(rng, 200)),),
                stop="end_turn",
                usage=Usage(input=3000, output=80, cache_read=2900, cache_write=None),
                model="faux-bench",
                ms=900,
            )
            yield RunEnded(run=run, outcome=Outcome.completed())
