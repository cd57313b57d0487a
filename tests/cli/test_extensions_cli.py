"""Extensions through the real ``kiso``: a broken one exits 2 naming the file; the trust gate
decides whether a project's loads; the header names what loaded; the tutorial denies a lockfile
write in a headless run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiso.kernel import ApprovalDecided, JsonlSessionStore

from .test_trust import faux, kiso

ROOT = Path(__file__).resolve().parents[2]
HEAD = "from kiso.runtime.extensions import Extension\n"
AUDIT = (
    HEAD + "from kiso.runtime.hooks import Hook\n"
    "class Audit(Hook):\n"
    "    def on_user_message(self, text, run):\n"
    "        return text + ' [audited]'\n"
    "extension = Extension(name='audit', hooks=[Audit()], system_prompt_append='Be brief.')\n"
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    return folder


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def script(tmp_path: Path) -> str:
    return faux(tmp_path, {"text": "done"})


def test_a_broken_user_extension_exits_2_naming_the_file(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    bad = home / "extensions" / "broken.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def oops(:\n")
    got = kiso(ws, home, "-p", "hi", KISO_FAUX_SCRIPT=script(tmp_path))
    assert got.returncode == 2, got.stderr
    assert str(bad) in got.stderr and "does not compile" in got.stderr
    assert "Traceback" not in got.stderr


def test_kiso_extensions_dir_is_used_and_named_in_the_header(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    other = tmp_path / "exts"
    other.mkdir()
    (other / "safe_defaults.py").write_bytes(
        (ROOT / "examples" / "extensions" / "safe_defaults.py").read_bytes()
    )
    turns = [
        {"tool_calls": [{"name": "write_file", "input": {"path": "poetry.lock", "content": "x"}}]},
        {"text": "ok"},
    ]
    got = kiso(
        ws,
        home,
        "--mode",
        "bypass",
        "-p",
        "go",
        "s1",
        KISO_FAUX_SCRIPT=faux(tmp_path, *turns),
        KISO_EXTENSIONS_DIR=str(other),
    )
    assert got.returncode == 0, got.stderr
    assert "extensions: safe-defaults (user)" in got.stderr
    assert not (ws / "poetry.lock").exists()
    events = JsonlSessionStore(home).load("s1").events
    decided = [e for e in events if isinstance(e, ApprovalDecided)]
    assert [(d.decision, d.decided_by) for d in decided] == [("denied", "extension:safe-defaults")]


def test_a_project_extension_loads_only_once_trusted(tmp_path: Path, ws: Path, home: Path) -> None:
    ext = ws / ".kiso" / "extensions" / "audit.py"
    ext.parent.mkdir(parents=True)
    ext.write_text(AUDIT)
    env = {"KISO_FAUX_SCRIPT": script(tmp_path)}
    untrusted = kiso(ws, home, "-p", "hi", **env)
    assert untrusted.returncode == 1  # the gate refuses a headless run: nothing of it loads
    assert "extensions:" not in untrusted.stderr and "did not start" in untrusted.stderr
    refused = kiso(ws, home, "trust", "--revoke")
    assert refused.returncode == 0, refused.stderr
    ran = kiso(ws, home, "-p", "hi", "r1", **env)
    assert ran.returncode == 0, ran.stderr
    assert "extensions:" not in ran.stderr
    assert json.dumps("hi [audited]") not in next((home / "projects").rglob("r1.jsonl")).read_text()
    trusted = kiso(ws, home, "trust")
    assert trusted.returncode == 0, trusted.stderr
    ran = kiso(ws, home, "-p", "hi", "t1", **env)
    assert ran.returncode == 0, ran.stderr
    assert "extensions: audit (project)" in ran.stderr
    log = next((home / "projects").rglob("t1.jsonl")).read_text()
    assert json.dumps("hi [audited]") in log  # the rewrite is what the user record holds
    assert "Be brief." in log  # the append is in the recorded system prompt


def test_a_project_extension_may_not_shadow_a_user_one(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    (home / "extensions").mkdir(parents=True)
    (home / "extensions" / "audit.py").write_text(AUDIT)
    ext = ws / ".kiso" / "extensions" / "audit.py"
    ext.parent.mkdir(parents=True)
    ext.write_text(AUDIT)
    assert kiso(ws, home, "trust").returncode == 0
    got = kiso(ws, home, "-p", "hi", KISO_FAUX_SCRIPT=script(tmp_path))
    assert got.returncode == 2, got.stderr
    assert str(ext) in got.stderr and "may not shadow" in got.stderr


def test_reload_swaps_a_sound_set_and_keeps_the_old_one_when_broken(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    from .test_repl import ENTER, Term, chat, squash, write_script

    exts = home / "extensions"
    exts.mkdir(parents=True)
    (exts / "one.py").write_text(
        HEAD + "extension = Extension(name='one', system_prompt_append='x' * 400)\n"
    )
    script = write_script(tmp_path / "s.json", [{"text": "hi"}])
    term = Term(chat("s1"), cwd=ws, home=home, script=script)
    try:
        term.wait_for("▸ default")
        assert squash("extensions: one (user)") in squash(term.text)
        term.send("/status" + ENTER)
        term.wait(lambda: squash("~100 tokens") in squash(term.text), 10, "one's rent in /status")
        (exts / "two.py").write_text(HEAD + "extension = Extension(name='two')\n")
        term.send("/reload" + ENTER)
        term.wait(
            lambda: squash("extensions: one (user), two (user)") in squash(term.text), 10, "reload"
        )
        (exts / "three.py").write_text("def broken(:\n")
        term.send("/reload" + ENTER)
        term.wait(lambda: squash("the old set is kept") in squash(term.text), 10, "the refusal")
        assert "three.py" in squash(term.text)
        term.send("/status" + ENTER)
        term.wait(lambda: squash("extension  two (user") in squash(term.text), 10, "two kept")
    finally:
        term.close()
