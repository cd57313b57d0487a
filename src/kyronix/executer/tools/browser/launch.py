"""Finding and starting the system Chromium: where it is, and the flags it is started with."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from kyronix.executer.tools.base import ToolFailure

__all__ = ["CHROMIUM_PATHS", "LAUNCH_ARGS", "VIEWPORT", "find_chromium"]

CHROMIUM_PATHS = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")

LAUNCH_ARGS = (
    "--no-sandbox",  # the executer may run as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-quic",  # QUIC is UDP: it would not go through the guard proxy
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)

VIEWPORT = {"width": 1280, "height": 800}

PIP_HINT = "pip install 'kiso[browser]'"


def find_chromium(environ: Mapping[str, str] | None = None) -> str:
    """The Chromium binary: ``$KYRONIX_CHROMIUM``, else Debian's, else ``chromium`` on PATH."""
    env = os.environ if environ is None else environ
    explicit = env.get("KYRONIX_CHROMIUM")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise ToolFailure(
            f"KYRONIX_CHROMIUM={explicit!r} is not an executable file; point it at a Chromium "
            "binary (Debian: /usr/lib/chromium/chromium) or unset it"
        )
    for path in CHROMIUM_PATHS:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which("chromium", path=env.get("PATH"))
    if found:
        return found
    raise ToolFailure(
        "the browser tools need Chromium and none was found (looked at $KYRONIX_CHROMIUM, "
        f"{', '.join(CHROMIUM_PATHS)} and chromium on PATH); install Debian's chromium "
        "(apt-get install chromium) or set KYRONIX_CHROMIUM to a Chromium binary"
    )
