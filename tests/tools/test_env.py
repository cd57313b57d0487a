"""The child environment: credentials never reach a process the model can drive."""

from __future__ import annotations

from kiso.tools.env import child_env, is_stripped

BASE = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/dev",
    "LANG": "C.UTF-8",
    "OPENAI_BASE_URL": "https://llm.example/v1",
    "ANTHROPIC_BASE_URL": "https://anthropic.example",
    "KEYBOARD": "us",
    "TOKENIZERS_PARALLELISM": "false",
}

SECRETS = {
    "OPENAI_API_KEY": "sk-openai",
    "ANTHROPIC_API_KEY": "sk-ant",
    "ANTHROPIC_AUTH_TOKEN": "ant-token",
    "DEEPSEEK_API_KEY": "ds",
    "ZAI_API_KEY": "zai",
    "GEMINI_API_KEY": "gem",
    "GOOGLE_API_KEY": "goog",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_SESSION_TOKEN": "aws-session",
    "GITHUB_TOKEN": "ghp_x",
    "GH_TOKEN": "gho_x",
    "HF_TOKEN": "hf_x",
    "KYRONIX_API_KEY": "kx",
    "KISO_FAILPOINT": "after_append",
    "FOO_API_KEY": "custom",
    "my_service_api_key": "lower",
    "Internal_Auth_Token": "mixed",
}


def test_credentials_are_stripped_and_everything_else_is_kept() -> None:
    env = child_env({**BASE, **SECRETS})
    assert env == BASE


def test_profile_variables_are_stripped_whatever_their_name() -> None:
    environ = {**BASE, "MY_LLM_SECRET": "s1", "corp_gateway_key": "s2"}
    env = child_env(environ, also_strip=["MY_LLM_SECRET", "CORP_GATEWAY_KEY"])
    assert env == BASE
    # A lone string is one name, not a list of letters.
    assert child_env(environ, also_strip="MY_LLM_SECRET") == {**BASE, "corp_gateway_key": "s2"}


def test_a_new_dict_is_returned_and_the_input_is_untouched() -> None:
    environ = {**BASE, "OPENAI_API_KEY": "sk"}
    env = child_env(environ)
    assert env is not environ
    assert environ["OPENAI_API_KEY"] == "sk"
    env["X"] = "1"
    assert "X" not in environ


def test_names_that_merely_resemble_credentials_are_kept() -> None:
    kept = {"API_KEYS_DOC": "x", "MY_API_KEY_FILE_HINT": "y", "AUTH_TOKENIZER": "z"}
    assert child_env(kept) == kept


def test_is_stripped_agrees_with_child_env() -> None:
    for name in SECRETS:
        assert is_stripped(name)
    for name in BASE:
        assert not is_stripped(name)
    assert is_stripped("CUSTOM", also_strip=["custom"])
