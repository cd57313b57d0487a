"""The executer's ``terminal`` runs in the OS sandbox by default (a plan from a server is the
least trusted input we run): the base is writable, the rest of the file system is not, the
executer's own state and the user's credentials are hidden, and there is no network."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kiso.tools.sandbox import SandboxPolicy
from kyronix.errors import KyronixUsageError
from kyronix.executer import ROOT_POLICIES, KyronixExecuter, PermissionManager

from .kmlkit import run

KYRONIX = str(Path(sys.executable).with_name("kyronix"))


def _executer(**kw: object) -> KyronixExecuter:
    return KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=":memory:", **kw)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE-KEY")
    monkeypatch.setenv("HOME", str(home))
    return home


def test_terminal_writes_in_the_base_and_nowhere_else(
    base: Path, home: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with _executer() as ex:
        inside = run(ex, base, "terminal", command="echo made > made.txt")
        escape = run(ex, base, "terminal", command=f"echo no > {outside}/x; echo no > ~/y")
        secret = run(ex, base, "terminal", command="cat ~/.ssh/id_rsa")
    assert inside["success"] and (base / "made.txt").read_text() == "made\n"
    assert not escape["success"] and "Read-only file system" in escape["output"]
    assert "sandbox" in escape["error"]  # the failure says why
    assert not (outside / "x").exists() and not (home / "y").exists()
    assert not secret["success"] and "PRIVATE-KEY" not in secret["output"]


def test_terminal_reaches_no_listener(base: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    connect = f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}))"
    try:
        with _executer() as ex:
            out = run(ex, base, "terminal", command=f'python3 -c "{connect}"')
        assert not out["success"] and "Connection refused" in out["output"]
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    finally:
        server.close()


def test_sandbox_off_is_the_callers_explicit_choice(base: Path, tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    with _executer(sandbox="off") as ex:
        out = run(ex, base, "terminal", command=f"echo yes > {target}")
    assert out["success"] and target.read_text() == "yes\n"
    with pytest.raises(KyronixUsageError, match="sandbox is one of"):
        _executer(sandbox="loose")
    policy = SandboxPolicy("read-only")
    with _executer(sandbox=policy) as ex:
        out = run(ex, base, "terminal", command="echo x > f")
    assert not out["success"] and not (base / "f").exists()


def test_kyronix_exec_takes_the_sandbox_flag(base: Path, tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    plan = tmp_path / "plan.kml"
    from .kmlkit import kml

    env = {**os.environ, "KYRONIX_HOME": str(tmp_path / "kx")}

    def kyronix(*flags: str) -> subprocess.CompletedProcess[str]:
        # a new plan each time: the same execution id would replay its receipt
        plan.write_text(kml(("terminal", {"command": f"echo hi > {target}"})))
        return subprocess.run(
            [KYRONIX, "exec", str(plan), "--base", str(base), "--root", *flags],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )

    assert kyronix().returncode == 1 and not target.exists()
    bad = kyronix("--sandbox", "nope")
    assert bad.returncode == 2 and "--sandbox" in bad.stderr
    assert kyronix("--sandbox", "off").returncode == 0 and target.read_text() == "hi\n"
