"""Which addresses and URLs the browser may reach: the checks every layer of the guard shares.

A host is resolved (so ``2130706433`` and ``0x7f.1`` are seen as the loopback they are) and
refused when any of its addresses is loopback, private, CGNAT, link-local, unspecified,
multicast, reserved or a cloud metadata address, unless ``net:private`` allows ``host:port``
(:func:`_vet`); ``navigate`` takes only ``http``/``https`` URLs (:func:`_split_url`).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kyronix.executer.tools.base import SecurityError, ToolFailure
from kyronix.executer.tools.net import (
    METADATA_ADDRESSES,
    METADATA_HOSTS,
    host_target,
    is_private_address,
)

if TYPE_CHECKING:
    from kyronix.executer.permissions import PermissionManager

__all__ = ["Address", "BlockedRequest"]


def _kind(ip: str) -> str | None:
    """Why the browser may not reach ``ip`` without ``net:private`` (None: it may)."""
    if not is_private_address(ip):
        return None
    try:
        if ipaddress.ip_address(ip.split("%", 1)[0]) in METADATA_ADDRESSES:
            return "cloud metadata"
    except ValueError:
        return "not an IP address"
    return "loopback, private, link-local or reserved"


def _canonical_host(host: str) -> str:
    """The host as Chromium will see it: lower case, no trailing dot, numeric forms such as
    ``2130706433`` or ``0x7f.1`` written as the address they are."""
    name = host.strip().strip("[]").rstrip(".").lower()
    try:
        info = socket.getaddrinfo(name, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return name
    return str(info[0][4][0]) if info else name


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


Address = tuple[int, tuple[Any, ...]]
"""A resolved address: socket family and sockaddr."""


def _vet(host: str, port: int, permissions: PermissionManager | None) -> list[Address]:
    """Resolve ``host`` and return its addresses if the browser may reach all of them.

    Raises :class:`SecurityError` when one is private (see
    :func:`~kyronix.executer.tools.net.is_private_address`) and ``net:private`` does not allow
    ``host:port``; :class:`ToolFailure` when the host does not
    resolve. ``permissions`` None allows no private address.
    """
    name = _canonical_host(host)
    if not name:
        raise ToolFailure("the URL has no host")
    special = None
    if name == "localhost" or name.endswith(".localhost"):
        special = f"{name} is a loopback name"
    elif name in METADATA_HOSTS:
        special = f"{name} is the cloud metadata server"
    addresses: list[Address] = []
    try:
        for family, _, _, _, sockaddr in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM):
            if (family, sockaddr) not in addresses:
                addresses.append((family, sockaddr))
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        if special is None:
            raise ToolFailure(f"the host {host!r} could not be resolved ({exc})") from None
    reason = special
    for _, sockaddr in addresses:
        ip = str(sockaddr[0])
        kind = _kind(ip)
        if reason is None and kind is not None:
            if _is_ip(name):
                reason = f"{ip} is a {kind} address"
            else:
                reason = f"{name} is {ip}, a {kind} address"
    if reason is not None:
        target = host_target(name, port)
        if permissions is None or not permissions.check("net:private", target):
            raise SecurityError(
                f"the browser may not reach {target}: {reason}. Loopback, private, link-local "
                f"and cloud metadata addresses need the permission net:private; allow this one "
                f"with allow('net:private', {target!r}) or use ROOT_POLICIES"
            )
    return addresses


_REFUSED_SCHEMES = {
    "file": "file: URLs would read files outside the base path; use read_file",
    "javascript": "javascript: URLs run script; use click and type on the page",
    "data": "data: URLs are not web pages",
    "chrome": "chrome: pages are the browser's internals",
}


def _split_url(url: str) -> tuple[str, int]:
    """Check a ``navigate`` URL's form and return its host and port (no network)."""
    if not url:
        raise ToolFailure("navigate needs a url, such as https://example.com/")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url) or "\\" in url:
        raise ToolFailure(
            f"the url {url[:200]!r} contains spaces, control characters or backslashes; "
            "percent-encode them (a space is %20)"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        after = url[len(scheme) + 1 :][:1]
        if scheme and not (after.isascii() and after.isdigit()):  # not "localhost:8080"
            why = _REFUSED_SCHEMES.get(scheme, f"{scheme}: URLs are not web pages")
            raise SecurityError(
                f"navigate opens only http:// and https:// URLs, not {url[:100]!r}: {why}"
            )
        raise ToolFailure(
            f"the url {url[:200]!r} has no http:// or https:// scheme; write it in full, such as "
            f"https://{url[:100]}"
        )
    try:
        port = parts.port
    except ValueError:
        raise ToolFailure(f"the url {url[:200]!r} has an invalid port") from None
    if not parts.hostname:
        raise ToolFailure(f"the url {url[:200]!r} has no host")
    return parts.hostname, port or (443 if scheme == "https" else 80)


@dataclass(frozen=True, slots=True)
class BlockedRequest:
    """A request the guard refused: by the ``route`` guard or the ``proxy``."""

    layer: str
    target: str
    reason: str
