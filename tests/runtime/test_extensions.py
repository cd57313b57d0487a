"""Extensions: the loader, the cascade, loud failures, composition, and safe-defaults in a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiso.kernel import ApprovalDecided, ApprovalRequested, RunEnded, ToolCall, User
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.approvals import FloorHook, ModeHook, compose
from kiso.runtime.extensions import (
    Extension,
    ExtensionHook,
    ExtensionLoadError,
    load_cascade,
)
from kiso.runtime.hooks import CallContext, Hook, RunInfo, Verdict, Veto
from kiso.tools import builtin_tools

ROOT = Path(__file__).resolve().parents[2]
SAFE_DEFAULTS = ROOT / "examples" / "extensions" / "safe_defaults.py"
HEAD = "from kiso.runtime.extensions import Extension\n"


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def cascade(home: Path, ws: Path, project: dict[str, bytes] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    return load_cascade(
        home=home,
        workspace=ws,
        project_files=project,
        builtin_tools=[t.name for t in builtin_tools()],
        environ={},
        **kw,  # type: ignore[arg-type]
    )


def test_user_and_project_extensions_load_in_order(tmp_path: Path) -> None:
    write(tmp_path / "extensions", "b.py", HEAD + 'extension = Extension(name="b")\n')
    write(
        tmp_path / "extensions",
        "a.py",
        HEAD + "def extension(ctx):\n    return Extension(name='a-' + ctx.layer)\n",
    )
    project = {"extensions/audit.py": (HEAD + 'extension = Extension(name="audit")\n').encode()}
    got = cascade(tmp_path, tmp_path / "ws", project)
    assert [(x.name, x.layer) for x in got.loaded] == [
        ("a-user", "user"),
        ("b", "user"),
        ("audit", "project"),
    ]
    assert got.notices() == ["extensions: a-user (user), b (user), audit (project)"]


def test_project_extensions_run_from_the_snapshot_bytes_not_the_disk(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / ".kiso" / "extensions", "x.py", "raise SystemExit('the disk was read')\n")
    project = {"extensions/x.py": (HEAD + 'extension = Extension(name="snap")\n').encode()}
    assert [x.name for x in cascade(tmp_path, ws, project).loaded] == ["snap"]
    assert cascade(tmp_path, ws, None).loaded == ()  # not trusted: nothing of it


def test_kiso_extensions_dir_overrides_the_user_dir(tmp_path: Path) -> None:
    other = tmp_path / "other"
    write(other, "o.py", HEAD + 'extension = Extension(name="o")\n')
    write(tmp_path / "extensions", "h.py", HEAD + 'extension = Extension(name="h")\n')
    got = load_cascade(
        home=tmp_path,
        workspace=tmp_path,
        project_files=None,
        environ={"KISO_EXTENSIONS_DIR": str(other)},
    )
    assert [x.name for x in got.loaded] == ["o"]


def test_a_user_extension_may_shadow_a_built_in_and_says_so(tmp_path: Path) -> None:
    path = write(tmp_path / "extensions", "m.py", HEAD + 'extension = Extension(name="mcp")\n')
    got = cascade(tmp_path, tmp_path, builtins=[Extension(name="mcp")])
    assert [(x.name, x.layer) for x in got.loaded] == [("mcp", "user")]
    assert any("shadows the built-in mcp" in n and str(path) in n for n in got.notices())


@pytest.mark.parametrize("taken", ["built-in", "user"])
def test_a_project_extension_may_never_shadow(tmp_path: Path, taken: str) -> None:
    builtins = [Extension(name="x")] if taken == "built-in" else []
    if taken == "user":
        write(tmp_path / "extensions", "x.py", HEAD + 'extension = Extension(name="x")\n')
    project = {"extensions/x.py": (HEAD + 'extension = Extension(name="x")\n').encode()}
    with pytest.raises(ExtensionLoadError, match=r"\.kiso/extensions/x\.py.*may not shadow"):
        cascade(tmp_path, tmp_path, project, builtins=builtins)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("def broken(:\n", "does not compile"),
        ("raise RuntimeError('boom')\n", "raised RuntimeError while loading: boom"),
        ("x = 1\n", "defines no `extension`"),
        ("extension = 42\n", "must be an Extension"),
        (HEAD + "extension = Extension(name='Bad Name')\n", "is not valid"),
        (HEAD + "extension = Extension(name='x', hooks=[object()])\n", "kiso.runtime.hooks.Hook"),
        (
            HEAD + "from kiso.tools import builtin_tools\n"
            "extension = Extension(name='x', tools=[builtin_tools()[0]])\n",
            "name of a built-in tool",
        ),
    ],
)
def test_a_broken_extension_fails_loudly_naming_the_file(
    tmp_path: Path, text: str, says: str
) -> None:
    path = write(tmp_path / "extensions", "bad.py", text)
    with pytest.raises(ExtensionLoadError) as info:
        cascade(tmp_path, tmp_path)
    assert str(path) in str(info.value) and says in str(info.value)


def test_a_duplicate_name_fails_naming_both_files(tmp_path: Path) -> None:
    a = write(tmp_path / "extensions", "a.py", HEAD + 'extension = Extension(name="dup")\n')
    b = write(tmp_path / "extensions", "b.py", HEAD + 'extension = Extension(name="dup")\n')
    with pytest.raises(ExtensionLoadError) as info:
        cascade(tmp_path, tmp_path)
    assert str(a) in str(info.value) and str(b) in str(info.value)


# ------------------------------------------------------------------ composition


class Says(Hook):
    def __init__(self, decision: str) -> None:
        self.decision = decision

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        return Verdict(self.decision, "ignored", f"said {self.decision}")  # type: ignore[arg-type]


def ctx(tmp_path: Path, mode: str, name: str, input: dict[str, object]) -> CallContext:
    tools = {t.name: t for t in builtin_tools()}
    return CallContext(ToolCall("c1", name, input), tools[name], tmp_path, tmp_path, mode)


@pytest.mark.parametrize(
    ("mode", "ext", "expect", "by"),
    [
        ("default", "allow", "ask", "mode:default"),  # cannot loosen the mode's ask
        ("plan", "allow", "deny", "mode:plan"),  # nor a mode's deny
        ("bypass", "ask", "ask", "extension:e"),  # may tighten an allow to an ask
        ("bypass", "deny", "deny", "extension:e"),
        ("default", "deny", "deny", "extension:e"),
    ],
)
def test_an_extension_can_only_constrain(
    tmp_path: Path, mode: str, ext: str, expect: str, by: str
) -> None:
    chain = [FloorHook(), ModeHook(), ExtensionHook("e", Says(ext))]
    got = compose(chain, ctx(tmp_path, mode, "shell", {"command": "ls"}))
    assert (got.decision, got.by) == (expect, by)


def test_an_extension_allow_cannot_override_the_floor(tmp_path: Path) -> None:
    chain = [FloorHook(), ModeHook(), ExtensionHook("e", Says("allow"))]
    got = compose(chain, ctx(tmp_path, "bypass", "shell", {"command": "rm -rf /"}))
    assert (got.decision, got.by) == ("deny", "floor")


def test_a_plain_agent_hook_still_may_allow(tmp_path: Path) -> None:
    """The cannot-loosen rule is the extensions': an SDK hook keeps its deny > allow > ask."""
    got = compose([ModeHook(), Says("allow")], ctx(tmp_path, "default", "shell", {"command": "x"}))
    assert got.decision == "allow"


# ------------------------------------------------------------------ new hook points, in a run


class Rewrite(Hook):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_user_message(self, text: str, run: RunInfo) -> str | Veto | None:
        if "forbidden" in text:
            return Veto("no forbidden words")
        return text.upper()

    def on_event(self, event: object, run: RunInfo) -> None:
        self.seen.append(getattr(event, "type", "?"))


def test_on_user_message_rewrites_what_the_log_holds_and_a_veto_ends_the_run(
    tmp_path: Path,
) -> None:
    hook = Rewrite()
    ext = load_cascade(home=tmp_path, workspace=tmp_path, project_files=None, environ={})
    agent = Agent(
        adapter=FauxAdapter([{"text": "ok"}, {"text": "never"}]),
        workspace=tmp_path,
        home=tmp_path,
        hooks=[*ext.hooks(), ExtensionHook("rw", hook)],
    )
    with agent.session("s1") as s:
        list(s.run_sync("hello"))
        users = [e for e in s.events if isinstance(e, User)]
        assert [u.content for u in users] == ["HELLO"]
        list(s.run_sync("a forbidden thing"))
        ended = [e for e in s.events if isinstance(e, RunEnded)]
        assert ended[-1].outcome.code == "vetoed"
        assert "extension:rw" in (ended[-1].outcome.message or "")
        assert len([e for e in s.events if isinstance(e, User)]) == 1  # the vetoed one is not
    assert hook.seen[:2] == ["run_started", "user"] and "run_ended" in hook.seen


# ------------------------------------------------------------------ the tutorial extension


def test_safe_defaults_asks_for_the_network_and_denies_lockfiles_in_a_real_run(
    tmp_path: Path,
) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    (home / "extensions").mkdir(parents=True)
    (home / "extensions" / "safe_defaults.py").write_bytes(SAFE_DEFAULTS.read_bytes())
    ext = load_cascade(home=home, workspace=ws, project_files=None, environ={})
    assert [(x.name, x.layer) for x in ext.loaded] == [("safe-defaults", "user")]
    turns = [
        {"tool_calls": [{"name": "write_file", "input": {"path": "uv.lock", "content": "x"}}]},
        {"tool_calls": [{"name": "shell", "input": {"command": "curl https://example.com"}}]},
    ]
    agent = Agent(
        adapter=FauxAdapter(turns),
        tools=builtin_tools(),
        workspace=ws,
        home=home,
        mode="bypass",  # would allow both: the extension tightens it
        rules=home / "rules",
        hooks=ext.hooks(),
    )
    with agent.session("sd") as s:
        list(s.run_sync("go"))
        decided = [e for e in s.events if isinstance(e, ApprovalDecided)]
        asked = [e for e in s.events if isinstance(e, ApprovalRequested)]
    assert [(d.decision, d.decided_by) for d in decided] == [("denied", "extension:safe-defaults")]
    assert "lockfile" in (decided[0].reason or "")
    assert not (ws / "uv.lock").exists()
    assert [(a.name, a.speaker) for a in asked] == [("shell", "extension:safe-defaults")]
