""" "Don't ask again" in the terminal: the panel's two scopes (this project, every project), what
``/status`` lists, and the one notice about rules written before scopes (in the REPL and on
stderr in print mode). Real git repositories, a real PTY, the real ``make``."""

# The fixtures (ws, kiso_home, spawn) come from test_repl: their names are parameters here.
# ruff: noqa: F401, F811

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kiso.kernel import ApprovalDecided

from .test_repl import ENTER, Term, chat, events, kiso_home, shell, spawn, squash, write_script, ws
from .test_repl_session import squash_lines

BIN = Path(sys.executable).parent / "kiso"
MAKEFILE = "all:\n\ttouch ran.txt\n"
NOTICE = "written before rules had a scope"


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)
    (path / "Makefile").write_text(MAKEFILE)
    return path


@pytest.fixture
def other(tmp_path: Path) -> Path:
    """A second repository, cloned fresh: its Makefile must not run on the first one's grant."""
    return git_repo(tmp_path / "cloned")


@pytest.fixture
def terms() -> Iterator[list[Term]]:
    started: list[Term] = []
    try:
        yield started
    finally:
        for term in started:
            term.close()


def in_dir(terms: list[Term], cwd: Path, home: Path, script: Path, sid: str) -> Term:
    term = Term(chat(sid), cwd=cwd, home=home, script=script, cols=220, rows=50)
    terms.append(term)
    return term


def ask_make(term: Term) -> str:
    term.wait_for("▸ default")
    term.send("build it" + ENTER)
    return term.wait_for("Run this command?")


def test_dont_ask_again_is_scoped_to_the_project_and_every_project_is_explicit(
    tmp_path: Path, ws: Path, other: Path, kiso_home: Path, terms: list[Term]
) -> None:
    git_repo(ws)
    rules = kiso_home / "dont-ask-again.rules"
    script = write_script(tmp_path / "s.json", [shell("make"), {"text": "Built."}])
    term = in_dir(terms, ws, kiso_home, script, "a1")
    screen = ask_make(term)
    assert squash(f"2. Yes, and don't ask again in this project ({ws})") in squash(screen)
    assert "3. No (tell the model why)" in screen
    assert squash("5. Yes, and don't ask again in every project") in squash(screen)
    term.send("2")
    term.wait_for("Built.")
    assert "won't ask again in this project: shell: make" in squash_lines(term.text)
    assert f"[project {ws}]\nshell: make\n" in rules.read_text()
    assert (ws / "ran.txt").exists()

    # the freshly cloned repository is asked about its Makefile, even though ws granted it
    term = in_dir(terms, other, kiso_home, script, "b1")
    ask_make(term)
    assert not (other / "ran.txt").exists()  # nothing ran before the answer
    term.send("5")
    term.wait_for("Built.")
    assert "won't ask again in every project: shell: make" in squash_lines(term.text)
    assert "[every project]\nshell: make\n" in rules.read_text()
    assert (other / "ran.txt").exists()
    decided = [e for e in events(kiso_home, "b1") if isinstance(e, ApprovalDecided)]
    assert [(d.decided_by, d.rule) for d in decided] == [("user", "shell: make")]

    # /status in ws lists both rules in force there, each with where it comes from
    term = in_dir(terms, ws, kiso_home, script, "a2")
    term.wait_for("▸ default")
    term.send("/status" + ENTER)
    term.wait(lambda t=term: "history /" in squash_lines(t.text), 10, "/status")
    status = squash_lines(term.text)
    assert f"rules {rules} · 2 in force in {ws}" in status
    assert f"rule shell: make · this project ({ws}) · {rules}:8" in status
    assert f"rule shell: make · every project · {rules}:11" in status

    # and in the cloned one only the every-project rule is in force
    term = in_dir(terms, other, kiso_home, script, "b2")
    term.wait_for("▸ default")
    term.send("/status" + ENTER)
    term.wait(lambda t=term: "history /" in squash_lines(t.text), 10, "/status")
    status = squash_lines(term.text)
    assert f"rules {rules} · 1 in force in {other}" in status
    assert f"rule shell: make · every project · {rules}:11" in status
    assert "this project" not in status


def test_a_rules_file_from_before_scopes_still_allows_and_the_repl_says_so_once(
    tmp_path: Path, ws: Path, kiso_home: Path, terms: list[Term]
) -> None:
    git_repo(ws)
    kiso_home.mkdir()
    rules = kiso_home / "dont-ask-again.rules"
    rules.write_text("# an older kiso's file\nshell: make\n")
    script = write_script(tmp_path / "s.json", [shell("make"), {"text": "Built."}])
    term = in_dir(terms, ws, kiso_home, script, "old")
    term.wait_for("▸ default")
    shown = squash_lines(term.text)
    assert shown.count(NOTICE) == 1
    assert f"move its line under a '[project {ws}]' line" in shown
    term.send("build it" + ENTER)
    term.wait_for("Built.")  # allowed by the old rule, no question
    assert "Run this command?" not in term.text
    assert (ws / "ran.txt").exists()
    decided = [e for e in events(kiso_home, "old") if isinstance(e, ApprovalDecided)]
    assert [(d.decided_by, d.rule) for d in decided] == [("rule:shell: make", "shell: make")]
    term.send("/status" + ENTER)
    term.wait(lambda: "history /" in squash_lines(term.text), 10, "/status")
    status = squash_lines(term.text)
    assert f"rule shell: make · every project (written without a scope) · {rules}:2" in status
    term.send("/reload" + ENTER)
    term.wait_for("reloaded")
    term.send("/status" + ENTER)
    term.wait(lambda: squash_lines(term.text).count("history /") == 2, 10, "/status again")
    assert squash_lines(term.text).count(NOTICE) == 1  # once in the process


def kiso_print(cwd: Path, home: Path, script: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    env.update(KISO_HOME=str(home), KISO_FAUX_SCRIPT=str(script))
    return subprocess.run(
        [str(BIN), "-p", "build it"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_print_mode_says_it_in_one_line_on_stderr(tmp_path: Path, ws: Path) -> None:
    git_repo(ws)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dont-ask-again.rules").write_text("shell: make\n")
    script = write_script(tmp_path / "s.json", [shell("make"), {"text": "Built."}])
    out = kiso_print(ws, home, script)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Built.\n"
    said = [ln for ln in out.stderr.splitlines() if NOTICE in ln]
    assert len(said) == 1 and str(home / "dont-ask-again.rules") in said[0]
    assert (ws / "ran.txt").exists()  # the old rule still allows


def test_a_malformed_section_stops_kiso_at_start_naming_the_file_and_line(
    tmp_path: Path, ws: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    rules = home / "dont-ask-again.rules"
    rules.write_text("[every project]\nread_file\n[project ../app]\nshell: make\n")
    script = write_script(tmp_path / "s.json", [{"text": "never"}])
    out = kiso_print(ws, home, script)
    assert out.returncode != 0
    assert f"{rules}, line 3" in out.stderr and "not an absolute path" in out.stderr
    assert "Traceback" not in out.stderr and "never" not in out.stdout
