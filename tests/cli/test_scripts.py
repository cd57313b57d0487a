"""The scripts a new user runs: scripts/install, scripts/run from elsewhere, demos that clean up.

Each runs as a real process, with HOME or TMPDIR pointed at a fresh folder, and is judged by
what is on disk afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from kiso.kernel import JsonlSessionStore

ROOT = Path(__file__).resolve().parents[2]
KISO = ROOT / ".venv" / "bin" / "kiso"
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_MODEL", "KISO_FAILPOINT")


def script(
    name: str, *args: str, cwd: Path | None = None, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in KEYS and k != "KISO_FAUX_SCRIPT"}
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / name), *args],
        cwd=cwd or ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --------------------------------------------------------------------------- scripts/install


def test_install_links_kiso_into_local_bin_once_and_says_whether_it_is_on_path(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    link = home / ".local" / "bin" / "kiso"
    first = script("install", HOME=str(home), PATH="/usr/bin:/bin")
    assert first.returncode == 0, first.stderr
    assert link.is_symlink() and Path(os.readlink(link)) == KISO
    assert f"linked {link} -> {KISO}" in first.stdout
    assert "is NOT on your PATH" in first.stdout and 'export PATH="$HOME/.local/bin:$PATH"' in (
        first.stdout
    )
    on_path = f"{home / '.local' / 'bin'}:/usr/bin:/bin"
    again = script("install", HOME=str(home), PATH=on_path)
    assert again.returncode == 0, again.stderr
    assert "already installed" in again.stdout and "is on your PATH" in again.stdout
    version = subprocess.run(
        [str(link), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert version.returncode == 0 and version.stdout.strip()


def test_uninstall_removes_only_its_own_link(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bin_dir = home / ".local" / "bin"
    assert script("install", HOME=str(home)).returncode == 0
    gone = script("install", "--uninstall", HOME=str(home))
    assert gone.returncode == 0, gone.stderr
    assert not (bin_dir / "kiso").exists() and not (bin_dir / "kiso").is_symlink()
    assert "removed" in gone.stdout
    assert "nothing to remove" in script("install", "--uninstall", HOME=str(home)).stdout

    theirs = bin_dir / "kiso"
    theirs.write_text("#!/bin/sh\necho another kiso\n")
    kept = script("install", "--uninstall", HOME=str(home))
    assert kept.returncode == 1 and "left" in kept.stderr
    refused = script("install", HOME=str(home))
    assert refused.returncode == 1 and "left it alone" in refused.stderr
    assert theirs.read_text() == "#!/bin/sh\necho another kiso\n"  # never replaced nor removed


# --------------------------------------------------------------------------- scripts/run


def test_run_uses_the_directory_it_is_started_from_as_the_workspace(tmp_path: Path) -> None:
    project, home = tmp_path / "my project", tmp_path / "home"
    project.mkdir()
    turns = [
        {"tool_calls": [{"name": "write_file", "input": {"path": "hello.txt", "content": "hi"}}]},
        {"text": "Wrote it."},
    ]
    faux = tmp_path / "script.json"
    faux.write_text(json.dumps({"turns": turns}))
    out = script(
        "run", "-p", "write hello.txt", "--mode", "accept-edits", cwd=project,
        KISO_HOME=str(home), KISO_FAUX_SCRIPT=str(faux),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert (project / "hello.txt").read_text() == "hi"
    assert not (ROOT / "hello.txt").exists()
    (row,) = JsonlSessionStore(home).list()
    assert Path(JsonlSessionStore(home).load(row.id).header.workspace) == project


# --------------------------------------------------------------------------- the demos


def test_kiso_demo_leaves_no_temporary_folder_and_says_so(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    out = subprocess.run(
        [str(KISO), "demo"],
        env={**env, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "EndRun: completed" in out.stdout
    assert "Removed the demo's temporary folders" in out.stdout
    assert list(tmp.iterdir()) == []


def test_kiso_demo_with_a_home_keeps_it(tmp_path: Path) -> None:
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    out = subprocess.run(
        [str(KISO), "demo", "--home", str(home)],
        env={**env, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Inspect it:  KISO_HOME={home}" in out.stdout and "Removed" not in out.stdout
    (row,) = JsonlSessionStore(home).list()
    workspace = Path(JsonlSessionStore(home).load(row.id).header.workspace)
    assert (workspace / "notes.txt").read_text() == "first line\nsecond line\n"


def test_the_kill9_demo_script_leaves_no_temporary_folder(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = script("demo-kill9.sh", TMPDIR=str(tmp), timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed the temporary folders (4)" in out.stdout
    assert list(tmp.iterdir()) == []
