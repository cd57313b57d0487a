"""The network guard every network tool runs before it connects: which addresses are private.

Two layers, pure logic first:

- :func:`is_private_address` decides from an IP address alone (no I/O): loopback, RFC 1918,
  carrier-grade NAT, unique-local, link-local, unspecified, multicast, reserved and broadcast
  ranges, the cloud metadata addresses, and IPv6 forms that embed an IPv4 address (IPv4-mapped,
  IPv4-compatible, 6to4, NAT64) are judged by the address they really reach.
- :func:`guard_host` and :func:`guard_url` resolve a host with :func:`socket.getaddrinfo` (so
  ``http://2130706433/``, ``http://0x7f000001/`` and ``http://127.1/`` are seen as the
  ``127.0.0.1`` they are) and raise :class:`SecurityError` when any resolved address is private,
  unless the permission ``net:private`` allows ``host:port`` (the host as written in the URL,
  lower-case, so ``localhost:8080``, ``127.0.0.1:8080``, ``[::1]:443``). Well-known cloud
  metadata host names are refused the same way, before any lookup.

The guard checks addresses once. A client that resolves the name again when it connects can be
given a different answer (DNS rebinding); :mod:`~kyronix.executer.tools.http` therefore connects to
the address returned here. Tools that hand the URL to another program (git) cannot pin it, and
say so.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import SplitResult, urlsplit

from kyronix.executer.tools.base import Call, SecurityError, ToolFailure

__all__ = [
    "DEFAULT_PORTS",
    "METADATA_ADDRESSES",
    "METADATA_HOSTS",
    "guard_host",
    "guard_url",
    "host_target",
    "is_private_address",
    "redact_url",
]

DEFAULT_PORTS: dict[str, int] = {"http": 80, "https": 443, "git": 9418, "ssh": 22}

METADATA_HOSTS: frozenset[str] = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
"""Names cloud providers resolve to their instance metadata service (credentials live there)."""

METADATA_ADDRESSES: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address] = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack, ...
        ipaddress.ip_address("169.254.170.2"),  # AWS ECS task credentials
        ipaddress.ip_address("fd00:ec2::254"),  # AWS IMDS over IPv6
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    }
)

_V4_NOT_PUBLIC = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local (and the metadata address)
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, including 255.255.255.255
    )
)

_V6_NOT_PUBLIC = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::/128",
        "::1/128",
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard-only
        "2001::/23",  # IETF protocol assignments (Teredo, ORCHID, ...)
        "2001:db8::/32",  # documentation
        "fc00::/7",  # unique local (and fd00:ec2::254)
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)

_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")


def is_private_address(ip: str) -> bool:
    """True when ``ip`` is not an ordinary public unicast address.

    Brackets (``[::1]``) and an IPv6 zone (``fe80::1%eth0``) are ignored. IPv6 addresses that
    carry an IPv4 address (``::ffff:127.0.0.1``, ``::127.0.0.1``, ``2002:7f00:1::``,
    ``64:ff9b::7f00:1``) are private when the IPv4 address is. Raises :class:`ValueError` when
    ``ip`` is not an IP address.
    """
    bare = ip.strip().removeprefix("[").removesuffix("]")
    address = ipaddress.ip_address(bare.split("%", 1)[0])
    return _is_private(address)


def _is_private(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if address in METADATA_ADDRESSES:
        return True
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_v4(address)
        if embedded is not None:
            return _is_private(embedded)
        ranges: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] = _V6_NOT_PUBLIC
    else:
        ranges = _V4_NOT_PUBLIC
    if any(address in net for net in ranges):
        return True
    return not address.is_global or address.is_multicast or address.is_reserved


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address delivers to, for the forms that embed one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64_WELL_KNOWN or (
        address in _IPV4_COMPATIBLE and int(address) > 1  # not :: or ::1
    ):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def host_target(host: str, port: int) -> str:
    """The ``net:private`` permission target: ``host:port``, ``[v6]:port`` for an IPv6 literal
    (policies match a target literally before trying it as a pattern)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def redact_url(url: str) -> str:
    """``url`` without a password in its userinfo (``https://user:***@host/``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return parts._replace(netloc=f"{user}:***@{hostport}").geturl()


def guard_host(call: Call, host: str, port: int, *, what: str = "") -> list[str]:
    """Resolve ``host`` and return its addresses, or refuse a private one (see the module doc).

    ``what`` names the request in messages (``"git_clone of https://..."``). Raises
    :class:`ToolFailure` when the name does not resolve and :class:`SecurityError` when an
    address is private and ``net:private`` does not allow ``host:port``.
    """
    name = host.strip().rstrip(".").lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not name:
        raise ToolFailure(f"{what or 'the URL'} has no host name", error_type="InvalidArguments")
    target = host_target(name, port)
    label = f" ({what})" if what else ""
    how = (
        f"allow it with the policy allow('net:private', {target!r}) (or "
        f"PermissionManager(ROOT_POLICIES)) if this address is meant to be reached"
    )
    allowed = call.permissions.check("net:private", target)
    if name in METADATA_HOSTS and not allowed:
        raise SecurityError(
            f"the host {name!r}{label} is a cloud metadata service name and was refused; {how}"
        )
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolFailure(
            f"could not resolve the host {name!r}{label}: {exc}; check the host name",
            error_type="NetworkError",
        ) from None
    addresses: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise ToolFailure(
            f"the host {name!r}{label} resolved to no address", error_type="NetworkError"
        )
    if not allowed:
        for address in addresses:
            if is_private_address(address):
                kind = (
                    "a cloud metadata"
                    if ipaddress.ip_address(address.split("%", 1)[0]) in METADATA_ADDRESSES
                    else "a private, loopback or link-local"
                )
                shown = name if name == address else f"{name!r} resolves to {address}, which"
                raise SecurityError(
                    f"the host {shown} is {kind} address{label} and was refused under the "
                    f"current policies; {how}"
                )
    return addresses


def split_url(url: str, *, schemes: Sequence[str]) -> tuple[SplitResult, str, int]:
    """``(parts, host, port)`` of an absolute URL whose scheme is one of ``schemes``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ToolFailure(
            f"the URL {redact_url(url)!r} is malformed ({exc}); give an absolute URL such as "
            f"https://example.com/path",
            error_type="InvalidArguments",
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        accepted = ", ".join(f"{s}://" for s in schemes)
        shown = f"the scheme {scheme!r}" if scheme else "no scheme"
        raise ToolFailure(
            f"the URL {redact_url(url)!r} has {shown}; only {accepted} URLs are accepted",
            error_type="InvalidArguments",
        )
    host = parts.hostname or ""
    if not host:
        raise ToolFailure(
            f"the URL {redact_url(url)!r} has no host; give an absolute URL such as "
            f"{schemes[0]}://example.com/path",
            error_type="InvalidArguments",
        )
    if port is None:
        port = DEFAULT_PORTS.get(scheme, 0)
    return parts, host, port


def guard_url(call: Call, url: str, *, schemes: Sequence[str] = ("http", "https")) -> list[str]:
    """Check ``url`` before anything connects to it and return the addresses its host has.

    Refuses (:class:`ToolFailure`) a scheme outside ``schemes`` and a URL without a host;
    refuses (:class:`SecurityError`) private addresses as :func:`guard_host` does. Credentials
    in the URL are allowed and never appear in a message.
    """
    _, host, port = split_url(url, schemes=schemes)
    return guard_host(call, host, port, what=redact_url(url))
