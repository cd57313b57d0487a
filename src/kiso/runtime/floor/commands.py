"""Commands: one simple command, after its wrappers.

The destructive ones (``rm``, ``git``, ``find -delete``/``-exec``), the ones that run a script
(shells, ``eval``), and the wrappers that run another command (``sudo``, ``env``, ``xargs``...).
Each destructive one is also noted with :meth:`Checker.record`, whatever its target, for
:func:`kiso.runtime.floor.destructive_commands`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from kiso.runtime.floor.destruction import IRREVERSIBLE, Destruction
from kiso.runtime.floor.parse import tolerant_tokens
from kiso.runtime.floor.places import inside
from kiso.runtime.floor.refusal import Refusal
from kiso.runtime.floor.words import Cwds, Unknown, Word, judge, resolve_target, token_word

if TYPE_CHECKING:
    from kiso.runtime.floor.checker import Checker

__all__ = ["CHECKED", "Call", "check_call", "command_name", "leading_options"]


@dataclass(frozen=True, slots=True)
class Call:
    words: tuple[Word, ...]
    """The command name first, then its arguments."""
    cwds: Cwds
    text: str
    """The simple command as written."""
    stdin: tuple[str, ...] = ()
    """Here-documents and here-strings given to it: the script, should it be a shell."""

    @property
    def display(self) -> str:
        text = " ".join(self.text.split())
        return text if len(text) <= 100 else text[:97] + "..."


def command_name(word: Word) -> str | None:
    value = word.value
    return None if value is None else value.rsplit("/", 1)[-1]


def leading_options(
    words: Sequence[Word], start: int, with_arg: str = "", long_with_arg: Iterable[str] = ()
) -> tuple[list[tuple[str, Word | None]], int]:
    """Parse leading options: ``(flag, value)`` pairs and the index of the first operand.

    Short flags are split (``-iu root`` gives ``-i`` and ``-u root``); ``with_arg`` lists the
    short flags, ``long_with_arg`` the long ones, that take a value.
    """
    found: list[tuple[str, Word | None]] = []
    i = start
    while i < len(words):
        text = words[i].value
        if text is None or text == "-" or not text.startswith("-"):
            break
        i += 1
        if text == "--":
            break
        if text.startswith("--"):
            name, eq, value = text.partition("=")
            if eq:
                found.append((name, Word(value, (("raw", value),))))
            elif name in long_with_arg:
                found.append((name, words[i] if i < len(words) else None))
                i += 1
            else:
                found.append((name, None))
            continue
        for k, char in enumerate(text[1:], start=2):
            if char not in with_arg:
                found.append(("-" + char, None))
                continue
            attached = text[k:]
            if attached:
                found.append(("-" + char, Word(attached, (("raw", attached),))))
            else:
                found.append(("-" + char, words[i] if i < len(words) else None))
                i += 1
            break
    return found, i


_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")


def _skip_assignments(words: Sequence[Word], i: int) -> int:
    while i < len(words) and _ASSIGNMENT.match(words[i].text):
        i += 1
    return i


_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh"})
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_FIND_SELECTORS = frozenset(
    {
        *("-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex"),
        *("-type", "-xtype", "-lname", "-ilname", "-newer", "-anewer", "-cnewer", "-used"),
        *("-mtime", "-mmin", "-atime", "-amin", "-ctime", "-cmin", "-size", "-empty", "-user"),
        *("-group", "-uid", "-gid", "-nouser", "-nogroup", "-perm", "-links", "-inum"),
        *("-samefile", "-fstype", "-readable", "-writable", "-executable", "-context"),
    }
)
_XARGS_INPUT = Word("<xargs input>", (("raw", "*"),))
"""What xargs adds to its command: names read from its input, taken as anything in cwd."""


# -- one simple command ----------------------------------------------------------------------


def check_call(checker: Checker, call: Call) -> Refusal | None:
    """The refusal for one simple command, seen through its wrappers, or ``None``."""
    unwrapped = unwrap(checker, call)
    if unwrapped is None:
        return None
    call = unwrapped
    name = command_name(call.words[0])
    if name == "rm":
        return _rm(checker, call)
    if name == "git":
        return _git(checker, call)
    if name == "find":
        return _find(checker, call)
    if name in _SHELLS:
        return _shell(checker, call)
    if name == "eval":
        return checker.script(" ".join(w.script for w in call.words[1:]), call.cwds, call)
    return None


def unwrap(checker: Checker, call: Call) -> Call | None:
    """The command its wrappers run (``sudo rm x`` runs ``rm x``), or ``None`` if it runs none.

    What ``xargs`` runs gets one more argument, :data:`_XARGS_INPUT`: the names it reads.
    """
    through_xargs = False
    for _ in range(32):
        if not call.words:
            return None
        name = command_name(call.words[0])
        unwrapper = _WRAPPERS.get(name or "")
        if unwrapper is None:
            break
        inner = unwrapper(checker, call)
        if inner is None:
            return None
        through_xargs = through_xargs or name == "xargs"
        call = inner
    if not call.words:
        return None
    if through_xargs:
        call = replace(call, words=(*call.words, _XARGS_INPUT))
    return call


def _note(checker: Checker, kind: str, call: Call, targets: Sequence[Word], warning: str) -> None:
    """Record a destructive command for :func:`destructive_commands`, whatever its target."""
    texts = tuple(word.text for word in targets)
    checker.record(Destruction(kind, call.text, texts, kind in IRREVERSIBLE, warning))


def _names(targets: Sequence[Word]) -> str:
    """The targets as written, for a person: ``build, dist``."""
    return ", ".join(
        "the names xargs reads" if word is _XARGS_INPUT else word.text for word in targets
    )


def _target(checker: Checker, call: Call, word: Word) -> Refusal | None:
    """Refuse deleting ``word`` if it may name something unrecoverable."""
    found = resolve_target(word, call.cwds, checker.places.home)
    if isinstance(found, Unknown):
        return Refusal(
            f"{call.display} was refused: its target {word.text} {found.why}, so it could"
            " name something that cannot be recovered",
            call.text,
            word.text,
        )
    for location in found:
        what = judge(checker.places, location, checker.dots)
        if what is not None:
            modal = "could" if location.rest else "would"
            return Refusal(
                f"{call.display} {modal} delete {what}, which cannot be recovered",
                call.text,
                word.text,
            )
    return None


# -- rm --------------------------------------------------------------------------------------


def _rm(checker: Checker, call: Call) -> Refusal | None:
    """``rm``, recursive or not: each operand is a target (GNU rm takes options anywhere)."""
    words = call.words
    end = next((i for i, w in enumerate(words) if w.value == "--"), len(words))
    operands = [
        w for w in words[1:end] if w.value is None or w.value == "-" or not w.value.startswith("-")
    ]
    targets = (*operands, *words[end + 1 :])
    if targets:
        values = (w.value for w in words[1:end])
        flags = [v for v in values if v is not None and v.startswith("-") and v != "-"]
        if any(_recursive(flag) for flag in flags):
            said = f"rm deletes {_names(targets)} and everything inside"
            _note(checker, "rm -r", call, targets, said)
        else:
            _note(checker, "rm", call, targets, f"rm deletes {_names(targets)}")
    for word in targets:
        refusal = _target(checker, call, word)
        if refusal is not None:
            return refusal
    return None


def _recursive(flag: str) -> bool:
    """``-r``, ``-R``, ``-rf``, ``--recursive`` (or a prefix of it, as getopt allows)."""
    if flag.startswith("--"):
        return len(flag) >= 3 and "--recursive".startswith(flag)
    return "r" in flag or "R" in flag


# -- git -------------------------------------------------------------------------------------


def _git(checker: Checker, call: Call) -> Refusal | None:
    """Commands that discard work git cannot give back, run in or above the workspace."""
    words, cwds, i = call.words, call.cwds, 1
    while i < len(words):
        value = words[i].value
        if value is None or not value.startswith("-"):
            break
        following = words[i + 1] if i + 1 < len(words) else None
        if value in ("-C", "--work-tree"):
            cwds, i = checker.directory(following, cwds), i + 2
        elif value.startswith("--work-tree="):
            path = value.partition("=")[2]
            cwds, i = checker.directory(Word(path, (("raw", path),)), cwds), i + 1
        elif value in ("-c", "--git-dir", "--namespace", "--super-prefix", "--config-env"):
            i += 2
        else:
            i += 1
    if i >= len(words):
        return None
    offence = _git_offence(words[i], words[i + 1 :])
    if offence is None:
        return None
    _note(checker, offence.kind, call, offence.paths, offence.warning)
    where = _repository_at_risk(checker, cwds)
    if where is None:
        return None
    return Refusal(
        f"{call.display} would discard {offence.what} in {where}, which git cannot recover",
        call.text,
        offence.target,
    )


def _repository_at_risk(checker: Checker, cwds: Cwds) -> str | None:
    workspace = checker.places.workspace
    if cwds is None:
        return "a directory only known when the command runs, which may be the workspace"
    for cwd in sorted(cwds):
        if inside(cwd, workspace):
            return f"the workspace ({workspace})"
        if inside(workspace, cwd):
            return f"the repository at {cwd} (it may hold the workspace)"
    return None


class _Offence(NamedTuple):
    target: str
    """The offending argument as written (the refusal's target)."""
    what: str
    """What is lost, for the refusal: "uncommitted changes"."""
    kind: str
    paths: tuple[Word, ...]
    """What it discards, as written; empty for the whole working tree."""
    warning: str


_WHOLE_TREE = "discards every uncommitted change in the working tree"


def _operands(words: Sequence[Word], with_arg: Iterable[str] = ()) -> tuple[Word, ...]:
    """The words that are not options, skipping the values of the options in ``with_arg``."""
    takes = frozenset(with_arg)
    found: list[Word] = []
    skip = False
    for word in words:
        value = word.value
        if skip:
            skip = False
        elif value is not None and value.startswith("-") and value != "-":
            skip = value in takes
        else:
            found.append(word)
    return tuple(found)


def _git_offence(sub: Word, args: Sequence[Word]) -> _Offence | None:
    """What is lost, and how to say it, if this git subcommand discards work."""
    name = sub.value
    dashdash = next((i for i, w in enumerate(args) if w.value == "--"), len(args))
    options = [w for w in args[:dashdash] if (w.value or "").startswith("-")]
    after = tuple(args[dashdash + 1 :])

    def short_flag(flag: str, stops: str) -> Word | None:
        for word in options:
            value = word.value or ""
            if value.startswith("--"):
                continue
            for char in value[1:]:
                if char == flag:
                    return word
                if char in stops:
                    break
        return None

    def long_flag(*flags: str) -> Word | None:
        return next((w for w in options if w.value in flags), None)

    if name == "clean":
        force = long_flag("--force") or short_flag("f", "e")
        dry = long_flag("--dry-run") or short_flag("n", "e")
        if force is None or dry is not None:
            return None
        paths = (*_operands(args[:dashdash], ("-e", "--exclude")), *after)
        kinds = "files and directories" if short_flag("d", "e") else "files"
        only_ignored = short_flag("X", "e") and not short_flag("x", "e")
        kinds = f"ignored {kinds}" if only_ignored else f"untracked {kinds}"
        where = f" in {_names(paths)}" if paths else ""
        ignored = " (ignored ones too)" if short_flag("x", "e") else ""
        said = f"git clean deletes {kinds}{where}{ignored}"
        return _Offence(force.text, "untracked files", "git clean -f", paths, said)
    if name == "reset":
        hard = long_flag("--hard")
        if hard is None:
            return None
        said = f"git reset --hard {_WHOLE_TREE}"
        return _Offence(hard.text, "uncommitted changes", "git reset --hard", (), said)
    if name == "restore":
        paths = (*_operands(args[:dashdash], ("-s", "--source")), *after)
        to = f" to {_names(paths)}" if paths else ""
        said = f"git restore discards uncommitted changes{to}"
        return _Offence(sub.text, "uncommitted changes", "git restore", paths, said)
    if name == "switch":
        force = long_flag("--force", "--discard-changes") or short_flag("f", "cC")
        if force is None:
            return None
        said = f"git switch -f {_WHOLE_TREE}"
        return _Offence(force.text, "uncommitted changes", "git switch -f", (), said)
    if name != "checkout":
        return None
    return _checkout(args, dashdash, options, short_flag, long_flag)


def _checkout(
    args: Sequence[Word],
    dashdash: int,
    options: Sequence[Word],
    short_flag: Callable[[str, str], Word | None],
    long_flag: Callable[..., Word | None],
) -> _Offence | None:
    """``git checkout`` of paths (``--``, ``.``, ``main file``), or forced (``-f``)."""
    sides = long_flag("--ours", "--theirs")
    spec = next((w for w in options if (w.value or "").startswith("--pathspec-from")), None)
    force = long_flag("--force", "--ours", "--theirs") or short_flag("f", "bB") or spec
    operands = [w for w in args[:dashdash] if not (w.value or "x").startswith("-")]
    at: Word | None = None
    paths: tuple[Word, ...] | None = None
    if dashdash + 1 < len(args):
        at, paths = args[dashdash], tuple(args[dashdash + 1 :])
    else:
        creating = long_flag("--orphan") or short_flag("b", "") or short_flag("B", "")
        for k, word in enumerate(operands):
            value = word.value or ""
            pathlike = (
                value in (".", "..")
                or value.startswith(("./", "../", ":"))
                or any(c in value for c in "*?[")
            )
            if pathlike or (k >= 1 and creating is None):
                at, paths = word, tuple(operands[k:])
                break
    if force is not None:
        target, what = force.text, "uncommitted changes"
    elif at is not None:
        target, what = at.text, "uncommitted changes to those paths"
    else:
        return None
    if paths is None and (sides is not None or spec is not None):
        paths = tuple(operands)
    if paths is None:
        said = f"git checkout -f {_WHOLE_TREE}"
        return _Offence(target, what, "git checkout -f", (), said)
    to = _names(paths) or "the paths it names"
    said = f"git checkout -- discards uncommitted changes to {to}"
    return _Offence(target, what, "git checkout --", paths, said)


# -- find ------------------------------------------------------------------------------------


def _find(checker: Checker, call: Call) -> Refusal | None:
    """``find -delete``/``-exec``: refused when nothing selects, so all would go."""
    words = call.words
    i = 1
    while i < len(words) and _is_find_option(words[i].value or ""):
        i += 2 if words[i].value == "-D" else 1
    starts: list[Word] = []
    while i < len(words):
        value = words[i].value
        if value is not None and value[:1] in ("-", "(", "!", ")", ","):
            break
        starts.append(words[i])
        i += 1
    written = tuple(starts)
    starts = starts or [Word(".", (("raw", "."),))]
    selective, deletes = False, False
    commands: list[Sequence[Word]] = []
    while i < len(words):
        value = words[i].value or ""
        i += 1
        if value in _FIND_EXEC:
            end = next((j for j in range(i, len(words)) if words[j].value in (";", "+")), None)
            commands.append(words[i:end])
            i = len(words) if end is None else end + 1
        elif value == "-delete":
            deletes = True
        elif value in _FIND_SELECTORS or value.startswith("-newer"):
            selective = True
    if checker.collecting:
        _note_find(
            checker, call, starts=written, selective=selective, deletes=deletes, commands=commands
        )
        return None  # what is refused does not matter here: every destructive one is noted
    for command in commands:
        # `{}` is a file find selected: harmless when something selects, else anything
        rest = tuple(w for w in command if "{}" not in w.text)
        refusal = check_call(checker, replace(call, words=rest))
        if refusal is not None:
            return refusal
        if selective:
            continue
        for start in starts:
            everything = (start, start.plus("raw", "/*"))
            each = tuple(a for w in command for a in (everything if "{}" in w.text else (w,)))
            refusal = check_call(checker, replace(call, words=each))
            if refusal is not None:
                return refusal
    if deletes and not selective:
        for start in starts:
            for target in (start, start.plus("raw", "/*")):
                refusal = _target(checker, call, target)
                if refusal is not None:
                    return refusal
    return None


def _note_find(
    checker: Checker,
    call: Call,
    *,
    starts: tuple[Word, ...],
    selective: bool,
    deletes: bool,
    commands: Sequence[Sequence[Word]],
) -> None:
    """Note ``find -delete`` and ``find -exec rm``, and what else ``-exec`` runs."""
    where = _names(starts) or "the current directory"
    what = "what it matches" if selective else "everything"
    if deletes:
        _note(checker, "find -delete", call, starts, f"find -delete deletes {what} under {where}")
    others: list[tuple[Word, ...]] = []
    removes: list[Call] = []
    for command in commands:
        inner = unwrap(checker, replace(call, words=tuple(command)))
        if inner is not None and command_name(inner.words[0]) == "rm":
            removes.append(inner)
        else:
            others.append(tuple(command))
    if removes:
        flags = [w.value for c in removes for w in c.words[1:] if w.value and w.value[0] == "-"]
        recursive = any(_recursive(flag) for flag in flags if flag is not None)
        inside = " and everything inside" if recursive and selective else ""
        said = f"find -exec rm deletes {what} under {where}{inside}"
        _note(checker, "find -exec rm", call, starts, said)
    for command in others:
        # as written (`sh -c 'rm -rf {}'`) and with `{}` a path (`git checkout {}`)
        placeholder = tuple(
            Word(w.text, (("lit", "./{}"),)) if "{}" in w.text else w for w in command
        )
        with checker.aside() as seen:
            for variant in dict.fromkeys((command, placeholder)):
                check_call(checker, replace(call, words=variant))
        # and without it, as the floor reads it (`-exec {} rm -rf x`): only what is new
        with checker.aside() as more:
            check_call(
                checker, replace(call, words=tuple(w for w in command if "{}" not in w.text))
            )
        known = {d.kind for d in seen}
        for destruction in (*seen, *(d for d in more if d.kind not in known)):
            checker.record(destruction)


def _is_find_option(value: str) -> bool:
    return value in ("-H", "-L", "-P", "-D") or value.startswith("-O")


# -- shells ----------------------------------------------------------------------------------


def _shell(checker: Checker, call: Call) -> Refusal | None:
    """``sh -c SCRIPT`` (and here-documents fed to a shell): the script is checked too."""
    words, i, has_c = call.words, 1, False
    while i < len(words):
        value = words[i].value
        if value is None or value[:1] not in ("-", "+") or value in ("-", "+"):
            break
        i += 1
        if value == "--":
            break
        if value.startswith("--"):
            i += value in ("--rcfile", "--init-file")
            continue
        for char in value[1:]:
            has_c = has_c or char == "c"
            i += char in "oO"
    if has_c:
        return checker.script(words[i].script, call.cwds, call) if i < len(words) else None
    if i < len(words):
        return None  # a script file: the floor does not read files
    first: Refusal | None = None
    for source in call.stdin:
        refusal = checker.script(source, call.cwds, call)
        if refusal is not None and not checker.collecting:
            return refusal
        first = first or refusal
    return first


# --------------------------------------------------------------------------------------------
# Wrappers: commands that run another command

_Unwrap = Callable[["Checker", Call], "Call | None"]


def _unwrap_sudo(checker: Checker, call: Call) -> Call | None:
    options, i = leading_options(
        call.words,
        1,
        "CDgpRrtTUu",
        {"--chdir", "--chroot", "--close-from", "--command-timeout", "--group", "--host"}
        | {"--other-user", "--prompt", "--role", "--type", "--user"},
    )
    cwds = call.cwds
    for flag, value in options:
        if flag in ("-i", "--login"):
            cwds = None  # a login shell starts in the target user's home
        elif flag in ("-D", "--chdir"):
            cwds = checker.directory(value, cwds)
    return replace(call, words=call.words[_skip_assignments(call.words, i) :], cwds=cwds)


def _unwrap_env(checker: Checker, call: Call) -> Call | None:
    options, i = leading_options(call.words, 1, "uCSP", ("--unset", "--chdir", "--split-string"))
    cwds = call.cwds
    split: tuple[Word, ...] = ()
    for flag, value in options:
        if flag in ("-C", "--chdir"):
            cwds = checker.directory(value, cwds)
        elif flag in ("-S", "--split-string") and value is not None:
            home = checker.places.home
            split = tuple(token_word(t, home) for t in tolerant_tokens(value.script))
    words = split + call.words[_skip_assignments(call.words, i) :]
    return replace(call, words=words, cwds=cwds)


def _simple_wrapper(
    with_arg: str = "", long_with_arg: Iterable[str] = (), skip: int = 0
) -> _Unwrap:
    def unwrap(checker: Checker, call: Call) -> Call | None:
        _, i = leading_options(call.words, 1, with_arg, long_with_arg)
        return replace(call, words=call.words[i + skip :])

    return unwrap


def _unwrap_command(checker: Checker, call: Call) -> Call | None:
    options, i = leading_options(call.words, 1)
    if any(flag in ("-v", "-V") for flag, _ in options):
        return None  # only describes the command
    return replace(call, words=call.words[i:])


_WRAPPERS: dict[str, _Unwrap] = {
    "sudo": _unwrap_sudo,
    "doas": _simple_wrapper("Cu"),
    "env": _unwrap_env,
    "nice": _simple_wrapper("n", ("--adjustment",)),
    "nohup": _simple_wrapper(),
    "time": _simple_wrapper("fo", ("--format", "--output")),
    "timeout": _simple_wrapper("ks", ("--kill-after", "--signal"), skip=1),
    "command": _unwrap_command,
    "builtin": _simple_wrapper(),
    "exec": _simple_wrapper("a"),
    "busybox": _simple_wrapper(),
    "xargs": _simple_wrapper(
        "adEILnPsJRS",
        {"--arg-file", "--delimiter", "--max-args", "--max-chars", "--max-procs"}
        | {"--process-slot-var"},
    ),
}
CHECKED = frozenset({*_WRAPPERS, *_SHELLS, "rm", "git", "find", "eval"})
