"""The approval chain, the five modes, and "don't ask again" rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import ApprovalDecided, ApprovalRequested, ToolCall
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.approvals import CallContext, ModeHook, Verdict, compose
from kiso.runtime.rules import Rule, RulesError, RulesFile, rule_for
from kiso.tools.base import Effects, Tool, define_tool

from .helpers import OBJ, note_tool, store

WS = Path("/home/ana/app")


def tool(effects: str, name: str = "t") -> Tool:
    return define_tool(name, "", {"type": "object"}, lambda a, c: "", effects=effects)


def ctx(effects: str, mode: str = "default", **input: Any) -> CallContext:
    t = tool(effects)
    return CallContext(ToolCall("c1", t.name, dict(input)), t, WS, Path("/home/ana"), mode)


class Fixed:
    def __init__(self, name: str, verdict: Verdict | None) -> None:
        self.name, self.verdict = name, verdict

    def decide(self, ctx: CallContext) -> Verdict | None:
        return self.verdict


class Raising:
    name = "extension:broken"

    def decide(self, ctx: CallContext) -> Verdict | None:
        raise RuntimeError("boom")


def test_composition_is_deny_over_allow_over_ask() -> None:
    allow, deny, ask = (Verdict("allow", "a"), Verdict("deny", "d"), Verdict("ask", "q"))
    c = ctx("edit")
    assert compose([Fixed("a", allow), Fixed("q", ask)], c) == allow
    assert compose([Fixed("q", ask), Fixed("a", allow), Fixed("d", deny)], c) == deny
    assert compose([Fixed("x", None), Fixed("q", ask)], c) == ask
    assert compose([Fixed("x", None)], c) == Verdict("ask", "default")
    broken = compose([Raising()], c)
    assert broken.decision == "ask" and broken.by == "extension:broken"
    assert "boom" in (broken.reason or "")
    assert compose([Raising(), Fixed("a", allow)], c) == allow  # asking abstains for an allow
    unattended = compose([Fixed("q", ask)], c, unattended=True)
    assert (unattended.decision, unattended.by) == ("deny", "mode:dontAsk")
    assert compose([Fixed("a", allow)], c, unattended=True) == allow


@pytest.mark.parametrize(
    ("mode", "effects", "expected"),
    [
        ("default", "read", "allow"),
        ("default", "edit", "ask"),
        ("default", "shell", "ask"),
        ("default", "other", "ask"),
        ("accept-edits", "read", "allow"),
        ("accept-edits", "edit", "allow"),
        ("accept-edits", "shell", "ask"),
        ("plan", "read", "allow"),
        ("plan", "edit", "deny"),
        ("plan", "shell", "deny"),
        ("plan", "other", "deny"),
        ("dontAsk", "read", "allow"),
        ("dontAsk", "edit", None),
        ("bypass", "shell", "allow"),
        ("bypass", "edit", "allow"),
    ],
)
def test_modes(mode: str, effects: str, expected: str | None) -> None:
    verdict = ModeHook().before_tool(ctx(effects, mode, path="src/a.py", command="ls"))
    assert (verdict.decision if verdict else None) == expected
    if verdict:
        assert verdict.by == f"mode:{mode}"


def test_accept_edits_still_asks_under_git_and_kiso() -> None:
    hook = ModeHook()
    for path in (".git/config", "sub/.git/HEAD", ".kiso/config.json"):
        verdict = hook.before_tool(ctx("edit", "accept-edits", path=path))
        assert verdict is not None and verdict.decision == "ask", path


def test_unknown_mode_is_a_clear_error(tmp_path: Path) -> None:
    from kiso.kernel import UsageError
    from kiso.runtime.approvals import check_mode

    with pytest.raises(UsageError, match="accept-edits"):
        check_mode("yolo")
    with pytest.raises(UsageError, match="accept-edits"):
        Agent(adapter=FauxAdapter([]), store=store(tmp_path), mode="yolo")


# --------------------------------------------------------------------------- rules


def test_rules_file_format_and_matching(tmp_path: Path) -> None:
    path = tmp_path / "rules"
    path.write_text("# comment\n\nshell: npm test\nedit_file: src/**\nread_file\n")
    rules = RulesFile(path)
    assert [r.text for r in rules.load()] == ["shell: npm test", "edit_file: src/**", "read_file"]
    sh, ed = tool("shell", "shell"), tool("edit", "edit_file")

    def m(t: Tool, **input: Any) -> str | None:
        rule = rules.match(ToolCall("c", t.name, input), t, WS)
        return rule.text if rule else None

    assert m(sh, command="npm test") == "shell: npm test"
    assert m(sh, command="npm   test -- -k x") == "shell: npm test"
    assert m(sh, command="npm testing") is None
    assert m(sh, command="npm test; rm -rf build") is None  # compound: never by a rule
    assert m(sh, command="npm test && curl x | sh") is None
    assert m(sh, command="npm test $(evil)") is None
    assert m(ed, path="src/pkg/a.py") == "edit_file: src/**"
    assert m(ed, path="/home/ana/app/src/a.py") == "edit_file: src/**"
    assert m(ed, path="docs/a.md") is None
    assert m(ed, path="src/.git/config") is None  # protected, whatever the glob says
    assert m(ed, path="../outside/src/a.py") is None
    assert m(tool("read", "read_file"), path="anything") == "read_file"


def test_a_malformed_rules_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rules"
    path.write_text("shell: ls\nthis is not a rule\n")
    with pytest.raises(RulesError, match="rules, line 2"):
        RulesFile(path).load()


def test_rule_for_a_call_is_narrow_and_never_protected() -> None:
    sh, ed = tool("shell", "shell"), tool("edit", "edit_file")
    assert rule_for(ToolCall("c", "shell", {"command": "pytest  -q"}), sh, WS) == Rule(
        "shell", "pytest -q"
    )
    assert rule_for(ToolCall("c", "shell", {"command": "a; b"}), sh, WS) is None
    assert rule_for(ToolCall("c", "edit_file", {"path": "src/x.py"}), ed, WS) == Rule(
        "edit_file", "src/x.py"
    )
    assert rule_for(ToolCall("c", "edit_file", {"path": ".git/HEAD"}), ed, WS) is None


def test_dont_ask_again_writes_a_rule_that_allows_and_deleting_it_revokes(
    tmp_path: Path,
) -> None:
    rules = RulesFile(tmp_path / "dont-ask-again.rules")
    notes = tmp_path / "notes.txt"
    script = [
        {"tool_calls": [{"name": "note", "input": {"line": "x"}}]},
        {"tool_calls": [{"name": "note", "input": {"line": "x"}}]},
        {"text": "done"},
        {"tool_calls": [{"name": "note", "input": {"line": "x"}}]},
        {"text": "done"},
    ]
    agent = Agent(
        adapter=FauxAdapter(script),
        tools=[note_tool(notes)],
        store=store(tmp_path),
        workspace=tmp_path,
        rules=rules,
    )
    with agent.session("s") as session:
        asked = 0
        for ev in session.run_sync("twice"):
            if ev.type == "approval_request":
                asked += 1
                session.approve(ev.call_id, always=True)
        assert asked == 1
        assert rules.path.read_text().splitlines()[-1] == "note"
        decided = [e for e in session.events if isinstance(e, ApprovalDecided)]
        assert [(d.decided_by, d.rule) for d in decided] == [
            ("user", "note"),
            ("rule:note", "note"),
        ]
        rules.path.unlink()  # revoke
        seen = [ev.type for ev in session.run_sync("again")]
        assert "approval_request" in seen
        assert sum(isinstance(e, ApprovalRequested) for e in session.events) == 2
    assert notes.read_text() == "x\nx\n"


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("plan", "read-only"), ("dontAsk", "would need a human")],
)
def test_plan_and_dont_ask_deny_edits_with_a_reason_the_model_sees(
    tmp_path: Path, mode: str, reason: str
) -> None:
    agent = Agent(
        adapter=FauxAdapter(
            [{"tool_calls": [{"name": "note", "input": {"line": "x"}}]}, {"text": "ok"}]
        ),
        tools=[note_tool(tmp_path / "n")],
        store=store(tmp_path),
        workspace=tmp_path,
        mode=mode,
    )
    with agent.session("s") as session:
        seen = [ev.type for ev in session.run_sync("edit")]
        assert "approval_request" not in seen and seen[-1] == "terminal"
        (verdict,) = [e for e in session.events if isinstance(e, ApprovalDecided)]
        assert (verdict.decision, verdict.decided_by) == ("denied", f"mode:{mode}")
        assert reason in (verdict.reason or "")
    assert not (tmp_path / "n").exists()


def test_effects_drive_parallelism_and_reruns() -> None:
    assert tool("read").parallel_safe and tool("read").rerunnable
    assert not tool("edit").parallel_safe and not tool("edit").rerunnable
    idem = define_tool(
        "w", "", {"type": "object"}, lambda a, c: "", effects="edit", idempotent=True
    )
    assert idem.rerunnable and not idem.parallel_safe
    assert Effects("shell") is Effects.SHELL
    with pytest.raises(ValueError, match="type 'object'"):
        define_tool("bad", "", {"type": "string"}, lambda a, c: "")
    assert OBJ["type"] == "object"
