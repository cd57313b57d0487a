"""What an approval may offer: one decision, by the runtime, from the floor's own parser."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiso.kernel import ToolCall
from kiso.runtime.floor import check_command
from kiso.runtime.offers import (
    COMPOUND,
    DESTRUCTIVE,
    IRREVERSIBLE,
    NO_COMMAND,
    OUTSIDE,
    PROTECTED,
    UNKNOWN_TOOL,
    UNREADABLE,
    Offer,
    approval_offer,
    refuse_always,
)
from kiso.runtime.rules import Rule, RulesFile, rule_for
from kiso.tools import EDIT_FILE, READ_FILE, SHELL, WRITE_FILE
from kiso.tools.base import Tool, define_tool
from tests.runtime.test_floor import SHELL_TEXT

WS = Path("/home/ana/app")
HOME = Path("/home/ana")
NOTE = define_tool("note", "", {"type": "object"}, lambda a, c: "", effects="other")


def offer(tool: Tool | None, name: str | None = None, **input: Any) -> Offer:
    call = ToolCall("c1", name or (tool.name if tool else "mystery"), dict(input))
    return approval_offer(call, tool, WS, HOME)


def shell(command: str) -> Offer:
    return offer(SHELL, command=command)


# (command, the rule it may write, or why none, and whether it carries the warning)
SHELL_TABLE: list[tuple[str, str | None, str | None, bool]] = [
    # ordinary commands: the narrowest rule, no warning
    ("npm test", "shell: npm test", None, False),
    ("pytest  -q   tests/", "shell: pytest -q tests/", None, False),
    ("git status", "shell: git status", None, False),
    ("git checkout main", "shell: git checkout main", None, False),
    ("git reset HEAD~1", "shell: git reset HEAD~1", None, False),
    ("git clean -n", "shell: git clean -n", None, False),
    ("echo rm -rf x", "shell: echo rm -rf x", None, False),
    ("grep -r rm .", "shell: grep -r rm .", None, False),
    ("echo 'rm -rf x'", "shell: echo 'rm -rf x'", None, False),
    ("docker rm container", "shell: docker rm container", None, False),
    # compound commands: no rule, and no warning unless they delete irreversibly
    ("make && make test", None, COMPOUND, False),
    ("ls | wc -l", None, COMPOUND, False),
    ("echo hi > out.txt", None, COMPOUND, False),
    ("echo $(git rev-parse HEAD)", None, COMPOUND, False),
    ('bash -c "$CMD"', None, COMPOUND, False),
    # destructive commands: never a rule, whatever they aim at
    ("rm notes.txt", None, DESTRUCTIVE, False),
    ("rm -f a.txt b.txt", None, DESTRUCTIVE, False),
    ("ls | xargs rm", None, DESTRUCTIVE, False),
    ("git restore .", None, DESTRUCTIVE, False),
    ("git restore --staged src/a.py", None, DESTRUCTIVE, False),
    ("git switch -f dev", None, DESTRUCTIVE, False),
    ("git checkout -f main", None, DESTRUCTIVE, False),
    ("sudo rm /tmp/x.lock", None, DESTRUCTIVE, False),
    # irreversible deletes: no rule, and the one yellow line
    ("rm -rf build", None, IRREVERSIBLE, True),
    ("rm -r build dist", None, IRREVERSIBLE, True),
    ("rm -rf /tmp/probe", None, IRREVERSIBLE, True),
    ('sh -c "rm -rf build"', None, IRREVERSIBLE, True),
    ("bash -c 'git reset --hard'", None, IRREVERSIBLE, True),
    ("eval 'rm -rf build'", None, IRREVERSIBLE, True),
    ("bash <<EOF\nrm -rf build\nEOF", None, IRREVERSIBLE, True),
    ("find . -name '*.o' -delete", None, IRREVERSIBLE, True),
    ("find . -name '*.pyc' -exec rm {} +", None, IRREVERSIBLE, True),
    ("ls | xargs rm -r", None, IRREVERSIBLE, True),
    ("make; rm -rf out", None, IRREVERSIBLE, True),
    ("(cd build && rm -rf out)", None, IRREVERSIBLE, True),
    ("echo $(rm -rf cache)", None, IRREVERSIBLE, True),
    ("sudo rm -rf build", None, IRREVERSIBLE, True),
    ("env X=1 nice rm -rf build", None, IRREVERSIBLE, True),
    ("git reset --hard", None, IRREVERSIBLE, True),
    ("git reset --hard HEAD~1", None, IRREVERSIBLE, True),
    ("git clean -fdx", None, IRREVERSIBLE, True),
    ("git checkout -- src/a.py", None, IRREVERSIBLE, True),
    ("git checkout .", None, IRREVERSIBLE, True),
    ("rm notes.txt; git reset --hard", None, IRREVERSIBLE, True),
    ("echo 'oops; rm -rf build", None, IRREVERSIBLE, True),  # unparseable: scanned
]


@pytest.mark.parametrize(("command", "rule", "because", "warned"), SHELL_TABLE)
def test_the_offer_for_a_shell_command(
    command: str, rule: str | None, because: str | None, warned: bool
) -> None:
    got = shell(command)
    assert (got.rule.text if got.rule else None) == rule
    assert got.no_rule_because == because
    assert (got.warning is not None) == warned
    assert (rule is None) == (because is not None)
    assert refuse_always(ToolCall("c", "shell", {"command": command}), SHELL, WS, HOME) == because


@pytest.mark.parametrize(
    ("command", "warning"),
    [
        ("rm -rf build dist", "rm deletes build, dist and everything inside"),
        ('sh -c "rm -rf build"', "rm deletes build and everything inside"),
        ("find . -name '*.o' -delete", "find -delete deletes what it matches under ."),
        ("ls | xargs rm -r", "rm deletes the names xargs reads and everything inside"),
        (
            "git reset --hard",
            "git reset --hard discards every uncommitted change in the working tree",
        ),
        ("git checkout -- a.py", "git checkout -- discards uncommitted changes to a.py"),
        ("git clean -fd", "git clean deletes untracked files and directories"),
        (
            "rm -rf out; rm notes.txt; git clean -f",
            "rm deletes out and everything inside; git clean deletes untracked files",
        ),
        ("rm -rf out; rm -rf out", "rm deletes out and everything inside"),
    ],
)
def test_the_warning_is_one_line_naming_only_the_irreversible(command: str, warning: str) -> None:
    assert shell(command).warning == warning


def test_every_destruction_found_is_kept() -> None:
    got = shell("rm notes.txt; git reset --hard")
    assert [d.kind for d in got.destructions] == ["rm", "git reset --hard"]
    assert shell("npm test").destructions == ()


def test_what_cannot_be_read_is_asked_every_time() -> None:
    deep = "echo x"
    for _ in range(9):
        deep = "bash -c " + shlex.quote(deep)
    got = shell(deep)
    assert got.rule is None and got.no_rule_because == UNREADABLE
    assert got.warning is not None and "may delete anything" in got.warning


@pytest.mark.parametrize(
    ("tool", "name", "input", "rule", "because"),
    [
        (EDIT_FILE, None, {"path": "src/a.py"}, "edit_file: src/a.py", None),
        (WRITE_FILE, None, {"path": "./docs/x.md"}, "write_file: docs/x.md", None),
        (EDIT_FILE, None, {"path": "/home/ana/app/src/a.py"}, "edit_file: src/a.py", None),
        (EDIT_FILE, None, {"path": ".git/config"}, None, PROTECTED),
        (WRITE_FILE, None, {"path": "sub/.kiso/x"}, None, PROTECTED),
        (EDIT_FILE, None, {"path": "../other/a.py"}, None, OUTSIDE),
        (WRITE_FILE, None, {"path": "/etc/hosts"}, None, OUTSIDE),
        (READ_FILE, None, {"path": "a.py"}, "read_file: a.py", None),
        (NOTE, None, {"line": "x"}, "note", None),
        (SHELL, None, {}, None, NO_COMMAND),
        (SHELL, None, {"command": "   "}, None, NO_COMMAND),
        (SHELL, None, {"command": 42}, None, NO_COMMAND),
        (None, "shell", {"command": "ls"}, None, UNKNOWN_TOOL),
    ],
)
def test_the_offer_for_other_calls(
    tool: Tool | None,
    name: str | None,
    input: dict[str, Any],
    rule: str | None,
    because: str | None,
) -> None:
    got = offer(tool, name, **input)
    assert (got.rule.text if got.rule else None) == rule
    assert got.no_rule_because == because
    assert got.warning is None and got.destructions == ()


def test_the_reasons_read_as_a_sentence_in_an_error() -> None:
    for because in (IRREVERSIBLE, UNREADABLE, DESTRUCTIVE, COMPOUND, NO_COMMAND, PROTECTED):
        message = f"'don't ask again' is not offered for this call: {because}"
        assert because[0].islower() and not because.endswith(".") and "\n" not in message


def test_the_rule_is_the_narrowest_rule_for() -> None:
    for command, rule, _, _ in SHELL_TABLE:
        call = ToolCall("c", "shell", {"command": command})
        got = rule_for(call, SHELL, WS)
        assert (got.text if got else None) == rule
        assert shell(command).rule == got


@pytest.mark.parametrize(
    ("rule", "command"),
    [
        ("shell: git reset", "git reset --hard"),
        ("shell: git checkout", "git checkout -- ."),
        ("shell: git clean", "git clean -fdx"),
        ("shell: git", "git restore src/"),
        ("shell: rm", "rm -rf build"),
        ("shell: rm -rf", "rm -rf build"),
        ("shell: find .", "find . -delete"),
        ("shell: sh -c", "sh -c 'rm -rf build'"),
        ("shell", "rm notes.txt"),
        ("shell: sudo", "sudo rm -rf build"),
    ],
)
def test_no_rule_ever_allows_a_destructive_command(tmp_path: Path, rule: str, command: str) -> None:
    path = tmp_path / "rules"
    path.write_text(rule + "\n")
    call = ToolCall("c", "shell", {"command": command})
    assert RulesFile(path).match(call, SHELL, WS) is None
    harmless = ToolCall("c", "shell", {"command": rule.partition(": ")[2] + " --help"})
    if rule != "shell":
        assert RulesFile(path).match(harmless, SHELL, WS) == Rule("shell", rule.partition(": ")[2])


@given(st.one_of(st.text(), SHELL_TEXT))
def test_a_command_the_floor_refuses_never_gets_a_rule(command: str) -> None:
    got = shell(command)
    assert (got.rule is None) == (got.no_rule_because is not None)
    assert got.warning is None or got.rule is None
    if check_command(command, workspace=WS, home=HOME) is not None:
        assert got.rule is None and got.no_rule_because in (IRREVERSIBLE, UNREADABLE, DESTRUCTIVE)
