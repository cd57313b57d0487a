"""The interactive session in a real pseudo-terminal: what a person sees on the screen.

Each test spawns the session in a PTY (pexpect), feeds everything it writes into a terminal
emulator (pyte) and asserts on the screen; the model is a scripted faux model, KISO_HOME a
temporary folder. Every wait is bounded and every child is killed in a finally block.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pexpect
import pyte
import pytest

from kiso.cli.render import CURSOR, PROMPT
from kiso.kernel import ApprovalDecided, Event, JsonlSessionStore, RunEnded, ToolCall
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.offers import Offer
from kiso.tools import builtin_tools

PYTHON = sys.executable
KISO = Path(sys.executable).with_name("kiso")
ENTRY = (
    "import sys; from kiso.cli.repl import run_interactive; "
    "sys.exit(run_interactive(session_id={sid!r}, model=None, mode={mode!r}, prompt=None))"
)
PICKER = (
    "import sys; from pathlib import Path; from kiso.kernel import JsonlSessionStore; "
    "from kiso.cli.picker import pick_session; "
    "print('PICKED', pick_session(JsonlSessionStore(), Path.cwd()))"
)
DROP = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_MODEL", "KISO_MODE")
ESC, ENTER = "\x1b", "\r"
COLOR_SGR = re.compile(rb"\x1b\[([0-9;]*)m")


@functools.cache
def has_chat() -> bool:
    """Is ``kiso chat`` wired to the interactive session? Then the tests go through it."""
    if not KISO.exists():
        return False
    done = subprocess.run(
        [str(KISO), "chat", "--help"], capture_output=True, timeout=30, check=False
    )
    return done.returncode == 0


def chat(sid: str, mode: str | None = None) -> list[str]:
    """The command line of an interactive session: ``kiso chat`` or the entry point itself."""
    if has_chat():
        return [str(KISO), "chat", sid, *(["--mode", mode] if mode else [])]
    return [PYTHON, "-c", ENTRY.format(sid=sid, mode=mode)]


def is_colour(params: bytes) -> bool:
    """Does an SGR parameter list set a colour (foreground or background)?"""
    codes = [int(p) for p in params.split(b";") if p.isdigit()]
    return any(30 <= c <= 49 or 90 <= c <= 107 for c in codes)


class Term:
    """A child process in a PTY, its output kept raw and rendered on a pyte screen."""

    def __init__(
        self,
        argv: list[str],
        *,
        cwd: Path,
        home: Path,
        script: Path | None = None,
        cols: int = 100,
        rows: int = 40,
        **env: str,
    ) -> None:
        base = {k: v for k, v in os.environ.items() if k not in DROP and k != "NO_COLOR"}
        base.update(
            KISO_HOME=str(home),
            TERM="xterm-256color",
            PROMPT_TOOLKIT_NO_CPR="1",
            COLUMNS=str(cols),
            LINES=str(rows),
        )
        if script is not None:
            base["KISO_FAUX_SCRIPT"] = str(script)
        else:
            base.pop("KISO_FAUX_SCRIPT", None)
        base.update(env)
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.child = pexpect.spawn(
            argv[0], argv[1:], cwd=str(cwd), env=base, dimensions=(rows, cols), timeout=5
        )
        self.eof = False

    def pump(self, wait: float = 0.05) -> None:
        if self.eof:
            time.sleep(wait)
            return
        try:
            data = self.child.read_nonblocking(65536, timeout=wait)
        except pexpect.TIMEOUT:
            return
        except pexpect.EOF:
            self.eof = True
            return
        self.raw += data
        self.stream.feed(data)

    @property
    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if check():
                return
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{self.text}")

    def wait_for(self, needle: str, timeout: float = 10) -> str:
        self.wait(lambda: needle in self.text, timeout, repr(needle))
        return self.text

    def settle(self, quiet: float = 0.3, timeout: float = 5) -> None:
        """Pump until nothing new arrives for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = len(self.raw)
            end = time.monotonic() + quiet
            while time.monotonic() < end:
                self.pump()
            if len(self.raw) == before:
                return

    def send(self, keys: str) -> None:
        self.child.send(keys)

    def exit_status(self, timeout: float = 10) -> int | None:
        self.wait(lambda: self.eof, timeout, "the process to exit")
        self.child.close(force=True)
        return self.child.exitstatus

    def close(self) -> None:
        if self.child.isalive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)
        self.child.close(force=True)


def squash(text: str) -> str:
    return "".join(text.split())


def write_script(path: Path, turns: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"turns": turns}))
    return path


def events(home: Path, sid: str) -> list[Event]:
    return list(JsonlSessionStore(home).load(sid).events)


def status_line(term: Term) -> str:
    lines = [ln for ln in term.text.splitlines() if ln.startswith("▸ ")]
    return lines[-1] if lines else ""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


@pytest.fixture
def kiso_home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def spawn(ws: Path, kiso_home: Path) -> Iterator[Callable[..., Term]]:
    started: list[Term] = []

    def start(
        script: Path | None = None,
        *,
        sid: str = "s",
        mode: str | None = None,
        argv: list[str] | None = None,
        **kw: Any,
    ) -> Term:
        term = Term(argv or chat(sid, mode), cwd=ws, home=kiso_home, script=script, **kw)
        started.append(term)
        return term

    try:
        yield start
    finally:
        for term in started:
            term.close()


SHELL = {"name": "shell", "input": {"command": "echo hi"}}


def shell(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "shell", "input": {"command": command}}]}


# ------------------------------------------------------------------------------------------------


def test_a_prompt_is_answered_with_text_that_streams_in(
    spawn: Callable[..., Term], tmp_path: Path
) -> None:
    answer = "The first words arrive early. " * 3 + "The last words arrive LATE."
    script = write_script(
        tmp_path / "s.json",
        [{"text": answer, "delay_ms": 2500, "usage": {"input": 900, "output": 40}}],
    )
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("hello there" + ENTER)
    term.wait_for("The first words")
    assert "LATE" not in term.text  # the beginning is shown before the end exists
    assert "working" in term.text
    screen = term.wait_for("LATE.")
    assert PROMPT + "hello there" in screen
    term.wait_for("✦ took")
    term.wait(lambda: "ctx left ~99%" in status_line(term), 5, "the status row")
    term.send("/exit" + ENTER)
    assert term.exit_status() == 0


def test_the_approval_panel_shows_the_whole_command_and_enter_approves(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    words = " ".join(f"word{i:03d}" for i in range(60))
    command = f"echo {words} > out.txt"
    script = write_script(tmp_path / "s.json", [shell(command), {"text": "Written."}])
    term = spawn(script, cols=80)
    term.wait_for("▸ default")
    term.send("write it" + ENTER)
    screen = term.wait_for("Run this command?")
    assert squash(command) in squash(screen)  # never truncated, however long
    assert CURSOR + "1. Yes" in screen  # the highlight is already on Yes
    assert "2. Yes, and don't ask again" in screen
    assert "3. No (tell the model why)" in screen
    assert "⚠" not in screen
    term.send(ENTER)
    term.wait_for("✓ approved")
    term.wait_for("Written.")
    assert "exit 0" in term.text
    assert (ws / "out.txt").read_text().startswith("word000")
    decided = [e for e in events(kiso_home, "s") if isinstance(e, ApprovalDecided)]
    assert [(d.decision, d.decided_by) for d in decided] == [("approved", "user")]


def test_two_approves_and_writes_the_dont_ask_again_rule(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    (ws / "f1.txt").write_text("one\nOLD\nthree\n")
    edit = {"path": "f1.txt", "edits": [{"oldText": "OLD", "newText": "NEW"}]}
    script = write_script(
        tmp_path / "s.json",
        [{"tool_calls": [{"name": "edit_file", "input": edit}]}, {"text": "Edited."}],
    )
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("edit it" + ENTER)
    screen = term.wait_for("Apply this edit to f1.txt?")
    assert "-OLD" in screen and "+NEW" in screen  # the whole diff, with context
    assert " one" in screen and " three" in screen
    term.send("2")
    term.wait_for("Edited.")
    assert (ws / "f1.txt").read_text() == "one\nNEW\nthree\n"
    rules = (kiso_home / "dont-ask-again.rules").read_text().splitlines()
    assert "edit_file: f1.txt" in rules
    decided = [e for e in events(kiso_home, "s") if isinstance(e, ApprovalDecided)]
    assert decided[0].decision == "approved" and decided[0].rule == "edit_file: f1.txt"


def test_three_denies_with_the_guidance_the_user_types(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    script = write_script(tmp_path / "s.json", [shell("touch made.txt"), {"text": "Understood."}])
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("make it" + ENTER)
    term.wait_for("Run this command?")
    term.send("3")
    term.wait_for("why?")
    term.send("use the build script instead" + ENTER)
    term.wait_for("Understood.")
    assert "✗ denied: use the build script instead" in term.text
    assert not (ws / "made.txt").exists()
    decided = [e for e in events(kiso_home, "s") if isinstance(e, ApprovalDecided)]
    assert decided[0].decision == "denied"
    assert decided[0].reason == "use the build script instead"


def test_irreversible_deletes_carry_one_warning_line_naming_what_goes(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path
) -> None:
    for name in ("build", "dist"):
        (ws / name).mkdir()
    script = write_script(
        tmp_path / "s.json",
        [shell("ls -la"), shell("rm -rf build dist"), {"text": "Cleaned."}],
    )
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("clean" + ENTER)
    screen = term.wait_for("Run this command?")
    assert "⚠" not in screen  # an ordinary command carries no warning
    term.send(ENTER)
    term.wait(lambda: "rm -rf build dist" in term.text, 10, "the second command")
    screen = term.wait_for("Run this command?")
    warnings = [ln for ln in screen.splitlines() if "⚠" in ln]
    assert len(warnings) == 1
    assert "build" in warnings[0] and "dist" in warnings[0]
    term.send(ENTER)
    term.wait_for("Cleaned.")
    assert not (ws / "build").exists() and not (ws / "dist").exists()


def current_call(screen: str) -> str:
    """The screen from the last call shown on: what the panel now asks about."""
    at = screen.rfind("● shell")
    return "" if at < 0 else screen[at:]


def test_the_panel_shows_what_the_runtime_offers(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path
) -> None:
    from kiso.runtime.offers import DESTRUCTIVE, IRREVERSIBLE

    (ws / "build").mkdir()
    (ws / "junk").mkdir()
    (ws / "a.o").write_text("x")
    (ws / "notes.txt").write_text("n")
    asked = [
        ('sh -c "rm -rf build"', "rm deletes build and everything inside", IRREVERSIBLE, ENTER),
        (
            "find . -name '*.o' -delete",
            "find -delete deletes what it matches under .",
            IRREVERSIBLE,
            ENTER,
        ),
        ("cd junk && ls | xargs rm -r", "the names xargs reads", IRREVERSIBLE, "3" + ENTER),
        ("rm notes.txt", None, DESTRUCTIVE, ENTER),
        # in the workspace the floor refuses `git restore .` before anyone is asked
        (f"git -C {tmp_path / 'other'} restore .", None, DESTRUCTIVE, ENTER),
    ]
    script = write_script(tmp_path / "s.json", [*(shell(c) for c, *_ in asked), {"text": "Done."}])
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("clean up" + ENTER)
    for n, (command, warning, because, answer) in enumerate(asked):
        term.wait(  # the whole panel drawn (a screen caught mid-paint has only its first row)
            lambda c=command: (
                "Run this command?" in term.text
                and c in current_call(term.text)
                and "don't ask again" in current_call(term.text)
            ),
            10,
            command,
        )
        shown = current_call(term.text)
        warnings = [ln for ln in shown.splitlines() if "⚠" in ln]
        if warning is None:
            assert warnings == [], command
        else:
            assert len(warnings) == 1 and squash(warning) in squash(shown), command
        assert squash(f"2. Yes, and don't ask again (not offered: {because})") in squash(shown)
        if n == 3:
            term.send("2")  # a disabled row says why, and answers nothing
            term.wait_for(f'"don\'t ask again" is not offered: {DESTRUCTIVE}')
            assert "Run this command?" in term.text
        term.send(answer)  # the next call's panel, or the answer, is what comes next
    term.wait_for("Done.")
    assert not (ws / "build").exists() and not (ws / "a.o").exists()
    assert (ws / "junk").exists()  # denied
    assert not (ws / "notes.txt").exists()


def test_no_color_means_no_colour_codes_at_all(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path
) -> None:
    (ws / "f.txt").write_text("OLD\n")
    edit = {"path": "f.txt", "edits": [{"oldText": "OLD", "newText": "NEW"}]}
    turns = [{"tool_calls": [{"name": "edit_file", "input": edit}]}, {"text": "**Done**."}]
    script = write_script(tmp_path / "s.json", turns)
    seen: dict[str, bytes] = {}
    for label, extra in (("mono", {"NO_COLOR": "1"}), ("colour", {})):
        (ws / "f.txt").write_text("OLD\n")
        term = spawn(script, sid=label, **extra)
        term.wait_for("▸ default")
        term.send("edit" + ENTER)
        term.wait_for("Apply this edit")
        term.send(ENTER)
        term.wait_for("Done")
        term.send("more" + ENTER)  # the script is exhausted: an error, in red
        term.wait_for("script_exhausted")
        term.settle()
        seen[label] = bytes(term.raw)
    colours = [p for p in COLOR_SGR.findall(seen["mono"]) if is_colour(p)]
    assert colours == []
    assert any(is_colour(p) for p in COLOR_SGR.findall(seen["colour"]))  # the control


def test_exhausted_script_shows_the_error_and_the_session_goes_on(
    spawn: Callable[..., Term], tmp_path: Path
) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "Only answer."}])
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("one" + ENTER)
    term.wait_for("Only answer.")
    term.send("two" + ENTER)
    term.wait_for("script_exhausted")
    assert squash("Set an API key") in squash(term.text)  # the runtime's own message
    term.send("/status" + ENTER)
    term.wait_for("workspace")  # still running
    term.send("\x04")  # ctrl+d right after a run that ended in an error
    assert term.exit_status() == 1


def test_a_narrow_terminal_shortens_the_model_name_not_the_facts(
    spawn: Callable[..., Term], tmp_path: Path
) -> None:
    script = write_script(
        tmp_path / "a-rather-long-script-name-for-a-narrow-terminal.json",
        [{"text": "Hi.", "usage": {"input": 6400, "output": 10, "cache_read": 1600}}],
    )
    term = spawn(script, cols=60)
    term.wait_for("▸ default")
    term.send("hi" + ENTER)
    term.wait_for("✦ took")
    term.wait(lambda: "ctx left ~94%" in status_line(term), 5, "the status row")
    row = status_line(term)
    assert row.startswith("▸ default · ")
    assert "ctx left ~94%" in row and "cache 20%" in row
    assert "…" in row and "faux:a-rather-long-script-name-for-a-narrow-terminal.json" not in row
    assert len(row) <= 60


def test_esc_stops_a_slow_tool_and_the_run_ends_aborted(
    spawn: Callable[..., Term], tmp_path: Path, kiso_home: Path
) -> None:
    script = write_script(tmp_path / "s.json", [shell("sleep 30"), {"text": "never"}])
    term = spawn(script, mode="bypass")
    term.wait_for("▸ bypass")
    term.send("wait" + ENTER)
    term.wait_for("● shell sleep 30")
    assert "esc stops" in term.text
    term.send(ESC)
    term.wait_for("aborted", timeout=10)  # well before the 30 s sleep could have ended
    assert "shell sleep 30 · stopped" in term.text
    log = events(kiso_home, "s")
    ends = [e for e in log if isinstance(e, RunEnded)]
    assert len(ends) == 1 and ends[0].outcome.kind == "aborted"
    assert isinstance(log[-1], RunEnded)
    term.send("/exit" + ENTER)
    assert term.exit_status() == 0


def _sessions(home: Path, ws: Path, other: Path) -> None:
    """done (completed), blank (empty), asks (awaiting_approval), elsewhere (another place)."""
    store = JsonlSessionStore(home)

    def agent(turns: list[dict[str, Any]], where: Path) -> Agent:
        return Agent(
            adapter=FauxAdapter(turns), tools=builtin_tools(), store=store, workspace=where
        )

    with agent([{"text": "fine"}], ws).session("done") as s:
        list(s.run_sync("finish the report"))
    store.create(str(ws), session_id="blank").close()
    with agent([shell("make")], ws).session("asks") as s:
        list(s.run_sync("build the thing"))  # nobody answers: it pauses
    with agent([{"text": "ok"}], other).session("elsewhere") as s:
        list(s.run_sync("another project"))


def test_the_picker_lists_states_filters_picks_and_cancels(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    _sessions(kiso_home, ws, other)
    before = {p: p.read_bytes() for p in kiso_home.rglob("*.jsonl")}
    held = JsonlSessionStore(kiso_home).open("done")  # the picker needs no writer lock
    term = spawn(argv=[PYTHON, "-c", PICKER])
    screen = term.wait_for("esc cancel")
    assert re.search(r"done\s+completed\s+\S+\s+finish the report", screen)
    assert re.search(r"blank\s+empty", screen)
    assert re.search(r"asks\s+awaiting_approval\s+\S+\s+build the thing", screen)
    assert "elsewhere" not in screen  # only this directory's sessions
    term.send("\t")
    screen = term.wait_for("elsewhere")
    tagged = next(ln for ln in screen.splitlines() if "elsewhere" in ln)
    assert tagged.endswith("/other]")  # every workspace: rows tagged with where they started
    assert re.search(r"done\s+completed.*/ws\]$", screen, re.MULTILINE)
    term.send("\t")
    term.wait(lambda: "elsewhere" not in term.text, 5, "the current scope")
    term.send("report")
    screen = term.wait_for("filter: report")
    assert "blank" not in screen and "asks" not in screen
    term.send(ENTER)
    term.wait_for("PICKED done")
    assert term.exit_status() == 0
    held.close()

    cancel = spawn(argv=[PYTHON, "-c", PICKER])
    cancel.wait_for("esc cancel")
    cancel.send(ESC)
    cancel.wait_for("PICKED None")
    assert cancel.exit_status() == 0
    assert {p: p.read_bytes() for p in kiso_home.rglob("*.jsonl")} == before  # nothing written


def test_a_stdout_that_is_not_a_terminal_gets_plain_text_and_numbered_questions(
    tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    script = write_script(tmp_path / "s.json", [shell("touch made.txt"), {"text": "**Fine**."}])
    env = {k: v for k, v in os.environ.items() if k not in DROP and k != "NO_COLOR"}
    env.update(KISO_HOME=str(kiso_home), KISO_FAUX_SCRIPT=str(script), TERM="xterm-256color")
    done = subprocess.run(
        [PYTHON, "-c", ENTRY.format(sid="p", mode=None)],
        input="make it\n3\nnot now\n/exit\n",
        capture_output=True,
        text=True,
        cwd=ws,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout  # a pipe carries zero ANSI
    assert "Run this command?\n  1. Yes\n" in done.stdout
    assert "denied: not now" in done.stdout and "Fine." in done.stdout
    assert not (ws / "made.txt").exists()
    decided = [e for e in events(kiso_home, "p") if isinstance(e, ApprovalDecided)]
    assert decided[0].decision == "denied" and decided[0].reason == "not now"


# ------------------------------------------------------------------------------------------------
# the pure parts, without a terminal


PANEL_WS, PANEL_HOME = Path("/home/ana/app"), Path("/home/ana")


def offer_for(command: str) -> tuple[ToolCall, Offer]:
    from kiso.runtime.offers import approval_offer
    from kiso.tools import SHELL as SHELL_TOOL

    call = ToolCall("c", "shell", {"command": command})
    return call, approval_offer(call, SHELL_TOOL, PANEL_WS, PANEL_HOME)


def rendered(command: str) -> str:
    from kiso.cli.panels import call_view
    from kiso.cli.render import Policy, Printer

    call, offer = offer_for(command)
    view = call_view(call, PANEL_WS, warning=offer.warning)
    return Printer(Policy(ansi=False, color=False)).render(view, 100)


@pytest.mark.parametrize(
    ("command", "names"),
    [
        ("rm -rf build dist", ["build", "dist"]),
        ("cd x && sudo rm -r -f ./node_modules", ["./node_modules"]),
        ("git checkout -- src/a.py", ["src/a.py"]),
        ("git -C repo reset --hard HEAD~1", ["reset --hard"]),
        ("git clean -fdx", ["untracked files and directories"]),
        ("make test; rm -rf out", ["out"]),
        ('sh -c "rm -rf build"', ["build"]),
        ("find . -name '*.o' -delete", ["find -delete", "under ."]),
        ("ls | xargs rm -r", ["the names xargs reads"]),
        ("echo $(rm -rf cache)", ["cache"]),
    ],
)
def test_an_irreversible_delete_is_named_on_one_line(command: str, names: list[str]) -> None:
    from kiso.cli.panels import approval_panel
    from kiso.runtime.offers import IRREVERSIBLE

    call, offer = offer_for(command)
    assert offer.warning is not None and "\n" not in offer.warning
    assert all(name in offer.warning for name in names)
    text = rendered(command)
    assert text.count("⚠") == 1  # one yellow line (however the terminal wraps it)
    assert squash(f"⚠ irreversible: {offer.warning}") in squash(text)
    always = approval_panel(call, offer).options[1]
    assert not always.enabled and offer.rule is None
    assert always.detail == f"(not offered: {IRREVERSIBLE})"


@pytest.mark.parametrize(
    ("command", "because"),
    [
        ("ls -la", None),
        ("git checkout main", None),
        ("git reset HEAD~1", None),
        ("git clean -n", None),
        ("echo rm -rf", None),
        ("echo 'rm -rf build' > notes.txt", "compound commands"),
        ("rm notes.txt", "destructive commands always ask"),
        ("git restore .", "destructive commands always ask"),
        ("ls | xargs rm", "destructive commands always ask"),
        ("git switch -f main", "destructive commands always ask"),
    ],
)
def test_nothing_else_carries_a_warning(command: str, because: str | None) -> None:
    from kiso.cli.panels import approval_panel

    call, offer = offer_for(command)
    assert offer.warning is None
    assert "⚠" not in rendered(command)
    always = approval_panel(call, offer).options[1]
    if because is None:
        assert always.enabled and always.detail == f"(adds the rule `shell: {command}`)"
    else:
        assert not always.enabled and because in always.detail and because in always.why_not


def test_the_uncertain_execution_view_has_no_warning() -> None:
    from kiso.cli.panels import call_view
    from kiso.cli.render import Policy, Printer

    call = ToolCall("c", "shell", {"command": "rm -rf build"})
    view = call_view(call, PANEL_WS, heading="● interrupted execution: shell (e1)")
    text = Printer(Policy(ansi=False, color=False)).render(view, 100)
    assert "interrupted execution" in text and "rm -rf build" in text and "⚠" not in text


def test_the_status_row_cuts_only_the_model_name() -> None:
    from kiso.cli.status import Meter, status_row

    m = Meter(ctx_left=42, cache_hit=97, tok_s=186.4)
    model = "deepseek-v3-terminus-thinking-on-0910"
    wide = status_row(mode="bypass", model=model, m=m, width=120)
    assert wide == f"▸ bypass · /mode to switch · {model} · ctx left ~42% · cache 97% · 186 tok/s"
    facts = "ctx left ~42% · cache 97% · 186 tok/s"
    for width in (80, 60, 58):
        row = status_row(mode="bypass", model=model, m=m, width=width)
        assert len(row) <= width
        assert row.startswith("▸ bypass · de") and row.endswith(facts)
        assert "…" in row
    assert status_row(mode="bypass", model=model, m=m, width=50) == f"▸ bypass · {facts}"
    assert "floor off" in status_row(mode="default", model="m", m=m, width=100, floor=False)


def test_streamed_text_leaves_in_paragraphs_and_code_blocks_stay_whole() -> None:
    from kiso.cli.render import StreamText

    text = StreamText()
    assert text.feed("First para") == []
    assert text.feed("graph.\n\n```\nline one\n\n") == ["First paragraph."]
    assert text.feed("line two\n```\n\nAfter.") == ["```\nline one\n\nline two\n```"]
    assert text.flush() == "After."


def test_a_finished_call_settles_into_its_record() -> None:
    from kiso.cli.records import record_text
    from kiso.cli.render import ERROR
    from kiso.kernel import ExecutionFinished

    call = ToolCall("c", "shell", {"command": "./suite.sh;\necho done"})

    def finished(content: str, ms: int, **kw: Any) -> ExecutionFinished:
        fields = {"ok": True, "is_error": False, **kw}
        return ExecutionFinished(
            run="r", execution_id="e", call_id="c", content=content, ms=ms, **fields
        )

    ok = record_text(call, finished("a\nb\nexit 0", 2600), 100).plain
    assert ok == "  shell ./suite.sh; echo done\n  └ a\n    b\n    exit 0 · 2 lines · 2.6s"
    bad = record_text(call, finished("boom\nexit 2", 100, is_error=True), 100)
    assert bad.plain.endswith("\n    exit 2 · 1 line · 0.1s")
    assert [s.style for s in bad.spans] == [ERROR]
    assert bad.plain[bad.spans[0].start : bad.spans[0].end] == "exit 2"
    narrow = record_text(call, finished("exit 0", 0), 40).plain
    assert len(narrow) <= 40 and narrow.endswith("· exit 0 · 0 lines · 0.0s")


def test_a_typed_choice_that_is_no_ascii_number_is_asked_again() -> None:
    """The plain screen (no terminal control) reads a choice as a line: ``²`` made int() raise
    out of the REPL, and an Arabic-Indic one (U+0661) picked row 1."""
    import asyncio

    from kiso.cli.panels import Option, Panel
    from kiso.cli.repl import Plain

    typed = iter(["²", "\u0661", "2"])
    asked: list[str] = []

    class Scripted(Plain):
        async def show(self, item: object) -> None:
            pass

        async def line(self, prompt: str) -> str | None:
            asked.append(prompt)
            return next(typed)

    panel = Panel("run it?", [Option("yes", "yes"), Option("skip", "skipped")])
    chosen = asyncio.run(Scripted.__new__(Scripted).ask(panel))
    assert chosen is not None and chosen.label == "skip"
    assert asked == ["choose 1-2: "] * 3
