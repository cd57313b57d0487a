"""The four tools, ``navigate``, ``click``, ``type`` and ``screenshot``, on the executer's one
:class:`~kyronix.executer.tools.browser.session.BrowserSession` (``Resources.browser``)."""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

from kiso.tools.atomic import atomic_write
from kyronix.executer.tools.base import Call, Param, ToolFailure, ToolOutput, ToolSpec
from kyronix.executer.tools.browser.guard import _split_url, _vet

__all__ = ["TOOLS", "click", "navigate", "screenshot", "type_text"]


def _png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ToolFailure("the browser returned something that is not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


def navigate(call: Call) -> ToolOutput:
    url = str(call.args["url"]).strip()
    host, port = _split_url(url)
    _vet(host, port, call.permissions)
    return call.resources.browser.navigate(url, call.permissions)


def click(call: Call) -> ToolOutput:
    return call.resources.browser.click(str(call.args["selector"]), call.permissions)


def type_text(call: Call) -> ToolOutput:
    selector, text = str(call.args["selector"]), str(call.args["text"])
    return call.resources.browser.type(selector, text, call.permissions)


def screenshot(call: Call) -> ToolOutput:
    path: Path | None = call.args.get("path")
    if path is not None and path.suffix.lower() != ".png":
        raise ToolFailure(
            f"screenshot writes PNG images; give a path ending in .png, not {call.rel(path)!r}"
        )
    if path is not None and path.is_dir():
        raise ToolFailure(f"{call.rel(path)!r} is a directory; give a file path ending in .png")
    png, url = call.resources.browser.screenshot(call.permissions)
    width, height = _png_size(png)
    data: dict[str, Any] = {"url": url, "width": width, "height": height, "bytes": len(png)}
    if path is None:
        data["png_base64"] = base64.b64encode(png).decode("ascii")
        return ToolOutput(
            f"Took a {width}x{height} screenshot of {url} ({len(png)} bytes of PNG in "
            "data.png_base64)",
            data,
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, png)
    except OSError as exc:
        raise ToolFailure(
            f"could not write the screenshot to {call.rel(path)!r}: {exc.strerror or exc}"
        ) from None
    data["path"] = call.rel(path)
    return ToolOutput(
        f"Saved a {width}x{height} screenshot of {url} to {call.rel(path)} ({len(png)} bytes)",
        data,
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "navigate",
        (Param("url", "string", description="an http:// or https:// URL"),),
        navigate,
        description=(
            "Open a URL in the headless browser; returns the final URL, HTTP status, title and "
            "the page's structure (roles, names, text)."
        ),
        # Not read-only: it changes the page click/type act on, and a page load reaches a
        # server. Idempotent: loading the same URL again (a GET) leaves the browser where one
        # load does, and after a crash the browser is a new one that must load it again.
        read_only=False,
        idempotent=True,
    ),
    ToolSpec(
        "click",
        (Param("selector", "string", description="CSS or Playwright selector"),),
        click,
        description="Click the first element matching the selector on the open page.",
        # A click may submit, buy, send: the page decides.
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "type",
        (
            Param("selector", "string", description="CSS or Playwright selector of a field"),
            Param("text", "string", description="the text to put in the field"),
        ),
        type_text,
        description="Fill a field on the open page with text (replacing what it held).",
        # Filling a field fires input events the page's scripts may act on (autosave).
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "screenshot",
        (Param("path", "path", required=False, description="where to save the PNG (.png)"),),
        screenshot,
        description=(
            "Capture the visible page as PNG: saved to path inside the base, or returned as "
            "base64 when no path is given."
        ),
        writes=True,
        # It may write a PNG (atomically, the whole file): again is the same as once.
        read_only=False,
        idempotent=True,
    ),
)
