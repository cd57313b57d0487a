"""kiso-code's system prompt on the wire: AGENTS.md, the flags, and a resume that keeps it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cli.test_print import kiso
from tests.providers.sse import SSEServer
from tests.providers.test_openai_compat import text_reply


def system_of(request_json: dict[str, object]) -> str:
    messages = request_json["messages"]
    assert isinstance(messages, list) and messages[0]["role"] == "system", messages[:1]
    content = messages[0]["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def env(home: Path, server: SSEServer) -> dict[str, str]:
    return {
        "KISO_HOME": str(home),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": server.url + "/v1",
        "OPENAI_MODEL": "gpt-test",
    }


def session_id(stderr: str) -> str:
    header = next(line for line in stderr.splitlines() if line.startswith("session "))
    return header.split()[1]


def test_the_model_is_told_how_to_work_where_it_is_and_the_projects_agents_md(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "feature-x"], cwd=ws, check=True)
    (ws / "AGENTS.md").write_text("Run `make check` before you say you are done.\n")
    with SSEServer([text_reply("ok")]) as server:
        out = kiso(ws, "-p", "hi", **env(tmp_path / "home", server))
    assert out.returncode == 0, out.stderr
    system = system_of(server.requests[0].json)
    assert "You are kiso" in system and "edit_file" in system
    assert str(ws.resolve()) in system
    assert "branch feature-x" in system
    assert "Run `make check` before you say you are done." in system


def test_a_resume_sends_the_recorded_prompt_even_after_agents_md_changed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("RULE ONE\n")
    home = tmp_path / "home"
    with SSEServer([text_reply("first"), text_reply("second"), text_reply("third")]) as server:
        first = kiso(ws, "-p", "hi", **env(home, server))
        assert first.returncode == 0, first.stderr
        sid = session_id(first.stderr)
        (ws / "AGENTS.md").write_text("RULE TWO\n")
        again = kiso(ws, "resume", sid, "again", **env(home, server))
        assert again.returncode == 0, again.stderr
        fresh = kiso(ws, "-p", "new session", **env(home, server))
        assert fresh.returncode == 0, fresh.stderr
    one, two, three = (system_of(r.json) for r in server.requests)
    assert one == two  # byte-identical
    assert "RULE ONE" in two and "RULE TWO" not in two
    assert "RULE TWO" in three  # a new session reads AGENTS.md as it is now
    log = next(home.glob(f"projects/*/{sid}.jsonl"))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    pinned = [r for r in records if r.get("key") == "system_prompt"]
    assert len(pinned) == 1 and pinned[0]["value"] == one


def test_append_and_file_flags_and_they_replace_a_recorded_prompt(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    home = tmp_path / "home"
    custom = tmp_path / "prompt.txt"
    custom.write_text("You are a terse reviewer.")
    with SSEServer([text_reply("a"), text_reply("b"), text_reply("c")]) as server:
        first = kiso(
            ws, "-p", "hi", "--append-system-prompt", "Answer in French.", **env(home, server)
        )
        assert first.returncode == 0, first.stderr
        sid = session_id(first.stderr)
        second = kiso(
            ws, "resume", sid, "again", "--system-prompt-file", str(custom), **env(home, server)
        )
        assert second.returncode == 0, second.stderr
        third = kiso(ws, "resume", sid, "once more", **env(home, server))
        assert third.returncode == 0, third.stderr
    one, two, three = (system_of(r.json) for r in server.requests)
    assert "You are kiso" in one and one.rstrip().endswith("Answer in French.")
    assert two.startswith("You are a terse reviewer.") and "You are kiso" not in two
    assert str(ws.resolve()) in two  # the environment is still said
    assert three == two  # the change was recorded: a plain resume keeps it


def test_an_unreadable_system_prompt_file_is_a_usage_error(tmp_path: Path) -> None:
    out = kiso(
        tmp_path,
        "-p",
        "hi",
        "--system-prompt-file",
        str(tmp_path / "missing.txt"),
        KISO_HOME=str(tmp_path / "h"),
    )
    assert out.returncode in (1, 2), out
    assert "missing.txt" in out.stderr and "Traceback" not in out.stderr
