"""Bad input gets one clear line and loses nothing: found by trying kiso as a new user would."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import (
    CorruptLogError,
    InvalidEventError,
    JsonlSessionStore,
    MemorySessionStore,
    RunEnded,
    ToolCall,
)
from kiso.providers import FauxAdapter
from kiso.providers.faux import ScriptError, load_script
from kiso.runtime import Agent, Hook, RunInfo
from kiso.runtime.rules import RulesFile
from kiso.tools.base import ToolResult, define_tool

from .test_headless import BIN, kiso, script


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_log_line_nested_too_deeply_is_corruption_not_a_crash(tmp_path: Path) -> None:
    home = tmp_path / "home"
    s = script(tmp_path, {"text": "hi"})
    assert kiso(tmp_path, "-p", "hi", "n1", KISO_HOME=str(home), KISO_FAUX_SCRIPT=s).returncode == 0
    log = next(home.glob("projects/*/n1.jsonl"))
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = ('{"a":' + deep(50_000) + "}\n").encode()
    log.write_bytes(b"".join(lines))
    with pytest.raises(CorruptLogError, match=r"line 3.*nested too deeply"):
        JsonlSessionStore(home).load("n1")
    listed = kiso(tmp_path, "sessions", KISO_HOME=str(home))
    assert "Traceback" not in listed.stderr and "n1\tcorrupt" in listed.stdout
    doctor = kiso(tmp_path, "doctor", "n1", KISO_HOME=str(home))
    assert "Traceback" not in doctor.stderr and doctor.returncode == 0, doctor.stderr
    assert JsonlSessionStore(home).load("n1").events  # loadable again


def test_a_model_turn_that_cannot_be_recorded_ends_the_run_with_an_error() -> None:
    nested: list[Any] = []
    for _ in range(990):  # deeper than the log's encoder will go, as a runaway model could write
        nested = [nested]
    call = {"name": "t", "input": {"x": nested}}
    agent = Agent(
        adapter=FauxAdapter([{"tool_calls": [call]}]),
        tools=[define_tool("t", "T", {"type": "object"}, lambda a: "ok", effects="read")],
        store=MemorySessionStore(),
        workspace="/tmp",
    )
    with agent.session("deep") as session:
        out = list(session.run_sync("go"))
    ended = out[-1]
    assert ended.type == "terminal" and ended.outcome.code == "invalid_turn"  # type: ignore[union-attr]
    assert isinstance(session.events[-1], RunEnded)  # the run is closed, not left open


def test_a_start_that_runs_another_input_than_its_call_is_refused_before_writing() -> None:
    from kiso.kernel import Assistant, ExecutionStarted, ModelRef, RunStarted, Usage, User

    with MemorySessionStore().create("/tmp", session_id="x") as log:
        c = ToolCall("c1", "shell", {"command": "ls"})
        log.append(
            RunStarted(run="r", trigger="user", model=ModelRef("f", "f"), mode="default"),
            User(run="r", content="go"),
            Assistant(run="r", blocks=(c,), stop="tool_use", usage=Usage(), model="f", ms=1),
        )
        with pytest.raises(InvalidEventError, match="differs"):
            log.append(
                ExecutionStarted(
                    run="r", execution_id="x:4", call_id="c1", name="shell", input={"x": 1}
                )
            )
        assert len(log.events) == 3


@pytest.mark.parametrize(
    ("content", "said"),
    [(b"\xff\xfe", "not UTF-8"), (('{"turns":' + deep(100_000) + "}").encode(), "too deeply")],
)
def test_an_unreadable_script_is_a_script_error(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(ScriptError, match=said):
        load_script(path)
    out = kiso(tmp_path, "-p", "hi", KISO_FAUX_SCRIPT=str(path))
    assert out.returncode == 1 and said in out.stderr and "Traceback" not in out.stderr


def test_resume_of_an_unknown_session_fails_and_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = kiso(tmp_path, "resume", "nosuch", KISO_HOME=str(home))
    assert out.returncode == 1 and "no session 'nosuch'" in out.stderr
    assert not list(home.glob("projects/*/nosuch.jsonl"))


@pytest.mark.parametrize(
    "args",
    [("resume", "../x"), ("-p", "hi", "bad id"), ("-p", "hi", "--mode", "yolo")],
)
def test_usage_errors_exit_2_in_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    out = kiso(tmp_path, *args)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "Error:" in out.stderr


def test_nothing_to_resume_is_not_an_error_in_the_json_result(tmp_path: Path) -> None:
    s = script(tmp_path, {"text": "hi"})
    assert kiso(tmp_path, "-p", "hi", "j0", KISO_FAUX_SCRIPT=s).returncode == 0
    out = kiso(tmp_path, "resume", "j0", "--output-format", "json", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0
    result = json.loads(out.stdout)
    assert result["is_error"] is False and result["v"] == 1


@pytest.mark.parametrize("fmt", ["text", "json", "stream-json"])
def test_a_reader_that_goes_away_ends_the_run_aborted_not_open(tmp_path: Path, fmt: str) -> None:
    """text and json write stdout only at the end: the reader's going is noticed before that."""
    s = script(tmp_path, {"text": "a long answer " * 50}, {"text": "more"})
    home = tmp_path / "home"
    env = {"KISO_HOME": str(home), "KISO_FAUX_SCRIPT": s}
    import os

    proc = subprocess.Popen(
        [str(BIN), "-p", "hi", "bp", "--output-format", fmt],
        cwd=tmp_path,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first word
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(60) == 1
    assert "Traceback" not in err and "Task was destroyed" not in err
    ends = [e for e in JsonlSessionStore(home).load("bp").events if isinstance(e, RunEnded)]
    assert [e.outcome.to_json() for e in ends] == [{"kind": "aborted", "by": "output closed"}]


def test_an_after_tool_hook_that_returns_something_else_is_a_hook_failure(tmp_path: Path) -> None:
    class Wrong(Hook):
        name = "extension:wrong"

        def after_tool(self, call: ToolCall, result: ToolResult, run: RunInfo) -> Any:
            return "a plain string"

    agent = Agent(
        adapter=FauxAdapter([{"tool_calls": [{"name": "t", "input": {}}]}, {"text": "x"}]),
        tools=[define_tool("t", "T", {"type": "object"}, lambda a: "ran", effects="other")],
        store=MemorySessionStore(),
        workspace=tmp_path,
        mode="bypass",
        hooks=[Wrong()],
    )
    with agent.session("w") as session:
        out = list(session.run_sync("go"))
        kinds = [e.type for e in session.events]
    assert out[-1].outcome.code == "hook_failed"  # type: ignore[union-attr]
    assert "return a ToolResult" in (out[-1].outcome.message or "")  # type: ignore[union-attr]
    assert kinds.count("execution_finished") == 1  # what really happened is on record


def test_rules_may_be_given_as_a_path(tmp_path: Path) -> None:
    path = tmp_path / "rules"
    agent = Agent(adapter=FauxAdapter([]), store=MemorySessionStore(), rules=str(path))
    assert isinstance(agent.rules, RulesFile) and agent.rules.path == path
    from kiso.kernel import UsageError

    with pytest.raises(UsageError, match="RulesFile"):
        Agent(adapter=FauxAdapter([]), store=MemorySessionStore(), rules=42)  # type: ignore[arg-type]


FULLWIDTH_8000 = "\uff18\uff10\uff10\uff10"
WINDOW_RULE = "must be a whole number of tokens, from 256 to 100,000,000"
"""8000 in fullwidth digits: isdigit() is true, and int() reads it."""


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("KISO_CONTEXT_WINDOW", "²", WINDOW_RULE),
        ("KISO_CONTEXT_WINDOW", "٣٠٠٠", WINDOW_RULE),
        ("KISO_CONTEXT_WINDOW", FULLWIDTH_8000, WINDOW_RULE),
        ("KISO_CONTEXT_WINDOW", "0", WINDOW_RULE),
        ("KISO_CONTEXT_WINDOW", "-1", WINDOW_RULE),
        ("KISO_CONTEXT_WINDOW", "1e6", WINDOW_RULE),
        ("KISO_CONTEXT_WINDOW", "255", WINDOW_RULE),
        ("KISO_CONTEXT_WINDOW", "9" * 20, WINDOW_RULE),
        ("KISO_FAILPOINT", "assistant:²", "expected <event-type>[:<n>]"),
        ("KISO_SUBAGENT_DEPTH", "²", "KISO_SUBAGENT_DEPTH must be a whole number"),
    ],
)
def test_a_bad_number_in_the_environment_is_one_line_and_exit_1(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    """Like every other broken setting (a bad KISO_MODE, a broken config): one line naming the
    variable and the rule, exit 1. ``"²".isdigit()`` is true, and int() of
    it used to end in a traceback; Arabic-Indic and fullwidth digits are no number either."""
    home = tmp_path / "home"
    s = script(tmp_path, {"text": "never"})
    out = kiso(tmp_path, "-p", "hi", "e1", KISO_HOME=str(home), KISO_FAUX_SCRIPT=s,
               **{variable: value})  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    [line] = [x for x in out.stderr.splitlines() if x.strip()]
    assert line.startswith("kiso: ") and variable in line and said in line, line
    if variable != "KISO_FAILPOINT":  # a test knob, read once the session is open
        assert not list(home.rglob("e1.jsonl"))  # no session was recorded


def test_the_numbers_kiso_reads_from_text_are_ascii_digits_only() -> None:
    from kiso.kernel import ascii_int
    from kiso.runtime.failpoint import Failpoint

    assert [ascii_int(t) for t in ("0", "42", "007")] == [0, 42, 7]
    for text in ("²", "٣٠٠٠", FULLWIDTH_8000, "", " 1", "-1", "+1", "1.0", "1e6", "1_000"):
        assert ascii_int(text) is None, text
    assert Failpoint.from_env({"KISO_FAILPOINT": "assistant:2"}).nth == 2


def test_a_callback_port_that_is_no_number_is_an_auth_error() -> None:
    from kiso.runtime.auth import AuthError
    from kiso.runtime.oauth import chatgpt_settings

    with pytest.raises(AuthError, match="KISO_CHATGPT_CALLBACK_PORT='²': must be a port"):
        chatgpt_settings({"KISO_CHATGPT_CALLBACK_PORT": "²"})
    assert chatgpt_settings({"KISO_CHATGPT_CALLBACK_PORT": "8123"}).port == 8123


def test_a_colorfgbg_with_a_superscript_is_no_theme() -> None:
    from kiso.cli.theme import from_colorfgbg

    assert from_colorfgbg("15;²") is None
    assert from_colorfgbg("0;15") == "light"
