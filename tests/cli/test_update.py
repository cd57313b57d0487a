"""The new-release notice and `kiso update`, against a package index served on 127.0.0.1.

The index is a real HTTP server in this process serving a folder of wheels built here (a stand-in
``kiso`` distribution: metadata only, a higher version); the sessions are real ``kiso`` processes
in a PTY; ``kiso update`` runs from throwaway venvs and upgrades them with real pip. Nothing
reaches the network.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import pty
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kiso
from kiso import __version__
from kiso.runtime.release import (
    CannotUpdate,
    Installation,
    Plan,
    Record,
    ReleaseCheck,
    announcement,
    check_enabled,
    index_url,
    newest,
    parse_version,
    plan_update,
    read_record,
    version_of,
    versions_in_page,
    write_record,
)
from tests.cli.test_repl import ENTER, Term, chat, write_script

MAJOR, MINOR = (int(p) for p in __version__.split(".")[:2])
CUR = __version__
NEXT = f"{MAJOR}.{MINOR + 1}.0"
"""A newer final release than the code under test."""
PRE = f"{MAJOR}.{MINOR + 2}.0rc1"
"""A pre-release newer still: never announced to a final release."""
NOTICE = f"kiso {NEXT} is out — kiso update"
DAY = 24 * 3600


# ------------------------------------------------------------------------------------------------
# a package index on 127.0.0.1


def build_wheel(folder: Path, version: str, dist: str = "kiso") -> Path:
    """A wheel of ``dist`` at ``version`` holding nothing but its metadata (RECORD hashed)."""
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
            "Summary: a stand-in served by the tests' index\n"
        ),
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: kiso-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


class Index:
    """A PEP 503 index of the ``kiso`` wheels in ``root/simple/kiso/``. It counts the requests
    for the project page; ``gate`` (when set) holds them until it opens; ``answer`` replaces the
    page with (status, content type, body)."""

    def __init__(self, root: Path, versions: tuple[str, ...] = (CUR, NEXT, PRE)) -> None:
        self.root = root
        self.project = root / "simple" / "kiso"
        self.project.mkdir(parents=True)
        self.pages: list[str] = []
        self.files: list[str] = []
        self.gate: threading.Event | None = None
        self.answer: tuple[int, str, bytes] | None = None
        self.bad_hash: set[str] = set()
        self.versions = list(versions)
        for version in versions:
            build_wheel(self.project, version)
        self.write_page()
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kw: Any) -> None:
                super().__init__(*args, directory=str(root), **kw)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path.rstrip("/") == "/simple/kiso":
                    index.pages.append(self.headers.get("Accept", ""))
                    if index.gate is not None:
                        index.gate.wait(30)
                    if index.answer is not None:
                        status, kind, body = index.answer
                        self.send_response(status)
                        self.send_header("Content-Type", kind)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                elif path.endswith(".whl"):
                    index.files.append(path.rsplit("/", 1)[-1])
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def add(self, version: str, *, bad_hash: bool = False) -> None:
        build_wheel(self.project, version)
        self.versions.append(version)
        if bad_hash:
            self.bad_hash.add(version)
        self.write_page()

    def write_page(self) -> None:
        links = []
        for version in self.versions:
            name = f"kiso-{version}-py3-none-any.whl"
            digest = hashlib.sha256((self.project / name).read_bytes()).hexdigest()
            if version in self.bad_hash:
                digest = "0" * 64
            links.append(f'<a href="{name}#sha256={digest}">{name}</a><br>')
        page = "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
        (self.project / "index.html").write_text(page)

    def close(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    served = Index(tmp_path / "index")
    try:
        yield served
    finally:
        served.close()


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (it was bound, then let go)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stale(home: Path, url: str, latest: str = NEXT) -> None:
    """A record from two days ago that knew of ``latest``: due again, and announcing it."""
    write_record(home, Record(time.time() - 2 * DAY, url, latest, latest))


# ------------------------------------------------------------------------------------------------
# the notice, in real sessions


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


@pytest.fixture
def kiso_home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def session(ws: Path, kiso_home: Path, tmp_path: Path) -> Iterator[Callable[..., Term]]:
    """Start ``kiso chat`` in a PTY with the release check on (``KISO_NO_UPDATE_CHECK`` empty)
    unless the test passes it."""
    started: list[Term] = []
    script = write_script(tmp_path / "script.json", [{"text": "fine"}])

    def start(sid: str = "s", **env: str) -> Term:
        env.setdefault("KISO_NO_UPDATE_CHECK", "")
        term = Term(chat(sid), cwd=ws, home=kiso_home, script=script, **env)
        started.append(term)
        return term

    try:
        yield start
    finally:
        for term in started:
            term.close()


def banner_lines(term: Term) -> list[str]:
    """The screen's lines from the banner's last line down to the status row."""
    lines = term.text.splitlines()
    first = next(i for i, ln in enumerate(lines) if "? shows the keys" in ln)
    return [ln for ln in lines[first + 1 :] if ln.strip()]


def test_a_newer_release_is_announced_under_the_banner_and_asked_once_a_day(
    session: Callable[..., Term], index: Index, kiso_home: Path
) -> None:
    index.gate = threading.Event()  # the index answers only once the banner is on the screen
    term = session(KISO_INDEX_URL=index.url)
    term.wait_for("▸ default")
    wait_until(lambda: len(index.pages) == 1, "the check to ask the index")
    assert "is out" not in term.text  # the start did not wait for the index
    assert read_record(kiso_home) is None
    index.gate.set()
    wait_until(lambda: read_record(kiso_home) is not None, "the check's record")
    record = read_record(kiso_home)
    assert record is not None
    assert (record.index, record.latest, record.latest_any) == (index.url, NEXT, PRE)
    assert 0 <= time.time() - record.checked < 60
    assert "simple.v1+json" in index.pages[0]  # it asks for PEP 691 and reads the HTML it got
    term.send("/exit" + ENTER)
    assert term.exit_status() == 0

    again = session("t", KISO_INDEX_URL=index.url)
    again.wait_for("▸ default")
    again.settle()
    below = banner_lines(again)
    assert below[0] == NOTICE  # one line, right under the banner
    assert again.text.count("is out") == 1
    assert PRE not in again.text  # a final release never hears of a pre-release
    assert len(index.pages) == 1  # checked today: the second start asked nothing
    again.send("/exit" + ENTER)
    assert again.exit_status() == 0
    assert "is out" not in "\n".join(again.text.splitlines()[-3:])  # said once, at the start


def test_no_notice_when_turned_off_in_print_mode_or_on_a_pipe(
    session: Callable[..., Term], index: Index, kiso_home: Path, ws: Path, tmp_path: Path
) -> None:
    # the control: a record two days old that knew of NEXT is announced, and due again
    stale(kiso_home, index.url)
    term = session("a", KISO_INDEX_URL=index.url)
    term.wait_for("▸ default")
    term.settle()
    assert NOTICE in term.text
    wait_until(lambda: len(index.pages) == 1, "the due check")
    term.send("/exit" + ENTER)
    assert term.exit_status() == 0

    # KISO_NO_UPDATE_CHECK=1: no line, no request
    stale(kiso_home, index.url)
    term = session("b", KISO_INDEX_URL=index.url, KISO_NO_UPDATE_CHECK="1")
    term.wait_for("▸ default")
    term.settle()
    assert "is out" not in term.text
    term.send("/exit" + ENTER)
    assert term.exit_status() == 0

    # "updateCheck": false in the user config: the same
    (kiso_home / "config.json").write_text(json.dumps({"updateCheck": False}))
    term = session("c", KISO_INDEX_URL=index.url)
    term.wait_for("▸ default")
    term.settle()
    assert "is out" not in term.text
    term.send("/exit" + ENTER)
    assert term.exit_status() == 0
    (kiso_home / "config.json").unlink()

    env = {k: v for k, v in os.environ.items() if k not in ("KISO_MODEL", "OPENAI_API_KEY")}
    env.update(
        KISO_HOME=str(kiso_home),
        KISO_INDEX_URL=index.url,
        KISO_NO_UPDATE_CHECK="",
        KISO_FAUX_SCRIPT=str(write_script(tmp_path / "p.json", [{"text": "printed"}])),
    )
    # print mode
    done = subprocess.run(
        [sys.executable, "-m", "kiso.cli", "-p", "hi", "d"],
        cwd=ws,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "printed"
    assert "is out" not in done.stdout + done.stderr

    # a terminal on stdin, a pipe on stdout: the session runs in plain lines, without the notice
    parent, child = pty.openpty()
    try:
        piped = subprocess.Popen(
            [sys.executable, "-m", "kiso.cli", "chat", "e"],
            cwd=ws,
            env=env,
            stdin=child,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.write(parent, b"/exit\n")
        out, err = piped.communicate(timeout=60)
    finally:
        os.close(parent)
        os.close(child)
    assert piped.returncode == 0, err
    assert b"? shows the keys" in out  # the banner was printed
    assert b"is out" not in out + err
    assert len(index.pages) == 1  # none of them asked the index


def test_offline_or_a_broken_index_is_silent(
    session: Callable[..., Term], index: Index, kiso_home: Path
) -> None:
    offline = f"http://127.0.0.1:{closed_port()}/simple/"
    term = session(KISO_INDEX_URL=offline)
    term.wait_for("▸ default")
    wait_until(lambda: read_record(kiso_home) is not None, "the failed attempt's record")
    term.settle()
    record = read_record(kiso_home)
    assert record is not None and record.latest is None  # the attempt counts: a day till the next
    assert "is out" not in term.text
    term.send("/exit" + ENTER)
    assert term.exit_status() == 0
    assert b"Traceback" not in term.raw and b"rror" not in term.raw

    (kiso_home / "release-check.json").unlink()
    index.answer = (200, "application/vnd.pypi.simple.v1+json", b"{not json")
    term = session("m", KISO_INDEX_URL=index.url)
    term.wait_for("▸ default")
    wait_until(lambda: read_record(kiso_home) is not None, "the malformed answer's record")
    term.settle()
    assert len(index.pages) == 1
    assert "is out" not in term.text
    term.send("/exit" + ENTER)
    assert term.exit_status() == 0
    assert b"Traceback" not in term.raw and b"rror" not in term.raw


# ------------------------------------------------------------------------------------------------
# the check, in this process, against the same index


@pytest.mark.parametrize(
    "answer",
    [
        (200, "application/vnd.pypi.simple.v1+json", b"{not json"),
        (200, "application/vnd.pypi.simple.v1+json", b'{"files": 5}'),
        (200, "application/vnd.pypi.simple.v1+json", b'{"files": [{"url": "x"}]}'),
        (200, "application/vnd.pypi.simple.v1+json", b"[1, 2]"),
        (200, "text/html", b"<html><body>nothing here</body></html>"),
        (200, "text/html", b'<a href="other-9.0.tar.gz">other-9.0.tar.gz</a>'),
        (200, "text/html", b"\xff\xfe\x00garbage"),
        (200, "image/png", b"\x89PNG"),
        (500, "text/html", b"oops"),
        (404, "text/html", b"not found"),
    ],
)
def test_a_malformed_answer_is_silence_and_keeps_what_was_known(
    index: Index, home: Path, answer: tuple[int, str, bytes]
) -> None:
    index.answer = answer
    fresh = ReleaseCheck(home, index.url, current=CUR).run()  # never raises
    assert (fresh.latest, fresh.latest_any) == (None, None)
    assert ReleaseCheck(home, index.url, current=CUR).notice() is None
    stale(home, index.url)  # a check that fails keeps the version the last one found
    kept = ReleaseCheck(home, index.url, current=CUR).run()
    assert kept.latest == NEXT and time.time() - kept.checked < 60
    assert len(index.pages) == 2


def test_the_check_reads_both_page_formats_and_skips_yanked_files(index: Index, home: Path) -> None:
    files = [
        {"filename": f"kiso-{NEXT}-py3-none-any.whl", "url": "a", "hashes": {}},
        {"filename": f"kiso-{MAJOR}.{MINOR + 5}.0.tar.gz", "url": "b", "hashes": {}, "yanked": "x"},
        {"filename": f"kiso-{PRE}-py3-none-any.whl", "url": "c", "hashes": {}, "yanked": False},
        {"filename": "kiso_tools-99.0-py3-none-any.whl", "url": "d", "hashes": {}},
    ]
    body = json.dumps({"meta": {"api-version": "1.1"}, "name": "kiso", "files": files}).encode()
    index.answer = (200, "application/vnd.pypi.simple.v1+json", body)
    record = ReleaseCheck(home, index.url, current=CUR).run()
    assert (record.latest, record.latest_any) == (NEXT, PRE)
    # a pre-release hears of newer pre-releases; a final one only of finals
    assert ReleaseCheck(home, index.url, current=f"{MAJOR}.{MINOR + 1}.0b1").notice() == (
        f"kiso {PRE} is out — kiso update"
    )
    assert ReleaseCheck(home, index.url, current=CUR).notice() == NOTICE
    assert ReleaseCheck(home, index.url, current=NEXT).notice() is None
    index.answer = None  # the HTML page
    assert ReleaseCheck(home, "http://nowhere.invalid/", current=CUR).due()  # another index
    record = ReleaseCheck(home, index.url, current=CUR).run()
    assert (record.latest, record.latest_any) == (NEXT, PRE)


def test_the_check_starts_only_when_due_and_only_when_allowed(index: Index, home: Path) -> None:
    now = time.time()
    write_record(home, Record(now - DAY + 60, index.url, NEXT, NEXT))
    check = ReleaseCheck(home, index.url)
    assert not check.start() and check.thread is None  # checked less than a day ago
    write_record(home, Record(now - DAY - 60, index.url, NEXT, NEXT))
    check = ReleaseCheck(home, index.url)
    assert check.start() and check.thread is not None
    check.thread.join(15)
    assert check.fresh is not None and check.fresh.checked >= now
    assert len(index.pages) == 1
    write_record(home, Record(now + DAY, index.url, None, None))  # a clock put back: ask again
    assert ReleaseCheck(home, index.url).due()

    assert check_enabled({}, home)
    for off in ("1", "yes", "true"):
        assert not check_enabled({"KISO_NO_UPDATE_CHECK": off}, home)
    assert check_enabled({"KISO_NO_UPDATE_CHECK": "0"}, home)
    (home / "config.json").write_text('{"updateCheck": false}')
    assert not check_enabled({}, home)
    (home / "config.json").write_text('{"updateCheck": "no"}')  # broken: the session says so
    assert check_enabled({}, home)


def test_the_index_comes_from_kiso_or_pip_settings() -> None:
    assert index_url({}) == "https://pypi.org/simple/"
    assert index_url({"PIP_INDEX_URL": "http://m/simple"}) == "http://m/simple"
    assert index_url({"PIP_INDEX_URL": "http://m/", "KISO_INDEX_URL": "http://k/"}) == "http://k/"


def test_the_record_is_written_whole_and_a_bad_one_is_ignored(home: Path) -> None:
    write_record(home, Record(1.5, "http://i/", NEXT, PRE))
    assert read_record(home) == Record(1.5, "http://i/", NEXT, PRE)
    assert [p.name for p in home.iterdir()] == ["release-check.json"]  # no temporary left
    for junk in ("", "{", "[]", '{"version": 2}', '{"version": 1, "checked": "x", "index": "i"}'):
        (home / "release-check.json").write_text(junk)
        assert read_record(home) is None
        assert ReleaseCheck(home, "http://i/").due()


def test_the_config_loader_knows_update_check(home: Path, tmp_path: Path) -> None:
    from kiso.runtime.config import ConfigError, load_config

    home.mkdir(parents=True)
    assert load_config(home).update_check is True
    (home / "config.json").write_text('{"updateCheck": false}')
    assert load_config(home).update_check is False
    (home / "config.json").write_text('{"updateCheck": 0}')
    with pytest.raises(ConfigError, match="updateCheck: must be true or false"):
        load_config(home)
    (home / "config.json").unlink()
    project = tmp_path / "proj"
    (project / ".kiso").mkdir(parents=True)
    (project / ".kiso" / "config.json").write_text('{"updateCheck": false}')
    with pytest.raises(ConfigError, match="only your user config"):
        load_config(home, project)


# ------------------------------------------------------------------------------------------------
# versions and pages, pure


def test_versions_order_as_pep_440_says() -> None:
    ordered = [
        "1.0.dev0",
        "1.0a1.dev1",
        "1.0a1",
        "1.0b2.post3",
        "1.0rc1",
        "1.0",
        "1.0.post1.dev1",
        "1.0.post1",
        "1.0.1",
        "1.1.dev1",
        "1!0.1",
    ]
    parsed = [parse_version(v) for v in ordered]
    assert all(p is not None for p in parsed)
    assert parsed == sorted(parsed, key=lambda p: p.key if p else ())
    assert parse_version("1.0") == parse_version("1.0.0") == parse_version("v1.0")
    assert parse_version("1.0-1") == parse_version("1.0.post1")
    assert parse_version("1.0.ALPHA.2") == parse_version("1.0a2")
    for bad in ("", "one", "1.0-beta-x", "1..0", "latest"):
        assert parse_version(bad) is None
    assert newest(["0.1.0", "0.10.0", "0.9.9", "junk", "0.11.0rc1"], prereleases=False) == "0.10.0"
    assert newest(["0.1.0", "0.11.0rc1", "0.12.0+local"], prereleases=True) == "0.11.0rc1"
    assert newest([], prereleases=True) is None


_SEP = st.sampled_from(["", ".", "-", "_"])
_VERSIONS = st.builds(
    lambda epoch, release, pre, post, dev: epoch + release + pre + post + dev,
    st.sampled_from(["", "1!"]),
    st.lists(st.integers(0, 11), min_size=1, max_size=4).map(lambda r: ".".join(map(str, r))),
    st.one_of(
        st.just(""),
        st.builds(
            lambda s, label, n: f"{s}{label}{n}",
            _SEP,
            st.sampled_from(["a", "b", "rc", "c", "alpha", "beta", "pre", "preview"]),
            st.sampled_from(["", "0", "1", "2"]),
        ),
    ),
    st.sampled_from(["", ".post1", "-2", "post0", ".rev3", "r1"]),
    st.sampled_from(["", ".dev0", ".dev3", "dev"]),
)


@given(_VERSIONS, _VERSIONS)
def test_version_order_agrees_with_packaging(a: str, b: str) -> None:
    from packaging.version import Version as Reference

    va, vb = parse_version(a), parse_version(b)
    assert va is not None and vb is not None
    ra, rb = Reference(a), Reference(b)
    assert (va < vb, va == vb, va > vb) == (ra < rb, ra == rb, ra > rb)
    assert va.prerelease == ra.is_prerelease


def test_page_parsing_names_only_this_distributions_files() -> None:
    html = (
        b'<a href="../../f/kiso-0.2.0-py3-none-any.whl#sha256=ab">kiso-0.2.0-py3-none-any.whl</a>'
        b'<a href="kiso-0.3.0.tar.gz" data-yanked="broken">kiso-0.3.0.tar.gz</a>'
        b'<a href="kiso-0.2.5.tar.gz"></a>'
        b'<a href="kiso_extra-9.0-py3-none-any.whl">kiso_extra-9.0-py3-none-any.whl</a>'
        b'<a href="kiso-extra-9.0.tar.gz">kiso-extra-9.0.tar.gz</a>'
    )
    assert versions_in_page(html, "text/html; charset=utf-8") == ["0.2.0", "0.2.5"]
    only_versions = json.dumps({"name": "kiso", "versions": ["0.4.0"], "files": []}).encode()
    assert versions_in_page(only_versions, "application/vnd.pypi.simple.v1+json") == ["0.4.0"]
    assert version_of("Kiso-1.0-cp311-cp311-manylinux_x86_64.whl") == "1.0"
    assert version_of("kiso-1.0.zip") == "1.0"
    assert version_of("kiso-1.0.exe") is None


def test_the_announcement_compares_versions_not_strings() -> None:
    def rec(latest: str | None, latest_any: str | None = None) -> Record:
        return Record(0, "i", latest, latest_any or latest)

    assert announcement("0.9.0", rec("0.10.0")) == "kiso 0.10.0 is out — kiso update"
    assert announcement("0.10.0", rec("0.9.0")) is None
    assert announcement("0.10.0", rec("0.10")) is None
    assert announcement("0.10.0", rec(None, "0.11.0rc1")) is None
    assert announcement("0.10.0rc1", rec("0.10.0")) == "kiso 0.10.0 is out — kiso update"
    assert announcement("0.10.0.dev1", rec(None, "0.10.0a1")) == (
        "kiso 0.10.0a1 is out — kiso update"
    )
    assert announcement("0.10.0", rec("not a version")) is None
    assert announcement("0.10.0", None) is None


# ------------------------------------------------------------------------------------------------
# kiso update: the plan, pure

SITE = Path("/venv/lib/python3.11/site-packages")
BASE = Installation(
    executable="/venv/bin/python",
    prefix=Path("/venv"),
    version=CUR,
    location=SITE,
    site_dirs=(SITE,),
    has_pip=True,
)


def which(found: dict[str, str]) -> Callable[[str], str | None]:
    return found.get


@pytest.mark.parametrize(
    ("changes", "on_path", "expected"),
    [
        ({}, {}, ("pip", "/venv/bin/python -m pip install --upgrade kiso")),
        (
            {"location": Path("/u/site"), "user_site": Path("/u/site")},
            {},
            ("pip", "/venv/bin/python -m pip install --user --upgrade kiso"),
        ),
        (
            {"pipx": True, "prefix": Path("/h/pipx/venvs/kiso")},
            {"pipx": "/bin/pipx"},
            ("pipx", "/bin/pipx upgrade kiso"),
        ),
        (
            {"uv_tool": True, "prefix": Path("/h/uv/tools/kiso")},
            {"uv": "/bin/uv"},
            ("uv tool", "/bin/uv tool upgrade kiso"),
        ),
    ],
)
def test_the_plan_follows_the_way_kiso_was_installed(
    changes: dict[str, Any], on_path: dict[str, str], expected: tuple[str, str]
) -> None:
    plan = plan_update(replace(BASE, **changes), which(on_path))
    assert isinstance(plan, Plan)
    assert (plan.tool, " ".join(plan.argv)) == expected


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"location": None}, ["not installed as a package", "pipx install kiso"]),
        ({"editable": "file:///src/kiso"}, ["editable install of /src/kiso", "git -C /src/kiso"]),
        ({"writable": False}, ["cannot write", "sudo /venv/bin/python -m pip install"]),
        ({"has_pip": False}, ["no pip", "/venv/bin/python -m ensurepip"]),
        ({"externally_managed": True}, ["EXTERNALLY-MANAGED", "pipx install kiso"]),
        ({"location": Path("/elsewhere")}, ["/elsewhere, outside the environment"]),
        ({"pipx": True, "prefix": Path("/p/venvs/kiso")}, ["`pipx` is not on PATH"]),
        ({"uv_tool": True}, ["`uv` is not on PATH", "uv tool upgrade"]),
    ],
)
def test_the_plan_says_plainly_when_it_cannot_tell(
    changes: dict[str, Any], says: list[str]
) -> None:
    plan = plan_update(replace(BASE, **changes), which({}))
    assert isinstance(plan, CannotUpdate)
    for words in says:
        assert words in plan.message


# ------------------------------------------------------------------------------------------------
# kiso update: real installers in throwaway venvs


def site_packages(venv: Path) -> Path:
    (found,) = (venv / "lib").glob("python3*/site-packages")
    return found


def run_kiso_here(venv: Path) -> None:
    """Let ``venv``'s Python run the kiso under test: its source and dependencies go at the end
    of its path (after the venv's own site-packages, so the venv's ``kiso`` metadata wins)."""
    src = Path(kiso.__file__).resolve().parents[1]
    deps = Path(click.__file__).resolve().parents[1]
    (site_packages(venv) / "zz_kiso_under_test.pth").write_text(f"{src}\n{deps}\n")


def installed(venv: Path) -> list[str]:
    return sorted(p.name for p in site_packages(venv).glob("kiso-*.dist-info"))


def installer_env(index: Index, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The user's environment, with pip pointed at the local index and away from any other."""
    drop = ("PIP_", "KISO_", "VIRTUAL_ENV", "PYTHON", "UV_", "PIPX_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        KISO_HOME=str(tmp_path / "home"),
        PIP_INDEX_URL=index.url,
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_CACHE_DIR="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        PIP_RETRIES="0",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    env.update(extra)
    return env


def kiso_update(venv: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "kiso.cli", "update"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_kiso_update_upgrades_a_pip_install_with_its_own_pip(index: Index, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = installer_env(index, tmp_path, KISO_TEST_MARK="from the user")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"kiso=={CUR}"],
        env=env,
        check=True,
        timeout=120,
    )
    assert installed(venv) == [f"kiso-{CUR}.dist-info"]
    run_kiso_here(venv)

    done = kiso_update(venv, env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"kiso {CUR}, installed with pip in {venv}"
    assert lines[1] == f"running: {python} -m pip install --upgrade kiso"
    assert lines[-1] == f"kiso {CUR} → {NEXT}"
    assert any("Successfully installed kiso" in ln for ln in lines[2:-1])  # pip's own output
    assert installed(venv) == [f"kiso-{NEXT}.dist-info"]  # the final release, not the rc
    assert f"kiso-{NEXT}-py3-none-any.whl" in index.files

    done = kiso_update(venv, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"kiso {NEXT}: already the newest (pip changed nothing)"

    broken = f"{MAJOR}.{MINOR + 1}.1"
    index.add(broken, bad_hash=True)  # pip refuses a file whose hash is not the page's
    done = kiso_update(venv, env)
    assert done.returncode != 0
    assert f"pip failed (exit status {done.returncode}); kiso is still {NEXT}" in done.stderr
    assert installed(venv) == [f"kiso-{NEXT}.dist-info"]


FAKE_TOOL = """#!{python}
import os, sys, shutil, zipfile
from pathlib import Path
with open({log!r}, "a") as log:
    log.write(" ".join(sys.argv[1:]) + " | " + os.environ.get("KISO_TEST_MARK", "-") + "\\n")
print("fake {name}: upgrading", flush=True)
code = int(os.environ.get("FAKE_EXIT", "0"))
if code == 0:
    site = Path({site!r})
    for old in site.glob("kiso-*.dist-info"):
        shutil.rmtree(old)
    zipfile.ZipFile({wheel!r}).extractall(site)
sys.exit(code)
"""


TOOLS = {
    # the tool: where it keeps its environments, the file it leaves in one, its upgrade command
    "pipx": (("pipx", "venvs"), "pipx_metadata.json", "upgrade kiso"),
    "uv": (("uv", "tools"), "uv-receipt.toml", "tool upgrade kiso"),
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_kiso_update_uses_the_tool_that_installed_it(
    index: Index, tmp_path: Path, tool: str
) -> None:
    layout, marker, args = TOOLS[tool]
    venv = tmp_path.joinpath(*layout, "kiso")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    (venv / marker).write_text("")
    site = site_packages(venv)
    zipfile.ZipFile(index.project / f"kiso-{CUR}-py3-none-any.whl").extractall(site)
    run_kiso_here(venv)
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    fake = bin_dir / tool
    fake.write_text(
        FAKE_TOOL.format(
            python=sys.executable,
            log=str(log),
            name=tool,
            site=str(site),
            wheel=str(index.project / f"kiso-{NEXT}-py3-none-any.whl"),
        )
    )
    fake.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    env = installer_env(index, tmp_path, PATH=path, KISO_TEST_MARK="from the user")

    done = kiso_update(venv, {**env, "FAKE_EXIT": "3"})
    assert done.returncode == 3  # the installer's own status
    label = "uv tool" if tool == "uv" else tool
    assert f"{label} failed (exit status 3); kiso is still {CUR}" in done.stderr

    done = kiso_update(venv, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"kiso {CUR}, installed with {label} in {venv}",
        f"running: {fake} {args}",
        f"fake {tool}: upgrading",  # the installer writes to the same terminal
        f"kiso {CUR} → {NEXT}",
    ]
    assert log.read_text().splitlines() == [f"{args} | from the user"] * 2  # the user's env

    done = kiso_update(venv, {**env, "PATH": str(tmp_path / "nothing")})
    assert done.returncode == 1
    assert f"kiso was installed with {label} ({venv}), but `{tool}` is not on PATH" in done.stderr
    assert f"`{tool} {args}`" in done.stderr


def test_kiso_update_refuses_a_development_checkout(tmp_path: Path) -> None:
    """The project's own venv holds kiso as an editable install: nothing is run."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kiso")), "update"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    root = Path(kiso.__file__).resolve().parents[2]
    assert f"kiso is an editable install of {root}" in done.stderr
    assert f"`git -C {root} pull`" in done.stderr
    assert "Traceback" not in done.stderr
