"""The pure parts of delegation: child ids, scopes, the role's tools and policy, the config key,
and the errors a delegation gives before it starts anything (end to end: tests/e2e)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kiso.kernel import ToolCall, UsageError
from kiso.kernel.ids import SESSION_ID_PATTERN
from kiso.runtime.config import ConfigError, load_config
from kiso.runtime.hooks import CallContext
from kiso.runtime.subagent_role import ChildRole, child_role, in_scope, scope_problem
from kiso.runtime.subagents import call_fingerprint, child_id, delegate_tool
from kiso.tools import builtin_tools
from kiso.tools.base import ToolContext
from kiso.tools.tasks import update_tasks_tool


def test_child_ids_are_deterministic_legal_and_distinct() -> None:
    one = child_id("p1", "call_0_0", 1, "explorer")
    assert one == child_id("p1", "call_0_0", 1, "explorer")
    assert one.startswith("sub-p1-") and one.endswith("-1-explorer")
    assert one != child_id("p1", "call_1_0", 1, "explorer")
    long_a, long_b = "a" * 128, "a" * 127 + "b"
    ids = {child_id(p, "c", 8, "implementer") for p in (long_a, long_b)}
    assert len(ids) == 2
    for made in ids:
        assert len(made) <= 128 and SESSION_ID_PATTERN.fullmatch(made)


def test_a_repeated_call_id_with_other_tasks_gets_other_children() -> None:
    """Defense in depth for a provider whose call ids repeat: the call's tasks are hashed in
    too, so only the same call (the same id and the same tasks) finds the same children."""
    a = call_fingerprint([{"role": "explorer", "task": "where is x?"}])
    b = call_fingerprint([{"task": "where is y?", "role": "explorer"}])
    assert a == call_fingerprint([{"task": "where is x?", "role": "explorer"}])  # key order
    assert child_id("p1", "call_0", 1, "explorer", a) == child_id("p1", "call_0", 1, "explorer", a)
    assert child_id("p1", "call_0", 1, "explorer", a) != child_id("p1", "call_0", 1, "explorer", b)
    one, two = (child_id("p1", "call_0", n, "explorer", a) for n in (1, 2))
    assert one.rsplit("-", 2)[0] == two.rsplit("-", 2)[0]  # one tag per call: task order sorts


@pytest.mark.parametrize(
    ("path", "scope", "inside"),
    [
        ("src/a.py", ["src/**"], True),
        ("src/deep/a.py", ["src/*.py"], False),
        ("src/a.py", ["src/*.py"], True),
        ("src/deep/a.py", ["src"], True),
        ("docs/x.md", ["src/**", "docs/*.md"], True),
        ("top.txt", ["src/**"], False),
        ("../escape.txt", ["**"], False),
        ("a/b/c.txt", ["**/c.txt"], True),
        ("c.txt", ["**/c.txt"], True),
    ],
)
def test_scope_globs(tmp_path: Path, path: str, scope: list[str], inside: bool) -> None:
    assert in_scope(path, tmp_path, scope) is inside


def test_a_symlink_cannot_lead_a_write_out_of_scope(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "src" / "link").symlink_to(tmp_path / "other")
    assert not in_scope("src/link/x.txt", tmp_path, ["src/**"])
    assert in_scope(str(tmp_path / "src" / "a.txt"), tmp_path, ["src/**"])  # absolute, inside


@pytest.mark.parametrize("glob", ["", "/etc/*", "~/x", "a/../b", "a\\b"])
def test_bad_scope_globs_are_named(glob: str) -> None:
    assert scope_problem(glob) is not None


def test_the_child_environment_is_read_loudly() -> None:
    assert child_role({}) is None and child_role({"KISO_SUBAGENT_DEPTH": "0"}) is None
    env = {
        "KISO_SUBAGENT_DEPTH": "1",
        "KISO_SUBAGENT_ROLE": "implementer",
        "KISO_SUBAGENT_PARENT": "p1",
        "KISO_SUBAGENT_SCOPE": '["src/**"]',
    }
    assert child_role(env) == ChildRole("implementer", "p1", 1, ("src/**",))
    for key, value, said in [
        ("KISO_SUBAGENT_ROLE", "boss", "KISO_SUBAGENT_ROLE is 'boss'"),
        ("KISO_SUBAGENT_DEPTH", "x", "KISO_SUBAGENT_DEPTH must be"),
        ("KISO_SUBAGENT_PARENT", "", "KISO_SUBAGENT_PARENT must be"),
        ("KISO_SUBAGENT_SCOPE", "src", "KISO_SUBAGENT_SCOPE must be a JSON list"),
        ("KISO_SUBAGENT_SCOPE", '["/etc"]', "relative to the workspace"),
    ]:
        with pytest.raises(UsageError, match=said):
            child_role({**env, key: value})


def test_roles_restrict_the_tools_and_never_offer_delegate() -> None:
    tools = [*builtin_tools(), update_tasks_tool(), delegate_tool()]
    names = lambda role: [t.name for t in role.restrict(tools)]  # noqa: E731
    reads = ["read_file", "list_dir", "search_text", "update_tasks"]  # a todo list is a read
    assert names(ChildRole("explorer", "p")) == reads
    assert names(ChildRole("reviewer", "p")) == reads
    every = ["read_file", "list_dir", "search_text", "write_file", "edit_file", "shell"]
    assert names(ChildRole("implementer", "p")) == [*every, "update_tasks"]
    scoped = ChildRole("tester", "p", scope=("tests/**",))
    assert names(scoped) == [*every[:5], "update_tasks"]  # no shell


def test_the_role_policy_allows_its_tools_and_denies_writes_outside_the_scope(
    tmp_path: Path,
) -> None:
    role = ChildRole("implementer", "p", scope=("src/**",))
    offered = role.restrict(builtin_tools())
    hook = role.hook(offered)
    by_name = {t.name: t for t in builtin_tools()}

    def verdict(name: str, **input: object) -> tuple[str, str | None]:
        ctx = CallContext(ToolCall("c1", name, dict(input)), by_name[name], tmp_path, tmp_path)
        got = hook.before_tool(ctx)
        assert got is not None and got.by == "subagent:implementer"
        return got.decision, got.reason

    assert verdict("write_file", path="src/a.py", content="")[0] == "allow"
    decision, reason = verdict("edit_file", path="setup.py", edits=[])
    assert decision == "deny" and reason is not None and "outside this task's scope" in reason
    assert verdict("shell", command="ls")[0] == "deny"  # not offered, so denied if named
    assert verdict("read_file", path="anything")[0] == "allow"


def test_the_subagents_config_key(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    (ws / ".kiso").mkdir(parents=True)
    home.mkdir()
    user, project = home / "config.json", ws / ".kiso" / "config.json"
    user.write_text(json.dumps({"subagents": {"checks": {"tests": "pytest", "lint": "ruff"}}}))
    project.write_text(json.dumps({"subagents": {"checks": {"tests": "pytest -q"}}}))
    config = load_config(home, ws, environ={})
    assert config.subagents is True
    assert config.subagent_checks == {"tests": "pytest -q", "lint": "ruff"}
    for bad, said in [
        ({"subagents": []}, "subagents: must be an object"),
        ({"subagents": {"enabled": "no"}}, "subagents.enabled: must be true or false"),
        ({"subagents": {"check": {}}}, "subagents.check: unknown key"),
        ({"subagents": {"checks": {"t": ""}}}, "subagents.checks.t: must be the command"),
        ({"subagents": {"checks": {"a b": "x"}}}, "subagents.checks.a b: a check name"),
    ]:
        user.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=str(user).replace(".", r"\.")) as caught:
            load_config(home, None, environ={})
        assert said in str(caught.value)
    user.write_text(json.dumps({"subagents": {"enabled": False}}))
    assert load_config(home, None, environ={}).subagents is False


def _run(tool_input: dict[str, object], ws: Path, **checks: str) -> tuple[str, str | None]:
    tool = delegate_tool(checks=checks)
    ctx = ToolContext(workspace=ws, execution_id="p:1", session_id="p", call_id="c")
    result = tool.execute(tool_input, ctx)
    assert not isinstance(result, str) and hasattr(result, "is_error")
    assert result.is_error  # type: ignore[union-attr]
    return result.content, result.error_kind  # type: ignore[union-attr]


def test_errors_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said, kind = _run({"tasks": [{"role": "tester", "task": "t"}]}, tmp_path)
    assert kind == "precondition" and "is not a git repository" in said
    assert "nothing was started" in said
    said, kind = _run({"tasks": [{"role": "explorer", "task": "t", "acceptance": "x"}]}, tmp_path)
    assert kind == "invalid_input" and "no check named 'x' is configured (defined: none)" in said
    said, _ = _run({"tasks": [{"role": "reviewer", "task": "t", "scope": ["a"]}]}, tmp_path)
    assert "a reviewer writes nothing, so it takes no scope" in said
    said, _ = _run({"tasks": [{"role": "explorer", "task": "t"}] * 9}, tmp_path)
    assert "tasks must be a list of 1 to 8 tasks, got 9" in said
    monkeypatch.setenv("KISO_SUBAGENT_TIMEOUT_MS", "soon")
    said, kind = _run({"tasks": [{"role": "explorer", "task": "t"}]}, tmp_path)
    assert kind == "precondition" and "KISO_SUBAGENT_TIMEOUT_MS must be a positive" in said
    assert not (Path(os.environ["KISO_HOME"]) / "projects").exists()  # no child was started


@pytest.mark.parametrize("value", ["²", "٣٠٠٠", "0", "-5"])
def test_a_timeout_that_is_no_number_is_a_clear_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """``"²".isdigit()`` is true: int() of it used to raise out of the tool."""
    monkeypatch.setenv("KISO_SUBAGENT_TIMEOUT_MS", value)
    said, kind = _run({"tasks": [{"role": "explorer", "task": "t"}]}, tmp_path)
    assert kind == "precondition"
    assert f"KISO_SUBAGENT_TIMEOUT_MS must be a positive number of milliseconds, got {value!r}" in (
        said
    )


@pytest.mark.parametrize("text", ["   ", "\u200b", " \n\u200b ", "..."])
def test_a_task_that_says_nothing_is_refused(tmp_path: Path, text: str) -> None:
    said, kind = _run({"tasks": [{"role": "explorer", "task": text}]}, tmp_path)
    assert kind == "invalid_input" and "tasks[0].task must be a non-empty string" in said
    assert not (Path(os.environ["KISO_HOME"]) / "projects").exists()


def test_a_prompt_directory_that_is_not_kisos_own_starts_no_child(tmp_path: Path) -> None:
    """``$KISO_HOME/subagents`` planted as a link to a directory anyone can write: the prompt is
    not put there (whoever owns it could swap it before the child reads it)."""
    home = Path(os.environ["KISO_HOME"])
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    home.mkdir(parents=True, exist_ok=True)
    (home / "subagents").symlink_to(loose)
    tool = delegate_tool()
    ctx = ToolContext(workspace=tmp_path, execution_id="p:1", session_id="p", call_id="c")
    result = tool.execute({"tasks": [{"role": "explorer", "task": "look"}]}, ctx)
    content = result.content  # type: ignore[union-attr]
    assert "is not a directory of this user's" in content and "0 of 1" in content
    assert list(loose.iterdir()) == []
    assert not (home / "projects").exists()  # no child was started
