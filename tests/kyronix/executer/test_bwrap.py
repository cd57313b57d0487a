"""The bubblewrap recipe of docs/executer.md, run for real when ``bwrap`` is installed.

The path sandbox cannot contain the ``terminal`` (a shell can do anything the executer's user
can); an OS sandbox can. docs/executer.md documents one ``bwrap`` command line: the whole
filesystem read-only, the base (and the executer's state directory) writable, a private /tmp,
no network. This test takes that command line from the document itself and checks, on the
filesystem and with a canary HTTP server on 127.0.0.1, that a plan run under it can write in the
base and nowhere else, and reaches no network. Without bwrap the test is skipped; with a bwrap
that cannot create namespaces here (a container without user namespaces) it is skipped loudly,
with bwrap's own words; any other failure of bwrap fails the test.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "executer.md"
BWRAP = shutil.which("bwrap")
KYRONIX = str(Path(sys.executable).with_name("kyronix"))
INSTALL = Path(__file__).resolve().parents[3]
"""The checkout: this venv and the editable install's sources both live in it."""

pytestmark = pytest.mark.skipif(BWRAP is None, reason="bubblewrap (bwrap) is not installed")

_NAMESPACE_ERRORS = (
    "namespace",
    "uid map",
    "setting up uid",
    "unshare",
    "Operation not permitted",
    "No permissions",
)


def recipe() -> list[str]:
    """The documented command line (the ```bash block after "Running the executer under
    bubblewrap"), with its variables left for the test to fill in."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Running the executer under bubblewrap", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "docs/executer.md lost its bwrap recipe"
    line = block.group(1).replace("\\\n", " ")
    command = next(x for x in line.splitlines() if x.strip().startswith("bwrap "))
    return shlex.split(command)


def _fill(argv: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for arg in argv:
        filled = arg
        for name, value in values.items():
            filled = filled.replace(f"${name}", value).replace(f"${{{name}}}", value)
        out.append(filled)
    return out


def _namespaces_or_skip() -> None:
    assert BWRAP is not None
    probe = subprocess.run(
        [BWRAP, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode == 0:
        return
    why = probe.stderr.strip()
    if any(word.lower() in why.lower() for word in _NAMESPACE_ERRORS):
        pytest.skip(
            f"bwrap is installed but cannot create namespaces here, so the documented recipe "
            f"cannot be run in this environment: {why!r}"
        )
    pytest.fail(f"bwrap failed for another reason than namespaces: {why!r}")


class _Canary(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Canary.hits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"canary")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canary() -> Iterator[int]:
    _Canary.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Canary)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_the_documented_recipe_confines_the_terminal(tmp_path: Path, canary: int) -> None:
    _namespaces_or_skip()
    base = tmp_path / "project"
    base.mkdir()
    home = tmp_path / "kyronix-home"
    home.mkdir()
    outside = tmp_path / "outside.txt"
    probe = Path("/var/tmp") / f"kyronix-bwrap-probe-{uuid.uuid4().hex}"
    url = f"http://127.0.0.1:{canary}/from-the-sandbox"
    fetch = f"import urllib.request; urllib.request.urlopen({url!r}, timeout=5)"
    command = (
        f"echo escaped > {shlex.quote(str(outside))}; "
        f"touch {shlex.quote(str(probe))} || echo probe-refused; "
        f"{shlex.quote(sys.executable)} -c {shlex.quote(fetch)} 2>/dev/null || echo no-network; "
        "echo inside > made-by-the-shell.txt"
    )
    plan = (
        '<tool name="write_file"><path>in.txt</path><content>inside</content></tool>'
        f'<tool name="terminal"><command><![CDATA[{command}]]></command></tool>'
    )
    argv = _fill(
        recipe(),
        {
            "BASE": str(base),
            "KYRONIX_HOME": str(home),
            "PLAN": "-",
            "KYRONIX_INSTALL": str(INSTALL),
        },
    )
    argv = [KYRONIX if arg == "kyronix" else arg for arg in argv]  # this venv's kyronix
    assert argv[0] == "bwrap" and "--unshare-all" in argv and "--share-net" not in argv
    argv[0] = BWRAP or "bwrap"
    try:
        out = subprocess.run(
            argv,
            input=plan,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "KYRONIX_HOME": str(home)},
            check=False,
        )
        assert out.returncode == 0, (out.stdout, out.stderr)
        first, shell = (r["result"] for r in json.loads(out.stdout))
        assert first["success"] and shell["success"], (first, shell)
        assert "probe-refused" in shell["output"] and "no-network" in shell["output"]
        # the filesystem: the base changed, nothing else did
        assert (base / "in.txt").read_text() == "inside"
        assert (base / "made-by-the-shell.txt").read_text() == "inside\n"
        assert not outside.exists(), "the shell wrote outside the base"
        assert not probe.exists(), "the shell wrote to the read-only filesystem"
        # the network: the canary on the host's loopback saw nothing
        assert _Canary.hits == []
        # and the receipts were written where they last
        assert (home / "receipts.sqlite3").exists()
    finally:
        if probe.exists():
            probe.unlink()
