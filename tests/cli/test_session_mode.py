"""The mode is session state; a headless denial is the runtime's, recorded as ``headless``.

Real `kiso` processes against a scripted model: the log is read back from disk after each.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from kiso.kernel import ApprovalDecided, JsonlSessionStore, RunStarted, SettingChanged

from .test_headless import kiso, script

SHELL_TURN = {"tool_calls": [{"name": "shell", "input": {"command": "echo ran >> effects.log"}}]}
EDIT_TURN = {"tool_calls": [{"name": "write_file", "input": {"path": "x.txt", "content": "x"}}]}


def events(tmp_path: Path, session: str) -> list[object]:
    return list(JsonlSessionStore(tmp_path / "home").load(session).events)


def test_a_bypass_session_killed_and_resumed_headless_continues_in_bypass(
    tmp_path: Path,
) -> None:
    s = script(tmp_path, {"text": "first"}, SHELL_TURN, SHELL_TURN, {"text": "done"})
    home = str(tmp_path / "home")
    assert kiso(tmp_path, "-p", "one", "m1", "--mode", "bypass", KISO_HOME=home,
                KISO_FAUX_SCRIPT=s).returncode == 0  # fmt: skip
    crashed = kiso(
        tmp_path, "-p", "two", "m1", KISO_HOME=home, KISO_FAUX_SCRIPT=s,
        KISO_FAILPOINT="execution_finished",
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL
    resumed = kiso(tmp_path, "resume", "m1", KISO_HOME=home, KISO_FAUX_SCRIPT=s)
    assert resumed.returncode == 0, resumed.stderr
    assert "mode bypass" in resumed.stderr  # the headless header names the mode in force
    assert (tmp_path / "effects.log").read_text() == "ran\nran\n"  # nothing denied, nothing twice
    log = events(tmp_path, "m1")
    verdicts = [e for e in log if isinstance(e, ApprovalDecided)]
    assert [v.decided_by for v in verdicts] == ["mode:bypass", "mode:bypass"]
    assert all(e.mode == "bypass" for e in log if isinstance(e, RunStarted))


def test_a_flag_or_kiso_mode_overrides_the_record_and_the_change_is_recorded(
    tmp_path: Path,
) -> None:
    s = script(tmp_path, {"text": "a"}, EDIT_TURN, {"text": "b"}, EDIT_TURN, {"text": "c"})
    home = str(tmp_path / "home")
    assert kiso(tmp_path, "-p", "one", "m2", "--mode", "bypass", KISO_HOME=home,
                KISO_FAUX_SCRIPT=s).returncode == 0  # fmt: skip
    out = kiso(tmp_path, "-p", "two", "m2", "--mode", "plan", KISO_HOME=home, KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0, out.stderr
    assert "mode plan" in out.stderr
    assert not (tmp_path / "x.txt").exists()  # plan denied the write
    changes = [
        e for e in events(tmp_path, "m2") if isinstance(e, SettingChanged) and e.key == "mode"
    ]
    assert [(c.key, c.value) for c in changes] == [("mode", "plan")]
    # KISO_MODE outranks the session's record too; a flag outranks KISO_MODE
    env = kiso(tmp_path, "-p", "three", "m2", KISO_HOME=home, KISO_FAUX_SCRIPT=s,
               KISO_MODE="accept-edits")  # fmt: skip
    assert env.returncode == 0, env.stderr
    assert "mode accept-edits" in env.stderr
    assert (tmp_path / "x.txt").read_text() == "x"
    changes = [
        e for e in events(tmp_path, "m2") if isinstance(e, SettingChanged) and e.key == "mode"
    ]
    assert [c.value for c in changes] == ["plan", "accept-edits"]
    again = kiso(tmp_path, "-p", "four", "m2", KISO_HOME=home, KISO_FAUX_SCRIPT=s)
    assert "mode accept-edits" in again.stderr  # the session now records accept-edits


def test_a_headless_denial_is_recorded_as_headless_and_names_only_modes_that_allow(
    tmp_path: Path,
) -> None:
    s = script(tmp_path, SHELL_TURN, EDIT_TURN, {"text": "done"})
    home = str(tmp_path / "home")
    out = kiso(tmp_path, "-p", "go", "h1", "--output-format", "stream-json", KISO_HOME=home,
               KISO_FAUX_SCRIPT=s)  # fmt: skip
    assert out.returncode == 0, out.stderr
    verdicts = [e for e in events(tmp_path, "h1") if isinstance(e, ApprovalDecided)]
    assert [(v.decision, v.decided_by) for v in verdicts] == [
        ("denied", "headless"),
        ("denied", "headless"),
    ]
    shell, edit = (v.reason or "" for v in verdicts)
    assert "bypass" in shell and "accept-edits" not in shell  # only modes that would allow it
    assert "accept-edits or bypass" in edit and "plan" not in edit
    assert not (tmp_path / "effects.log").exists() and not (tmp_path / "x.txt").exists()
    # stream-json carries every decision record, in the runtime's one JSON form
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    streamed = [line["event"] for line in lines if line["type"] == "decision"]
    assert streamed == [v.to_json() for v in verdicts]
    assert all(line["v"] == 1 for line in lines if line["type"] not in ("note", "result"))


def test_a_question_left_by_an_interactive_run_is_denied_headless_not_by_user(
    tmp_path: Path,
) -> None:
    from kiso.kernel import ApprovalRequested

    s = script(tmp_path, SHELL_TURN, {"text": "done"})
    home = tmp_path / "home"
    from kiso.providers import FauxAdapter
    from kiso.runtime import Agent
    from kiso.tools import builtin_tools

    agent = Agent(
        adapter=FauxAdapter.from_file(s),
        tools=builtin_tools(),
        store=JsonlSessionStore(home),
        workspace=tmp_path,
    )
    with agent.session("q1") as session:
        for ev in session.run_sync("go"):
            if ev.type == "approval_request":
                break  # the person walked away; the question stays on disk
    assert any(isinstance(e, ApprovalRequested) for e in events(tmp_path, "q1"))
    out = kiso(tmp_path, "resume", "q1", KISO_HOME=str(home), KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0, out.stderr
    verdicts = [e for e in events(tmp_path, "q1") if isinstance(e, ApprovalDecided)]
    assert [(v.decision, v.decided_by) for v in verdicts] == [("denied", "headless")]
