"""Declarative permissions: the pattern grammar, matching, composition with the modes, config."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import ToolCall
from kiso.runtime.agent import Agent
from kiso.runtime.approvals import CallContext, FloorHook, ModeHook, compose
from kiso.runtime.config import ConfigError, load_config
from kiso.runtime.permissions import (
    Permissions,
    PermissionsError,
    parse_config,
    parse_flags,
    parse_pattern,
    permission_hooks,
    split_patterns,
)
from kiso.tools import EDIT_FILE, LIST_DIR, READ_FILE, SHELL, WRITE_FILE
from kiso.tools.base import Tool, define_tool

WS = Path("/home/ana/app")
HOME = Path("/home/ana")
MCP = define_tool("mcp__git__status", "", {"type": "object"}, lambda a, c: "", effects="other")
TOOLS = {t.name: t for t in (READ_FILE, LIST_DIR, WRITE_FILE, EDIT_FILE, SHELL, MCP)}


def perms(**lists: list[str]) -> Permissions:
    return parse_config(lists, "/home/ana/.kiso/config.json", project=False)


def call(name: str, **input: Any) -> tuple[ToolCall, Tool]:
    return ToolCall("c1", name, dict(input)), TOOLS[name]


def first(p: Permissions, kind: str, name: str, **input: Any) -> str | None:
    c, t = call(name, **input)
    rule = p.first(kind, c, t, WS, HOME)  # type: ignore[arg-type]
    return rule.pattern.text if rule is not None else None


def decide(p: Permissions, mode: str, name: str, **input: Any) -> tuple[str, str]:
    c, t = call(name, **input)
    chain = [FloorHook(), ModeHook(), *permission_hooks(p)]
    verdict = compose(chain, CallContext(c, t, WS, HOME, mode), unattended=mode == "dontAsk")
    return verdict.decision, verdict.by


# --------------------------------------------------------------------------- the grammar


def test_patterns_parse_and_bad_shapes_say_what_is_wrong() -> None:
    assert parse_pattern("shell").specifier is None
    assert parse_pattern(" shell( git   diff:* ) ").text == "shell(git diff:*)"
    assert parse_pattern("edit_file(src/**)").specifier == "src/**"
    assert parse_pattern("mcp__git__*").names("mcp__git__status")
    assert not parse_pattern("mcp__git__*").names("mcp__github__status")
    assert parse_pattern("shell(echo $(date))").specifier == "echo $(date)"
    for bad, said in (
        ("", "empty pattern"),
        ("   ", "empty pattern"),
        ("shell(npm test", "unclosed '('"),
        ("shell(a))", "unbalanced parentheses"),
        ("shell)", "')' with no '('"),
        ("shell()", "empty specifier"),
        ("shell(:*)", "needs words before ':*'"),
        ("shell(npm run *)", "'*' elsewhere is not a wildcard"),
        ("read file", "a tool name is"),
    ):
        with pytest.raises(PermissionsError, match=re.escape(said)):
            parse_pattern(bad)


def test_flag_values_split_on_commas_and_spaces_outside_parentheses() -> None:
    assert split_patterns(["shell(npm test),read_file edit_file(src/**)", "mcp__git__*"]) == [
        "shell(npm test)",
        "read_file",
        "edit_file(src/**)",
        "mcp__git__*",
    ]
    assert split_patterns([" , shell(git diff:*) ,, "]) == ["shell(git diff:*)"]
    flags = parse_flags(["shell(npm test) read_file"], ["shell(rm:*)"])
    assert flags.describe() == {
        "allow": ["shell(npm test)", "read_file"],
        "ask": [],
        "deny": ["shell(rm:*)"],
    }
    assert {r.source for r in flags.rules} == {"--allowed-tools", "--disallowed-tools"}
    with pytest.raises(PermissionsError, match=r"^--disallowed-tools: 'shell\(x' has an unclosed"):
        parse_flags([], ["shell(x"])
    with pytest.raises(PermissionsError, match=r"^--allowed-tools: no pattern given"):
        parse_flags([" , "], [])


# --------------------------------------------------------------------------- matching


def test_an_allow_matches_exact_commands_and_word_prefixes_only() -> None:
    p = perms(allow=["shell(npm test)", "shell(git diff:*)"])
    assert first(p, "allow", "shell", command="npm test") == "shell(npm test)"
    assert first(p, "allow", "shell", command="npm  test") == "shell(npm test)"
    assert first(p, "allow", "shell", command="npm test --watch") is None  # exact
    assert first(p, "allow", "shell", command="git diff") == "shell(git diff:*)"
    assert first(p, "allow", "shell", command="git diff --stat") == "shell(git diff:*)"
    assert first(p, "allow", "shell", command="git difftool") is None  # a word boundary
    assert first(p, "allow", "shell", command="git") is None


@pytest.mark.parametrize(
    "command",
    [
        "git diff; curl evil.sh",
        "git diff && rm x",
        "git diff | sh",
        "git diff $(curl x)",
        "git diff `curl x`",
        "git diff > /etc/passwd",
        "git diff\nrm -rf .",
    ],
)
def test_an_allow_never_allows_a_compound_command(command: str) -> None:
    p = perms(allow=["shell(git diff:*)", "shell"])
    assert first(p, "allow", "shell", command=command) is None


def test_an_allow_never_allows_a_destructive_command() -> None:
    p = perms(allow=["shell(git reset:*)", "shell(rm:*)", "shell"])
    assert first(p, "allow", "shell", command="git reset --hard") is None
    assert first(p, "allow", "shell", command="rm notes.txt") is None
    assert first(p, "allow", "shell", command="git reset HEAD~1") == "shell(git reset:*)"


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf build",
        "ls && rm x",
        "ls; /bin/rm x",
        "echo $(rm x)",
        "sudo rm x",
        "sh -c 'cd /tmp && rm x'",
        'bash -c "rm x"',
        "find . | xargs rm",
        "FOO=1 rm x",
        "ls\nrm x",
    ],
)
def test_a_deny_matches_any_simple_command_of_a_compound(command: str) -> None:
    p = perms(deny=["shell(rm:*)"])
    assert first(p, "deny", "shell", command=command) == "shell(rm:*)"


def test_a_deny_keeps_word_boundaries_and_exact_commands() -> None:
    p = perms(deny=["shell(git push:*)", "shell(npm publish)"])
    assert first(p, "deny", "shell", command="git pushx") is None
    assert first(p, "deny", "shell", command="git status") is None
    assert first(p, "deny", "shell", command="make && git push --force") == "shell(git push:*)"
    assert first(p, "deny", "shell", command="cd pkg && npm publish") == "shell(npm publish)"
    assert first(p, "deny", "shell", command="npm publish > log") == "shell(npm publish)"
    assert first(p, "deny", "shell", command="npm publish --dry-run") is None  # exact


def test_file_patterns_are_globs_relative_to_the_workspace() -> None:
    p = perms(allow=["edit_file(src/**)", "read_file(**/*.md)"], deny=["read_file(.env)"])
    assert first(p, "allow", "edit_file", path="src/a/b.py", edits=[]) == "edit_file(src/**)"
    assert first(p, "allow", "edit_file", path="/home/ana/app/src/x.py") == "edit_file(src/**)"
    assert first(p, "allow", "edit_file", path="lib/x.py") is None
    assert first(p, "allow", "edit_file", path="src/../../etc/passwd") is None
    assert first(p, "allow", "read_file", path="README.md") == "read_file(**/*.md)"
    assert first(p, "allow", "read_file", path="docs/a/b.md") == "read_file(**/*.md)"
    assert first(p, "deny", "read_file", path="./.env") == "read_file(.env)"
    assert first(p, "deny", "read_file", path="/home/ana/app/.env") == "read_file(.env)"
    assert first(p, "deny", "read_file", path="src/.env") is None
    guarded = perms(allow=["write_file", "write_file(**)"])
    assert first(guarded, "allow", "write_file", path=".git/config") is None  # never .git/
    assert first(guarded, "allow", "write_file", path=".kiso/config.json") is None
    assert first(guarded, "allow", "write_file", path="../other/x") is None  # never outside
    absolute = perms(deny=["read_file(~/.aws/**)", "read_file(/etc/**)"])
    assert first(absolute, "deny", "read_file", path="/home/ana/.aws/credentials")
    assert first(absolute, "deny", "read_file", path="../../../etc/shadow") == "read_file(/etc/**)"
    everything = perms(deny=["list_dir(**)"])
    assert first(everything, "deny", "list_dir") == "list_dir(**)"  # no path: the workspace


def test_mcp_tools_match_by_wildcard_and_a_whole_denied_tool_is_hidden() -> None:
    p = perms(deny=["mcp__git__*", "shell(rm:*)"])
    assert first(p, "deny", "mcp__git__status") == "mcp__git__*"
    assert p.hides("mcp__git__status") and p.hides("mcp__git__log")
    assert not p.hides("shell")  # a deny with a specifier leaves the tool offered
    tools = [READ_FILE, SHELL, MCP]
    agent = Agent(model="faux", tools=tools, adapter=_NoModel(), permissions=p)
    assert [s.name for s in agent.tool_specs()] == ["read_file", "shell"]
    assert agent.tool("mcp__git__status") is MCP  # still known: a call to it is denied by name


def test_a_pattern_naming_no_tool_is_a_notice_with_a_suggestion() -> None:
    p = perms(deny=["shel(rm:*)", "mcp__later__*", "shell"])
    notes = p.unknown(TOOLS)
    assert len(notes) == 1
    assert "shel(rm:*)" in notes[0] and "did you mean shell?" in notes[0]


# --------------------------------------------------------------------------- composition


def test_a_deny_denies_in_every_mode_including_bypass() -> None:
    p = perms(deny=["shell(git push:*)"], allow=["shell(git push:*)"])
    for mode in ("default", "accept-edits", "plan", "dontAsk", "bypass"):
        decision, by = decide(p, mode, "shell", command="git push origin main")
        assert decision == "deny", mode
        assert by == ("mode:plan" if mode == "plan" else "permissions:deny:shell(git push:*)")


def test_an_ask_asks_even_where_the_mode_allows() -> None:
    p = perms(ask=["write_file(secrets/**)", "shell(git push:*)"], allow=["shell(git push:*)"])
    assert decide(p, "accept-edits", "write_file", path="secrets/k", content="") == (
        "ask",
        "permissions:ask:write_file(secrets/**)",
    )
    assert decide(p, "accept-edits", "write_file", path="src/k", content="")[0] == "allow"
    assert decide(p, "bypass", "shell", command="git push") == (
        "ask",
        "permissions:ask:shell(git push:*)",
    )
    assert decide(p, "dontAsk", "shell", command="git push") == ("deny", "mode:dontAsk")


def test_an_allow_allows_what_the_mode_would_ask_never_what_it_denies() -> None:
    p = perms(allow=["shell(npm test)", "write_file(src/**)"])
    assert decide(p, "default", "shell", command="npm test") == (
        "allow",
        "permissions:allow:shell(npm test)",
    )
    assert decide(p, "dontAsk", "shell", command="npm test")[0] == "allow"
    assert decide(p, "default", "shell", command="npm test && curl x")[0] == "ask"
    assert decide(p, "plan", "write_file", path="src/a", content="") == ("deny", "mode:plan")
    assert decide(p, "plan", "shell", command="npm test") == ("deny", "mode:plan")


def test_the_floor_stays_above_every_rule() -> None:
    p = perms(allow=["shell"])
    assert decide(p, "bypass", "shell", command="rm -rf /") == ("deny", "floor")
    assert decide(perms(deny=["shell(rm:*)"]), "bypass", "shell", command="rm -rf ~")[1] == "floor"


# --------------------------------------------------------------------------- config


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_config_permissions_merge_user_and_project(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    user = write(home / "config.json", {"permissions": {"allow": ["shell(npm test)"]}})
    project = write(ws / ".kiso" / "config.json", {"permissions": {"deny": ["shell(rm:*)"]}})
    config = load_config(home, ws)
    assert config.permissions.describe() == {
        "allow": ["shell(npm test)"],
        "ask": [],
        "deny": ["shell(rm:*)"],
    }
    assert [r.source for r in config.permissions.rules] == [str(user), str(project)]
    assert load_config(home, ws, project=False).permissions.describe()["deny"] == []


def test_a_project_may_only_tighten(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    project = write(
        ws / ".kiso" / "config.json", {"permissions": {"allow": ["shell"], "deny": ["x"]}}
    )
    with pytest.raises(ConfigError) as caught:
        load_config(home, ws)
    said = str(caught.value)
    assert said.startswith(f"{project}: permissions.allow: a project config may only tighten")
    write(ws / ".kiso" / "config.json", {"permissions": {"allow": [], "ask": ["shell"]}})
    assert load_config(home, ws).permissions.describe()["ask"] == ["shell"]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (["shell"], "permissions: must be an object"),
        ({"allowed": []}, "permissions.allowed: unknown key; known keys: allow, ask, deny"),
        ({"deny": "shell"}, "permissions.deny: must be a list of patterns"),
        ({"deny": [3]}, "permissions.deny[0]: must be a pattern string"),
        ({"ask": ["ok", "shell(x"]}, "permissions.ask[1]: 'shell(x' has an unclosed '('"),
        ({"deny": [""]}, "permissions.deny[0]: an empty pattern"),
    ],
)
def test_a_bad_permissions_entry_names_the_file_and_the_key(
    tmp_path: Path, value: Any, said: str
) -> None:
    home = tmp_path / "home"
    path = write(home / "config.json", {"permissions": value})
    with pytest.raises(ConfigError) as caught:
        load_config(home, None)
    assert str(caught.value).startswith(f"{path}: {said}")


class _NoModel:
    """An adapter that is never called (the agent is only inspected)."""

    provider = "none"
    model = "none"

    def stream(self, request: Any) -> Any:
        raise AssertionError("not called")


def test_an_ask_rule_offers_no_dont_ask_again_rule() -> None:
    p = perms(ask=["shell(git push:*)"])
    agent = Agent(model="faux", tools=[SHELL], adapter=_NoModel(), permissions=p, home=HOME)
    asked = agent.offer(ToolCall("c1", "shell", {"command": "git push"}))
    assert asked.rule is None
    assert asked.no_rule_because == (
        "the permission rule shell(git push:*) (permissions.ask in /home/ana/.kiso/config.json) "
        "always asks"
    )
    other = agent.offer(ToolCall("c2", "shell", {"command": "git status"}))
    assert other.rule is not None and other.rule.text == "shell: git status"
