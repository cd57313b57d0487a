"""The `kiso` and `kyronix` commands, run as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiso import __version__
from kiso.kernel import JsonlSessionStore, ModelRef, RunStarted, User

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_help_and_version() -> None:
    out = run(str(BIN / "kiso"), "--help")
    assert out.returncode == 0
    for word in ("demo", "sessions", "KISO_HOME"):
        assert word in out.stdout
    assert run(str(BIN / "kiso"), "--version").stdout.strip() == f"kiso, version {__version__}"
    assert (
        run(str(BIN / "kyronix"), "--version").stdout.strip() == f"kyronix, version {__version__}"
    )
    assert run(str(BIN / "kyronix"), "--help").returncode == 0


def test_help_imports_no_provider_sdk_and_not_the_store() -> None:
    probe = (
        "import sys\n"
        "sys.argv = ['kiso', '--help']\n"
        "from kiso.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('openai', 'anthropic', 'httpx', 'httpx2', 'pydantic', 'kiso.kernel.jsonl')\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = run(sys.executable, "-c", probe)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("LOADED []")


def test_demo_kills_an_agent_and_recovers_it(tmp_path: Path) -> None:
    home = tmp_path / "demo-home"
    out = run(str(BIN / "kiso"), "demo", "--home", str(home))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the agent died by SIGKILL" in out.stdout
    assert "ResolveUncertain" in out.stdout and "EndRun: completed" in out.stdout
    (row,) = JsonlSessionStore(home).list()
    assert row.state.value == "completed"
    log = JsonlSessionStore(home).load(row.id)
    kinds = [e.type for e in log.events]
    # the first call ran once; the interrupted one was ruled on and executed once more
    assert kinds.count("execution_started") == 3
    assert kinds.count("execution_finished") == 2
    assert kinds.count("execution_resolved") == 1
    assert kinds[-1] == "run_ended"
    notes = Path(log.header.workspace) / "notes.txt"
    assert notes.read_text() == "first line\nsecond line\n"


def test_sessions_lists_this_workspace_or_all(tmp_path: Path, home: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    store = JsonlSessionStore(home)
    with store.create(here, session_id="s-here") as w:
        w.append(
            RunStarted(run="r", trigger="user", model=ModelRef("faux", "m"), mode="default"),
            User(run="r", content="refactor the parser\nplease"),
        )
    store.create(there, session_id="s-there").close()
    out = run(str(BIN / "kiso"), "sessions", cwd=here)
    assert out.returncode == 0
    assert "s-here" in out.stdout and "interrupted" in out.stdout
    assert "refactor the parser please" in out.stdout
    assert "s-there" not in out.stdout
    every = run(str(BIN / "kiso"), "sessions", "--all", cwd=here).stdout
    assert "s-here" in every and "s-there" in every and str(there) in every
    rows = [
        json.loads(line)
        for line in run(str(BIN / "kiso"), "sessions", "--all", "--json").stdout.splitlines()
    ]
    assert {r["id"]: r["state"] for r in rows} == {"s-here": "interrupted", "s-there": "empty"}
    empty = run(str(BIN / "kiso"), "sessions", cwd=tmp_path)
    assert empty.returncode == 0 and empty.stdout == ""  # piped: nothing but rows
    assert "no sessions in this directory" in empty.stderr


def test_a_corrupt_log_is_listed_not_a_traceback(tmp_path: Path, home: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    store = JsonlSessionStore(home)
    store.create(ws, session_id="bad").close()
    with open(store.path_of("bad"), "ab") as f:
        f.write(b"{oops}\n")
    out = run(str(BIN / "kiso"), "sessions", cwd=ws)
    assert out.returncode == 0
    assert "\tcorrupt\t" in out.stdout and "line 2" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("script", ["scripts/run", "scripts/test", "scripts/bootstrap", ".ci/run"])
def test_the_readme_commands_exist(script: str) -> None:
    path = ROOT / script
    assert path.is_file() and os.access(path, os.X_OK)
    readme = (ROOT / "README.md").read_text()
    if script in ("scripts/run", "scripts/test"):
        assert script in readme


def test_the_readme_main_job_runs() -> None:
    """`scripts/run` as a newcomer types it (the venv already exists, so it is quick)."""
    out = run(str(ROOT / "scripts" / "run"), cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "session state: completed" in out.stdout


def test_help_and_version_take_a_fast_path_that_imports_no_toolkit() -> None:
    probe = (
        "import sys\n"
        "sys.argv = ['kiso', '{arg}']\n"
        "from kiso.cli import main\n"
        "main()\n"
        "heavy = ('click', 'openai', 'anthropic', 'prompt_toolkit', 'rich', 'httpx2',"
        " 'kiso.kernel')\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    for arg in ("--help", "--version"):
        out = run(sys.executable, "-c", probe.format(arg=arg))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().endswith("LOADED []"), out.stdout


def test_the_fast_help_is_exactly_what_click_renders() -> None:
    from click.testing import CliRunner

    from kiso.cli.help import HELP
    from kiso.cli.main import cli

    rendered = CliRunner().invoke(cli, ["--help"], prog_name="kiso", terminal_width=80).output
    assert rendered == HELP, "regenerate src/kiso/cli/help.py from click's rendering"
