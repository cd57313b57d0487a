"""The floor reports every destructive command in a line, whatever it aims at.

`destructive_commands` walks the floor's own parse (tree-sitter-bash), through the same wrappers,
shells and fallback scan, and returns one `Destruction` per destructive simple command. Pure: the
paths are fake and nothing touches the file system.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiso.runtime import floor
from kiso.runtime.floor import IRREVERSIBLE, KINDS, Destruction, destructive_commands
from tests.runtime.test_floor import ALLOWED, BENIGN, HOME, REFUSED, SHELL_TEXT, WORKSPACE, check

INTERNAL_FAILURE = "could not be analysed"


def found(command: str, cwd: Path | None = None) -> tuple[Destruction, ...]:
    return destructive_commands(command, workspace=WORKSPACE, home=HOME, cwd=cwd)


def kinds(command: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(d.kind, d.targets) for d in found(command)]


RM_R = "rm -r"
X = ("<xargs input>",)

FORMS: list[tuple[str, list[tuple[str, tuple[str, ...]]]]] = [
    # rm, recursive or not, whatever the target
    ("rm notes.txt", [("rm", ("notes.txt",))]),
    ("rm -f a.txt b.txt", [("rm", ("a.txt", "b.txt"))]),
    ("rm -r build", [(RM_R, ("build",))]),
    ("rm -rf build dist", [(RM_R, ("build", "dist"))]),
    ("rm -fr out", [(RM_R, ("out",))]),
    ("rm -R out", [(RM_R, ("out",))]),
    ("rm --recursive out", [(RM_R, ("out",))]),
    ("rm --rec out", [(RM_R, ("out",))]),
    ("rm -v -r -f out", [(RM_R, ("out",))]),
    ("rm out -rf", [(RM_R, ("out",))]),  # GNU rm takes options anywhere
    ("rm -- -rf", [("rm", ("-rf",))]),
    ("rm -rf /tmp/probe", [(RM_R, ("/tmp/probe",))]),
    ("rm -rf ~", [(RM_R, ("~",))]),
    ('rm -rf "my dir"', [(RM_R, ('"my dir"',))]),
    ("rm -rf build/$X", [(RM_R, ("build/$X",))]),
    ("rm x 2>/dev/null y", [("rm", ("x", "y"))]),
    ("/bin/rm -rf out", [(RM_R, ("out",))]),
    ("\\rm -rf out", [(RM_R, ("out",))]),
    ('"rm" -rf out', [(RM_R, ("out",))]),
    # find that deletes, selecting or not
    ("find . -name '*.o' -delete", [("find -delete", (".",))]),
    ("find build -delete", [("find -delete", ("build",))]),
    ("find -delete", [("find -delete", ())]),
    ("find /tmp/x -type f -mtime +7 -delete", [("find -delete", ("/tmp/x",))]),
    ("find . -name '*.pyc' -exec rm {} +", [("find -exec rm", (".",))]),
    ("find . -name __pycache__ -exec rm -rf {} \\;", [("find -exec rm", (".",))]),
    ("find . -exec sudo rm -f {} \\;", [("find -exec rm", (".",))]),
    ("find src -okdir rm {} \\;", [("find -exec rm", ("src",))]),
    ("find . -exec sh -c 'rm -rf {}' \\;", [(RM_R, ("{}",))]),
    ("find . -exec git checkout {} \\;", [("git checkout --", ("{}",))]),
    ("find . -name x -exec find {} -delete \\;", [("find -delete", ("{}",))]),
    # git commands that discard work, wherever they run
    ("git clean -f", [("git clean -f", ())]),
    ("git clean -fdx", [("git clean -f", ())]),
    ("git clean -d -f src/", [("git clean -f", ("src/",))]),
    ("git clean -f -e '*.log' build", [("git clean -f", ("build",))]),
    ("git -C /tmp/x clean -fdx", [("git clean -f", ())]),
    ("git reset --hard", [("git reset --hard", ())]),
    ("git reset --hard HEAD~1", [("git reset --hard", ())]),
    ("git -C repo reset --hard", [("git reset --hard", ())]),
    ("cd /tmp/x && git reset --hard", [("git reset --hard", ())]),
    ("git checkout -- src/a.py", [("git checkout --", ("src/a.py",))]),
    ("git checkout -- .", [("git checkout --", (".",))]),
    ("git checkout .", [("git checkout --", (".",))]),
    ("git checkout HEAD -- a b", [("git checkout --", ("a", "b"))]),
    ("git checkout main README.md", [("git checkout --", ("README.md",))]),
    ("git checkout --theirs f.txt", [("git checkout --", ("f.txt",))]),
    ("git checkout -f main", [("git checkout -f", ())]),
    ("git checkout --force main", [("git checkout -f", ())]),
    ("git restore .", [("git restore", (".",))]),
    ("git restore -s HEAD~1 src/", [("git restore", ("src/",))]),
    ("git restore --staged --worktree f", [("git restore", ("f",))]),
    ("git switch -f dev", [("git switch -f", ())]),
    ("git switch --discard-changes dev", [("git switch -f", ())]),
    ("/usr/bin/git reset --hard", [("git reset --hard", ())]),
    # every simple command anywhere in the tree
    ("make && rm -rf out", [(RM_R, ("out",))]),
    ("make; rm -rf out", [(RM_R, ("out",))]),
    ("false || rm -rf out", [(RM_R, ("out",))]),
    ("ls | rm -rf out", [(RM_R, ("out",))]),
    ("(cd build && rm -rf out)", [(RM_R, ("out",))]),
    ("{ rm -rf out; }", [(RM_R, ("out",))]),
    ("echo $(rm -rf out)", [(RM_R, ("out",))]),
    ("echo `rm -rf out`", [(RM_R, ("out",))]),
    ("diff <(rm -rf out) x", [(RM_R, ("out",))]),
    ("X=$(git reset --hard) true", [("git reset --hard", ())]),
    ("if true; then rm -rf out; fi", [(RM_R, ("out",))]),
    ("for d in a b; do rm -rf $d; done", [(RM_R, ("$d",))]),
    ("while true; do git clean -fd; done", [("git clean -f", ())]),
    ("case $x in a) rm x;; esac", [("rm", ("x",))]),
    ("f() { rm -rf out; }", [(RM_R, ("out",))]),
    ("rm -rf out > /dev/null 2>&1", [(RM_R, ("out",))]),
    ("ls\nrm -rf out\n", [(RM_R, ("out",))]),
    (
        "rm -rf a; git reset --hard; rm b",
        [(RM_R, ("a",)), ("git reset --hard", ()), ("rm", ("b",))],
    ),
    # shells, eval and here-documents: the script is read too
    ('sh -c "rm -rf build"', [(RM_R, ("build",))]),
    ("bash -c 'rm -rf build'", [(RM_R, ("build",))]),
    ("bash -lc 'git reset --hard'", [("git reset --hard", ())]),
    ('sh -c "sh -c \\"rm -rf out\\""', [(RM_R, ("out",))]),
    ("eval 'rm -rf build'", [(RM_R, ("build",))]),
    ("eval rm -rf build", [(RM_R, ("build",))]),
    ("bash <<EOF\nrm -rf out\nEOF", [(RM_R, ("out",))]),
    ("sh <<'EOF'\ncd /tmp/x\ngit clean -f\nEOF", [("git clean -f", ())]),
    ('sh <<<"rm -rf out"', [(RM_R, ("out",))]),
    ("env -S 'rm -rf out'", [(RM_R, ("out",))]),
    # xargs: the names come from its input
    ("ls | xargs rm -r", [(RM_R, X)]),
    ("ls | xargs rm", [("rm", X)]),
    ("find . -name '*.pyc' | xargs rm -f", [("rm", X)]),
    ("xargs -0 -n 1 rm -rf < list.txt", [(RM_R, X)]),
    ("ls | xargs sudo rm -rf", [(RM_R, X)]),
    # wrappers
    ("sudo rm -rf /var/lib", [(RM_R, ("/var/lib",))]),
    ("sudo -u root -- rm -rf out", [(RM_R, ("out",))]),
    ("doas rm -rf out", [(RM_R, ("out",))]),
    ("env rm -rf out", [(RM_R, ("out",))]),
    ("env VAR=x rm -rf out", [(RM_R, ("out",))]),
    ("FOO=1 rm -rf out", [(RM_R, ("out",))]),
    ("nice -n 10 rm -rf out", [(RM_R, ("out",))]),
    ("nohup rm -rf out &", [(RM_R, ("out",))]),
    ("time rm -rf out", [(RM_R, ("out",))]),
    ("timeout 10 rm -rf out", [(RM_R, ("out",))]),
    ("command rm -rf out", [(RM_R, ("out",))]),
    ("builtin rm -rf out", [(RM_R, ("out",))]),
    ("exec rm -rf out", [(RM_R, ("out",))]),
    ("busybox rm -rf out", [(RM_R, ("out",))]),
    ("sudo nice -n 5 env X=1 git reset --hard", [("git reset --hard", ())]),
    # what the parser cannot read is scanned, conservatively
    ("echo ((( rm -rf out", [(RM_R, ("out",))]),
    ('rm -rf out "unterminated', [(RM_R, ("out", '"unterminated'))]),
    ("echo 'oops; rm -rf out", [(RM_R, ("out",))]),
    ('sh -c "rm -rf out', [(RM_R, ("out",))]),
    ("if then rm -rf out fi fi", [(RM_R, ("out", "fi", "fi"))]),
    # the same command twice is one destruction
    ("rm -rf out; rm -rf out", [(RM_R, ("out",))]),
    ("rm -rf out; rm -rf 'out'", [(RM_R, ("out",))]),
]

HARMLESS: list[str] = [
    "echo rm -rf x",
    "echo 'rm -rf x'",
    'echo "rm -rf x"',
    "printf '%s\\n' 'git reset --hard'",
    "grep -r rm .",
    'grep -r "rm -rf" .',
    "git checkout main",
    "git checkout -b feature origin/main",
    "git checkout -",
    "git checkout --",
    "git switch dev",
    "git reset",
    "git reset --soft HEAD~1",
    "git clean -n",
    "git clean -fn",
    "git clean --dry-run -f",
    "git commit -m 'rm -rf ~ is dangerous'",
    "git status && git diff",
    "git rm --cached x",
    "rm",
    "rm -rf",
    "find .",
    "find . -name '*.py'",
    "find . -exec cat {} +",
    "command -v rm",
    "type rm",
    "man rm",
    "which rm",
    "docker rm container",
    "kubectl delete pod x",
    "npm run clean",
    "bash script.sh",
    "cat <<'EOF'\nrm -rf ~\nEOF",
    "rm() { echo nope; }",
    "# rm -rf ~",
    "ls -la",
    "pytest -q",
    "",
    "   ",
]


@pytest.mark.parametrize(("command", "expected"), FORMS)
def test_every_form_is_found(command: str, expected: list[tuple[str, tuple[str, ...]]]) -> None:
    assert kinds(command) == expected


@pytest.mark.parametrize("command", HARMLESS)
def test_mentioning_is_not_deleting(command: str) -> None:
    assert found(command) == ()


@pytest.mark.parametrize(("command", "expected"), FORMS)
def test_irreversible_is_the_kind_and_a_warning_is_one_line(
    command: str, expected: list[tuple[str, tuple[str, ...]]]
) -> None:
    for d in found(command):
        assert d.kind in KINDS
        assert d.irreversible == (d.kind in IRREVERSIBLE)
        assert d.warning and "\n" not in d.warning
        assert d.command


@pytest.mark.parametrize(
    ("command", "irreversible"),
    [
        ("rm -rf build", True),
        ("rm -r build", True),
        ("rm build", False),
        ("rm -f build", False),
        ("find . -delete", True),
        ("find . -name '*.o' -exec rm {} +", True),
        ("git clean -f", True),
        ("git reset --hard", True),
        ("git checkout -- .", True),
        ("git checkout -f main", False),
        ("git restore .", False),
        ("git switch -f dev", False),
    ],
)
def test_the_irreversible_ones_are_those_the_document_names(
    command: str, irreversible: bool
) -> None:
    (d,) = found(command)
    assert d.irreversible is irreversible


@pytest.mark.parametrize(
    ("command", "warning"),
    [
        ("rm -rf build dist", "rm deletes build, dist and everything inside"),
        ("rm notes.txt", "rm deletes notes.txt"),
        ("ls | xargs rm -r", "rm deletes the names xargs reads and everything inside"),
        ("find . -name '*.o' -delete", "find -delete deletes what it matches under ."),
        ("find build -delete", "find -delete deletes everything under build"),
        ("find -delete", "find -delete deletes everything under the current directory"),
        ("find . -name '*.pyc' -exec rm {} +", "find -exec rm deletes what it matches under ."),
        (
            "find . -name x -exec rm -rf {} +",
            "find -exec rm deletes what it matches under . and everything inside",
        ),
        (
            "git reset --hard",
            "git reset --hard discards every uncommitted change in the working tree",
        ),
        ("git checkout -- src/a.py", "git checkout -- discards uncommitted changes to src/a.py"),
        ("git checkout .", "git checkout -- discards uncommitted changes to ."),
        ("git clean -f", "git clean deletes untracked files"),
        ("git clean -fd src", "git clean deletes untracked files and directories in src"),
        ("git clean -fdx", "git clean deletes untracked files and directories (ignored ones too)"),
        ("git clean -fX", "git clean deletes ignored files"),
        ("git restore src/", "git restore discards uncommitted changes to src/"),
        (
            "git switch -f dev",
            "git switch -f discards every uncommitted change in the working tree",
        ),
    ],
)
def test_the_warning_names_what_goes(command: str, warning: str) -> None:
    (d,) = found(command)
    assert d.warning == warning


@pytest.mark.parametrize(
    ("command", "simple"),
    [
        ("ls && sudo rm -rf /var/lib", "sudo rm -rf /var/lib"),
        ("sh -c 'echo; rm -rf out'", "rm -rf out"),
        ("echo x | xargs rm -rf", "xargs rm -rf"),
        ("echo $(git reset --hard)", "git reset --hard"),
        ("find . -name x -delete -print", "find . -name x -delete -print"),
    ],
)
def test_each_names_its_simple_command_as_written(command: str, simple: str) -> None:
    (d,) = found(command)
    assert d.command == simple


def test_shells_nested_too_deeply_are_unreadable_and_irreversible() -> None:
    command = "echo harmless"
    for _ in range(9):
        command = "bash -c " + shlex.quote(command)
    (d,) = found(command)
    assert (d.kind, d.irreversible) == ("unreadable", True)
    assert "nested too deeply" in d.warning and "may delete anything" in d.warning


def test_a_line_too_long_and_garbled_is_unreadable() -> None:
    command = "((( " + "rm -rf x " * 30_000
    assert any(d.kind == "unreadable" for d in found(command))


def test_it_never_raises_it_answers_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(floor._Places, "of", broken)
    (d,) = found("ls")
    assert (d.kind, d.irreversible) == ("unreadable", True)
    assert INTERNAL_FAILURE in d.warning


def test_the_target_does_not_matter_nor_where_it_runs() -> None:
    for cwd in (None, Path("/tmp/x"), Path("build"), HOME):
        assert [d.kind for d in found("rm -rf * && git reset --hard", cwd)] == [
            RM_R,
            "git reset --hard",
        ]


# --------------------------------------------------------------------------------------------
# Properties: whatever the floor refuses is destructive


@pytest.mark.parametrize(("command", "why"), REFUSED)
def test_every_command_the_floor_refuses_is_destructive(command: str, why: str) -> None:
    assert check(command) is not None
    assert found(command) != ()


@pytest.mark.parametrize("command", ALLOWED)
def test_the_floor_allows_what_it_finds_harmless_and_destructive_commands_alike(
    command: str,
) -> None:
    assert check(command) is None
    for d in found(command):
        assert d.kind in KINDS and d.kind != "unreadable"


@given(st.one_of(st.text(), SHELL_TEXT))
def test_arbitrary_text_a_refusal_is_always_destructive_and_nothing_raises(command: str) -> None:
    destructions = found(command)
    assert all(INTERNAL_FAILURE not in d.warning for d in destructions)
    if check(command) is not None:
        assert destructions != ()


@given(BENIGN)
def test_benign_commands_have_none_until_a_delete_is_appended(command: str) -> None:
    assert found(command) == ()
    assert kinds(command + "; rm -rf build") == [(RM_R, ("build",))]
    assert kinds(f"sh -c '{command.replace(chr(39), '')}; rm notes.txt'")[-1] == (
        "rm",
        ("notes.txt",),
    )


@given(
    st.sampled_from(["sudo", "env", "nice", "nohup", "time", "command", "exec", "doas", "xargs"]),
    st.sampled_from(["rm -rf out", "git reset --hard", "find . -delete", "rm x"]),
    st.sampled_from(["{}", "( {} )", "echo $({})", "sh -c '{}'", "true && {}", "ls | {}"]),
)
def test_a_destructive_command_is_found_however_it_is_wrapped_and_nested(
    wrapper: str, destructive: str, around: str
) -> None:
    plain = found(destructive)
    wrapped = found(around.format(f"{wrapper} {destructive}"))
    assert [d.kind for d in wrapped] == [d.kind for d in plain]
