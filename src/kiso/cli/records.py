"""Tool cards and records, the full call and its diff, and the conversation so far: what the
interactive session shows of tool calls, from what the log recorded."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from kiso.kernel import (
    ApprovalDecided,
    Assistant,
    Compacted,
    Event,
    ExecutionFinished,
    ImageBlock,
    RunEnded,
    RunStarted,
    ToolCall,
    User,
)
from kiso.tools import resolve_in_workspace

from .render import (
    ADDED,
    ERROR,
    error_text,
    markdown,
    prompt_echo,
    shorten_end,
    warning_text,
)

__all__ = [
    "age",
    "copy_sequence",
    "diff_view",
    "duration",
    "last_view",
    "record_text",
    "running_card",
    "target_of",
    "transcript",
]

# --------------------------------------------------------------------------------------------
# tool cards and records


def duration(ms: float) -> str:
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def age(ms: float) -> str:
    seconds = max(ms, 0) / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def one_line(text: str) -> str:
    return " ".join(text.split())


def target_of(call: ToolCall) -> str:
    """What a call aims at: the command, the path, the pattern."""
    inp: dict[str, Any] = dict(call.input)
    if call.name == "shell" and isinstance(inp.get("command"), str):
        return one_line(inp["command"])
    if call.name == "search_text" and isinstance(inp.get("pattern"), str):
        where = inp.get("path")
        pattern: str = inp["pattern"]
        return pattern + (f" in {where}" if isinstance(where, str) and where else "")
    path = inp.get("path")
    if isinstance(path, str):
        return path
    return one_line(json.dumps(inp, ensure_ascii=False, sort_keys=True)) if inp else ""


_EXIT = re.compile(r"^exit (-?\d+)")
_READ = re.compile(r"^\[lines (\d+)-(\d+) of (\d+)")
_FOOTER = re.compile(r"^\[.*\]$")
SETTLED_TAIL = 4
"""How many of a finished shell command's last output lines its record keeps."""
LIVE_TAIL = 3
"""How many of a running call's latest output lines its card shows."""


def outcome_of(call: ToolCall, finished: ExecutionFinished) -> tuple[str, bool, int]:
    """``(status, is_error, lines of output)`` of a finished call (-1: no line count)."""
    status, failed, lines = _outcome(call, finished)
    return status, failed, -1 if lines is None else len(lines)


def _outcome(call: ToolCall, finished: ExecutionFinished) -> tuple[str, bool, list[str] | None]:
    """``(status, is_error, the output's lines)``: the output without the tool's own footers."""
    lines = finished.content.splitlines()
    failed = finished.is_error or not finished.ok
    if finished.error_kind in ("aborted", "timeout"):
        status = "stopped" if finished.error_kind == "aborted" else "timed out"
        if call.name == "shell" and lines:
            lines = lines[:-1]  # "cancelled; the process group was killed", "timed out after..."
    elif call.name == "shell" and lines:
        last = lines[-1]
        match = _EXIT.match(last)
        status = f"exit {match.group(1)}" if match else one_line(last)
        lines = lines[:-1]
    elif finished.is_error:
        return "error: " + one_line(lines[0] if lines else "failed"), failed, lines
    elif call.name in ("edit_file", "write_file") and lines:
        status = re.sub(r"\s*\[rev:[^\]]*\]$", "", one_line(lines[0]))
        status = re.sub(r"^edited [^:]*: |^wrote (\S+ bytes) to .*$", r"\1", status)
        return status, False, None
    elif call.name == "read_file":
        return _read_outcome(lines), failed, [ln for ln in lines if not _FOOTER.match(ln)]
    else:
        status = "ok"
        while lines and _FOOTER.match(lines[-1]):
            lines.pop()  # "[12 entries]", "[rev:...]": what the tool said about its output
    if call.name == "shell":
        lines = [ln for ln in lines if not ln.startswith("[processes the command left")]
    return status, failed, lines


def _read_outcome(lines: list[str]) -> str:
    """``ok``, or which part of a longer file was shown (``lines 1-200 of 950``)."""
    for line in reversed(lines):
        match = _READ.match(line)
        if match is not None:
            first, last, total = (int(g) for g in match.groups())
            return "ok" if first == 1 and last == total else f"lines {first}-{last} of {total}"
    return "ok"


def _fit(prefix: str, target: str, tail: Sequence[str], width: int) -> str:
    """``prefix target · tail...`` in ``width`` columns: only the target is shortened."""
    facts = "".join(f" · {t}" for t in tail)
    room = width - len(prefix) - len(facts)
    return f"{prefix}{shorten_end(target, max(room, 3))}{facts}"


def _tail_lines(lines: Sequence[str], keep: int, width: int, *, hidden: int = 0) -> list[str]:
    """The last ``keep`` output lines under a card: ``└`` before the first, each cut to fit."""
    shown = list(lines[-keep:])
    more = len(lines) - len(shown) + hidden
    rows = [f"… {more} earlier line{'s' if more != 1 else ''} · ctrl+o expands"] if more else []
    rows += shown
    return [shorten_end(("  └ " if i == 0 else "    ") + r, width) for i, r in enumerate(rows)]


def record_text(call: ToolCall, finished: ExecutionFinished, width: int) -> Text:
    """What a finished call settles into: one line, ``name target · status · N lines · time``;
    a shell command that printed something keeps the tail of its output under its command."""
    status, failed, lines = _outcome(call, finished)
    count = -1 if lines is None else len(lines)
    noun = "line" if count == 1 else "lines"
    facts = [status, *([f"{count} {noun}"] if count >= 0 else []), duration(finished.ms)]
    body = [ln.rstrip() for ln in lines or []]
    while body and not body[-1].strip():
        body.pop()
    if call.name == "shell" and body:
        head = shorten_end(f"  shell {target_of(call)}", width)
        tail = _tail_lines(body, SETTLED_TAIL, width)
        last = "    " + " · ".join(facts)
        text = Text("\n".join([head, *tail, last]))
        at = len(text.plain) - len(last) + 4
    else:
        line = _fit(f"  {call.name} ", target_of(call), facts, width)
        text = Text(line)
        at = line.rfind(f" · {status}") + 3
    if failed and status != "stopped":
        text.stylize(ERROR, at, at + len(status))
    return text


def running_card(call: ToolCall, elapsed_ms: float, output: str, width: int) -> list[str]:
    """A running call: ``● name target``, the latest lines of its output, then how long it has
    run and how to stop it (``1.2s · esc stops · alt+⏎ redirects``)."""
    head = shorten_end(f"● {call.name} {target_of(call)}", width)
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    tail = _tail_lines(lines[-LIVE_TAIL:], LIVE_TAIL, width)
    facts = shorten_end(f"    {duration(elapsed_ms)} · esc stops · alt+⏎ redirects", width)
    return [head, *tail, facts]


# --------------------------------------------------------------------------------------------
# the full call, and what the commands show


def _diff_text(lines: list[str]) -> Text:
    text = Text(overflow="fold")
    for line in lines:
        added = line.startswith("+") and not line.startswith("+++")
        text.append(line + "\n", style=ADDED if added else "")
    text.rstrip()
    return text


def _read(workspace: Path, path: str) -> str | None:
    try:
        target = resolve_in_workspace(workspace, path, must_exist=True)
        data = target.read_bytes()
    except (OSError, ValueError):
        return None
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def _diff_lines(name: str, inp: dict[str, Any], workspace: Path) -> list[str]:
    path: str = inp["path"]
    before = _read(workspace, path)
    if name == "write_file":
        content = inp.get("content")
        after = content if isinstance(content, str) else ""
        if before is None:
            return [f"new file {path}", *(f"+{ln}" for ln in after.splitlines())]
        return _unified(path, before, after) or ["(no change)"]
    edits = [e for e in inp.get("edits") or [] if isinstance(e, dict)]
    pairs = [(str(e.get("oldText", "")), str(e.get("newText", ""))) for e in edits]
    if before is not None:
        after = before
        for old, new in pairs:
            if not old or after.count(old) != 1:
                break
            after = after.replace(old, new, 1)
        else:
            diff = _unified(path, before, after)
            if diff:
                return diff
    out = [f"edits to {path}:"]
    for old, new in pairs:
        out += [f"-{ln}" for ln in old.splitlines()] + [f"+{ln}" for ln in new.splitlines()]
    return out


def _unified(path: str, before: str, after: str) -> list[str]:
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
            n=3,
        )
    ]


def diff_view(name: str, inp: dict[str, Any], workspace: Path) -> Text:
    """What an ``edit_file`` or ``write_file`` call would change, whole: a unified diff against
    the file as it is now (additions green), or the new file's every line."""
    return _diff_text(_diff_lines(name, inp, workspace))


def last_view(call: ToolCall, finished: ExecutionFinished, width: int, *, full: bool) -> Group:
    """A finished call with its complete output (``full``: and its whole input)."""
    parts: list[RenderableType] = [record_text(call, finished, width)]
    if full:
        body = json.dumps(call.input, ensure_ascii=False, indent=2)
        parts += [Text("  input:"), Padding(Text(body, overflow="fold"), (0, 0, 0, 4))]
        parts.append(Text("  output:"))
    style = ERROR if finished.is_error and finished.error_kind != "aborted" else ""
    content = finished.content or "(no output)"
    parts.append(Padding(Text(content, style=style, overflow="fold"), (0, 0, 0, 4)))
    return Group(*parts)


# --------------------------------------------------------------------------------------------
# the conversation so far, from the log


def transcript(
    events: Sequence[Event], width: int, *, runs: int | None = None
) -> list[RenderableType]:
    """What the log says was said and done, as it was shown: each prompt, the answers, each
    call's record, denials and how runs ended. ``runs``: only the last that many runs, after a
    line saying how many came before."""
    groups: list[list[RenderableType]] = []
    calls: dict[str, ToolCall] = {}
    for e in events:
        if isinstance(e, RunStarted):
            groups.append([])
            continue
        if not groups:
            continue
        shown = groups[-1]
        if isinstance(e, User) and e.source == "user":
            blocks = () if isinstance(e.content, str) else e.content
            images = sum(isinstance(b, ImageBlock) for b in blocks)
            shown.append(prompt_echo(e.text + " [image]" * images))
        elif isinstance(e, Assistant):
            calls.update((c.call_id, c) for c in e.calls)
            if e.text.strip():
                shown.append(markdown(e.text.strip("\n")))
        elif isinstance(e, ExecutionFinished):
            call = calls.get(e.call_id) or ToolCall(e.call_id, "tool", {})
            shown.append(record_text(call, e, width))
        elif isinstance(e, ApprovalDecided) and e.decision == "denied":
            denied = calls.get(e.call_id)
            what = f"{denied.name} {shorten_end(target_of(denied), 60)}" if denied else e.call_id
            shown.append(Text(f"  ✗ {what} denied by {e.decided_by}: {e.reason or ''}"))
        elif isinstance(e, Compacted):
            shown.append(Text("  (the context was compacted here: the model sees a summary)"))
        elif isinstance(e, RunEnded):
            o = e.outcome
            if o.kind == "error":
                shown.append(error_text(f"✗ {o.message} ({o.code})"))
            elif o.kind == "aborted":
                shown.append(Text(f"✦ aborted by {o.by}"))
            elif o.kind != "completed":
                shown.append(warning_text(f"the run ended: {o.kind}"))
    out: list[RenderableType] = []
    if runs is not None and len(groups) > runs:
        earlier = len(groups) - runs
        out.append(
            Text(f"… {earlier} earlier turn{'s' if earlier != 1 else ''} · ctrl+r shows them all")
        )
        groups = groups[-runs:] if runs else []
    for group in groups:
        out.extend(group)
    return out


def copy_sequence(text: str, *, tmux: bool = False) -> str:
    """OSC 52: the terminal puts ``text`` on the system clipboard (inside tmux, passed through)."""
    import base64

    seq = "\x1b]52;c;" + base64.b64encode(text.encode("utf-8")).decode("ascii") + "\x07"
    return f"\x1bPtmux;{seq.replace(chr(27), chr(27) * 2)}\x1b\\" if tmux else seq
