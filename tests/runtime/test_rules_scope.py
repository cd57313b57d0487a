""" "Don't ask again" scoped to the project: a grant records the workspace's project (its git root,
else the directory) and applies only there; "every project" is a separate, explicit scope; a file
written before scopes keeps working, everywhere, and says so.

Real directories, real git roots (``git init``), the real shell tool running a real ``make``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import ApprovalDecided, JsonlSessionStore, ToolCall, UsageError
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.rules import (
    EVERY_PROJECT,
    Rule,
    RulesError,
    RulesFile,
    project_of,
    unscoped_notice,
)
from kiso.tools import builtin_tools

MAKEFILE = "all:\n\ttouch ran.txt\n"
MAKE = {"tool_calls": [{"name": "shell", "input": {"command": "make"}}]}


def repo(path: Path, *, git: bool = True) -> Path:
    """A directory with a Makefile that leaves ``ran.txt`` behind; a git repository if ``git``."""
    path.mkdir(parents=True, exist_ok=True)
    if git:
        subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)
    (path / "Makefile").write_text(MAKEFILE)
    return path


def body(path: Path) -> list[str]:
    """The file's lines a person wrote or kiso added, without the comments."""
    return [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]


def agent(tmp_path: Path, workspace: Path, rules: RulesFile, turns: list[dict[str, Any]]) -> Agent:
    return Agent(
        adapter=FauxAdapter(turns),
        tools=builtin_tools(),
        store=JsonlSessionStore(tmp_path / "home"),
        workspace=workspace,
        rules=rules,
    )


def grant(tmp_path: Path, workspace: Path, rules: RulesFile, *, every: bool = False) -> None:
    """Run ``make`` in ``workspace`` and answer "Yes, and don't ask again" (in every project)."""
    a = agent(tmp_path, workspace, rules, [MAKE, {"text": "made"}])
    with a.session() as session:
        asked = 0
        for ev in session.run_sync("build it"):
            if ev.type == "approval_request":
                asked += 1
                session.approve(ev.call_id, always=True, every_project=every)
        assert asked == 1
    assert (workspace / "ran.txt").exists()


def unattended_make(tmp_path: Path, workspace: Path, rules: RulesFile) -> ApprovalDecided:
    """Run ``make`` in ``workspace`` with nobody to ask: a rule allows it, or it is denied."""
    a = agent(tmp_path, workspace, rules, [MAKE, {"text": "done"}])
    with a.session(headless=True) as session:
        list(session.run_sync("AGENTS.md says: always run make"))
        (decided,) = [e for e in session.events if isinstance(e, ApprovalDecided)]
    return decided


def test_a_rule_granted_in_one_repository_does_not_apply_in_another(tmp_path: Path) -> None:
    rules = RulesFile(tmp_path / "home" / "dont-ask-again.rules")
    a, b = repo(tmp_path / "a"), repo(tmp_path / "b")
    grant(tmp_path, a, rules)
    text = rules.path.read_text()
    assert f"[project {a}]\nshell: make\n" in text  # the workspace is recorded, readable
    assert EVERY_PROJECT not in body(rules.path)
    decided = unattended_make(tmp_path, b, rules)
    assert decided.decision == "denied" and decided.decided_by == "headless"
    assert not (b / "ran.txt").exists()  # the cloned repository's Makefile did not run
    again = unattended_make(tmp_path, a, rules)  # and in its own project it still allows
    assert (again.decision, again.decided_by, again.rule) == (
        "approved",
        "rule:shell: make",
        "shell: make",
    )
    assert f"project {a}" in (again.reason or "") and f"{rules.path} line" in (again.reason or "")


def test_a_project_rule_applies_in_a_subdirectory_of_its_git_root(tmp_path: Path) -> None:
    rules = RulesFile(tmp_path / "home" / "dont-ask-again.rules")
    a = repo(tmp_path / "a")
    sub = repo(a / "src" / "sub", git=False)
    grant(tmp_path, sub, rules)  # granted from the subdirectory: recorded for the git root
    assert f"[project {a}]" in rules.path.read_text()
    (sub / "ran.txt").unlink()
    assert unattended_make(tmp_path, a, rules).decided_by == "rule:shell: make"
    assert unattended_make(tmp_path, sub, rules).decided_by == "rule:shell: make"
    assert (a / "ran.txt").exists() and (sub / "ran.txt").exists()
    assert [g.rule.text for g in rules.in_force(sub)] == ["shell: make"]


def test_every_project_is_an_explicit_choice_that_applies_in_both(tmp_path: Path) -> None:
    rules = RulesFile(tmp_path / "home" / "dont-ask-again.rules")
    a, b = repo(tmp_path / "a"), repo(tmp_path / "b")
    grant(tmp_path, a, rules, every=True)
    assert f"{EVERY_PROJECT}\nshell: make\n" in rules.path.read_text()
    assert not [ln for ln in body(rules.path) if ln.startswith("[project")]
    assert unattended_make(tmp_path, b, rules).decided_by == "rule:shell: make"
    assert (b / "ran.txt").exists()
    assert "(every project" in (unattended_make(tmp_path, a, rules).reason or "")
    assert unscoped_notice(rules, b) is None  # chosen explicitly: nothing to tell


def test_every_project_without_always_is_a_usage_error(tmp_path: Path) -> None:
    rules = RulesFile(tmp_path / "rules")
    a = repo(tmp_path / "a")
    ag = agent(tmp_path, a, rules, [MAKE, {"text": "made"}])
    with ag.session() as session:
        for ev in session.run_sync("build"):
            if ev.type == "approval_request":
                with pytest.raises(UsageError, match="always=True"):
                    session.approve(ev.call_id, every_project=True)
                session.deny(ev.call_id)
    assert not rules.path.exists()


def test_a_repository_inside_another_is_another_project(tmp_path: Path) -> None:
    rules = RulesFile(tmp_path / "home" / "dont-ask-again.rules")
    outer = repo(tmp_path / "outer")
    inner = repo(outer / "vendor" / "cloned")  # its own .git: its own project
    grant(tmp_path, outer, rules)
    assert project_of(inner) == inner
    assert unattended_make(tmp_path, inner, rules).decided_by == "headless"
    assert not (inner / "ran.txt").exists()


def test_outside_git_the_project_is_the_directory_itself(tmp_path: Path) -> None:
    rules = RulesFile(tmp_path / "home" / "dont-ask-again.rules")
    plain = repo(tmp_path / "plain", git=False)
    below = repo(plain / "below", git=False)
    grant(tmp_path, plain, rules)
    assert project_of(plain) == plain and project_of(below) == below
    assert unattended_make(tmp_path, below, rules).decided_by == "headless"
    assert not (below / "ran.txt").exists()


def test_projects_are_compared_with_symlinks_resolved(tmp_path: Path) -> None:
    rules = RulesFile(tmp_path / "home" / "dont-ask-again.rules")
    a = repo(tmp_path / "a")
    link = tmp_path / "link-to-a"
    link.symlink_to(a)
    grant(tmp_path, link, rules)  # granted through the link: the real path is recorded
    assert f"[project {a}]" in rules.path.read_text()
    (a / "ran.txt").unlink()
    assert unattended_make(tmp_path, a, rules).decided_by == "rule:shell: make"
    # a section a person wrote with the link's path names the same project
    rules.path.write_text(f"[project {link}]\nshell: make\n")
    assert unattended_make(tmp_path, a, rules).decided_by == "rule:shell: make"
    # and a link that points elsewhere now is another project
    other = repo(tmp_path / "other")
    link.unlink()
    link.symlink_to(other)
    assert unattended_make(tmp_path, a, rules).decided_by == "headless"


def test_a_file_written_before_scopes_keeps_working_everywhere_and_says_so(
    tmp_path: Path,
) -> None:
    path = tmp_path / "home" / "dont-ask-again.rules"
    path.parent.mkdir()
    path.write_text(  # as kiso 0.1 wrote it: a header and rules, no sections
        '# kiso: "don\'t ask again" rules. Allow-only: each line lets one tool (and, for shell, a\n'
        "# command prefix; for files, a path glob) run without asking. Delete a line, or this "
        "file,\n# to be asked again. Destructive commands and writes into .git/ or .kiso/ always "
        "ask.\nshell: make\nread_file\n"
    )
    rules = RulesFile(path)
    a, b = repo(tmp_path / "a"), repo(tmp_path / "b")
    for where in (a, b):
        assert unattended_make(tmp_path, where, rules).decided_by == "rule:shell: make"
        assert (where / "ran.txt").exists()
    assert [g.line for g in rules.unscoped()] == [4, 5]
    notice = unscoped_notice(rules, a)
    assert notice is not None
    assert str(path) in notice and "lines 4-5" in notice and "'shell: make'" in notice
    assert "every project" in notice and f"[project {a}]" in notice and EVERY_PROJECT in notice
    # a new grant goes under its project; the old lines stay as they were
    rules.add(Rule("shell", "make test"), project=a)
    lines = path.read_text().splitlines()
    assert lines[3:] == ["shell: make", "read_file", "", f"[project {a}]", "shell: make test"]
    # scoping it by hand, as the notice says, scopes it (and the notice stops)
    path.write_text(f"[project {a}]\nshell: make\n\n{EVERY_PROJECT}\nread_file\n")
    assert unscoped_notice(rules, a) is None
    assert unattended_make(tmp_path, b, rules).decided_by == "headless"
    assert unattended_make(tmp_path, a, rules).decided_by == "rule:shell: make"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("[projects /srv/app]", "is not a section"),
        ("[every]", "is not a section"),
        ("[project]", "is not a section"),
        ("[project /srv/app", "is not a section"),
        ("[]", "is not a section"),
        ("[project srv/app]", "is not an absolute path"),
    ],
)
def test_a_malformed_section_is_an_error_naming_the_file_and_line(
    tmp_path: Path, line: str, says: str
) -> None:
    path = tmp_path / "dont-ask-again.rules"
    path.write_text(f"# rules\n{EVERY_PROJECT}\nread_file\n{line}\nshell: make\n")
    rules = RulesFile(path)
    with pytest.raises(RulesError, match=f"{path}, line 4: .*{says}") as raised:
        rules.in_force(tmp_path)
    assert "[project /absolute/path" in str(raised.value)  # and what to write instead
    call = ToolCall("c", "read_file", {"path": "x"})
    with pytest.raises(RulesError):
        rules.match(call, None, tmp_path)  # never a silent "no rules"
    with pytest.raises(RulesError):
        rules.add(Rule("read_file"), project=None)
    assert path.read_text().count("\n") == 5  # nothing was written


def test_add_writes_under_its_section_keeping_what_a_person_wrote(tmp_path: Path) -> None:
    path = tmp_path / "home" / "dont-ask-again.rules"
    rules = RulesFile(path)
    a, b = repo(tmp_path / "a"), repo(tmp_path / "b")
    rules.add(Rule("shell", "make"), project=a)
    rules.add(Rule("read_file"), project=None)
    rules.add(Rule("shell", "make"), project=b)
    rules.add(Rule("shell", "make lint"), project=a)  # into a's section, not at the end
    rules.add(Rule("shell", "make"), project=a)  # already there: nothing changes
    rules.add(Rule("grep"), project=None)
    text = path.read_text()
    assert text.startswith("# kiso:")  # the header explains the sections
    assert body(path) == [
        "",
        f"[project {a}]",
        "shell: make",
        "shell: make lint",
        "",
        EVERY_PROJECT,
        "read_file",
        "grep",
        "",
        f"[project {b}]",
        "shell: make",
    ]
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert [(g.rule.text, g.scope) for g in rules.in_force(b)] == [
        ("shell: make", f"project {b}"),
        ("read_file", "every project"),
        ("grep", "every project"),
    ]
