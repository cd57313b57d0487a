"""``kyronix exec`` and ``python -m kyronix.executer``, as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

KYRONIX = str(Path(sys.executable).with_name("kyronix"))


def _run(*args: str, stdin: str | None = None, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KYRONIX_HOME": str(home)},
        check=False,
    )


@pytest.mark.parametrize("entry", ["kyronix", "module"])
def test_exec_prints_json_results(tmp_path: Path, base: Path, entry: str) -> None:
    plan = tmp_path / "plan.kml"
    plan.write_text(
        "Here you go:\n<kyronix><plan>make a file</plan>"
        '<tool name="write_file"><path>src/hello.py</path><content>\nprint("hi")\n</content>'
        '</tool><tool name="read_file"><path>src/hello.py</path></tool>'
        "<status>complete</status></kyronix>"
    )
    cmd = [KYRONIX, "exec"] if entry == "kyronix" else [sys.executable, "-m", "kyronix.executer"]
    out = _run(*cmd, str(plan), "--base", str(base), home=tmp_path)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    assert [r["tool"] for r in results] == ["write_file", "read_file"]
    assert results[1]["result"]["output"] == 'print("hi")\n'
    assert (base / "src/hello.py").read_text() == 'print("hi")\n'
    assert (tmp_path / "receipts.sqlite3").exists()


def test_exec_reads_stdin_and_applies_policies(tmp_path: Path, base: Path) -> None:
    plan = '<tool name="terminal"><command>echo from-shell</command></tool>'
    denied = _run(KYRONIX, "exec", "-", "--base", str(base), stdin=plan, home=tmp_path)
    assert denied.returncode == 1
    [entry] = json.loads(denied.stdout)
    assert entry["result"]["errorType"] == "SecurityError"
    plan2 = '<tool name="terminal"><command>echo from-shell-2</command></tool>'
    allowed = _run(
        KYRONIX, "exec", "-", "--base", str(base), "--allow", "tool:terminal", stdin=plan2,
        home=tmp_path,
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)[0]["result"]["output"].startswith("from-shell-2")


def test_exec_bad_input_is_a_clear_error(tmp_path: Path, base: Path) -> None:
    truncated = tmp_path / "bad.kml"
    truncated.write_text('<kyronix><tool name="write_file"><path>a</path><content>x')
    out = _run(KYRONIX, "exec", str(truncated), "--base", str(base), home=tmp_path)
    assert out.returncode == 2
    assert "not valid KML" in out.stderr and "offset" in out.stderr
    assert "nothing was run" in out.stderr and "Traceback" not in out.stderr
    assert os.listdir(base) == []

    missing = _run(KYRONIX, "exec", str(tmp_path / "nope.kml"), "--base", str(base), home=tmp_path)
    assert missing.returncode == 2 and "cannot read the plan" in missing.stderr
    bad_allow = _run(KYRONIX, "exec", "-", "--allow", "terminal", stdin="", home=tmp_path)
    assert bad_allow.returncode == 2 and "tool:terminal" in bad_allow.stderr
    bad_resolve = _run(KYRONIX, "exec", "--resolve", "x=maybe", "--base", str(base), home=tmp_path)
    assert bad_resolve.returncode == 2 and "ID=rerun" in bad_resolve.stderr
    unknown = _run(KYRONIX, "exec", "--resolve", "x=rerun", "--base", str(base), home=tmp_path)
    assert unknown.returncode == 1 and "no execution 'x'" in unknown.stderr
    nobase = _run(KYRONIX, "exec", "-", "--base", str(tmp_path / "nope"), stdin="", home=tmp_path)
    assert nobase.returncode == 2 and "does not exist" in nobase.stderr
    for out in (missing, bad_allow, bad_resolve, unknown, nobase):
        assert "Traceback" not in out.stderr


def test_resolve_accepts_skip_as_an_alias(tmp_path: Path, base: Path) -> None:
    from kiso.kernel.execution import ExecutionId
    from kyronix.executer import ReceiptStore
    from kyronix.executer.receipts import request_hash

    receipts = tmp_path / "r.sqlite3"
    args = {"command": "echo ran > ran.txt"}
    store = ReceiptStore(receipts)
    store.start(str(base), ExecutionId("t-1"), "terminal", request_hash("terminal", args))
    store.start(str(base), ExecutionId("t-2"), "terminal", request_hash("terminal", args))
    store.close()
    common = ["--base", str(base), "--receipts", str(receipts)]
    out = _run(KYRONIX, "exec", "--resolve", "t-1=skip", "--resolve", "t-2=applied", *common,
               home=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["t-1: skipped", "t-2: applied"]
    plan = '<tool name="terminal" executionId="t-1"><command>echo ran > ran.txt</command></tool>'
    ran = _run(KYRONIX, "exec", "-", "--root", *common, stdin=plan, home=tmp_path)
    [entry] = json.loads(ran.stdout)
    assert entry["result"]["resolved"] == "skipped" and ran.returncode == 1
    assert not (base / "ran.txt").exists()
    again = _run(KYRONIX, "exec", "--resolve", "t-1=rerun", *common, home=tmp_path)
    assert again.returncode == 1 and "already finished" in again.stderr
    assert "Traceback" not in again.stderr


def test_user_errors_never_print_a_traceback(tmp_path: Path, base: Path) -> None:
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"not a database" * 100)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    plan = '<tool name="list_dir"></tool>'
    cases = {
        "damaged store": (["--receipts", str(junk)], plan, "receipt store"),
        "store under a file": (["--receipts", str(a_file / "r.sqlite3")], plan, "receipt store"),
        "store is a directory": (["--receipts", str(tmp_path)], plan, "is a directory"),
        "bad ruling": (["--resolve", "x=later"], "", "ID=skipped (or ID=skip)"),
        "no id": (["--resolve", "=rerun"], "", "ID=rerun"),
    }
    for what, (extra, stdin, message) in cases.items():
        out = _run(KYRONIX, "exec", "-", "--base", str(base), *extra, stdin=stdin, home=tmp_path)
        assert out.returncode in (1, 2), (what, out)
        assert message in out.stderr, (what, out.stderr)
        assert "Traceback" not in out.stderr, (what, out.stderr)
    binary = subprocess.run(
        [KYRONIX, "exec", "-", "--base", str(base)],
        input=b"\xff\xfe<tool name='list_dir'></tool>",
        capture_output=True,
        timeout=60,
        env={**os.environ, "KYRONIX_HOME": str(tmp_path), "PYTHONIOENCODING": "utf-8"},
        check=False,
    )
    assert binary.returncode == 2 and b"not UTF-8" in binary.stderr
    assert b"Traceback" not in binary.stderr


def test_an_unreadable_or_non_utf8_plan_exits_2_and_runs_nothing(
    tmp_path: Path, base: Path
) -> None:
    """As the help says: 2 when the plan could not be read (missing, unreadable, a directory,
    not UTF-8) or parsed; nothing runs."""
    latin1 = tmp_path / "latin1.kml"
    latin1.write_bytes(
        "<tool name='write_file'><path>é.txt</path><content>x</content></tool>".encode("latin-1")
    )
    unreadable = tmp_path / "secret.kml"
    unreadable.write_text("<tool name='write_file'><path>a</path><content>x</content></tool>")
    unreadable.chmod(0)
    cases = {
        "missing": str(tmp_path / "nope.kml"),
        "a directory": str(tmp_path),
        "not UTF-8": str(latin1),
    }
    if os.geteuid() != 0:  # root reads a mode-0 file anyway
        cases["unreadable"] = str(unreadable)
    for what, plan in cases.items():
        out = _run(KYRONIX, "exec", plan, "--base", str(base), home=tmp_path)
        assert out.returncode == 2, (what, out)
        assert "nothing was run" in out.stderr and "Traceback" not in out.stderr, what
    help_text = _run(KYRONIX, "exec", "--help", home=tmp_path).stdout
    assert "2 when the plan could not" in " ".join(help_text.split())
    assert os.listdir(base) == []
