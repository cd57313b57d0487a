"""Context relief when the endpoint refuses: learn the window, compact once, retry once.

Every request goes through an official SDK (``openai`` for :class:`OpenAICompatAdapter`,
``anthropic`` for :class:`AnthropicAdapter`) over real HTTP to a scripted server on 127.0.0.1,
which answers with the refusal bodies the servers really send (llama.cpp's
``exceed_context_size_error`` naming ``n_ctx``, Anthropic's ``prompt is too long``). The server
recognizes the summary request by the fixed instruction it carries. The logs are real JSONL
files; the CLI cases run the real ``kiso`` binary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import Assistant, Compacted, JsonlSessionStore, RunEnded, RunStarted, User
from kiso.kernel.messages import UserMessage
from kiso.kernel.values import TextBlock
from kiso.providers.anthropic import AnthropicAdapter
from kiso.providers.openai_compat import OpenAICompatAdapter
from kiso.runtime import Agent
from kiso.runtime import stream as ev
from kiso.runtime.compaction import SUMMARY_INSTRUCTION
from kiso.runtime.context import LEARNED_FILE, Window, message_tokens
from kiso.runtime.session import PromptTooLargeError
from tests.cli.test_usage import piped
from tests.providers import anthropic_server as anth
from tests.providers.sse import Recorded, Reply, SSEServer, Stream
from tests.providers.test_openai_compat import (
    call_fragment,
    chunk,
    read_note_tool,
    sse,
    usage_chunk,
)

MODEL = "relief-test-model"  # in no registry: a 128K window is assumed until a refusal says
SYSTEM = "You are a careful coding agent. Keep answers short and exact."
MARK = "[kiso: context compaction]"
SUMMARY = (
    "## Goal\nShip the parser fix.\n## Constraints\nNo new dependencies.\n## User requests\n"
    "Fix the parser, then the tests.\n## Files and changes\nsrc/parser.py: the tokenizer loop.\n"
    "## Errors and fixes\nNone yet.\n## Current work\nThe tokenizer.\n## Next steps\nRun the tests."
)
FINAL = "Done: the parser is fixed."


def llama_refusal(n_prompt: int, n_ctx: int) -> Reply:
    """llama.cpp's server, today's builds: a 400 naming the prompt's tokens and ``n_ctx``."""
    message = (
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try "
        f"increasing it"
    )
    body = {
        "error": {
            "code": 400,
            "message": message,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n_prompt,
            "n_ctx": n_ctx,
        }
    }
    return Reply(400, body)


def answer(request: Recorded, *pieces: str) -> Stream:
    """A streamed text answer whose usage is the request's size (about four bytes a token)."""
    return sse(
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": p}) for p in pieces),
        chunk({}, "stop"),
        usage_chunk(len(request.body) // 4, max(len("".join(pieces)) // 4, 1)),
    )


def summarized(request: Recorded) -> Stream:
    return answer(request, SUMMARY)


def finished(request: Recorded) -> Stream:
    return answer(request, FINAL)


def is_summary_request(request: Recorded) -> bool:
    return MARK.encode() in request.body


def openai_agent(server: SSEServer, tmp_path: Path, window: Window | int | None = None) -> Agent:
    return Agent(
        adapter=OpenAICompatAdapter(model=MODEL, api_key="sk-test", base_url=server.url + "/v1"),
        tools=[read_note_tool(tmp_path)],
        store=JsonlSessionStore(tmp_path / "home"),
        workspace=tmp_path,
        system_prompt=SYSTEM,
        retry_base_delay=0.01,
        window=window,
    )


def learned_window(server_url: str, tmp_path: Path, model: str = MODEL) -> Window:
    """The window the CLI would build: keyed by endpoint and model, remembered in a file."""
    return Window(
        model, key=f"test {server_url} {model}", learned_file=tmp_path / "home" / LEARNED_FILE
    )


def words(turn: int, chars: int) -> str:
    line = f"Turn {turn}: the tokenizer loop in src/parser.py drops the last token of a line. "
    return (line * (chars // len(line) + 1))[:chars]


def build_history(tmp_path: Path, sid: str, turns: int, chars: int) -> None:
    """``turns`` completed runs in session ``sid``: prompts and answers of ``chars`` characters,
    with the provider's (realistic) counts, against a server that never refuses."""
    with SSEServer(lambda r: answer(r, words(99, chars))) as server:
        agent = openai_agent(server, tmp_path)
        with agent.session(sid) as session:
            for turn in range(turns):
                seen = list(session.run_sync(words(turn, chars)))
                assert seen[-1].outcome.kind == "completed"
    assert len(server.requests) == turns


def log_bytes(tmp_path: Path, sid: str) -> bytes:
    (path,) = (tmp_path / "home").rglob(f"{sid}.jsonl")
    return path.read_bytes()


def refusing(
    first: Callable[[Recorded], Stream | Reply],
    summary: Callable[[Recorded], Stream | Reply],
    then: Callable[[Recorded], Stream | Reply],
) -> Callable[[Recorded], Stream | Reply]:
    """The first model request gets ``first``; a summary request ``summary``; the rest ``then``."""
    state = {"refused": False}

    def reply(request: Recorded) -> Stream | Reply:
        if is_summary_request(request):
            return summary(request)
        if not state["refused"]:
            state["refused"] = True
            return first(request)
        return then(request)

    return reply


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


# --------------------------------------------------------------------------- OpenAI-compatible


def test_a_llama_cpp_refusal_learns_the_window_compacts_once_and_the_retry_completes(
    tmp_path: Path,
) -> None:
    build_history(tmp_path, "s", turns=4, chars=400)
    before = JsonlSessionStore(tmp_path / "home").load("s").events
    script = refusing(lambda r: llama_refusal(3412, 3000), summarized, finished)
    with SSEServer(script) as server:
        window = learned_window(server.url, tmp_path)
        agent = openai_agent(server, tmp_path, window)
        assert agent.window.tokens == 128_000  # the premise: no threshold fires on its own
        with agent.session("s") as session:
            seen = list(session.run_sync(words(4, 400)))
    assert seen[-1].outcome.kind == "completed", seen[-1].outcome
    assert [e.type for e in seen if isinstance(e, ev.Compaction | ev.CompactionFailed)] == [
        "compaction"
    ]
    assert not [e for e in seen if isinstance(e, ev.Retry)]

    # three requests: the refused one, the summary, the retry
    assert len(server.requests) == 3
    refused, summary, retry = (r.json for r in server.requests)
    assert MARK not in json.dumps(refused) and MARK not in json.dumps(retry)
    # the summary request is the refused request's own prefix plus the instruction (a cache hit)
    assert summary["model"] == refused["model"] == MODEL
    assert summary["tools"] == refused["tools"]
    assert summary["messages"][:-1] == refused["messages"]
    assert summary["messages"][0] == {"role": "system", "content": SYSTEM}
    assert summary["messages"][-1] == {"role": "user", "content": SUMMARY_INSTRUCTION}
    # the retry: the summary first, fewer messages, the new prompt last
    assert retry["messages"][0] == {"role": "system", "content": SYSTEM}
    head = text_of(retry["messages"][1])
    assert head.startswith("[Earlier conversation compacted]") and SUMMARY in head
    assert len(retry["messages"]) < len(refused["messages"])
    assert retry["messages"][-1] == {"role": "user", "content": words(4, 400)}
    assert retry["tools"] == refused["tools"]

    log = JsonlSessionStore(tmp_path / "home").load("s").events
    (compacted,) = [e for e in log if isinstance(e, Compacted)]
    run = next(e.run for e in reversed(log) if isinstance(e, RunStarted))
    assert (compacted.run, compacted.trigger) == (run, "auto")
    assert compacted.covers_to_seq < compacted.seq
    # a tenth of the learned window is kept verbatim: the last answer and the new prompt
    last_input = [e for e in before if isinstance(e, User)][-1]
    assert compacted.covers_to_seq == last_input.seq
    assert [m["role"] for m in retry["messages"]] == ["system", "user", "assistant", "user"]
    assert compacted.summary.startswith(SUMMARY)
    assert compacted.tokens_before is not None and compacted.tokens_after is not None
    assert 0 < compacted.tokens_after < compacted.tokens_before
    assert [e.outcome.kind for e in log if isinstance(e, RunEnded)] == ["completed"] * 5
    assert [e for e in log if isinstance(e, Assistant)][-1].text == FINAL

    # the window came down to what the endpoint named, and the next start knows it
    assert agent.window.current().tokens == 3000
    assert agent.window.current().source == "learned"
    path = tmp_path / "home" / LEARNED_FILE
    assert json.loads(path.read_text(encoding="utf-8")) == {f"test {server.url} {MODEL}": 3000}
    assert learned_window(server.url, tmp_path).tokens == 3000


def test_when_the_prefix_no_longer_fits_the_summary_is_asked_of_a_transcript(
    tmp_path: Path,
) -> None:
    build_history(tmp_path, "t", turns=4, chars=400)
    script = refusing(lambda r: llama_refusal(1390, 1000), summarized, finished)
    with SSEServer(script) as server:
        agent = openai_agent(server, tmp_path, learned_window(server.url, tmp_path))
        with agent.session("t") as session:
            seen = list(session.run_sync(words(4, 400)))
    assert seen[-1].outcome.kind == "completed", seen[-1].outcome
    assert len(server.requests) == 3
    refused, summary, retry = (r.json for r in server.requests)
    # one user message quoting the history (clipped to the window), no tools to call
    assert "tools" not in summary
    assert [m["role"] for m in summary["messages"]] == ["system", "user"]
    asked = summary["messages"][1]["content"]
    assert "<<<conversation\n[user] Turn 0:" in asked and asked.endswith(SUMMARY_INSTRUCTION)
    assert len(json.dumps(summary)) < len(json.dumps(refused))
    assert retry["messages"][0] == {"role": "system", "content": SYSTEM}
    assert text_of(retry["messages"][1]).startswith("[Earlier conversation compacted]")
    assert len(retry["messages"]) < len(refused["messages"])
    assert agent.window.tokens == 1000


def test_a_second_refusal_after_the_compaction_ends_the_run_naming_the_window(
    tmp_path: Path,
) -> None:
    build_history(tmp_path, "r", turns=4, chars=400)
    script = refusing(
        lambda r: llama_refusal(3412, 3000),
        summarized,
        lambda r: llama_refusal(3105, 3000),
    )
    with SSEServer(script) as server:
        agent = openai_agent(server, tmp_path, learned_window(server.url, tmp_path))
        with agent.session("r") as session:
            seen = list(session.run_sync(words(4, 400)))
    outcome = seen[-1].outcome
    assert (outcome.kind, outcome.code, outcome.retryable) == ("error", "context_overflow", False)
    assert "3,000 tokens (learned from the endpoint's refusal)" in outcome.message
    assert "this request: ~" in outcome.message and "3105 tokens" in outcome.message
    # one compaction, one retry: refused, summary, refused, and nothing after
    assert [is_summary_request(r) for r in server.requests] == [False, True, False]
    assert [e.type for e in seen if isinstance(e, ev.Compaction | ev.CompactionFailed)] == [
        "compaction"
    ]
    log = JsonlSessionStore(tmp_path / "home").load("r").events
    assert len([e for e in log if isinstance(e, Compacted)]) == 1
    ended = [e for e in log if isinstance(e, RunEnded)][-1]
    assert ended.outcome == outcome


def tool_call_summary(request: Recorded) -> Stream:
    return sse(
        chunk({"role": "assistant", "content": None}),
        call_fragment(0, '{"path": "notes.txt"}', call_id="call_1", name="read_note"),
        chunk({}, "tool_calls"),
        usage_chunk(len(request.body) // 4, 9),
    )


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (answer, "the summary was empty"),
        (
            lambda r: answer(r, '<tool_call>{"name": "shell", "arguments": {}}</tool_call>'),
            "the summary carries tool-call markup",
        ),
        (
            lambda r: answer(r, "Let me run the tests first to see what fails."),
            "the model continued the work instead of summarizing it",
        ),
        (tool_call_summary, "the model called a tool instead of summarizing"),
    ],
    ids=["empty", "markup", "continues", "tool-call"],
)
def test_a_rejected_summary_writes_nothing_and_the_run_ends_with_the_overflow(
    tmp_path: Path, reply: Callable[[Recorded], Stream], why: str
) -> None:
    build_history(tmp_path, "x", turns=4, chars=400)
    old = log_bytes(tmp_path, "x")
    script = refusing(lambda r: llama_refusal(3412, 3000), reply, finished)
    with SSEServer(script) as server:
        agent = openai_agent(server, tmp_path, learned_window(server.url, tmp_path))
        with agent.session("x") as session:
            seen = list(session.run_sync(words(4, 400)))
            assert session.compaction_failures == 1
    outcome = seen[-1].outcome
    assert (outcome.kind, outcome.code) == ("error", "context_overflow")
    assert "3,000 tokens (learned" in outcome.message
    (failed,) = [e for e in seen if isinstance(e, ev.CompactionFailed)]
    assert failed.reason == why and failed.counted
    assert not [e for e in seen if isinstance(e, ev.Compaction)]
    # nothing compacted, so no retry: the refused request and the summary request only
    assert [is_summary_request(r) for r in server.requests] == [False, True]
    new = log_bytes(tmp_path, "x")
    assert new.startswith(old)  # appended to, nothing rewritten
    added = [json.loads(line)["type"] for line in new[len(old) :].splitlines()]
    assert added == ["run_started", "user", "run_ended"]
    assert b'"compacted"' not in new
    assert agent.window.tokens == 3000  # the refusal still taught the window


def test_a_prompt_larger_than_the_whole_window_is_refused_before_anything_is_recorded(
    tmp_path: Path,
) -> None:
    replies: list[Stream | Reply] = [
        sse(chunk({"content": "hi"}), chunk({}, "stop"), usage_chunk(40, 1)),
        sse(chunk({"content": "small"}), chunk({}, "stop"), usage_chunk(60, 1)),
    ]
    big = words(7, 8_000)
    tokens = message_tokens(UserMessage((TextBlock(big),)))
    assert tokens > 1000  # the premise
    with SSEServer(replies) as server:
        agent = openai_agent(server, tmp_path, 1000)
        with agent.session("p") as session:
            assert list(session.run_sync("hello"))[-1].outcome.kind == "completed"
            old = log_bytes(tmp_path, "p")
            with pytest.raises(PromptTooLargeError) as caught:
                list(session.run_sync(big))
            assert log_bytes(tmp_path, "p") == old  # no run_started, no user
            assert len(server.requests) == 1  # and nothing was sent
            assert session.fold.open_run is None
            message = str(caught.value)
            assert f"~{tokens:,} tokens" in message
            assert "context window of 1,000 tokens" in message
            assert "nothing was recorded" in message
            seen = list(session.run_sync("something small"))
    assert seen[-1].outcome.kind == "completed"
    assert len(server.requests) == 2
    users = [e.text for e in JsonlSessionStore(tmp_path / "home").load("p").events if
             isinstance(e, User)]  # fmt: skip
    assert users == ["hello", "something small"]


# --------------------------------------------------------------------------- Anthropic


def anthropic_summary(body: anth.JsonObj) -> anth.Sse:
    return anth.turn(anth.text_block(0, SUMMARY[:40], SUMMARY[40:]), input_tokens=25_000)


def anthropic_reply(body: anth.JsonObj) -> anth.Sse | anth.Status:
    """Anthropic's own refusal for the first model request, a summary for the summary request,
    an answer otherwise (the usage: about four bytes a token, like the real counts)."""
    text = json.dumps(body)
    if MARK in text:
        return anthropic_summary(body)
    if not anthropic_reply.refused:  # type: ignore[attr-defined]
        anthropic_reply.refused = True  # type: ignore[attr-defined]
        message = "prompt is too long: 210000 tokens > 200000 maximum"
        return anth.Status(400, anth.error("invalid_request_error", message))
    return anth.turn(anth.text_block(0, FINAL), input_tokens=len(text) // 4)


def test_anthropics_prompt_is_too_long_is_relieved_the_same_way(tmp_path: Path) -> None:
    anthropic_reply.refused = True  # type: ignore[attr-defined]  # the history is not refused
    home = tmp_path / "home"
    window = Window("claude-test-1", explicit=1_000_000, key="anthropic test claude-test-1",
                    learned_file=home / LEARNED_FILE)  # fmt: skip
    with anth.serve([anthropic_reply] * 20) as server:
        agent = Agent(
            adapter=AnthropicAdapter(
                model="claude-test-1", api_key="sk-ant-test", base_url=anth.base_url(server)
            ),
            tools=[read_note_tool(tmp_path)],
            store=JsonlSessionStore(home),
            workspace=tmp_path,
            system_prompt=SYSTEM,
            retry_base_delay=0.01,
            window=window,
        )
        with agent.session("a") as session:
            for turn in range(5):  # ~25K tokens: more than a tenth of 200K is kept verbatim
                assert list(session.run_sync(words(turn, 20_000)))[-1].outcome.kind == "completed"
            history = len(server.recorded)
            anthropic_reply.refused = False  # type: ignore[attr-defined]
            seen = list(session.run_sync("Now fix the parser."))
    assert seen[-1].outcome.kind == "completed", seen[-1].outcome
    requests = server.recorded[history:]
    assert len(requests) == 3
    refused, summary, retry = (r.body for r in requests)
    assert [MARK in json.dumps(b) for b in (refused, summary, retry)] == [False, True, False]
    # the same system prompt, tools and messages, then the instruction (merged into the last
    # user turn, as the Messages API wants roles to alternate)
    assert summary["system"] == refused["system"] and summary["tools"] == refused["tools"]
    assert summary["messages"][:-1] == refused["messages"][:-1]
    last_refused, last_summary = refused["messages"][-1], summary["messages"][-1]
    assert last_summary["role"] == last_refused["role"] == "user"
    assert last_summary["content"][: len(last_refused["content"])] == last_refused["content"]
    assert last_summary["content"][-1]["text"] == SUMMARY_INSTRUCTION
    # the retry: the summary first, then what is kept
    assert retry["system"] == refused["system"]
    assert text_of(retry["messages"][0]).startswith("[Earlier conversation compacted]")
    assert SUMMARY in text_of(retry["messages"][0])
    assert len(retry["messages"]) < len(refused["messages"])
    assert "Now fix the parser." in text_of(retry["messages"][-1])

    log = JsonlSessionStore(home).load("a").events
    (compacted,) = [e for e in log if isinstance(e, Compacted)]
    assert compacted.trigger == "auto" and compacted.covers_to_seq < compacted.seq
    assert compacted.tokens_before is not None and compacted.tokens_after is not None
    assert 0 < compacted.tokens_after < compacted.tokens_before
    assert agent.window.current().tokens == 200_000
    learned = json.loads((home / LEARNED_FILE).read_text(encoding="utf-8"))
    assert learned == {"anthropic test claude-test-1": 200_000}


# --------------------------------------------------------------------------- the CLI


def test_the_cli_remembers_the_window_refuses_too_big_a_prompt_up_front_and_is_not_stuck(
    tmp_path: Path,
) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    script = refusing(lambda r: llama_refusal(3412, 3000), summarized, finished)
    with SSEServer(script) as server:
        env = {
            "KISO_HOME": str(home),
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": server.url + "/v1",
            "OPENAI_MODEL": MODEL,
        }
        first = piped(ws, ("-p", words(1, 2_000), "cli"), None, **env)
        assert first.returncode == 0, first.stderr.decode()
        assert first.stdout.decode().strip() == FINAL
        assert [is_summary_request(r) for r in server.requests] == [False, True, False]
        learned = json.loads((home / LEARNED_FILE).read_text(encoding="utf-8"))
        assert learned == {f"openai-compat {server.url} {MODEL}": 3000}

        old = log_bytes(tmp_path, "cli")
        big = words(2, 16_000)
        tokens = message_tokens(UserMessage((TextBlock(big),)))
        refused = piped(ws, ("-p", big, "cli"), None, **env)
        stderr = refused.stderr.decode()
        assert refused.returncode == 2, stderr
        assert f"~{tokens:,} tokens" in stderr
        assert "3,000 tokens (learned from the endpoint's refusal)" in stderr
        assert len(server.requests) == 3  # the server saw nothing
        assert log_bytes(tmp_path, "cli") == old

        resumed = piped(ws, ("resume", "cli", "hi"), b"", **env)
        assert resumed.returncode == 0, resumed.stderr.decode()
        assert resumed.stdout.decode().strip() == FINAL
        assert len(server.requests) == 4
        assert text_of(server.requests[3].json["messages"][-1]) == "hi"
    log = JsonlSessionStore(home).load("cli").events
    assert [e.outcome.kind for e in log if isinstance(e, RunEnded)] == ["completed", "completed"]
    assert len([e for e in log if isinstance(e, Compacted)]) == 1


def test_an_explicit_window_wins_over_a_learned_one_and_the_refusal_says_how(
    tmp_path: Path,
) -> None:
    """``learned-windows.json`` says 3,000 tokens for this endpoint; the person knows better.
    Without a setting the learned window refuses the prompt and names the way out; with
    ``KISO_CONTEXT_WINDOW``, or a profile's ``contextWindow``, the prompt is sent."""
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    home.mkdir()
    big = words(1, 16_000)  # ~4,000 tokens: more than the learned window, less than the set one
    with SSEServer(finished) as server:
        key = f"openai-compat {server.url} {MODEL}"
        (home / LEARNED_FILE).write_text(json.dumps({key: 3000}))
        env = {
            "KISO_HOME": str(home),
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": server.url + "/v1",
            "OPENAI_MODEL": MODEL,
        }
        refused = piped(ws, ("-p", big, "w1"), None, **env)
        said = refused.stderr.decode()
        assert refused.returncode == 2, said
        assert (
            "3,000 tokens (learned from the endpoint's refusal), which a profile's contextWindow "
            "or KISO_CONTEXT_WINDOW overrides"
        ) in said
        assert "a profile's contextWindow sets it" not in said
        assert server.requests == []

        raised = piped(ws, ("-p", big, "w2"), None, KISO_CONTEXT_WINDOW="100000", **env)
        assert raised.returncode == 0, raised.stderr.decode()
        assert raised.stdout.decode().strip() == FINAL
        assert len(server.requests) == 1

        profile = {"kind": "openai-compat", "model": MODEL, "baseUrl": server.url + "/v1",
                   "apiKeyEnv": "OPENAI_API_KEY", "contextWindow": 100_000}  # fmt: skip
        (home / "config.json").write_text(
            json.dumps({"model": "local", "models": {"local": profile}})
        )
        by_profile = piped(ws, ("-p", big, "w3"), None, **env)
        assert by_profile.returncode == 0, by_profile.stderr.decode()
        assert len(server.requests) == 2
    # what was learned is still remembered (only a setting outranks it)
    assert json.loads((home / LEARNED_FILE).read_text()) == {key: 3000}


def test_a_refusal_still_lowers_an_explicit_window_for_the_rest_of_the_process(
    tmp_path: Path,
) -> None:
    learned = tmp_path / LEARNED_FILE
    learned.write_text(json.dumps({"k": 3000}))
    w = Window("gpt-4o", explicit=50_000, key="k", learned_file=learned)
    assert (w.tokens, w.current().source) == (50_000, "profile")  # the person's word first
    assert w.learn(8_000) and (w.tokens, w.current().source) == (8_000, "learned")
    assert w.current().describe() == (
        "8,000 tokens (learned from the endpoint's refusal), which a profile's contextWindow or "
        "KISO_CONTEXT_WINDOW overrides"
    )
    assert json.loads(learned.read_text()) == {"k": 8000}  # recorded
    assert Window("gpt-4o", explicit=50_000, key="k", learned_file=learned).tokens == 50_000
    assert Window("gpt-4o", key="k", learned_file=learned).tokens == 8_000  # above the registry
    env = Window("m", explicit=9_000, explicit_source="KISO_CONTEXT_WINDOW").current()
    assert env.describe() == "9,000 tokens (set by KISO_CONTEXT_WINDOW)"
    assert env.how_to_change == "KISO_CONTEXT_WINDOW changes it"
    assert (
        Window("nope-model")
        .current()
        .describe()
        .endswith(", which a profile's contextWindow or KISO_CONTEXT_WINDOW overrides")
    )
