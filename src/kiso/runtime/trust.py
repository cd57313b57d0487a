"""The project trust gate: a project's ``.kiso/`` is cloned code, applied only once trusted.

A workspace's ``.kiso/`` directory (``config.json`` today; extensions, skills and ``mcp.json``
later) arrived with the repository: a profile in it can send your key to any URL, and a mode in
it can run every call without asking. So nothing in it applies until you trust it:

* :func:`scan` lists every entry under ``.kiso/`` (relative path, size, SHA-256) and computes
  one content digest over them, in sorted path order;
* :class:`TrustStore` keeps one verdict per project in ``$KISO_HOME/trust.json``: the digest, the
  absolute project path, the time, trusted or refused;
* :func:`check` compares the two, and :func:`gate` applies the policy:

  ======================================  =============================================
  no ``.kiso/``, or one with no files     nothing to trust
  trusted, these exact contents           applied
  refused, these exact contents           nothing applied, and a notice says so
  never asked, or changed since           ``ask`` decides (and is recorded); with nobody
                                          to ask, :class:`UntrustedProjectError`
  ======================================  =============================================

No environment variable skips the gate. The scan never follows a symbolic link: a link (or a
FIFO, socket or device) inside ``.kiso/`` is listed as such, counted in the digest by its target
text, and makes the directory impossible to trust until it is a regular file (refusing it is
always possible). Every file is opened relative to its directory's descriptor with
``O_NOFOLLOW`` and checked with ``fstat``, and the bytes that were hashed are the bytes that are
applied (:attr:`Snapshot.contents`): nothing is read twice, so nothing can change in between.

Kiso itself writes nothing under a project's ``.kiso/``. When ``<workspace>/.kiso`` *is*
``$KISO_HOME`` (kiso started in your home directory), it is your own state, not a project's, and
there is nothing to trust; a ``$KISO_HOME`` nested inside a project's ``.kiso/`` is skipped.

``trust.json`` (mode 0600, replaced atomically under ``trust.json.lock``), version 1::

    {"version": 1, "projects": {"/abs/project": {
      "digest": "sha256:…", "verdict": "trusted", "at": "2025-06-01T12:00:00Z",
      "files": [{"path": "config.json", "kind": "file", "size": 120, "sha256": "…"}]}}}
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from kiso.kernel import RefusedError, UsageError
from kiso.kernel.layout import make_private_dirs
from kiso.tools.atomic import atomic_write

__all__ = [
    "MAX_BYTES",
    "MAX_FILES",
    "PROJECT_DIR",
    "TRUST_FILE",
    "TRUST_VERSION",
    "AskTrust",
    "Entry",
    "Gate",
    "Snapshot",
    "Status",
    "TrustCheck",
    "TrustError",
    "TrustStore",
    "UntrustedProjectError",
    "Verdict",
    "check",
    "digest",
    "gate",
    "scan",
    "untrusted_message",
]

PROJECT_DIR = ".kiso"
TRUST_FILE = "trust.json"
TRUST_VERSION = 1
"""Version 1: one verdict per absolute project path (digest, verdict, at, files)."""
MAX_FILES = 10_000
MAX_BYTES = 64 * 1024 * 1024
"""Limits of a ``.kiso/`` kiso will read: more than this is refused, not truncated."""
_MAX_DEPTH = 32
_DOMAIN = b"kiso-trust-v1\0"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

Kind = Literal["file", "link", "other"]
_FIX = (
    "fix it, or delete it (kiso then asks again about every project's .kiso/ and applies "
    "nothing until you answer)"
)


class TrustError(UsageError):
    """A project's ``.kiso/`` or ``trust.json`` cannot be read or is invalid; the message names
    the file and what to do."""


class UntrustedProjectError(RefusedError):
    """The project's ``.kiso/`` is not trusted for its current contents and nobody was there to
    ask (or it holds a link, which can never be trusted): the run does not start."""


# ------------------------------------------------------------------------------------- scanning


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry under ``.kiso/``."""

    path: str
    """Relative to ``.kiso/``, ``/``-separated; ``"."`` is ``.kiso`` itself (when it is a link)."""
    kind: Kind
    """``file`` (a regular file), ``link`` (a symbolic link, never followed), ``other``."""
    size: int
    """Bytes of a file's content, or of a link's target text; 0 for ``other``."""
    sha256: str
    """Hex SHA-256 of a file's content or of a link's target text; ``""`` for ``other``."""
    target: str | None = None
    """A link's target text, as stored in the link."""

    def describe(self) -> str:
        """``config.json (120 bytes)``, ``x -> /etc/passwd (symbolic link)``, ``p (fifo...)``."""
        shown = _shown(self.path)
        if self.kind == "link":
            return f"{shown} -> {_shown(self.target or '')} (symbolic link)"
        if self.kind == "other":
            return f"{shown} (not a regular file)"
        return f"{shown} ({self.size} {'byte' if self.size == 1 else 'bytes'})"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What ``<project>/.kiso/`` held when it was scanned, with the bytes that were hashed."""

    project: Path
    """The workspace, an absolute path with no symbolic links in it."""
    entries: tuple[Entry, ...] = ()
    """Sorted by path."""
    contents: Mapping[str, bytes] = field(default_factory=dict, compare=False, hash=False)
    """The regular files' bytes by relative path: apply these, never re-read the disk."""

    @property
    def root(self) -> Path:
        return self.project / PROJECT_DIR

    @property
    def empty(self) -> bool:
        """Nothing to trust: no ``.kiso/``, an empty one, or one that is ``$KISO_HOME``."""
        return not self.entries

    @property
    def unsafe(self) -> tuple[Entry, ...]:
        """Entries that make the directory impossible to trust: links and non-regular files."""
        return tuple(e for e in self.entries if e.kind != "file")

    @property
    def digest(self) -> str:
        return digest(self.entries)

    def listing(self) -> list[str]:
        return [e.describe() for e in self.entries]


def digest(entries: Iterable[Entry]) -> str:
    """``sha256:<hex>`` over the entries in sorted path order: each one's kind, path, size and
    content hash. Any file changed, added, removed or renamed changes it."""
    h = hashlib.sha256(_DOMAIN)
    for e in sorted(entries, key=lambda e: e.path):
        h.update(f"{e.kind}\0{e.path}\0{e.size}\0{e.sha256}\n".encode("utf-8", "surrogateescape"))
    return f"sha256:{h.hexdigest()}"


def scan(workspace: Path, *, home: Path | None = None) -> Snapshot:
    """Read ``<workspace>/.kiso/`` without following any link. ``home``: ``$KISO_HOME``, which
    is never a project's (``<workspace>/.kiso`` that is ``home`` scans as empty)."""
    project = Path(os.path.realpath(workspace))
    root = project / PROJECT_DIR
    skip = _identity(home)
    try:
        ws_fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise TrustError(f"{project}: cannot open the project directory ({_why(exc)})") from None
    try:
        try:
            st = os.stat(PROJECT_DIR, dir_fd=ws_fd, follow_symlinks=False)
        except FileNotFoundError:
            return Snapshot(project)
        except OSError as exc:
            raise TrustError(f"{root}: cannot read it ({_why(exc)})") from None
        if stat.S_ISLNK(st.st_mode):
            if skip is not None and _identity(Path(os.path.realpath(root))) == skip:
                return Snapshot(project)  # a link to $KISO_HOME: the user's own state
            target = os.readlink(PROJECT_DIR, dir_fd=ws_fd)
            return Snapshot(project, (_link(".", target),))
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) == skip:
            return Snapshot(project)  # a plain file named .kiso holds nothing kiso reads
        try:
            root_fd = os.open(PROJECT_DIR, _DIR_FLAGS, dir_fd=ws_fd)
        except OSError as exc:
            raise TrustError(f"{root}: cannot read it ({_why(exc)})") from None
    finally:
        os.close(ws_fd)
    walker = _Walker(root, skip)
    try:
        _same_object(root, root_fd, st)
        walker.walk(root_fd, "", 0)
    finally:
        os.close(root_fd)
    entries = sorted(walker.entries, key=lambda e: e.path)
    return Snapshot(project, tuple(entries), walker.contents)


class _Walker:
    """A depth-first read of ``.kiso/`` through directory descriptors, never through a link."""

    def __init__(self, root: Path, skip: tuple[int, int] | None) -> None:
        self.root = root
        self.skip = skip
        self.entries: list[Entry] = []
        self.contents: dict[str, bytes] = {}
        self.total = 0

    def walk(self, dir_fd: int, prefix: str, depth: int) -> None:
        root = self.root
        if depth > _MAX_DEPTH:
            raise TrustError(f"{root / prefix}: nested deeper than {_MAX_DEPTH} folders")
        try:
            with os.scandir(dir_fd) as it:
                names = sorted(e.name for e in it)
        except OSError as exc:
            raise TrustError(f"{root / prefix}: cannot list it ({_why(exc)})") from None
        for name in names:
            rel = f"{prefix}{name}"
            where = root / rel
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we listed: it is not part of what we read
            except OSError as exc:
                raise TrustError(f"{where}: cannot read it ({_why(exc)})") from None
            if stat.S_ISLNK(st.st_mode):
                self.entries.append(_link(rel, os.readlink(name, dir_fd=dir_fd)))
            elif stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) == self.skip:
                    continue  # $KISO_HOME inside the project's .kiso/: kiso's own state
                fd = _open(where, name, dir_fd, _DIR_FLAGS)
                try:
                    _same_object(where, fd, st)
                    self.walk(fd, f"{rel}/", depth + 1)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode):
                fd = _open(where, name, dir_fd, _FILE_FLAGS)
                try:
                    _same_object(where, fd, st)
                    data = _read_all(where, fd, MAX_BYTES - self.total)
                finally:
                    os.close(fd)
                self.total += len(data)
                self.contents[rel] = data
                self.entries.append(Entry(rel, "file", len(data), hashlib.sha256(data).hexdigest()))
            else:
                self.entries.append(Entry(rel, "other", 0, ""))
            if len(self.entries) > MAX_FILES:
                raise TrustError(f"{root}: more than {MAX_FILES} files; kiso will not review it")


def _open(where: Path, name: str, dir_fd: int, flags: int) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise TrustError(f"{where}: cannot open it ({_why(exc)}); if it was being changed, "
                         f"run kiso again") from None  # fmt: skip


def _same_object(where: Path, fd: int, st: os.stat_result) -> None:
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or stat.S_IFMT(
        now.st_mode
    ) != stat.S_IFMT(st.st_mode):
        raise TrustError(f"{where}: it changed while kiso read it; run kiso again")


def _read_all(where: Path, fd: int, budget: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except OSError as exc:
            raise TrustError(f"{where}: cannot read it ({_why(exc)})") from None
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > budget:
            raise TrustError(
                f"{where}: the project's .kiso/ holds more than {MAX_BYTES // (1024 * 1024)} MiB;"
                f" kiso will not review it"
            )
        chunks.append(chunk)


def _link(rel: str, target: str) -> Entry:
    raw = target.encode("utf-8", "surrogateescape")
    return Entry(rel, "link", len(raw), hashlib.sha256(raw).hexdigest(), target)


def _identity(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _shown(text: str) -> str:
    """A name as it can be shown safely: control characters and undecodable bytes escaped, so a
    file name cannot draw a fake listing on the terminal."""
    return text if text.isprintable() else repr(text)[1:-1]


# ------------------------------------------------------------------------------------- verdicts


@dataclass(frozen=True, slots=True)
class Verdict:
    """The user's answer about one project's ``.kiso/``, for the contents it was given for."""

    project: str
    digest: str
    trusted: bool
    at: str
    """When, UTC, ``YYYY-MM-DDTHH:MM:SSZ``."""
    files: tuple[Entry, ...] = ()
    """What the directory held then (``target`` is not kept)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "verdict": "trusted" if self.trusted else "refused",
            "at": self.at,
            "files": [
                {"path": e.path, "kind": e.kind, "size": e.size, "sha256": e.sha256}
                for e in self.files
            ],
        }


class TrustStore:
    """``$KISO_HOME/trust.json``: one verdict per absolute project path."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / TRUST_FILE
        self._lock_path = home / f"{TRUST_FILE}.lock"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        make_private_dirs(self.home)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> dict[str, Verdict]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise TrustError(f"{self.path}: cannot read it ({_why(exc)})") from None
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise TrustError(f"{self.path}: not valid JSON ({exc}); {_FIX}") from None
        if not isinstance(data, dict) or not isinstance(data.get("projects"), dict):
            raise TrustError(f"{self.path}: has no 'projects' object; {_FIX}")
        version = data.get("version")
        if version != TRUST_VERSION:
            if isinstance(version, int) and version > TRUST_VERSION:
                raise TrustError(
                    f"{self.path}: version {version} was written by a newer kiso; upgrade kiso"
                )
            raise TrustError(f"{self.path}: unknown version {version!r}; {_FIX}")
        return {
            project: self._verdict(project, raw_verdict)
            for project, raw_verdict in data["projects"].items()
        }

    def _verdict(self, project: str, raw: Any) -> Verdict:
        where = f"{self.path}: projects[{project!r}]"
        if not isinstance(raw, dict):
            raise TrustError(f"{where}: must be an object; {_FIX}")
        dig, verdict, at = raw.get("digest"), raw.get("verdict"), raw.get("at")
        if not isinstance(dig, str) or not dig.startswith("sha256:"):
            raise TrustError(f"{where}.digest: must be a sha256:<hex> string; {_FIX}")
        if verdict not in ("trusted", "refused"):
            raise TrustError(f'{where}.verdict: must be "trusted" or "refused"; {_FIX}')
        if not isinstance(at, str):
            raise TrustError(f"{where}.at: must be a time string; {_FIX}")
        files: list[Entry] = []
        raw_files = raw.get("files", [])
        if not isinstance(raw_files, list):
            raise TrustError(f"{where}.files: must be a list; {_FIX}")
        for item in raw_files:
            ok = (
                isinstance(item, dict)
                and isinstance(item.get("path"), str)
                and item.get("kind") in ("file", "link", "other")
                and isinstance(item.get("size"), int)
                and isinstance(item.get("sha256"), str)
            )
            if not ok:
                raise TrustError(f"{where}.files: a malformed entry {item!r}; {_FIX}")
            files.append(Entry(item["path"], item["kind"], item["size"], item["sha256"]))
        return Verdict(project, dig, verdict == "trusted", at, tuple(files))

    def _write(self, verdicts: Mapping[str, Verdict]) -> None:
        data = {
            "version": TRUST_VERSION,
            "projects": {p: verdicts[p].to_json() for p in sorted(verdicts)},
        }
        body = (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()
        with contextlib.suppress(FileNotFoundError):
            os.chmod(self.path, 0o600)  # atomic_write keeps the bits of the file it replaces
        atomic_write(self.path, body)
        os.chmod(self.path, 0o600)  # a new file got 0o666 minus the umask

    def get(self, project: Path | str) -> Verdict | None:
        """The verdict recorded for ``project`` (an absolute path), if any."""
        return self._read().get(str(project))

    def verdicts(self) -> list[Verdict]:
        return [v for _, v in sorted(self._read().items())]

    def record(self, snapshot: Snapshot, *, trusted: bool, now: float | None = None) -> Verdict:
        """Record the verdict for exactly these contents. Trusting a directory that holds a
        link or a non-regular file is refused (:class:`UntrustedProjectError`)."""
        if trusted and snapshot.unsafe:
            raise UntrustedProjectError(_unsafe_message(snapshot))
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
        files = tuple(Entry(e.path, e.kind, e.size, e.sha256) for e in snapshot.entries)
        verdict = Verdict(str(snapshot.project), snapshot.digest, trusted, at, files)
        with self._locked():
            verdicts = self._read()
            verdicts[verdict.project] = verdict
            self._write(verdicts)
        return verdict

    def forget(self, project: Path | str) -> bool:
        """Drop any verdict for ``project``; whether there was one."""
        with self._locked():
            verdicts = self._read()
            if verdicts.pop(str(project), None) is None:
                return False
            self._write(verdicts)
            return True


# ---------------------------------------------------------------------------------- the policy


class Status(Enum):
    NOTHING = "nothing"
    """No ``.kiso/`` files: nothing to trust."""
    TRUSTED = "trusted"
    REFUSED = "refused"
    UNKNOWN = "unknown"
    """Never asked."""
    CHANGED = "changed"
    """A verdict was given for other contents."""


@dataclass(frozen=True, slots=True)
class TrustCheck:
    snapshot: Snapshot
    status: Status
    previous: Verdict | None = None
    """The recorded verdict (for these contents or, when ``CHANGED``, for earlier ones)."""

    @property
    def undecided(self) -> bool:
        return self.status in (Status.UNKNOWN, Status.CHANGED)

    def changes(self) -> list[str]:
        """What differs from the contents the recorded verdict was given for."""
        if self.previous is None:
            return []
        before = {e.path: e for e in self.previous.files}
        now = {e.path: e for e in self.snapshot.entries}
        out = [f"added {_shown(p)}" for p in sorted(now.keys() - before.keys())]
        out += [f"removed {_shown(p)}" for p in sorted(before.keys() - now.keys())]
        out += [
            f"changed {_shown(p)}"
            for p in sorted(now.keys() & before.keys())
            if (now[p].kind, now[p].sha256) != (before[p].kind, before[p].sha256)
        ]
        return out

    def reason(self) -> str:
        """``never reviewed`` or ``changed since you trusted it on … (changed config.json)``."""
        if self.status is Status.CHANGED and self.previous is not None:
            what = "trusted" if self.previous.trusted else "refused"
            changes = ", ".join(self.changes()) or "its contents differ"
            return f"changed since you {what} it on {self.previous.at}: {changes}"
        if self.status is Status.UNKNOWN:
            return "never reviewed"
        return str(self.status.value)


AskTrust = Callable[[TrustCheck], bool | None]
"""Asks a person: True trusts, False refuses (both recorded), None answers nothing this time."""


@dataclass(frozen=True, slots=True)
class Gate:
    """What the gate decided for one start."""

    check: TrustCheck
    applied: bool
    """Whether the project's ``.kiso/`` applies to this run."""
    notices: tuple[str, ...] = ()
    """Lines to show before the first prompt."""

    @property
    def project_files(self) -> Mapping[str, bytes] | None:
        """The trusted bytes to apply, or None when nothing of the project applies."""
        return self.check.snapshot.contents if self.applied else None


def check(workspace: Path, home: Path, *, store: TrustStore | None = None) -> TrustCheck:
    """Scan ``<workspace>/.kiso/`` and compare it with the verdict in ``$KISO_HOME``."""
    snapshot = scan(workspace, home=home)
    if snapshot.empty:
        return TrustCheck(snapshot, Status.NOTHING)
    previous = (store or TrustStore(home)).get(snapshot.project)
    if previous is None:
        return TrustCheck(snapshot, Status.UNKNOWN)
    if previous.digest != snapshot.digest:
        return TrustCheck(snapshot, Status.CHANGED, previous)
    if not previous.trusted:
        return TrustCheck(snapshot, Status.REFUSED, previous)
    if snapshot.unsafe:  # only a hand-edited trust.json says so: never apply a link
        return TrustCheck(snapshot, Status.CHANGED, previous)
    return TrustCheck(snapshot, Status.TRUSTED, previous)


def gate(
    workspace: Path, home: Path, ask: AskTrust | None = None, *, now: float | None = None
) -> Gate:
    """Decide whether the project's ``.kiso/`` applies to this start.

    Trusted: applied. Refused: not applied, with a notice. Never asked or changed: ``ask`` is
    asked and its answer recorded; with no ``ask`` (a headless run),
    :class:`UntrustedProjectError` — a run never starts with the project silently dropped.
    """
    store = TrustStore(home)
    c = check(workspace, home, store=store)
    root = c.snapshot.root
    if c.status is Status.NOTHING:
        return Gate(c, applied=False)
    if c.status is Status.TRUSTED:
        return Gate(c, applied=True)
    if c.status is Status.REFUSED:
        assert c.previous is not None
        return Gate(c, False, (_refused_notice(root, c.previous.at),))
    if c.snapshot.unsafe:
        raise UntrustedProjectError(_unsafe_message(c.snapshot))
    if ask is None:
        raise UntrustedProjectError(untrusted_message(c))
    answer = ask(c)
    if answer is None:
        return Gate(c, False, (f"{root} is not applied this time (no answer): kiso asks again "
                               f"next time; `kiso trust` applies it",))  # fmt: skip
    verdict = store.record(c.snapshot, trusted=answer, now=now)
    if answer:
        return Gate(c, applied=True)
    return Gate(c, False, (_refused_notice(root, verdict.at),))


def untrusted_message(c: TrustCheck) -> str:
    """The one line a headless run refuses with."""
    files = _files_line(c.snapshot)
    return (
        f"{c.snapshot.root} is not trusted ({c.reason()}): it holds {files}. Nothing in it was "
        f"applied and the run did not start. Review the files, then `{_command(c.snapshot)}` to "
        f"apply them, or `{_command(c.snapshot, revoke=True)}` to run without them"
    )


def _unsafe_message(snapshot: Snapshot) -> str:
    links = "; ".join(e.describe() for e in snapshot.unsafe[:5])
    return (
        f"{snapshot.root} holds what kiso never follows or reads: {links}. It cannot be "
        f"trusted until each is a regular file inside .kiso/ (nothing in it was applied); "
        f"`{_command(snapshot, revoke=True)}` runs without it"
    )


def _refused_notice(root: Path, at: str) -> str:
    return (
        f"{root} is not applied: you refused it on {at}; `kiso trust` applies it (kiso asks "
        f"again only if its files change)"
    )


def _files_line(snapshot: Snapshot, limit: int = 5) -> str:
    shown = [e.describe() for e in snapshot.entries[:limit]]
    more = len(snapshot.entries) - limit
    if more > 0:
        shown.append(f"and {more} more")
    return ", ".join(shown)


def _command(snapshot: Snapshot, *, revoke: bool = False) -> str:
    here = os.path.realpath(os.getcwd()) == str(snapshot.project)
    where = "" if here else f" {shlex.quote(str(snapshot.project))}"
    return f"kiso trust{where}{' --revoke' if revoke else ''}"
