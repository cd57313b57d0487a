"""The network guard: which addresses are private, and guard_url's decisions (no network)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest

from kyronix.executer.permissions import (
    ROOT_POLICIES,
    SAFE_POLICIES,
    PermissionManager,
    allow,
    deny,
)
from kyronix.executer.tools.base import Call, SecurityError, ToolFailure
from kyronix.executer.tools.net import guard_url, is_private_address, redact_url

PRIVATE = [
    # IPv4
    "127.0.0.1",
    "127.255.255.254",
    "10.0.0.1",
    "10.255.255.255",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.0.1",
    "100.64.0.1",  # carrier-grade NAT
    "100.127.255.254",
    "169.254.0.1",  # link-local
    "169.254.169.254",  # cloud metadata
    "169.254.170.2",  # ECS task metadata
    "100.100.100.200",  # Alibaba metadata (public-looking, inside CGNAT)
    "0.0.0.0",
    "0.1.2.3",  # 0.0.0.0/8
    "224.0.0.1",  # multicast
    "239.255.255.250",
    "240.0.0.1",  # reserved
    "255.255.255.255",  # broadcast
    "192.0.2.10",  # documentation
    "198.18.0.1",  # benchmarking
    "192.0.0.8",
    # IPv6
    "::1",
    "::",
    "fc00::1",
    "fd12:3456::1",
    "fd00:ec2::254",  # AWS metadata over IPv6
    "fe80::1",
    "fe80::1%lo",
    "febf::1",
    "fec0::1",  # site-local
    "ff02::1",  # multicast
    "2001:db8::1",  # documentation
    "100::1",  # discard
    # IPv6 forms carrying a private IPv4 address
    "::ffff:127.0.0.1",
    "::ffff:7f00:1",
    "::ffff:10.1.2.3",
    "::ffff:169.254.169.254",
    "::127.0.0.1",  # IPv4-compatible
    "::a9fe:a9fe",
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
    "2002:c0a8:101::",  # 6to4 of 192.168.1.1
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::808:808",  # local-use NAT64 prefix
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "172.15.255.255",
    "172.32.0.1",
    "100.63.255.255",
    "100.128.0.1",
    "192.167.255.255",
    "192.169.0.1",
    "169.253.255.255",
    "223.255.255.255",
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "::ffff:8.8.8.8",
    "2002:808:808::1",  # 6to4 of 8.8.8.8
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
]


@pytest.mark.parametrize("ip", PRIVATE)
def test_private_addresses(ip: str) -> None:
    assert is_private_address(ip) is True


@pytest.mark.parametrize("ip", PUBLIC)
def test_public_addresses(ip: str) -> None:
    assert is_private_address(ip) is False


@pytest.mark.parametrize("text", ["", "localhost", "127.0.0.1.1", "2130706433", "::g"])
def test_non_addresses_raise(text: str) -> None:
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        is_private_address(text)


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("https://u:tok@h.example/p?q") == "https://u:***@h.example/p?q"
    assert redact_url("https://u@h.example/") == "https://u@h.example/"
    assert redact_url("https://h.example/") == "https://h.example/"


# -- guard_url ----------------------------------------------------------------------------------


def make_call(tmp_path: Path, permissions: PermissionManager) -> Call:
    return Call(
        tool="http_request",
        execution_id="e1",
        args={},
        base=tmp_path.resolve(),
        permissions=permissions,
    )


SAFE = PermissionManager(SAFE_POLICIES).with_policies(allow("tool:http_request"))


@pytest.fixture
def no_lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every name resolution; resolve only numeric hosts and localhost (no network)."""
    asked: list[str] = []
    real = socket.getaddrinfo

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        if host == "localhost" or re.fullmatch(r"[0-9a-fA-FxX.:%]+", host):
            return real(host, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return asked


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://127.0.0.1/", "127.0.0.1"),
        ("http://localhost:8080/x", "127.0.0.1"),
        ("http://[::1]/", "::1"),
        ("http://2130706433/", "127.0.0.1"),
        ("http://0x7f000001/", "127.0.0.1"),
        ("http://127.1/", "127.0.0.1"),
        ("http://0177.0.0.1/", "127.0.0.1"),
        ("https://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
        ("http://[fd00:ec2::254]/", "fd00:ec2::254"),
        ("http://10.0.0.7:9000/", "10.0.0.7"),
        ("http://0.0.0.0:8000/", "0.0.0.0"),
    ],
)
def test_private_destinations_are_refused_under_safe_policies(
    tmp_path: Path, url: str, address: str, no_lookups: list[str]
) -> None:
    with pytest.raises(SecurityError) as info:
        guard_url(make_call(tmp_path, SAFE), url)
    message = info.value.message
    assert address in message
    assert "allow('net:private'" in message


def test_the_message_names_the_host_the_address_and_the_policy(
    tmp_path: Path, no_lookups: list[str]
) -> None:
    with pytest.raises(SecurityError) as info:
        guard_url(make_call(tmp_path, SAFE), "http://localhost:8080/x")
    message = info.value.message
    assert "'localhost' resolves to 127.0.0.1" in message
    assert "allow('net:private', 'localhost:8080')" in message


@pytest.mark.parametrize(
    "host",
    ["metadata.google.internal", "METADATA.google.internal.", "metadata", "instance-data"],
)
def test_metadata_names_are_refused_without_a_lookup(
    tmp_path: Path, host: str, no_lookups: list[str]
) -> None:
    with pytest.raises(SecurityError) as info:
        guard_url(make_call(tmp_path, SAFE), f"http://{host}/computeMetadata/v1/")
    assert "cloud metadata" in info.value.message
    assert no_lookups == []


def test_public_addresses_pass_without_any_policy(tmp_path: Path, no_lookups: list[str]) -> None:
    bare = PermissionManager(())
    assert guard_url(make_call(tmp_path, bare), "https://8.8.8.8/dns") == ["8.8.8.8"]
    assert guard_url(make_call(tmp_path, bare), "http://[2606:4700::1111]:81/") == [
        "2606:4700::1111"
    ]


def test_net_private_allows_exactly_the_host_and_port_named(
    tmp_path: Path, no_lookups: list[str]
) -> None:
    permissions = SAFE.with_policies(
        allow("net:private", "127.0.0.1:8080"), allow("net:private", "[::1]:443")
    )
    call = make_call(tmp_path, permissions)
    assert guard_url(call, "http://127.0.0.1:8080/api") == ["127.0.0.1"]
    assert guard_url(call, "https://[::1]/") == ["::1"]
    with pytest.raises(SecurityError):
        guard_url(call, "http://127.0.0.1:8081/api")
    with pytest.raises(SecurityError):  # the same address under another name is another target
        guard_url(call, "http://2130706433:8080/api")


def test_root_policies_allow_private_addresses_and_a_deny_still_wins(
    tmp_path: Path, no_lookups: list[str]
) -> None:
    root = PermissionManager(ROOT_POLICIES)
    assert "127.0.0.1" in guard_url(make_call(tmp_path, root), "http://localhost/")
    assert guard_url(make_call(tmp_path, root), "http://169.254.169.254/") == ["169.254.169.254"]
    denied = root.with_policies(deny("net:private", "169.254.169.254:*"))
    with pytest.raises(SecurityError):
        guard_url(make_call(tmp_path, denied), "http://169.254.169.254/")


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("ftp://example.com/f", "'ftp'"),
        ("file:///etc/passwd", "'file'"),
        ("gopher://127.0.0.1:70/", "'gopher'"),
        ("javascript:alert(1)", "'javascript'"),
        ("//example.com/x", "no scheme"),
        ("example.com/x", "no scheme"),
    ],
)
def test_other_schemes_are_refused_naming_what_is_accepted(
    tmp_path: Path, url: str, scheme: str, no_lookups: list[str]
) -> None:
    with pytest.raises(ToolFailure) as info:
        guard_url(make_call(tmp_path, SAFE), url)
    assert not isinstance(info.value, SecurityError)
    assert scheme in info.value.message
    assert "only http://, https:// URLs are accepted" in info.value.message
    assert no_lookups == []


def test_custom_schemes(tmp_path: Path, no_lookups: list[str]) -> None:
    call = make_call(tmp_path, PermissionManager(ROOT_POLICIES))
    assert guard_url(call, "git://127.0.0.1/repo.git", schemes=("git",)) == ["127.0.0.1"]
    with pytest.raises(ToolFailure) as info:
        guard_url(call, "https://127.0.0.1/", schemes=("git",))
    assert "only git:// URLs are accepted" in info.value.message


@pytest.mark.parametrize("url", ["http:///path", "http://:80/", "http://[::1/", "http://h:99999/"])
def test_malformed_urls_fail_clearly(tmp_path: Path, url: str, no_lookups: list[str]) -> None:
    with pytest.raises(ToolFailure) as info:
        guard_url(make_call(tmp_path, SAFE), url)
    assert not isinstance(info.value, SecurityError)
    assert info.value.error_type == "InvalidArguments"


def test_an_unresolvable_name_is_a_tool_failure(tmp_path: Path, no_lookups: list[str]) -> None:
    with pytest.raises(ToolFailure) as info:
        guard_url(make_call(tmp_path, SAFE), "https://no-such-host.example/")
    assert not isinstance(info.value, SecurityError)
    assert info.value.error_type == "NetworkError"
    assert "could not resolve the host 'no-such-host.example'" in info.value.message


def test_credentials_in_the_url_are_allowed_but_never_in_messages(
    tmp_path: Path, no_lookups: list[str]
) -> None:
    root = make_call(tmp_path, PermissionManager(ROOT_POLICIES))
    assert guard_url(root, "http://user:hunter2@127.0.0.1/") == ["127.0.0.1"]
    for url in ("http://user:hunter2@127.0.0.1/", "ftp://user:hunter2@example.com/"):
        with pytest.raises(ToolFailure) as info:
            guard_url(make_call(tmp_path, SAFE), url)
        assert "hunter2" not in info.value.message


def test_any_private_address_among_several_is_enough_to_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def two(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.4.4", port)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1%2", port, 0, 2)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", two)
    with pytest.raises(SecurityError) as info:
        guard_url(make_call(tmp_path, SAFE), "https://split.example/")
    assert "fe80::1%2" in info.value.message
    root = make_call(tmp_path, PermissionManager(ROOT_POLICIES))
    assert guard_url(root, "https://split.example/") == ["8.8.4.4", "fe80::1%2"]
