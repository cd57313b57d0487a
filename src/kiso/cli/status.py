"""The status and working rows: facts from what the session recorded (the last turn's usage, the
session's spend) and from the turn streaming now; no extra request, no estimate shown as a
measurement."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.cells import cell_len

from kiso.kernel import (
    Assistant,
    Event,
    billed,
)
from kiso.providers.registry import cost, lookup
from kiso.runtime.prompt import estimate_tokens
from kiso.tools.sandbox import Sandbox, SandboxPolicy

from .render import shorten_end, shorten_middle

__all__ = [
    "Meter",
    "Streamed",
    "meter",
    "money",
    "pass_env_line",
    "sandbox_line",
    "spend",
    "status_row",
    "working_row",
]


def sandbox_line(sandbox: Sandbox | None, policy: SandboxPolicy) -> str:
    """``/status``'s sandbox row: what contains commands, and who chose it."""
    source = {"default": "the default", "flag": "--sandbox", "environment": "KISO_SANDBOX"}
    where = source.get(policy.source, policy.source)
    if sandbox is None:
        return f"off: commands run with your full access (from {where})"
    extra = f", also writable: {', '.join(policy.writable_roots)}" if policy.writable_roots else ""
    return f"{sandbox.describe()}{extra} (from {where})"


# --------------------------------------------------------------------------------------------
# the status row


@dataclass(frozen=True, slots=True)
class Meter:
    """Facts about the last model turn that reported them, from its recorded usage (the
    provider's own counts); ``None`` where unknown."""

    ctx_left: int | None = None
    cache_hit: int | None = None
    tok_s: float | None = None
    turn: Assistant | None = None


def meter(events: Iterable[Event], window: int, *, used: int | None = None) -> Meter:
    """``used``: the next request's size as the runtime measures it (``/context``'s total);
    without it, the last counted turn's own figures."""
    last: Assistant | None = None
    counted: Assistant | None = None
    timed: Assistant | None = None
    for e in events:
        if isinstance(e, Assistant):
            last = e
            if e.usage.input is not None or e.usage.cache_read is not None:
                counted = e
            if e.usage.output and e.ms > 0:
                timed = e
    if last is None:
        return Meter(ctx_left=100)
    ctx_left = cache = None
    if used is not None:
        ctx_left = max(0, min(100, round(100 - used * 100 / max(window, 1))))
    if counted is not None:
        u = counted.usage
        if used is None:
            size = (u.input or 0) + (u.cache_read or 0) + (u.cache_write or 0) + (u.output or 0)
            ctx_left = max(0, min(100, round(100 - size * 100 / max(window, 1))))
        seen = (u.input or 0) + (u.cache_read or 0)
        if seen and u.cache_read is not None:
            cache = round(u.cache_read * 100 / seen)
    tok_s = None
    if timed is not None and timed.usage.output:
        tok_s = timed.usage.output / (timed.ms / 1000)
    return Meter(ctx_left=ctx_left, cache_hit=cache, tok_s=tok_s, turn=last)


def status_row(
    *,
    mode: str,
    model: str,
    m: Meter,
    width: int,
    floor: bool = True,
    note: str = "",
    cost: str = "",
) -> str:
    """``▸ mode · /mode to switch · model · facts``: when the row is too narrow the hint goes
    first, then the model name is shortened in its middle; the facts are never cut."""
    facts = [f"ctx left ~{m.ctx_left}%" if m.ctx_left is not None else "ctx left ?"]
    if m.cache_hit is not None:
        facts.append(f"cache {m.cache_hit}%")
    if m.tok_s is not None:
        facts.append(f"{m.tok_s:.0f} tok/s")
    if cost:
        facts.append(cost)
    if not floor:
        facts.append("floor off")
    if note:
        facts.append(note)
    head = f"▸ {mode}"
    for hint in (["/mode to switch"], []):
        row = " · ".join([head, *hint, model, *facts])
        if len(row) <= width:
            return row
    room = width - len(" · ".join([head, "", *facts]))
    if room < 4:  # no room for even a shortened name: the facts stay, the name goes
        return " · ".join([head, *facts])
    return " · ".join([head, shorten_middle(model, room), *facts])


def pass_env_line(names: Iterable[str]) -> str:
    """``/status``'s row for ``shell.passEnv``: the names the shell tool keeps, never a value."""
    kept = list(names)
    if not kept:
        return "shell env  credentials stripped (shell.passEnv passes none)"
    return f"shell env  passes {', '.join(kept)} (shell.passEnv; values not shown)"


def money(dollars: float) -> str:
    return f"${dollars:,.2f}" if dollars >= 0.1 or dollars == 0 else f"${dollars:.4f}"


def spend(events: Iterable[Event], model: str) -> str:
    """What the session's model requests (its turns and its summaries) cost at the registry's
    dated list prices: ``$0.0123``; ``≥$0.0123`` when some request could not be priced (no price,
    or a count the provider did not report); ``cost unknown`` when nothing could be priced and
    the model has no price."""
    total, unpriced = 0.0, 0
    for used, usage in billed(events):
        dollars = cost(used, usage)
        if dollars is None:
            unpriced += 1
        else:
            total += dollars
    if lookup(model).price is None and total == 0:
        return "cost unknown"
    return ("≥" if unpriced else "") + money(total)


class Streamed:
    """Output tokens of the run going on, counted as they stream, and the decode rate.

    A committed turn counts what the provider reported (``usage.output``); the turn streaming
    now, and a turn whose provider reported nothing, count an estimate from the streamed text
    (about four bytes a token), shown with ``~``. The rate is tokens over the time from the
    turn's first delta to its last: the decode rate, without the wait for the first token.
    """

    def __init__(self) -> None:
        self.reported = 0
        self.estimated = 0
        self.text = ""
        self.first: float | None = None
        self.last: float | None = None
        self.rate: float | None = None
        """The decode rate of the last turn that could be measured."""

    def delta(self, text: str, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now
        self.text += text

    def _measured(self, tokens: int) -> float | None:
        if self.first is None or self.last is None or self.last - self.first < 0.2:
            return None
        return tokens / (self.last - self.first)

    def turn(self, output: int | None) -> None:
        """A model turn was committed; ``output``: its reported output tokens."""
        streamed = estimate_tokens(self.text) if self.text else 0
        if output is None:
            self.estimated += streamed
        else:
            self.reported += output
        rate = self._measured(output if output is not None else streamed)
        if rate is not None:
            self.rate = rate
        self.text, self.first, self.last = "", None, None

    def tokens(self) -> tuple[int, bool]:
        """``(output tokens so far, whether any of it is an estimate)``."""
        live = estimate_tokens(self.text) if self.text else 0
        return self.reported + self.estimated + live, bool(live or self.estimated)

    def live_rate(self) -> float | None:
        if self.text:
            rate = self._measured(estimate_tokens(self.text))
            if rate is not None:
                return rate
        return self.rate


def working_row(
    *,
    thinking: bool,
    seconds: int,
    streamed: Streamed,
    queued: int,
    ctx_left: int | None,
    width: int,
) -> str:
    """``✦ working 19s ↓ 94 tokens · 186 tok/s · esc stop · alt+⏎ redirect · ctx left ~98%``:
    the hints give way first when the row is narrow."""
    head = f"✦ {'thinking' if thinking else 'working'} {seconds}s"
    tokens, approximate = streamed.tokens()
    if tokens:
        head += f" ↓ {'~' if approximate else ''}{tokens} tokens"
    rate = streamed.live_rate()
    facts = [f"{rate:.0f} tok/s"] if rate is not None else []
    tail = [f"{queued} queued"] if queued else []
    if ctx_left is not None:
        tail.append(f"ctx left ~{ctx_left}%")
    for hints in (["esc stop", "alt+⏎ redirect"], ["esc stop"], []):
        row = " · ".join([head, *facts, *hints, *tail])
        if cell_len(row) <= width:
            return row
    return shorten_end(" · ".join([head, *facts, *tail]), width)
