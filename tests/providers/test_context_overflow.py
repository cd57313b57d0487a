"""Local servers' "the prompt does not fit" errors are ``context_overflow``, never retried.

The bodies are the servers' own, served on 127.0.0.1 and read through the official ``openai`` SDK
by :class:`OpenAICompatAdapter` (llama.cpp's and vLLM's OpenAI-compatible servers). The llama.cpp
one is also produced by the real server in ``test_real_model.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from kiso.providers.errors import from_status, is_context_overflow

from .sse import Event, Reply, Stream
from .test_openai_compat import chunk, failure

LLAMA_CPP = [
    (  # llama.cpp server today (b6xxx and later), as a real server sends it
        400,
        {"error": {"code": 400, "message": "request (6031 tokens) exceeds the available context "
         "size (4096 tokens), try increasing it", "type": "exceed_context_size_error",
         "n_prompt_tokens": 6031, "n_ctx": 4096}},
    ),
    (
        400,
        {"error": {"code": 400, "message": "the request exceeds the available context size, try "
         "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 5000,
         "n_ctx": 4096}},
    ),
    (  # the builds that sent it with a 500
        500,
        {"error": {"code": 500, "message": "the request exceeds the available context size. try "
         "increasing the context size or enable context shift", "type": "exceed_context_size_error",
         "n_prompt_tokens": 1407, "n_ctx": 256}},
    ),
    (500, {"error": {"code": 500, "message": "Context size has been exceeded.", "type":
                     "server_error"}}),
    (  # older builds, with context shift disabled
        500,
        {"error": {"code": 500, "message": "Input is too large to process. Either enable context "
         "shift or increase context length. ", "type": "server_error"}},
    ),
    (400, {"error": {"code": 400, "message": "context length exceeded", "type":
                     "invalid_request_error"}}),
]  # fmt: skip

VLLM = [
    (  # vLLM's older top-level error object
        400,
        {"object": "error", "message": "This model's maximum context length is 4096 tokens. "
         "However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). "
         "Please reduce the length of the messages or completion.", "type": "BadRequestError",
         "param": None, "code": 400},
    ),
    (
        400,
        {"error": {"message": "This model's maximum context length is 2048 tokens. However, your "
         "request has 8 input tokens plus 2045 'max_tokens'. Please reduce one or the other. "
         "(parameter=input_tokens, max_tokens, value=(8, 2045))", "type": "BadRequestError",
         "param": "input_tokens, max_tokens", "code": 400}},
    ),
    (
        400,
        {"object": "error", "message": "The decoder prompt (length 5000) is longer than the "
         "maximum model length of 4096. Make sure that `max_model_len` is no smaller than the "
         "number of text tokens.", "type": "BadRequestError", "param": None, "code": 400},
    ),
    (500, {"detail": "[address=0.0.0.0:43769, pid=1065] The decoder prompt (length 66501) is "
                     "longer than the maximum model length of 65536."}),
    (400, {"object": "error", "message": "Prompt length of 5016 is longer than the maximum model "
           "length of 4096.", "type": "BadRequestError", "param": None, "code": 400}),
]  # fmt: skip


@pytest.mark.parametrize(("status", "body"), LLAMA_CPP + VLLM)
def test_a_servers_context_error_is_a_context_overflow(status: int, body: dict[str, Any]) -> None:
    err = failure([Reply(status, body)])
    assert (err.status, err.code, err.retryable) == (status, "context_overflow", False)
    assert "longer than the model's context window" in err.message


def test_llama_cpps_token_counts_are_in_the_message() -> None:
    err = failure([Reply(*LLAMA_CPP[1])])
    assert "5000 prompt tokens, a 4096-token context" in err.message
    again = failure([Reply(*LLAMA_CPP[0])])  # its message already says both: not repeated
    assert again.message.count("4096") == 1


def test_the_type_alone_says_overflow_whatever_the_wording() -> None:
    body = {"error": {"code": 400, "message": "zu lang", "type": "exceed_context_size_error"}}
    err = failure([Reply(400, body)])
    assert (err.code, err.retryable) == ("context_overflow", False)


def test_an_overflow_reported_inside_the_stream() -> None:
    error = {"message": "Context size has been exceeded.", "type": "server_error", "code": 500}
    err = failure([Stream([Event(chunk({"content": "Hel"})), Event({"error": error})])])
    assert (err.code, err.retryable) == ("context_overflow", False)


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (500, {"error": {"message": "CUDA error: out of memory", "type": "server_error"}},
         "api_5xx"),
        (400, {"object": "error", "message": "max_tokens must be at least 1, got -186.",
               "type": "BadRequestError", "param": None, "code": 400}, "invalid_request"),
        (503, {"error": {"message": "Loading model", "type": "unavailable_error"}}, "api_5xx"),
    ],
)  # fmt: skip
def test_other_errors_from_the_same_servers_keep_their_codes(
    status: int, body: dict[str, Any], code: str
) -> None:
    assert failure([Reply(status, body)]).code == code


def test_a_503_that_mentions_the_context_is_still_retried() -> None:
    err = from_status(503, "maximum context length is being resized", provider="x")
    assert (err.code, err.retryable) == ("api_5xx", True)
    assert is_context_overflow("whatever", "exceed_context_size_error")
