"""The stuck session, with a real model: a prompt bigger than a real llama.cpp server's context.

A local endpoint with a small ``n_ctx`` refuses the first request (its window is not in any
registry, so kiso assumed 128K). kiso learns the window from the refusal, summarizes through the
transcript fallback (the run's own prefix no longer fits), retries once and the run completes; the
next ``kiso resume`` in that session completes too, and the learned window is on disk. The model
is SmolLM2-135M on llama.cpp's server (xllamacpp), the binary is the real ``kiso``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiso.kernel import Assistant, Compacted, JsonlSessionStore, RunEnded, User

from .llama import ROOT, llama_server

BIN = Path(sys.executable).parent / "kiso"
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_FAUX_SCRIPT", "KISO_MODEL")
N_CTX = 4096
"""Not smaller: kiso's built-in tool schemas alone are ~2,000 of SmolLM's tokens, so a 2,048
window could never carry a request with them, summary or not."""
SYSTEM = "You are a terse assistant. Answer in one short sentence."


def kiso(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in KEYS and not k.startswith("KISO_")}
    return subprocess.run(
        [str(BIN), *args],
        cwd=cwd,
        env={**base, "KISO_HOME": str(home)},
        input="",  # headless: a pipe, not a terminal
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def real_text(chars: int) -> str:
    """Real English prose (kiso's own durability document), cut at a line end."""
    text = (ROOT / "docs" / "durability.md").read_text(encoding="utf-8")
    assert len(text) > chars, "the premise: the document is long enough"
    return text[: text.rindex("\n", 0, chars)]


def relief(stream_json: str) -> str:
    """What the run said about its relief and its end (the lines a failure should show)."""
    kinds = ("compaction", "compaction_failed", "terminal")
    lines = [json.loads(line) for line in stream_json.splitlines() if line.startswith("{")]
    return "\n".join(json.dumps(line) for line in lines if line.get("type") in kinds)


@pytest.mark.timeout(420)  # a real model on two cores: minutes when it talks at length
def test_a_prompt_bigger_than_the_endpoints_context_is_relieved_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    system_file = tmp_path / "system.txt"
    system_file.write_text(SYSTEM, encoding="utf-8")
    prompt = "Summarize this document in one sentence.\n\n" + real_text(16_000)
    with llama_server(n_ctx=N_CTX, repeat_penalty=1.3) as url:
        profile = {"kind": "openai-compat", "model": "smollm", "baseUrl": f"{url}/v1"}
        config = {"model": "local", "models": {"local": profile}}
        (home / "config.json").write_text(json.dumps(config), encoding="utf-8")
        first = kiso(
            ws, home, "-p", prompt, "stuck", "--system-prompt-file", str(system_file),
            "--output-format", "stream-json",
        )  # fmt: skip
        learned = json.loads((home / "learned-windows.json").read_text(encoding="utf-8"))
        assert learned == {f"openai-compat {url} smollm": N_CTX}  # the refusal was learned
        assert first.returncode in (0, 1), relief(first.stdout)
        resumed = kiso(ws, home, "resume", "stuck", "hi")
    log = JsonlSessionStore(home).load("stuck").events
    # The refusal's compaction; a second one is right too when the first answer ran to the
    # window's end (the resume's request is then past 80% of it).
    compacted, *more = [e for e in log if isinstance(e, Compacted)]
    assert compacted.trigger == "auto" and compacted.summary.strip()
    assert all(c.trigger == "auto" for c in more) and len(more) <= 1
    # The endpoint accepted the request after the compaction, and the one after the resume: each
    # run has a committed model turn, and neither ended refused. Whether a 135M model stops on its
    # own or runs into its output limit is the model's business ("max_tokens"), not the relief's.
    ended = [e.outcome for e in log if isinstance(e, RunEnded)]
    assert len(ended) == 2, relief(first.stdout)
    assert all(o.kind == "completed" or o.code == "max_tokens" for o in ended), ended
    assert resumed.returncode == (0 if ended[1].kind == "completed" else 1), resumed.stderr
    turns = [e for e in log if isinstance(e, Assistant)]
    assert len(turns) == 2 and turns[0].seq > compacted.seq
    assert [e.text for e in log if isinstance(e, User)][-1] == "hi"
