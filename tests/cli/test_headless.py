"""Headless runs: output formats, resume off a terminal, rulings, and the workspace rule."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent / "kiso"
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_FAUX_SCRIPT", "KISO_MODEL")


def kiso(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in KEYS and k != "KISO_FAILPOINT"}
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


def test_json_and_stream_json_results(tmp_path: Path) -> None:
    s = script(
        tmp_path,
        {"tool_calls": [{"name": "list_dir", "input": {}}], "usage": {"input": 10, "output": 2}},
        {"text": "Two files.", "usage": {"input": 30, "output": 3, "cache_read": 8}},
    )
    out = kiso(tmp_path, "-p", "what is here?", "j1", "--output-format", "json", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["type"] == "result" and result["session_id"] == "j1"
    assert result["is_error"] is False and result["outcome"] == {"kind": "completed"}
    assert result["result"] == "Two files."
    assert result["usage"] == {"input": 40, "output": 5, "cache_read": 8, "cache_write": None}
    assert result["cost"] is None  # a faux model has no price: unknown, never invented
    streamed = kiso(tmp_path, "-p", "again", "--output-format", "stream-json", KISO_FAUX_SCRIPT=s)
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "note" and kinds[-1] == "result"
    assert "tool_start" in kinds and "tool_end" in kinds and "terminal" in kinds
    tool_end = next(line for line in lines if line["type"] == "tool_end")
    assert tool_end["event"]["type"] == "execution_finished"


def test_an_uncertain_execution_stops_a_headless_resume_until_ruled(tmp_path: Path) -> None:
    s = script(
        tmp_path,
        {"tool_calls": [{"name": "shell", "input": {"command": "echo ran >> effects.log"}}]},
        {"text": "done"},
    )
    crashed = kiso(
        tmp_path, "-p", "go", "s1", "--mode", "bypass",
        KISO_FAUX_SCRIPT=s, KISO_FAILPOINT="execution_started",
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL
    stuck = kiso(tmp_path, "resume", "s1", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert stuck.returncode == 1
    assert (
        "shell (s1:" in stuck.stderr
        and "kiso resume s1 --resolve rerun|skip|applied" in stuck.stderr
    )
    assert not (tmp_path / "effects.log").exists()
    ruled = kiso(
        tmp_path, "resume", "s1", "--resolve", "rerun", "--mode", "bypass", KISO_FAUX_SCRIPT=s
    )
    assert ruled.returncode == 0, ruled.stderr
    assert (tmp_path / "effects.log").read_text() == "ran\n"  # run again once, as ruled


def test_resume_with_a_prompt_off_a_terminal_runs_headless(tmp_path: Path) -> None:
    s = script(tmp_path, {"text": "first"}, {"text": "second"})
    assert kiso(tmp_path, "-p", "one", "r1", KISO_FAUX_SCRIPT=s).returncode == 0
    out = kiso(tmp_path, "resume", "r1", "two", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "second"
    idle = kiso(tmp_path, "resume", "r1", KISO_FAUX_SCRIPT=s)
    assert idle.returncode == 0  # nothing open: nothing to do


def test_a_session_resumes_only_in_its_own_workspace(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    s = script(tmp_path, {"text": "hi"}, {"text": "again"})
    assert kiso(here, "-p", "hi", "w1", KISO_FAUX_SCRIPT=s).returncode == 0
    out = kiso(there, "resume", "w1", "more", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 1
    assert f"cd {here}" in out.stderr and "only in its own workspace" in out.stderr


def test_commands_that_need_a_terminal_say_so(tmp_path: Path) -> None:
    bare = kiso(tmp_path)
    assert bare.returncode == 2 and 'kiso -p "prompt"' in bare.stderr
    picker = kiso(tmp_path, "resume")
    assert picker.returncode == 2 and "needs a session id" in picker.stderr


def test_a_compactions_summary_is_counted_in_the_results_usage(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("".join(f"line {i} of a long file\n" for i in range(170)))
    read = {"tool_calls": [{"name": "read_file", "input": {"path": "big.txt"}}]}
    path = tmp_path / "script.json"
    path.write_text(json.dumps({
        "turns": [*[read] * 6, {"text": "read it all", "usage": {"input": 100, "output": 4}}],
        "summaries": [{"text": "## Goal\nread big.txt\n## Next steps\nnone",
                       "usage": {"input": 900, "output": 30}}],
    }))  # fmt: skip
    home = tmp_path / "home"
    out = kiso(
        tmp_path, "-p", "read big.txt six times", "c1", "--output-format", "json",
        KISO_FAUX_SCRIPT=str(path), KISO_CONTEXT_WINDOW="8000", KISO_HOME=str(home),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    [log] = home.glob("projects/*/c1.jsonl")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    compacted = [e for e in records if e["type"] == "compacted"]
    assert len(compacted) == 1, [e["type"] for e in records]
    assert compacted[0]["usage"]["input"] == 900 and compacted[0]["model"]
    result = json.loads(out.stdout)
    assert result["turns"] == 7  # model turns; the summary is not one of them
    # the reads reported no counts; the last turn and the summary did
    assert result["usage"]["input"] == 100 + 900 and result["usage"]["output"] == 4 + 30


def test_a_prompt_is_on_disk_before_the_model_answers_so_a_kill_loses_nothing(
    tmp_path: Path,
) -> None:
    """kill -9 while the first model call runs: the prompt is already in the log, and
    ``kiso resume`` carries the run on to its answer (ADR 0022)."""
    import time

    home = tmp_path / "home"
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"turns": [{"text": "never", "delay_ms": 120_000}]}))
    base = {k: v for k, v in os.environ.items() if k not in KEYS and k != "KISO_FAILPOINT"}
    env = {**base, "KISO_HOME": str(home), "KISO_FAUX_SCRIPT": str(slow)}
    proc = subprocess.Popen(
        [str(BIN), "-p", "an important prompt", "k9"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            logs = list(home.glob("projects/*/k9.jsonl"))
            if logs and '"type":"user"' in logs[0].read_text():
                break
            assert proc.poll() is None, "kiso ended before the model answered"
            assert time.monotonic() < deadline, "the prompt never reached the log"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    answered = script(tmp_path, {"text": "the answer"})
    out = kiso(tmp_path, "resume", "k9", KISO_HOME=str(home), KISO_FAUX_SCRIPT=answered)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in logs[0].read_text().splitlines()]
    assert [r["content"] for r in records if r["type"] == "user"] == ["an important prompt"]
    assert [r["type"] for r in records].count("run_started") == 1  # the same run, carried on
    assert records[-1]["type"] == "run_ended" and records[-1]["outcome"]["kind"] == "completed"
