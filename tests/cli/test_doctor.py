"""`kiso doctor <id>` as a real process: what it prints, its exit codes, and that a session it
repaired resumes without running again any effect that had a receipt."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from kiso.kernel import JsonlSessionStore

from .test_headless import kiso


def shell(tag: str) -> dict[str, object]:
    return {"name": "shell", "input": {"command": f"echo {tag} >> effects.log"}}


def script(tmp_path: Path) -> str:
    path = tmp_path / "script.json"
    turns = [
        {"text": "First.", "tool_calls": [shell("a")]},
        {"tool_calls": [shell("b")]},
        {"text": "Done."},
        {"text": "Still done."},  # the answer to a later prompt
    ]
    path.write_text(json.dumps({"turns": turns}))
    return str(path)


def effects(ws: Path) -> list[str]:
    log = ws / "effects.log"
    return log.read_text().splitlines() if log.exists() else []


def log_path(session_id: str) -> Path:
    return JsonlSessionStore().path_of(session_id)


def damage(path: Path, kind: str, nth: int = 1) -> bytes:
    """Overwrite bytes in the middle of the nth line of type ``kind``; returns the new bytes."""
    lines = path.read_bytes().split(b"\n")
    found = [i for i, line in enumerate(lines) if f'"type":"{kind}"'.encode() in line]
    i = found[nth - 1]
    lines[i] = lines[i][:30] + b"\x00damage\x00" + lines[i][40:]
    data = b"\n".join(lines)
    path.write_bytes(data)
    return data


def test_a_repaired_session_resumes_without_repeating_an_effect(tmp_path: Path) -> None:
    s = script(tmp_path)
    run = kiso(tmp_path, "-p", "go", "d1", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert run.returncode == 0, run.stderr
    assert effects(tmp_path) == ["a", "b"]
    path = log_path("d1")
    broken = damage(path, "assistant", 1)  # the turn of effect a: its receipt is after it
    stuck = kiso(tmp_path, "resume", "d1", "more", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert stuck.returncode == 1 and "Traceback" not in stuck.stderr
    assert "`kiso doctor d1`" in stuck.stderr and "remove line" not in stuck.stderr
    listed = kiso(tmp_path, "sessions")
    assert "\tcorrupt\t" in listed.stdout and "kiso doctor d1" in listed.stderr

    out = kiso(tmp_path, "doctor", "d1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr == ""
    report = out.stdout
    assert report.startswith(f"session d1: repaired {path}\n")
    # line 1 the header, then run_started, user, the system prompt record, the turn
    assert "dropped line 5" in report and "added seq 4 assistant" in report
    assert "kept as finished, never run again: d1:" in report
    assert "next: `kiso resume d1`" in report
    (copy,) = path.parent.glob("d1.jsonl.damaged-*")
    assert copy.read_bytes() == broken and stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert f"kept, unchanged, as {copy}" in report

    rows = kiso(tmp_path, "sessions").stdout
    assert rows.startswith("d1\tcompleted\t")
    again = kiso(tmp_path, "resume", "d1", "anything else?", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "Still done."  # the script went on: no turn was replayed
    assert effects(tmp_path) == ["a", "b"]
    assert kiso(tmp_path, "doctor", "d1").stdout.startswith("session d1: the log loads")


def test_an_interrupted_session_repaired_then_ruled_on_runs_each_effect_once(
    tmp_path: Path,
) -> None:
    s = script(tmp_path)
    crashed = kiso(
        tmp_path, "-p", "go", "d2", "--mode", "bypass",
        KISO_FAUX_SCRIPT=s, KISO_FAILPOINT="execution_started:2",
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL
    assert effects(tmp_path) == ["a"]  # b started and was killed before it ran
    damage(log_path("d2"), "execution_started", 1)  # a's start; its receipt is after it
    out = kiso(tmp_path, "doctor", "d2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "uncertain, never run again unasked: d2:" in out.stdout
    stuck = kiso(tmp_path, "resume", "d2", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert stuck.returncode == 1 and "--resolve rerun|skip|applied" in stuck.stderr
    assert effects(tmp_path) == ["a"]
    ruled = kiso(
        tmp_path, "resume", "d2", "--resolve", "rerun", "--mode", "bypass", KISO_FAUX_SCRIPT=s
    )
    assert ruled.returncode == 0, ruled.stderr
    assert effects(tmp_path) == ["a", "b"]  # a never again; b once, as ruled


def test_exit_codes_and_messages(tmp_path: Path) -> None:
    s = script(tmp_path)
    assert kiso(tmp_path, "-p", "go", "d3", "--mode", "bypass", KISO_FAUX_SCRIPT=s).returncode == 0
    healthy = kiso(tmp_path, "doctor", "d3")
    assert healthy.returncode == 0
    assert healthy.stdout == "session d3: the log loads; nothing to repair\n"
    missing = kiso(tmp_path, "doctor", "nope")
    assert missing.returncode == 1 and "no session 'nope'" in missing.stderr
    usage = kiso(tmp_path, "doctor")
    assert usage.returncode == 2 and "Missing argument" in usage.stderr
    bad = kiso(tmp_path, "doctor", "../escape")
    assert bad.returncode == 2 and "invalid session id" in bad.stderr
    path = log_path("d3")
    lines = path.read_bytes().split(b"\n")
    lines[0] = lines[0][:20] + b"\x00" + lines[0][21:]
    broken = b"\n".join(lines)
    path.write_bytes(broken)
    refused = kiso(tmp_path, "doctor", "d3")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "could not repair" in refused.stderr and "line 1, the header" in refused.stderr
    assert path.read_bytes() == broken and not list(path.parent.glob("d3.jsonl.damaged-*"))
    for out in (healthy, missing, usage, bad, refused):
        assert "Traceback" not in out.stderr


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kiso.kernel.lock import SessionLock
    lock = SessionLock.acquire(Path(sys.argv[1]), sys.argv[2])
    print("HOLDING", flush=True)
    time.sleep(120)
    """
)


def test_the_doctor_waits_for_no_one_and_touches_nothing_while_a_writer_holds_the_session(
    tmp_path: Path,
) -> None:
    s = script(tmp_path)
    assert kiso(tmp_path, "-p", "go", "d4", "--mode", "bypass", KISO_FAUX_SCRIPT=s).returncode == 0
    path = log_path("d4")
    broken = damage(path, "user")
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), "d4"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "HOLDING"
            out = kiso(tmp_path, "doctor", "d4")
            assert out.returncode == 1 and "Traceback" not in out.stderr
            assert f"open for writing by pid {holder.pid}" in out.stderr
            assert path.read_bytes() == broken
        finally:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    assert kiso(tmp_path, "doctor", "d4").returncode == 0
