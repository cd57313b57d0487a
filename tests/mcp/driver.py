"""A kiso process for the kill -9 test: an Agent whose scripted model calls one MCP tool.

    python driver.py HOME WORKSPACE TOOL run|resume

Prints one JSON line per run event (``type`` and, for ``uncertain``, the executions).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kiso.kernel import JsonlSessionStore
from kiso.mcp import McpManager, mcp_tools
from kiso.providers.faux import FauxAdapter
from kiso.runtime import Agent
from tests.mcp.helpers import stdio_server


def main() -> None:
    home, workspace, tool, what = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    manager = McpManager({"t": stdio_server()}, env=os.environ, home=home)
    manager.start()
    assert manager.wait_ready(60)
    turns = [
        {"tool_calls": [{"name": f"mcp__t__{tool}", "input": {"seconds": 120}}]},
        {"text": "done"},
    ]
    agent = Agent(
        tools=mcp_tools(manager),
        store=JsonlSessionStore(home),
        adapter=FauxAdapter(turns),
        workspace=workspace,
        mode="bypass",
        home=home,
    )
    with agent.session(id="k9") as session:
        events = session.run_sync("go") if what == "run" else session.resume_sync()
        for ev in events:
            line = ev.to_json()
            print(
                json.dumps(
                    {
                        "type": line["type"],
                        **(
                            {"executions": line["executions"]}
                            if line["type"] == "uncertain"
                            else {}
                        ),
                    }
                ),
                flush=True,
            )
    manager.close()


if __name__ == "__main__":
    main()
