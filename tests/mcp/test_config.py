"""mcp.json parsing: shapes, errors that name the file and the key, the project layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiso.mcp import McpConfigError, load_configs, parse_config


def test_both_transports_parse() -> None:
    servers = parse_config(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
                    "web": {"url": "https://h/mcp", "headers": {"A": "b"}, "timeout": 5},
                    "off": {"command": "x", "disabled": True},
                }
            }
        ),
        "/h/mcp.json",
    )
    assert servers["time"].transport == "stdio" and servers["time"].args == ("mcp-server-time",)
    assert servers["time"].timeout == 60
    assert servers["web"].transport == "http" and servers["web"].timeout == 5
    assert servers["off"].disabled


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "top level must be an object"),
        ('{"servers": {}}', "'servers'"),
        ('{"mcpServers": []}', '"mcpServers" must be an object'),
        ('{"mcpServers": {"a": {}}}', 'mcpServers."a": give exactly one of "command"'),
        ('{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}', "exactly one"),
        ('{"mcpServers": {"a": {"command": "x", "headers": {}}}}', 'mcpServers."a".headers'),
        ('{"mcpServers": {"a": {"command": ["x"]}}}', 'mcpServers."a".command'),
        ('{"mcpServers": {"a": {"command": "x", "args": "y"}}}', 'mcpServers."a".args'),
        ('{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}', 'mcpServers."a".env'),
        ('{"mcpServers": {"a": {"url": "ftp://h"}}}', 'mcpServers."a".url'),
        ('{"mcpServers": {"a": {"command": "x", "disabled": "no"}}}', 'mcpServers."a".disabled'),
        ('{"mcpServers": {"a": {"command": "x", "timeout": 0}}}', 'mcpServers."a".timeout'),
        ('{"mcpServers": {"a__b": {"command": "x"}}}', 'mcpServers."a__b": a server name'),
    ],
)
def test_bad_files_name_the_file_and_the_key(text: str, names: str) -> None:
    with pytest.raises(McpConfigError) as info:
        parse_config(text, "/home/u/.kiso/mcp.json")
    assert str(info.value).startswith("/home/u/.kiso/mcp.json: ")
    assert names in str(info.value)


def test_the_project_layer_comes_from_the_trusted_bytes(home: Path, workspace: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "mcp.json").write_text('{"mcpServers": {"mine": {"command": "a"}}}')
    (workspace / ".kiso").mkdir()
    (workspace / ".kiso" / "mcp.json").write_text('{"mcpServers": {"evil": {"command": "b"}}}')
    trusted = {"mcp.json": b'{"mcpServers": {"proj": {"command": "c"}}}'}
    assert set(load_configs(home, workspace, trusted)) == {"mine", "proj"}  # never the disk
    assert set(load_configs(home, workspace, None)) == {"mine"}  # not trusted: not applied
    shadow = {"mcp.json": b'{"mcpServers": {"mine": {"command": "c"}}}'}
    with pytest.raises(McpConfigError, match="may not replace your own servers"):
        load_configs(home, workspace, shadow)


def test_a_bad_project_file_names_its_path(home: Path, workspace: Path) -> None:
    with pytest.raises(McpConfigError) as info:
        load_configs(home, workspace, {"mcp.json": b"{"})
    assert str(info.value).startswith(str(workspace / ".kiso" / "mcp.json"))
