"""Is there a newer kiso? The release check behind the banner's one-line notice, and the plan
``kiso update`` follows.

At most once a day an interactive start asks the package index which versions of the ``kiso``
distribution it has, in a daemon thread with a short timeout, and records the newest in
``$KISO_HOME/release-check.json`` (written atomically)::

    {"version": 1, "checked": 1790000000.0, "index": "https://pypi.org/simple/",
     "latest": "0.2.0", "latestAny": "0.3.0rc1"}

The banner announces a newer version from that record, or from this start's check when it
finished first: ``kiso 0.2.0 is out — kiso update``. Offline, a slow index, an answer that does
not parse: nothing is said and nothing waits (a failed attempt is recorded too, so a day passes
before the next). ``KISO_NO_UPDATE_CHECK=1`` or ``"updateCheck": false`` in the user config
turns it off. A final release is never told about pre-releases; a pre-release is.

The index speaks the simple repository API (PEP 691 JSON or PEP 503 HTML): ``KISO_INDEX_URL``,
else ``PIP_INDEX_URL``, else PyPI's. Versions compare as PEP 440 says (:class:`Version`).

Pure logic first: :func:`parse_version`, :func:`versions_in_page`, :func:`announcement`,
:func:`plan_update`. The I/O around it is :func:`fetch_versions` (urllib, imported in the thread),
:func:`read_record` / :func:`write_record` and :class:`ReleaseCheck`. Only the standard library
is imported here, so an interactive start pays next to nothing and ``kiso --help`` nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import TypeAlias
from urllib.parse import unquote, urlsplit

from kiso._version import __version__

__all__ = [
    "CHECK_EVERY",
    "DIST",
    "CannotUpdate",
    "Installation",
    "Plan",
    "Record",
    "ReleaseCheck",
    "Version",
    "announcement",
    "check_enabled",
    "fetch_versions",
    "index_url",
    "newest",
    "notice",
    "parse_version",
    "plan_update",
    "read_record",
    "start_check",
    "versions_in_page",
    "write_record",
]

DIST = "kiso"
"""The distribution kiso is published as (``[project] name`` in pyproject.toml)."""
DEFAULT_INDEX = "https://pypi.org/simple/"
CHECK_EVERY = 24 * 3600.0
"""Seconds between two questions to the index."""
TIMEOUT = 3.0
"""Seconds the check waits for the index to connect, and then for each read."""
RECORD_FILE = "release-check.json"
MAX_PAGE = 8 * 1024 * 1024
"""The most of a project page read: an index answering more is not one."""
ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
    "text/html;q=0.1"
)


# --------------------------------------------------------------------------------- versions

_VERSION = re.compile(
    r"""
    v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    """,
    re.VERBOSE | re.IGNORECASE,
)
_PHASE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}

_Key: TypeAlias = tuple[int, tuple[int, ...], tuple[int, int], int, tuple[int, int]]


@dataclass(frozen=True, slots=True, order=True)
class Version:
    """A PEP 440 version, ordered as PEP 440 orders them (``1.0.dev1 < 1.0a1 < 1.0rc1 < 1.0 <
    1.0.post1``; ``1.0 == 1.0.0``). A local label (``+abc``) is kept but not compared."""

    key: _Key = field(repr=False)
    text: str = field(compare=False)
    prerelease: bool = field(compare=False)
    """A pre-release or a development release."""
    local: bool = field(compare=False, default=False)

    def __str__(self) -> str:
        return self.text


def parse_version(text: str) -> Version | None:
    """``text`` as a :class:`Version`, or None when it is not a PEP 440 version."""
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        return None
    release = [int(part) for part in m["release"].split(".")]
    while release and release[-1] == 0:
        release.pop()
    pre = (_PHASE[m["pre_l"].lower()], int(m["pre_n"] or 0)) if m["pre_l"] else None
    if m["post_n1"] is not None:
        post: int | None = int(m["post_n1"])
    elif m["post_l"]:
        post = int(m["post_n2"] or 0)
    else:
        post = None
    dev = int(m["dev_n"] or 0) if m["dev_l"] else None
    # a bare dev release sorts before every pre-release of its version; a final one after them
    bare = (-1, 0) if post is None and dev is not None else (3, 0)
    pre_key = bare if pre is None else pre
    key: _Key = (
        int(m["epoch"] or 0),
        tuple(release),
        pre_key,
        -1 if post is None else post,
        (1, 0) if dev is None else (0, dev),
    )
    return Version(key, text.strip(), pre is not None or dev is not None, m["local"] is not None)


def newest(versions: Iterable[str], *, prereleases: bool) -> str | None:
    """The highest of ``versions`` (pre-releases only when ``prereleases``; local versions and
    what does not parse never), as written; None when there is none."""
    best: Version | None = None
    for text in versions:
        v = parse_version(text)
        if v is None or v.local or (v.prerelease and not prereleases):
            continue
        if best is None or v > best:
            best = v
    return None if best is None else best.text


def announcement(current: str, record: Record | None) -> str | None:
    """The banner's line when ``record`` knows a version newer than ``current``, else None. A
    final release hears only of final releases; a pre-release also of newer pre-releases."""
    here = parse_version(current)
    if here is None or record is None:
        return None
    candidate = record.latest_any if here.prerelease else record.latest
    there = parse_version(candidate) if candidate else None
    if there is None or there <= here:
        return None
    return f"kiso {there.text} is out — kiso update"


# --------------------------------------------------------------------------------- the index


def index_url(environ: Mapping[str, str]) -> str:
    """The simple index asked: ``KISO_INDEX_URL``, else ``PIP_INDEX_URL``, else PyPI."""
    for name in ("KISO_INDEX_URL", "PIP_INDEX_URL"):
        value = environ.get(name, "").strip()
        if value:
            return value
    return DEFAULT_INDEX


def normalize(name: str) -> str:
    """A project name as the index spells it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_url(index: str, dist: str = DIST) -> str:
    return index.rstrip("/") + "/" + normalize(dist) + "/"


_SDIST = (".tar.gz", ".zip", ".tar.bz2", ".tar.xz", ".tgz", ".tar")


def version_of(filename: str, dist: str = DIST) -> str | None:
    """The version a wheel or sdist file name carries when it is ``dist``'s (and a version),
    else None: ``kiso-extra-9.0.tar.gz`` is another project's."""
    name = normalize(dist)
    found = None
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        if len(parts) in (5, 6) and normalize(parts[0]) == name:
            found = parts[1]
    else:
        ext = next((e for e in _SDIST if filename.lower().endswith(e)), None)
        stem = filename[: -len(ext)] if ext else ""
        if stem[: len(name) + 1].lower().replace("_", "-").replace(".", "-") == name + "-":
            found = stem[len(name) + 1 :]
    return found if found and parse_version(found) is not None else None


class IndexAnswerError(ValueError):
    """The index answered something that is not a project page."""


class _Links(HTMLParser):
    """The files a PEP 503 page links to: (file name, yanked)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.files: list[tuple[str, bool]] = []
        self._href: str | None = None
        self._yanked = False
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            found = dict(attrs)
            self._href = found.get("href") or ""
            self._yanked = "data-yanked" in found
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            name = "".join(self._text).strip()
            if not name:
                path = urlsplit(self._href).path
                name = unquote(path.rsplit("/", 1)[-1])
            self.files.append((name, self._yanked))
            self._href = None


def versions_in_page(body: bytes, content_type: str, dist: str = DIST) -> list[str]:
    """The versions of ``dist`` a project page offers (yanked files left out), in the JSON
    (PEP 691) or HTML (PEP 503) form. Raises :class:`IndexAnswerError` when it is neither."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind.endswith("json"):
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise IndexAnswerError(f"not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("files", []), list):
            raise IndexAnswerError("not a PEP 691 project page")
        found: list[str] = []
        for file in data.get("files", []):
            if not isinstance(file, dict) or not isinstance(file.get("filename"), str):
                raise IndexAnswerError("a file entry without a filename")
            version = None if file.get("yanked") else version_of(file["filename"], dist)
            if version is not None:
                found.append(version)
        listed = data.get("versions")
        if not found and isinstance(listed, list):
            found = [v for v in listed if isinstance(v, str)]
        return found
    if kind in ("text/html", "application/vnd.pypi.simple.v1+html", ""):
        links = _Links()  # lenient: what is not a link is skipped
        links.feed(body.decode("utf-8", errors="replace"))
        links.close()
        out = [version_of(name, dist) for name, yanked in links.files if not yanked]
        return [v for v in out if v is not None]
    raise IndexAnswerError(f"an answer of type {kind!r}")


def fetch_versions(index: str, *, timeout: float = TIMEOUT, dist: str = DIST) -> list[str]:
    """Ask ``index`` for ``dist``'s project page; its versions. Raises on any failure (an
    ``OSError`` for the network, :class:`IndexAnswerError` for the answer)."""
    import urllib.request  # here, not at import time: only the check's thread pays for it

    url = project_url(index, dist)
    if urlsplit(url).scheme not in ("http", "https"):
        raise IndexAnswerError(f"not an http(s) index: {index}")
    request = urllib.request.Request(
        url, headers={"Accept": ACCEPT, "User-Agent": f"kiso/{__version__} (release check)"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if response.status != 200:
            raise IndexAnswerError(f"status {response.status}")
        body = response.read(MAX_PAGE + 1)
        if len(body) > MAX_PAGE:
            raise IndexAnswerError("the page is too large")
        content_type = response.headers.get("Content-Type", "")
    versions = versions_in_page(body, content_type, dist)
    if not versions:
        raise IndexAnswerError(f"no version of {dist} on the page")
    return versions


# --------------------------------------------------------------------------------- the record


@dataclass(frozen=True, slots=True)
class Record:
    """What the last check learned (``release-check.json``)."""

    checked: float
    """When it asked (seconds since the epoch), whether or not the index answered."""
    index: str
    latest: str | None = None
    """The newest final release the index listed."""
    latest_any: str | None = None
    """The newest release, pre-releases included."""

    def due(self, now: float, index: str) -> bool:
        """Is it time to ask again? (A record of another index, or from the future, is.)"""
        return index != self.index or not (0 <= now - self.checked < CHECK_EVERY)


def read_record(home: Path) -> Record | None:
    """The record in ``home``, or None when there is none or it does not parse."""
    try:
        data = json.loads((home / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != 1:
        return None
    checked, index = data.get("checked"), data.get("index")
    latest, latest_any = data.get("latest"), data.get("latestAny")
    if not isinstance(checked, int | float) or isinstance(checked, bool):
        return None
    if not isinstance(index, str):
        return None
    if not all(v is None or isinstance(v, str) for v in (latest, latest_any)):
        return None
    return Record(float(checked), index, latest, latest_any)


def write_record(home: Path, record: Record) -> None:
    """Write ``record`` into ``home`` atomically (a temporary file renamed into place)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = {
        "version": 1,
        "checked": record.checked,
        "index": record.index,
        "latest": record.latest,
        "latestAny": record.latest_any,
    }
    path = home / RECORD_FILE
    tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (json.dumps(data) + "\n").encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


# --------------------------------------------------------------------------------- the check


def home_of(environ: Mapping[str, str]) -> Path:
    """``$KISO_HOME`` or ``~/.kiso`` (as :func:`kiso.kernel.kiso_home`, without importing the
    kernel)."""
    value = environ.get("KISO_HOME", "")
    return Path(value).expanduser() if value else Path.home() / ".kiso"


def check_enabled(environ: Mapping[str, str], home: Path) -> bool:
    """Off with ``KISO_NO_UPDATE_CHECK`` set (to anything but ``0``/``false``/``no``/``off``) or
    ``"updateCheck": false`` in the user config. A config that does not load leaves it on: the
    session's own start says what is wrong with the file."""
    flag = environ.get("KISO_NO_UPDATE_CHECK", "").strip().lower()
    if flag not in ("", "0", "false", "no", "off"):
        return False
    from kiso.runtime.config import ConfigError, load_config

    try:
        return load_config(home, None, environ={}, project=False).update_check
    except ConfigError:
        return True


class ReleaseCheck:
    """One start's check: the record as the start found it, and (when it is due) a daemon
    thread asking the index and writing the new record. :meth:`notice` never waits."""

    def __init__(
        self,
        home: Path,
        index: str,
        *,
        current: str = __version__,
        fetch: Callable[[str], list[str]] = fetch_versions,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.home, self.index, self.current = home, index, current
        self.fetch, self.clock = fetch, clock
        self.record = read_record(home)
        self.fresh: Record | None = None
        self.thread: threading.Thread | None = None

    def due(self) -> bool:
        return self.record is None or self.record.due(self.clock(), self.index)

    def start(self) -> bool:
        """Start the thread when a check is due; whether it started."""
        if not self.due():
            return False
        self.thread = threading.Thread(target=self.run, name="kiso-release-check", daemon=True)
        self.thread.start()
        return True

    def run(self) -> Record:
        """Ask the index now and record what it said (or that it did not answer). Never raises:
        whatever goes wrong, the previous knowledge is kept."""
        old = self.record if self.record is not None and self.record.index == self.index else None
        record = Record(
            self.clock(),
            self.index,
            old.latest if old else None,
            old.latest_any if old else None,
        )
        try:
            versions = self.fetch(self.index)
            record = Record(
                record.checked,
                self.index,
                newest(versions, prereleases=False),
                newest(versions, prereleases=True),
            )
        except Exception:  # offline, refused, timed out, a malformed answer: silence
            pass
        with contextlib.suppress(OSError):
            write_record(self.home, record)
        self.fresh = record
        return record

    def notice(self) -> str | None:
        """The banner's line, from this start's check if it is done, else from the record."""
        return announcement(self.current, self.fresh or self.record)


_started: ReleaseCheck | None = None


def start_check(environ: Mapping[str, str] | None = None) -> ReleaseCheck | None:
    """Begin this start's check (an interactive session on a terminal calls it first thing);
    None when it is turned off. Never raises, never waits."""
    global _started
    env = os.environ if environ is None else environ
    try:
        home = home_of(env)
        if not check_enabled(env, home):
            return None
        check = ReleaseCheck(home, index_url(env))
        check.start()
    except Exception:  # whatever it is, the session starts without the check
        return None
    _started = check
    return check


def notice() -> str | None:
    """The line for the banner when this process started a check that knows of a newer kiso."""
    return None if _started is None else _started.notice()


# --------------------------------------------------------------------------------- kiso update


@dataclass(frozen=True, slots=True)
class Installation:
    """What ``kiso update`` found out about the installation it runs from."""

    executable: str
    """``sys.executable``: the Python kiso runs on."""
    prefix: Path
    """``sys.prefix``: its environment."""
    version: str
    """The version installed (the distribution's metadata, else the code's own)."""
    location: Path | None
    """The directory holding the distribution's metadata; None: kiso is not installed as a
    package here (it runs from a source tree)."""
    editable: str | None = None
    """The source of an editable install (``direct_url.json``)."""
    site_dirs: tuple[Path, ...] = ()
    """This Python's own site-packages directories."""
    user_site: Path | None = None
    writable: bool = True
    """Whether ``location`` can be written by this user."""
    has_pip: bool = False
    pipx: bool = False
    """``prefix`` is a pipx venv (``pipx_metadata.json``, or under pipx's ``venvs``)."""
    uv_tool: bool = False
    """``prefix`` is a uv tool environment (``uv-receipt.toml``, or under uv's ``tools``)."""
    externally_managed: bool = False
    """The system's own Python, marked EXTERNALLY-MANAGED (PEP 668)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The installer to run: which tool, and the exact command line."""

    tool: str
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CannotUpdate:
    """Why ``kiso update`` will not run an installer, and what to run instead."""

    message: str


def plan_update(inst: Installation, which: Callable[[str], str | None]) -> Plan | CannotUpdate:
    """How to upgrade ``inst`` the way it was installed: pipx, uv tool, or pip in its own
    environment; or why that cannot be told. ``which`` finds a program on PATH."""
    if inst.location is None:
        return CannotUpdate(
            f"kiso is not installed as a package in {inst.prefix} (it runs from a source tree), "
            "so there is no installation to upgrade: update that copy the way you got it (e.g. "
            f"`git pull`), or install a release with `pipx install {DIST}`"
        )
    if inst.editable is not None:
        source = inst.editable
        if source.startswith("file://"):
            source = unquote(urlsplit(source).path)
        return CannotUpdate(
            f"kiso is an editable install of {source} (a development checkout), not a release: "
            f"update the checkout instead (`git -C {source} pull`)"
        )
    if inst.pipx:
        return _tool("pipx", ("upgrade", inst.prefix.name), inst, which)
    if inst.uv_tool:
        return _tool("uv", ("tool", "upgrade", inst.prefix.name), inst, which, label="uv tool")
    pip = f"{inst.executable} -m pip install --upgrade {DIST}"
    where = inst.location
    user = inst.user_site is not None and where == inst.user_site
    if not user and where not in inst.site_dirs:
        return CannotUpdate(
            f"kiso is installed in {where}, outside the environment of the Python it runs on "
            f"({inst.prefix}), so kiso update cannot tell how it got there: upgrade it with the "
            "tool that installed it"
        )
    if not inst.writable:
        return CannotUpdate(
            f"kiso is installed in {where}, which you cannot write (a system or read-only "
            "installation): upgrade it the way it was installed (your system's package manager, "
            f"or `sudo {pip}`), or install your own copy with `pipx install {DIST}`"
        )
    if inst.externally_managed and not user:
        return CannotUpdate(
            f"kiso is installed in {where}, a Python your system manages (EXTERNALLY-MANAGED, "
            "PEP 668): upgrade it with the system's package manager, or install your own copy "
            f"with `pipx install {DIST}`"
        )
    if not inst.has_pip:
        return CannotUpdate(
            f"kiso is installed in {where}, but that environment has no pip: add it "
            f"(`{inst.executable} -m ensurepip`) and run kiso update again, or upgrade kiso with "
            "the tool that installed it"
        )
    argv = [inst.executable, "-m", "pip", "install", "--upgrade", DIST]
    if user:
        argv.insert(4, "--user")
    return Plan("pip", tuple(argv))


def _tool(
    name: str,
    args: tuple[str, ...],
    inst: Installation,
    which: Callable[[str], str | None],
    *,
    label: str | None = None,
) -> Plan | CannotUpdate:
    label = label or name
    program = which(name)
    if program is None:
        return CannotUpdate(
            f"kiso was installed with {label} ({inst.prefix}), but `{name}` is not on PATH: run "
            f"`{' '.join((name, *args))}` where {name} is available"
        )
    return Plan(label, (program, *args))
