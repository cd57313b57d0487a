"""`kiso login`, `kiso logout`, `kiso auth` as real processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent / "kiso"


def kiso(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_login_reads_the_key_from_stdin_and_stores_it_privately(home: Path) -> None:
    out = kiso("login", "deepseek", stdin="sk-deep-1234567890\n")
    assert out.returncode == 0, out.stderr
    assert "stored a key for deepseek" in out.stdout
    assert '"model": "deepseek"' in out.stdout  # the comment-free profile to paste
    json.loads(out.stdout[out.stdout.index("{") :])  # it really is plain JSON
    auth = home / "auth.json"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600
    assert json.loads(auth.read_text())["credentials"]["deepseek"]["key"] == "sk-deep-1234567890"
    shown = kiso("auth", env={"OPENAI_API_KEY": "sk-env-abcdefgh"})
    assert "sk-deep-1234567890" not in shown.stdout and "sk-env-abcdefgh" not in shown.stdout
    assert "sk-…7890" in shown.stdout and "sk-…efgh" in shown.stdout
    assert kiso("logout", "deepseek").returncode == 0
    assert json.loads(auth.read_text())["credentials"] == {}
    assert "no key was stored" in kiso("logout", "deepseek").stdout


def test_a_key_on_the_command_line_is_refused_and_not_stored(home: Path) -> None:
    out = kiso("login", "openai", "sk-on-argv-123")
    assert out.returncode == 2
    assert "never put a key on the command line" in out.stderr
    assert not (home / "auth.json").exists()


def test_unknown_providers_and_empty_keys_are_clear_errors(home: Path) -> None:
    bad = kiso("login", "acme", stdin="k\n")
    assert bad.returncode == 2
    assert "choose one of openai, anthropic, deepseek, zai, chatgpt" in bad.stderr
    empty = kiso("login", "zai", stdin="\n")
    assert empty.returncode == 1 and "not an API key" in empty.stderr
