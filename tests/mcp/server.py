"""A small MCP server written with the official SDK, for the tests (run as a script).

    python server.py stdio            # over stdio
    python server.py http PORTFILE    # streamable HTTP on 127.0.0.1, an OS-chosen port written
                                      # to PORTFILE; every request must carry X-Test-Token: t0k

Tools: ``env_keys`` (read-only: the names in os.environ, JSON), ``env_value`` (read-only),
``slow_write`` / ``slow_read`` (append a line to ``$MCP_TEST_RUNS``, write this process's pid to
``$MCP_TEST_PIDFILE``, then sleep ``seconds``), ``echo`` (read-only).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("kiso-test")
READ_ONLY = ToolAnnotations(read_only_hint=True)


@server.tool(annotations=READ_ONLY)
def env_keys() -> str:
    """The names of this server's environment variables."""
    return json.dumps(sorted(os.environ))


@server.tool(annotations=READ_ONLY)
def env_value(name: str) -> str:
    """One environment variable's value."""
    return os.environ.get(name, "<unset>")


@server.tool(annotations=READ_ONLY)
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


def _run(kind: str, seconds: float) -> str:
    with open(os.environ["MCP_TEST_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))
    with open(os.environ["MCP_TEST_RUNS"], "a") as f:
        f.write(f"{kind}\n")
    hold = os.environ.get("MCP_TEST_HOLD")  # sleep while this file exists (at most ``seconds``)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (hold is None or os.path.exists(hold)):
        time.sleep(0.02)
    return f"{kind} done"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def slow_write(seconds: float) -> str:
    """Append to the runs file, then sleep."""
    return _run("write", seconds)


@server.tool(annotations=READ_ONLY)
def slow_read(seconds: float) -> str:
    """Append to the runs file (a test's way to count runs), then sleep."""
    return _run("read", seconds)


def _http(portfile: str) -> None:
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"x-test-token") != b"t0k":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"missing X-Test-Token"})
                return
        await app(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # listening before the port is published: early connects queue, not fail
    port = sock.getsockname()[1]
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
    userver = uvicorn.Server(config)

    async def main() -> None:
        with open(portfile + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(portfile + ".tmp", portfile)
        await userver.serve(sockets=[sock])

    asyncio.run(main())


if __name__ == "__main__":
    if sys.argv[1] == "http":
        _http(sys.argv[2])
    else:
        server.run("stdio")
