"""Declarative permissions and run limits, end to end: the real ``kiso`` in subprocesses.

``permissions`` in the user and a trusted project config, ``--allowed-tools`` /
``--disallowed-tools``, ``--max-turns`` and ``--max-budget-usd`` (against a local
OpenAI-compatible server serving a priced model), each proved by what happened on disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.providers.sse import SSEServer, Stream
from tests.providers.test_openai_compat import chunk, sse

BIN = Path(sys.executable).parent / "kiso"
KEYS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENAI_BASE_URL",
    "KISO_FAUX_SCRIPT",
    "KISO_MODEL",
    "KISO_MODE",
    "KISO_FAILPOINT",
)


def kiso(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in KEYS}
    return subprocess.run(
        [str(BIN), *args],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def script(tmp_path: Path, *turns: dict[str, object]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"turns": list(turns)}))
    return str(path)


def shell(command: str) -> dict[str, object]:
    return {"tool_calls": [{"name": "shell", "input": {"command": command}}]}


def user_config(data: dict[str, Any]) -> Path:
    path = Path(os.environ["KISO_HOME"]) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def log_of(session_id: str) -> list[dict[str, Any]]:
    (path,) = Path(os.environ["KISO_HOME"]).glob(f"projects/**/{session_id}.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def decisions(session_id: str) -> list[tuple[str, str]]:
    return [
        (e["decision"], e["decided_by"])
        for e in log_of(session_id)
        if e.get("type") == "approval_decided"
    ]


def test_a_deny_beats_bypass_from_the_flag_and_from_the_config(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    s = script(tmp_path, shell("echo x > flag.txt"), shell("touch made.txt"), {"text": "ok"})
    out = kiso(
        ws, "-p", "go", "d1", "--mode", "bypass", "--output-format", "json",
        "--disallowed-tools", "shell(echo:*),  shell(touch:*)",
        KISO_FAUX_SCRIPT=s,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert not (ws / "flag.txt").exists() and not (ws / "made.txt").exists()
    result = json.loads(out.stdout)
    assert [d["decided_by"] for d in result["permission_denials"]] == [
        "permissions:deny:shell(echo:*)",
        "permissions:deny:shell(touch:*)",
    ]
    assert result["permission_denials"][1]["tool_input"] == {"command": "touch made.txt"}
    assert decisions("d1") == [
        ("denied", "permissions:deny:shell(echo:*)"),
        ("denied", "permissions:deny:shell(touch:*)"),
    ]
    config = user_config({"permissions": {"deny": ["shell(touch:*)"]}})
    again = kiso(ws, "-p", "go", "d2", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert again.returncode == 0, again.stderr
    assert (ws / "flag.txt").read_text() == "x\n"  # bypass allows what no rule denies
    assert not (ws / "made.txt").exists()
    assert "denied shell (permissions:deny:shell(touch:*))" in again.stderr
    assert f"permissions.deny in {config}" in again.stderr  # the reason names the source


def test_an_allow_runs_a_command_without_asking_and_never_a_compound_one(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    user_config({"permissions": {"allow": ["shell(touch:*)"]}})
    s = script(
        tmp_path,
        shell("touch allowed.txt"),
        shell("touch a.txt && touch b.txt"),
        shell("touch c.txt; echo hi"),
        {"text": "ok"},
    )
    out = kiso(ws, "-p", "go", "a1", KISO_FAUX_SCRIPT=s)  # default mode, headless
    assert out.returncode == 0, out.stderr
    assert (ws / "allowed.txt").exists()
    assert not any((ws / f).exists() for f in ("a.txt", "b.txt", "c.txt"))
    assert decisions("a1") == [
        ("approved", "permissions:allow:shell(touch:*)"),
        ("denied", "headless"),
        ("denied", "headless"),
    ]


def test_an_allow_from_the_flag_and_a_resume_with_flags_after_the_id(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    s = script(tmp_path, {"text": "first"}, shell("touch one.txt"), {"text": "ok"})
    assert kiso(ws, "-p", "hi", "r1", KISO_FAUX_SCRIPT=s).returncode == 0
    out = kiso(
        ws, "resume", "r1", "go", "--allowed-tools", "read_file",
        "--allowed-tools", "shell(touch one.txt)", KISO_FAUX_SCRIPT=s,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (ws / "one.txt").exists()
    assert decisions("r1") == [("approved", "permissions:allow:shell(touch one.txt)")]


def test_an_ask_asks_even_in_accept_edits(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    user_config({"permissions": {"ask": ["write_file(secrets/**)"]}})
    write = {"name": "write_file", "input": {"path": "secrets/key.txt", "content": "k"}}
    other = {"name": "write_file", "input": {"path": "notes.txt", "content": "n"}}
    s = script(tmp_path, {"tool_calls": [write]}, {"tool_calls": [other]}, {"text": "ok"})
    out = kiso(ws, "-p", "go", "q1", "--mode", "accept-edits", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0, out.stderr
    assert not (ws / "secrets" / "key.txt").exists()  # asked, and nobody can answer headless
    assert (ws / "notes.txt").read_text() == "n"  # accept-edits allows the rest
    assert decisions("q1") == [("denied", "headless"), ("approved", "mode:accept-edits")]
    assert "no approval mode would allow it" in out.stderr


def test_a_project_config_may_deny_but_never_allow(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".kiso").mkdir(parents=True)
    project = ws / ".kiso" / "config.json"
    project.write_text(json.dumps({"permissions": {"deny": ["shell(touch:*)"]}}))
    s = script(tmp_path, shell("touch p.txt"), {"text": "ok"})
    assert kiso(ws, "trust").returncode == 0
    out = kiso(ws, "-p", "go", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0, out.stderr
    assert not (ws / "p.txt").exists()
    assert f"permissions.deny in {project}" in out.stderr
    project.write_text(json.dumps({"permissions": {"allow": ["shell"]}}))
    assert kiso(ws, "trust").returncode == 0
    refused = kiso(ws, "-p", "go", KISO_FAUX_SCRIPT=s)
    assert refused.returncode == 1
    assert f"{project}: permissions.allow: a project config may only tighten" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_bad_flags_are_usage_errors_naming_the_flag(tmp_path: Path) -> None:
    s = script(tmp_path, {"text": "never"})
    for args, said in (
        (("--allowed-tools", "shell(npm test"), "--allowed-tools: 'shell(npm test' has an"),
        (("--disallowed-tools", "shell()"), "--disallowed-tools: 'shell()' has an empty"),
        (("--max-turns", "0"), "Invalid value for '--max-turns'"),
        (("--max-turns", "many"), "Invalid value for '--max-turns'"),
        (("--max-budget-usd", "-1"), "Invalid value for '--max-budget-usd': must be a positive"),
        (("--max-budget-usd", "inf"), "Invalid value for '--max-budget-usd': must be a positive"),
    ):
        out = kiso(tmp_path, "-p", "hi", *args, KISO_FAUX_SCRIPT=s)
        assert out.returncode == 2, (args, out.stderr)
        assert said in out.stderr and "Traceback" not in out.stderr
    assert not list(Path(os.environ["KISO_HOME"]).glob("projects/**/*.jsonl"))  # nothing ran


def test_max_turns_ends_the_run_with_a_recorded_outcome(tmp_path: Path) -> None:
    s = script(tmp_path, {"tool_calls": [{"name": "list_dir", "input": {}}]}, {"text": "never"})
    out = kiso(
        tmp_path, "-p", "look", "m1", "--max-turns", "1", "--output-format", "json",
        KISO_FAUX_SCRIPT=s,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    result = json.loads(out.stdout)
    assert result["outcome"] == {"kind": "max_turns"} and result["subtype"] == "error_max_turns"
    assert result["is_error"] is True and result["num_turns"] == 1 and result["turns"] == 1
    ended = [e for e in log_of("m1") if e["type"] == "run_ended"]
    assert [e["outcome"] for e in ended] == [{"kind": "max_turns"}]
    text = kiso(tmp_path, "-p", "look", "m2", "--max-turns", "1", KISO_FAUX_SCRIPT=s)
    assert text.returncode == 1
    assert "the run did not complete: max_turns" in text.stderr and "--max-turns 1" in text.stderr


PRICED = "gpt-4o-mini"  # $0.15 a million input tokens, $0.60 a million output tokens


def priced_call(call_id: str, name: str, arguments: dict[str, Any], tokens: int) -> Stream:
    def part(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return chunk(delta, finish, model=PRICED)

    fragment = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    usage = {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}
    return sse(
        part({"role": "assistant", "content": None}),
        part({"tool_calls": [fragment]}),
        part({}, "tool_calls"),
        {**part({}), "choices": [], "usage": usage},
    )


def test_max_budget_usd_ends_the_run_once_its_cost_reaches_the_budget(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    replies = [priced_call(f"call_{i}", "list_dir", {}, 1_000_000) for i in range(3)]
    with SSEServer(replies) as server:
        user_config(
            {
                "model": "priced",
                "models": {
                    "priced": {
                        "kind": "openai-compat",
                        "model": PRICED,
                        "baseUrl": server.url + "/v1",
                        "apiKeyEnv": "PRICED_TOKEN",
                    }
                },
            }
        )
        out = kiso(
            ws, "-p", "look", "b1", "--max-budget-usd", "0.25", "--output-format", "json",
            PRICED_TOKEN="tok",
        )  # fmt: skip
        assert out.returncode == 1, out.stderr
        assert len(server.requests) == 2  # $0.15, $0.30: no third request once over $0.25
    result = json.loads(out.stdout)
    assert result["outcome"] == {"kind": "budget"} and result["subtype"] == "error_max_budget_usd"
    assert result["total_cost_usd"] == 0.3 and result["cost"] == 0.3
    assert result["num_turns"] == 2 and result["is_error"] is True
    ended = [e for e in log_of("b1") if e["type"] == "run_ended"]
    assert [e["outcome"] for e in ended] == [{"kind": "budget"}]
    tools = [e for e in log_of("b1") if e["type"] == "execution_finished"]
    assert len(tools) == 2  # both turns' tools ran to their end: the check is between turns


def test_a_budget_on_a_model_without_a_price_refuses_to_start(tmp_path: Path) -> None:
    s = script(tmp_path, {"text": "never"})
    out = kiso(tmp_path, "-p", "hi", "--max-budget-usd", "1", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 1
    assert "--max-budget-usd 1: the model faux:script.json has no known price" in out.stderr
    assert "cannot be enforced" in out.stderr
    assert not list(Path(os.environ["KISO_HOME"]).glob("projects/**/*.jsonl"))


def test_a_delegated_child_keeps_the_parents_disallowed_tools(tmp_path: Path) -> None:
    from tests.e2e.test_delegate import World

    w = World(tmp_path)
    read = {"tool_calls": [{"name": "read_file", "input": {"path": "a.txt"}}]}
    w.child(1, read, {"text": "could not read it"})
    w.parent(
        {"tool_calls": [{"name": "delegate", "input": {"tasks": [
            {"role": "explorer", "task": "What does a.txt say?"}]}}]},
        {"text": "parent done"},
    )  # fmt: skip
    out = w.kiso("-p", "go", "p1", "--mode", "bypass", "--disallowed-tools", "read_file(a.txt)")
    assert out.returncode == 0, out.stderr
    [child] = w.child_ids()
    verdicts = [
        (e["decision"], e["decided_by"]) for e in w.log(child) if e["type"] == "approval_decided"
    ]
    assert verdicts == [("denied", "permissions:deny:read_file(a.txt)")]  # the role allows it
    assert not any(e["type"] == "execution_started" for e in w.log(child))


def test_a_tool_disallowed_whole_is_not_offered_to_the_model(tmp_path: Path) -> None:
    from tests.providers.test_openai_compat import text_reply

    with SSEServer([text_reply("fine"), text_reply("fine")]) as server:
        user_config(
            {
                "model": "local",
                "models": {
                    "local": {
                        "kind": "openai-compat",
                        "model": "m",
                        "baseUrl": server.url + "/v1",
                        "apiKeyEnv": "LOCAL_TOKEN",
                    }
                },
            }
        )
        plain = kiso(tmp_path, "-p", "hi", LOCAL_TOKEN="tok")
        hidden = kiso(tmp_path, "-p", "hi", "--disallowed-tools", "shell", LOCAL_TOKEN="tok")
        assert plain.returncode == 0 and hidden.returncode == 0, plain.stderr + hidden.stderr
        offered = [[t["function"]["name"] for t in r.json["tools"]] for r in server.requests]
    assert "shell" in offered[0] and "read_file" in offered[0]
    assert offered[1] == [name for name in offered[0] if name != "shell"]
