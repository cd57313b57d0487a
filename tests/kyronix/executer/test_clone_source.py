"""The scp-like clone source with a bracketed IPv6 host: ``git@[::1]:repo`` (issue 12).

``git@[::1]:repo`` is ``user@[host]:path`` with an IPv6 literal; git reads it as host ``::1``
(ssh's bracket syntax). The parser lives in ``kyronix/executer/tools/git.py``; these tests say
what it must return, and that the network guard then sees the loopback address it really is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kyronix.executer import SAFE_POLICIES, KyronixExecuter, PermissionManager, allow
from kyronix.executer.tools.git import parse_clone_source

from .kmlkit import kml


@pytest.mark.parametrize(
    ("source", "host", "port"),
    [
        ("git@[::1]:repo", "::1", 22),
        ("git@[::1]:org/repo.git", "::1", 22),
        ("deploy@[2001:db8::7]:x/y.git", "2001:db8::7", 22),
        ("[::1]:repo", "::1", 22),  # no user, bracketed host
        ("[git@example.com:2222]:repo", "example.com", 2222),  # ssh's [user@host:port]:path
        ("git@example.com:org/repo.git", "example.com", 22),
    ],
)
def test_scp_like_sources_parse_with_their_real_host(source: str, host: str, port: int) -> None:
    parsed = parse_clone_source(source)
    assert (parsed.protocol, parsed.host, parsed.port) == ("ssh", host, port)


def test_an_ipv6_loopback_clone_source_is_refused_by_the_network_guard(
    tmp_path: Path, base: Path
) -> None:
    ex = KyronixExecuter(
        permissions=PermissionManager([*SAFE_POLICIES, allow("tool:git_clone")]),
        receipts=tmp_path / "r.sqlite3",
    )
    with ex:
        [entry] = ex.execute_sync(kml(("git_clone", {"repository": "git@[::1]:repo"})), base)
    result = entry["result"]
    assert result["errorType"] == "SecurityError", result
    assert "::1" in result["error"]
    assert list(base.iterdir()) == []
