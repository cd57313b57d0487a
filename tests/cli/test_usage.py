"""How people start kiso, run as real processes: a first prompt of several words, `-c`, prompts
on stdin, stdout that carries only the answer, the system prompt flags, and every way to get the
command line wrong (a one-line usage error, exit 2) or the home wrong (one line, exit 1)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import JsonlSessionStore, User

from .test_headless import BIN, KEYS, kiso, script
from .test_repl import Term

ID_128 = "a" * 128
ANSWERS: list[dict[str, object]] = [{"text": f"answer {i}"} for i in range(4)]


def users(home: Path, sid: str) -> list[str]:
    """What the log says the person (or the pipe) said, in order."""
    out = []
    for event in JsonlSessionStore(home).load(sid).events:
        if isinstance(event, User):
            assert isinstance(event.content, str)
            out.append(event.content)
    return out


def files_under(home: Path) -> list[Path]:
    return sorted(home.rglob("*")) if home.exists() else []


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def piped(
    cwd: Path, args: tuple[str, ...], data: bytes | None, **env: str
) -> subprocess.CompletedProcess[bytes]:
    """``kiso ARGS`` with ``data`` on a pipe for stdin (None: /dev/null)."""
    base = {k: v for k, v in os.environ.items() if k not in KEYS}
    return subprocess.run(
        [str(BIN), *args],
        cwd=cwd,
        env={**base, **env},
        input=data,
        stdin=subprocess.DEVNULL if data is None else None,
        capture_output=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A real directory nobody can write, root included: a read-only tmpfs when running as root
    (chmod does not stop root), mode 0500 otherwise."""
    folder = tmp_path / "ro"
    folder.mkdir()
    root = os.geteuid() == 0
    if root:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(folder)], check=True)
    else:
        folder.chmod(0o500)
    try:
        with pytest.raises(OSError, match=r"Read-only|Permission denied"):  # the premise
            (folder / "probe").write_text("x")
        yield folder
    finally:
        if root:
            subprocess.run(["umount", str(folder)], check=True)
        else:
            folder.chmod(0o700)


# --- a first prompt of several words ------------------------------------------------------------


def test_several_words_start_the_interactive_session_with_them_as_the_first_prompt(
    tmp_path: Path, ws: Path
) -> None:
    home = tmp_path / "home"
    s = Path(script(tmp_path, {"text": "Looking at the tests now."}))
    term = Term([str(BIN), "fix the failing tests"], cwd=ws, home=home, script=s)
    try:
        term.wait_for("Looking at the tests now.", timeout=20)
        term.wait_for("▸ ")
        term.send("/exit\r")
        assert term.exit_status() == 0
    finally:
        term.close()
    (row,) = JsonlSessionStore(home).list(ws)
    assert row.id != "fix the failing tests"
    assert users(home, row.id) == ["fix the failing tests"]


def test_several_words_off_a_terminal_are_the_usual_needs_a_terminal_error(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    out = kiso(tmp_path, "fix the failing tests", KISO_HOME=str(home))
    assert out.returncode == 2, out.stderr
    assert "needs a terminal" in out.stderr and "invalid session id" not in out.stderr
    assert files_under(home) == []


# --- usage errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("resume", "../x"), "invalid session id '../x'"),
        (("resume", "a b"), "invalid session id 'a b'"),
        (("resume", "a" * 129), "invalid session id"),
        (("-p", "hi", "a b"), "invalid session id 'a b'"),
        (("-p", "hi", "a" * 129), "invalid session id"),
        (("a/b",), "invalid session id 'a/b'"),
        (("chat", "../x"), "invalid session id '../x'"),
        (("--mode", "yolo"), "unknown mode 'yolo'"),
        (("--mode", "yolo", "sessions"), "unknown mode 'yolo'"),
        (("--mode", "yolo", "resume", "k1"), "unknown mode 'yolo'"),
        (("resume", "k1", "--mode", "yolo"), "unknown mode 'yolo'"),
        (("k1", "--mode", "yolo"), "unknown mode 'yolo'"),
        (("chat", "--mode", "yolo"), "unknown mode 'yolo'"),
        (("-p", "hi", "--mode", "yolo"), "unknown mode 'yolo'"),
        (("-c", "k1"), "not both"),
        (("-p", ""), "the prompt is empty"),
        (("--system-prompt-file", "nosuch.txt", "-p", "hi"), "nosuch.txt"),
        (("-p", "hi", "k1", "--system-prompt-file", "nosuch.txt"), "nosuch.txt"),
        (("resume", "k1", "--system-prompt-file", "."), "is a directory"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    home = tmp_path / "home"
    out = kiso(tmp_path, *args, KISO_HOME=str(home), KISO_FAUX_SCRIPT=script(tmp_path))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "ValueError" not in out.stderr
    (line,) = error_lines(out.stderr)
    assert said in line
    assert out.stdout == ""
    assert files_under(home) == []  # nothing was created


def test_the_longest_legal_id_is_accepted(tmp_path: Path) -> None:
    out = kiso(tmp_path, "-p", "hi", ID_128, KISO_FAUX_SCRIPT=script(tmp_path, {"text": "ok"}))
    assert out.returncode == 0, out.stderr


# --- a home kiso cannot write -------------------------------------------------------------------

RUNS: list[tuple[str, ...]] = [
    ("-p", "hi"),
    ("-p", "hi", "--output-format", "json"),
    ("resume", "k1"),
    ("-c", "-p", "hi"),
]


@pytest.mark.parametrize("args", RUNS)
def test_a_home_under_a_file_cannot_be_created_and_says_so(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    home = blocker / "home"
    out = kiso(tmp_path, *args, KISO_HOME=str(home), KISO_FAUX_SCRIPT=script(tmp_path))
    assert out.returncode == 1, out.stderr
    said = out.stderr if "json" not in args else json.loads(out.stdout)["error"]
    assert f"KISO_HOME {home} does not exist and cannot be created" in said
    assert f"{blocker} is not a directory" in said and "point KISO_HOME at" in said
    assert "Traceback" not in out.stderr
    assert len((out.stderr if "json" not in args else out.stdout).strip().splitlines()) == 1


@pytest.mark.parametrize("args", RUNS)
def test_a_read_only_home_says_which_folder_and_what_to_do(
    tmp_path: Path, read_only: Path, args: tuple[str, ...]
) -> None:
    out = kiso(tmp_path, *args, KISO_HOME=str(read_only), KISO_FAUX_SCRIPT=script(tmp_path))
    assert out.returncode == 1, out.stderr
    said = out.stderr if "json" not in args else json.loads(out.stdout)["error"]
    assert f"KISO_HOME {read_only} is read-only" in said and "make it writable" in said
    assert "Traceback" not in out.stderr
    assert len((out.stderr if "json" not in args else out.stdout).strip().splitlines()) == 1


def test_a_missing_home_inside_a_read_only_folder_cannot_be_created(
    tmp_path: Path, read_only: Path
) -> None:
    home = read_only / "home"
    out = kiso(tmp_path, "-p", "hi", KISO_HOME=str(home), KISO_FAUX_SCRIPT=script(tmp_path))
    assert out.returncode == 1, out.stderr
    assert f"KISO_HOME {home} does not exist and cannot be created: {read_only} is read-only" in (
        out.stderr
    )
    assert "Traceback" not in out.stderr


def test_the_interactive_session_with_a_read_only_home_says_so(
    tmp_path: Path, ws: Path, read_only: Path
) -> None:
    term = Term([str(BIN)], cwd=ws, home=read_only)
    try:
        term.wait_for("is read-only", timeout=20)
        assert term.exit_status() == 1
        assert "Traceback" not in term.text and str(read_only) in term.text
    finally:
        term.close()


# --- sessions that do not exist ----------------------------------------------------------------


def test_resume_of_a_missing_session_off_a_terminal_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = kiso(tmp_path, "resume", "nosuch", "a prompt", KISO_HOME=str(home))
    assert out.returncode == 1 and "no session 'nosuch'" in out.stderr
    assert files_under(home) == []


def test_resume_of_a_missing_session_on_a_terminal_creates_nothing(
    tmp_path: Path, ws: Path
) -> None:
    home = tmp_path / "home"
    term = Term([str(BIN), "resume", "nosuch"], cwd=ws, home=home)
    try:
        term.wait_for("no session 'nosuch'", timeout=20)
        assert term.exit_status() == 1
    finally:
        term.close()
    assert files_under(home) == []


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_continue_with_no_session_here_is_exit_1_and_creates_nothing(
    tmp_path: Path, ws: Path, fmt: str
) -> None:
    home = tmp_path / "home"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    s = script(tmp_path, {"text": "hi"})
    assert (
        kiso(elsewhere, "-p", "hi", "other", KISO_HOME=str(home), KISO_FAUX_SCRIPT=s).returncode
        == 0
    )
    before = files_under(home)
    out = kiso(ws, "-c", "-p", "hi", "--output-format", fmt, KISO_HOME=str(home),
               KISO_FAUX_SCRIPT=s)  # fmt: skip
    assert out.returncode == 1, out.stderr
    said = out.stderr if fmt == "text" else json.loads(out.stdout)["error"]
    assert f"no session to continue in {ws}" in said
    assert files_under(home) == before  # the session of the other directory is not touched


def test_continue_on_a_terminal_with_no_session_here_creates_nothing(
    tmp_path: Path, ws: Path
) -> None:
    home = tmp_path / "home"
    term = Term([str(BIN), "-c"], cwd=ws, home=home)
    try:
        term.wait_for("no session to continue", timeout=20)
        assert term.exit_status() == 1
    finally:
        term.close()
    assert files_under(home) == []


# --- -c / --continue ----------------------------------------------------------------------------


def three_sessions(tmp_path: Path, ws: Path, home: Path, s: str) -> None:
    """c2 then c1 here (c1 is the latest here), then c3 in another directory (the latest)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd, sid in ((ws, "c2"), (ws, "c1"), (elsewhere, "c3")):
        out = kiso(cwd, "-p", f"start {sid}", sid, KISO_HOME=str(home), KISO_FAUX_SCRIPT=s)
        assert out.returncode == 0, out.stderr
        time.sleep(0.01)  # distinct update times


@pytest.mark.parametrize("flag", ["-c", "--continue"])
def test_continue_runs_the_prompt_in_the_latest_session_of_this_directory(
    tmp_path: Path, ws: Path, flag: str
) -> None:
    home = tmp_path / "home"
    s = script(tmp_path, *ANSWERS)
    three_sessions(tmp_path, ws, home, s)
    out = kiso(ws, flag, "-p", "and now?", KISO_HOME=str(home), KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0, out.stderr
    assert "session c1 " in out.stderr
    assert users(home, "c1") == ["start c1", "and now?"]
    assert users(home, "c2") == ["start c2"] and users(home, "c3") == ["start c3"]


def test_continue_on_a_terminal_opens_the_latest_session_here_with_a_first_prompt(
    tmp_path: Path, ws: Path
) -> None:
    home = tmp_path / "home"
    s = script(tmp_path, *ANSWERS)
    three_sessions(tmp_path, ws, home, s)
    term = Term([str(BIN), "-c", "what did we do so far"], cwd=ws, home=home, script=Path(s))
    try:
        term.wait_for("answer", timeout=20)
        term.wait_for("▸ ")
        term.send("/exit\r")
        assert term.exit_status() == 0
        assert "kiso resume c1" in term.text
    finally:
        term.close()
    assert users(home, "c1") == ["start c1", "what did we do so far"]
    assert users(home, "c2") == ["start c2"]


# --- prompts on stdin ---------------------------------------------------------------------------


def test_dash_reads_a_prompt_far_past_the_argument_limit_from_stdin(tmp_path: Path) -> None:
    from tests.providers.sse import SSEServer
    from tests.providers.test_openai_compat import text_reply

    home = tmp_path / "home"
    line = "the quick brown fox jumps over the lazy dog · ünïcödé\n"
    prompt = (line * (300 * 1024 // len(line.encode()) + 1)).encode()
    assert len(prompt) > 300 * 1024  # more than twice what one argument may be (128 KiB)
    with SSEServer([text_reply("read it all")]) as server:
        out = piped(
            tmp_path, ("-p", "-", "big"), prompt, KISO_HOME=str(home),
            OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=server.url + "/v1", OPENAI_MODEL="m",
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"read it all\n"
    assert users(home, "big") == [prompt.decode()]  # the log has it whole
    sent = server.requests[0].json["messages"][-1]
    assert sent == {"role": "user", "content": prompt.decode()}  # and so does the model


def test_a_bare_p_reads_the_prompt_from_stdin(tmp_path: Path) -> None:
    home = tmp_path / "home"
    s = script(tmp_path, {"text": "ok"})
    out = piped(tmp_path, ("-p", "--output-format", "json", "b1"), b"text from a pipe\n",
                KISO_HOME=str(home), KISO_FAUX_SCRIPT=s)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result"] == "ok"
    assert users(home, "b1") == ["text from a pipe\n"]


def test_piped_stdin_is_appended_to_the_prompt_after_a_blank_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    s = script(tmp_path, {"text": "explained"}, {"text": "again"})
    body = b"def f():\n    return 1\n"
    out = piped(tmp_path, ("-p", "explain this", "a1"), body, KISO_HOME=str(home),
                KISO_FAUX_SCRIPT=s)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert users(home, "a1") == ["explain this\n\ndef f():\n    return 1\n"]
    alone = piped(tmp_path, ("-p", "and this", "a1"), None, KISO_HOME=str(home),
                  KISO_FAUX_SCRIPT=s)  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    assert users(home, "a1")[-1] == "and this"  # /dev/null: nothing appended, no wait


def test_attachments_are_read_from_the_typed_prompt_never_from_piped_text(
    tmp_path: Path,
) -> None:
    """`git diff | kiso -p review`: a hostile diff naming @~/.kiso/auth.json must not pull the
    file into the prompt; the typed prompt's own @path still attaches."""
    home = tmp_path / "home"
    secret = tmp_path / "secret.txt"
    secret.write_text("sk-SECRET-9999\n")
    (tmp_path / "notes.txt").write_text("NOTES BODY\n")
    s = script(tmp_path, {"text": "a"}, {"text": "b"}, {"text": "c"})
    hostile = f"+ see @{secret} and file://{secret}\n".encode()
    env = {"KISO_HOME": str(home), "KISO_FAUX_SCRIPT": s}
    for args in (("-p", "review this", "p1"), ("-p", "-", "p1"), ("-p", "read @notes.txt", "p1")):
        out = piped(tmp_path, args, hostile, **env)
        assert out.returncode == 0, out.stderr
        assert b"attached" not in out.stderr or b"notes.txt" in out.stderr
    log = b"".join(f.read_bytes() for f in home.glob("projects/*/p1.jsonl"))
    assert b"sk-SECRET-9999" not in log  # piped text was sent as it came
    assert log.count(f"@{secret}".encode()) == 3  # ... verbatim, each time
    assert b"NOTES BODY" in log  # the typed prompt's attachment still works


def test_a_stdin_pipe_nobody_writes_to_does_not_hang_a_prompt(tmp_path: Path) -> None:
    home = tmp_path / "home"
    s = script(tmp_path, {"text": "went ahead"})
    base = {k: v for k, v in os.environ.items() if k not in KEYS}
    proc = subprocess.Popen(
        [str(BIN), "-p", "go", "h1"],
        cwd=tmp_path,
        env={**base, "KISO_HOME": str(home), "KISO_FAUX_SCRIPT": s},
        stdin=subprocess.PIPE,  # held open and never written: a launcher that forgot stdin
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        began = time.monotonic()
        code = proc.wait(30)
        assert time.monotonic() - began < 20  # it waited a moment for input, then went on
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout.read(), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
    assert code == 0, stderr
    assert stdout == b"went ahead\n"
    assert b"nothing arrived on stdin" in stderr
    assert users(home, "h1") == ["go"]


@pytest.mark.parametrize(("args", "data"), [(("-p",), b""), (("-p", "-"), b" \n")])
def test_an_empty_prompt_on_stdin_is_a_usage_error(
    tmp_path: Path, args: tuple[str, ...], data: bytes
) -> None:
    home = tmp_path / "home"
    out = piped(tmp_path, args, data, KISO_HOME=str(home))
    assert out.returncode == 2
    (line,) = error_lines(out.stderr.decode())
    assert "the prompt read from stdin is empty" in line
    assert files_under(home) == []


def test_a_bare_p_on_a_terminal_asks_for_a_prompt(tmp_path: Path, ws: Path) -> None:
    home = tmp_path / "home"
    term = Term([str(BIN), "-p"], cwd=ws, home=home)
    try:
        term.wait_for("needs a prompt", timeout=20)
        assert term.exit_status() == 2
    finally:
        term.close()
    assert files_under(home) == []


# --- stdout is the answer -----------------------------------------------------------------------


def test_text_output_is_the_final_answer_alone_on_stdout(tmp_path: Path) -> None:
    s = script(
        tmp_path,
        {"text": "Let me look around first.", "tool_calls": [{"name": "list_dir", "input": {}}]},
        {"text": "I will try a command.",
         "tool_calls": [{"name": "shell", "input": {"command": "touch made.txt"}}]},
        {"text": "There are two files."},
    )  # fmt: skip
    out = kiso(tmp_path, "-p", "what is here?", "o1", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "There are two files.\n"
    err = out.stderr
    for said in ("session o1 ", "Let me look around first.", "I will try a command.",
                 "[list_dir]", "denied shell", "3 model turns"):  # fmt: skip
        assert said in err
    assert "There are two files." not in err
    assert not (tmp_path / "made.txt").exists()


def test_text_output_of_a_resumed_run_and_a_prompt_is_the_last_answer(tmp_path: Path) -> None:
    s = script(tmp_path, {"text": "first answer"}, {"text": "second answer"})
    assert kiso(tmp_path, "-p", "one", "o2", KISO_FAUX_SCRIPT=s).stdout == "first answer\n"
    out = kiso(tmp_path, "-p", "two", "o2", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 0 and out.stdout == "second answer\n"


def test_json_and_stream_json_keep_everything_on_stdout(tmp_path: Path) -> None:
    s = script(
        tmp_path,
        {"text": "Looking.", "tool_calls": [{"name": "list_dir", "input": {}}]},
        {"text": "Done looking."},
    )
    one = kiso(tmp_path, "-p", "go", "--output-format", "json", KISO_FAUX_SCRIPT=s)
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["result"] == "Done looking."
    lines = [json.loads(line) for line in kiso(
        tmp_path, "-p", "go", "--output-format", "stream-json", KISO_FAUX_SCRIPT=s
    ).stdout.splitlines()]  # fmt: skip
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "note" and kinds[-1] == "result" and "text_delta" in kinds
    assert "model_turn" in kinds and "tool_start" in kinds


# --- --append-system-prompt and --system-prompt-file -------------------------------------------

DRIVER = """
import json, sys
import kiso.cli.print_mode as print_mode
import kiso.cli.repl as repl

def stub(kind):
    def run(*args, **kw):
        o = kw.pop("options", None)
        kw["options"] = None if o is None else [o.append_system_prompt, o.system_prompt_file]
        kw["prompt"] = args[0] if args else kw.get("prompt")
        given = kw["prompt"]
        if hasattr(given, "typed"):  # a headless PromptInput: the typed and the piped parts
            kw["prompt"] = (chr(10) * 2).join(x for x in (given.typed, given.piped) if x)
        print("CALLED", kind, json.dumps(kw, sort_keys=True), flush=True)
        return 0
    return run

print_mode.run_headless = stub("headless")
repl.run_interactive = stub("interactive")
sys.argv = ["kiso", *sys.argv[1:]]
from kiso.cli.main import main
main()
"""


def called(stdout: str) -> tuple[str, dict[str, Any]]:
    (line,) = [x for x in stdout.splitlines() if x.startswith("CALLED ")]
    _, kind, payload = line.split(" ", 2)
    return kind, json.loads(payload)


def drive(cwd: Path, *args: str) -> tuple[str, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    return called(out.stdout)


@pytest.mark.parametrize(
    "args",
    [
        ("--append-system-prompt", "Be brief.", "--system-prompt-file", "sys.md", "-p", "hi"),
        ("-p", "hi", "k1", "--append-system-prompt", "Be brief.", "--system-prompt-file", "sys.md"),
        ("chat", "k1", "-p", "hi", "--append-system-prompt", "Be brief.",
         "--system-prompt-file", "sys.md"),
        ("resume", "k1", "hi", "--append-system-prompt", "Be brief.",
         "--system-prompt-file", "sys.md"),
        ("--append-system-prompt", "Be brief.", "--system-prompt-file", "sys.md",
         "resume", "k1", "hi"),
    ],
)  # fmt: skip
def test_the_system_prompt_flags_reach_a_headless_run(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    (tmp_path / "sys.md").write_text("You are terse.")
    kind, kw = drive(tmp_path, *args)
    assert kind == "headless"
    assert kw["options"] == ["Be brief.", str((tmp_path / "sys.md").resolve())]
    assert kw["prompt"] == "hi"


def test_no_system_prompt_flags_pass_no_options(tmp_path: Path) -> None:
    assert drive(tmp_path, "-p", "hi")[1]["options"] is None


@pytest.mark.parametrize(
    "args",
    [
        ("--append-system-prompt", "Be brief.", "--system-prompt-file", "sys.md"),
        ("k1", "--append-system-prompt", "Be brief.", "--system-prompt-file", "sys.md"),
        ("--system-prompt-file", "sys.md", "--append-system-prompt", "Be brief.", "fix it now"),
    ],
)
def test_the_system_prompt_flags_reach_the_interactive_session(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    (tmp_path / "sys.md").write_text("You are terse.")
    term = Term([sys.executable, "-c", DRIVER, *args], cwd=tmp_path, home=tmp_path / "home")
    try:
        assert term.exit_status(20) == 0
        kind, kw = called(term.raw.decode().replace("\r\n", "\n"))
    finally:
        term.close()
    assert kind == "interactive"
    assert kw["options"] == ["Be brief.", str((tmp_path / "sys.md").resolve())]
    assert kw["prompt"] == ("fix it now" if "fix it now" in args else None)


def test_a_prompt_bigger_than_the_window_is_refused_and_creates_no_session(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    s = script(tmp_path, {"text": "never"})
    out = piped(
        tmp_path, ("-p", "-", "toobig"), b"word " * 4000, KISO_HOME=str(home),
        KISO_FAUX_SCRIPT=s, KISO_CONTEXT_WINDOW="3000",
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    said = out.stderr.decode()
    assert "~5,00" in said and "3,000 tokens (set by KISO_CONTEXT_WINDOW)" in said
    assert "nothing was recorded" in said
    assert not list(home.rglob("toobig.*"))  # no log, no lock: `kiso sessions` shows nothing


def test_resume_with_a_dash_reads_the_prompt_from_stdin(tmp_path: Path) -> None:
    """As ``-p -`` does: the literal ``-`` is never the prompt."""
    home = tmp_path / "home"
    s = script(tmp_path, {"text": "first"}, {"text": "second"})
    env = {"KISO_HOME": str(home), "KISO_FAUX_SCRIPT": s}
    assert piped(tmp_path, ("-p", "one", "r1"), None, **env).returncode == 0
    out = piped(tmp_path, ("resume", "r1", "-"), b"two, from a pipe\n", **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"second\n"
    assert users(home, "r1") == ["one", "two, from a pipe\n"]
    empty = piped(tmp_path, ("resume", "r1", "-"), b"  \n", **env)
    assert empty.returncode == 2
    (line,) = error_lines(empty.stderr.decode())
    assert "the prompt read from stdin is empty" in line
    assert users(home, "r1") == ["one", "two, from a pipe\n"]


def test_resume_with_a_dash_on_a_terminal_asks_for_a_pipe(tmp_path: Path, ws: Path) -> None:
    home = tmp_path / "home"
    s = script(tmp_path, {"text": "first"})
    assert (
        piped(ws, ("-p", "one", "r2"), None, KISO_HOME=str(home), KISO_FAUX_SCRIPT=s).returncode
        == 0
    )
    term = Term([str(BIN), "resume", "r2", "-"], cwd=ws, home=home)
    try:
        term.wait_for("reads the prompt from stdin", timeout=20)
        assert term.exit_status() == 2
    finally:
        term.close()
    assert users(home, "r2") == ["one"]
