"""Custom Agents Guide, sections 3 and 4, in Python: a custom agent with a tool of your own.

1. The executer side (section 3): a ``KyronixExecuter`` on the tunnel with a registered tool,
   ``execute_sql``, that runs a query on a small SQLite database (``signup.db``, made here in
   ``--base`` with a ``signup`` table of a few users) and returns ``{success, results}``.
2. The agent (the dashboard's "Create Custom Agent", through the HTTP API): ``Database
   Assistant`` with the document's tool schema, ``execute_sql(sql_query, limit)``; made once and
   found by its name after that.
3. The runtime side (section 4): ``kyronix.run_custom_agent(...)`` writes the plan, and
   ``kyronix.execute_kml_over_ws(...)`` runs it at the executer; the outcomes are printed.

Both sides are in this one program for brevity; in an application they are two (your backend
runs step 3, the machine with the database runs step 1).

    export KYRONIX_API_KEY=kyr_...                # kyronix keys create --project demo
    export KYRONIX_BASE_URL=http://127.0.0.1:8080  # the default: a local `kyronix serve`
    python examples/kyronix/custom_agent.py --base ./project
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx2

from kyronix import Kyronix, KyronixError
from kyronix.executer import KyronixExecuter, Param

AGENT = {
    "name": "Database Assistant",
    "description": "Queries analytics tables and generates summary reports",
    "tools": [
        {
            "name": "execute_sql",
            "description": "Executes a SQL query on analytical database",
            "params": ["sql_query", "limit"],
        }
    ],
}

# The document's request is "Fetch top 5 active users from signup table". A real model writes
# the SQL itself from such a sentence; the scripted model of a keyless `kyronix serve` copies the
# request into the tool's text arguments instead. So the request carries the query, with the
# sentence as its SQL comment: either way the tool receives a query SQLite can run.
INPUT = (
    "SELECT id, name, email, signed_up_at FROM signup WHERE active = 1 "
    "ORDER BY signed_up_at DESC LIMIT 5 -- Fetch top 5 active users from signup table"
)

EXECUTER_ID = "sql-demo"

USERS = [
    (1, "Ada Lovelace", "ada@example.com", 1, "2025-01-05"),
    (2, "Alan Turing", "alan@example.com", 1, "2025-01-09"),
    (3, "Grace Hopper", "grace@example.com", 1, "2025-02-11"),
    (4, "Edsger Dijkstra", "edsger@example.com", 0, "2025-02-14"),
    (5, "Barbara Liskov", "barbara@example.com", 1, "2025-03-02"),
    (6, "Donald Knuth", "donald@example.com", 1, "2025-03-20"),
    (7, "Frances Allen", "frances@example.com", 1, "2025-04-01"),
    (8, "Ken Thompson", "ken@example.com", 0, "2025-04-18"),
]


def make_database(path: Path) -> None:
    """The example's analytics database: a `signup` table of a few users (made once)."""
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS signup (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "email TEXT NOT NULL UNIQUE, active INTEGER NOT NULL, signed_up_at TEXT NOT NULL)"
        )
        db.executemany("INSERT OR IGNORE INTO signup VALUES (?, ?, ?, ?, ?)", USERS)
    db.close()


def sql_tool(path: Path) -> Any:
    """The handler of `execute_sql`: the query runs on a read-only connection (a plan cannot
    change the data), and at most `limit` rows come back."""

    def execute_sql(args: dict[str, Any]) -> dict[str, Any]:
        sql_query, limit = args["sql_query"], args.get("limit") or 100
        print(f"Executing SQL Query: {sql_query} (limit: {limit})", flush=True)
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            db.row_factory = sqlite3.Row
            rows = db.execute(sql_query).fetchmany(limit)
        except sqlite3.Error as error:  # a query SQLite refuses is this tool's failure
            return {"success": False, "error": f"SQLite: {error}"}
        finally:
            db.close()
        return {"success": True, "results": [dict(row) for row in rows]}

    return execute_sql


def find_or_create_agent(base_url: str, api_key: str) -> str:
    """The custom agent's id: the one named like ours, else a new one (POST /api/customagents).
    The SDK runs custom agents; making them is the dashboard's job, here its HTTP API's."""
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx2.Client(base_url=base_url, headers=headers, timeout=30) as http:
        listed = http.get("/api/customagents")
        listed.raise_for_status()
        for agent in listed.json():
            if agent["name"] == AGENT["name"]:
                if [t["name"] for t in agent["tools"]] != ["execute_sql"]:  # keep it ours
                    http.patch(f"/api/customagents/{agent['id']}", json=AGENT).raise_for_status()
                return str(agent["id"])
        made = http.post("/api/customagents", json=AGENT)
        made.raise_for_status()
        return str(made.json()["id"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Custom Agents Guide, sections 3 and 4.")
    parser.add_argument("--base", default=".", help="where signup.db is made (default: here)")
    parser.add_argument("--input", default=INPUT, help="the request to the custom agent")
    args = parser.parse_args(argv)

    api_key = os.environ.get("KYRONIX_API_KEY", "")
    base_url = os.environ.get("KYRONIX_BASE_URL", "http://127.0.0.1:8080").rstrip("/")
    ws_url = os.environ.get("KYRONIX_WS_URL") or (
        base_url.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + "/ws"
    )
    base = Path(args.base).resolve()
    database = base / "signup.db"
    make_database(database)

    # Section 3: the executer, connected to the tunnel, with the custom tool registered. It has
    # an executer id of its own, so it can run beside another executer of the project (client.py
    # and the daemon are `default`); the plan is addressed to it by that id below. The declared
    # params convert `limit` to an integer (and let a plan leave it out); read_only=True says the
    # tool changes nothing (true: its connection is read-only), so after a crash it may simply
    # run again.
    executor = KyronixExecuter(ws_url=ws_url, base_path=base, executer_id=EXECUTER_ID)
    executor.register(
        "execute_sql",
        sql_tool(database),
        params=[Param("sql_query"), Param("limit", "integer", required=False)],
        read_only=True,
    )
    executor.start()
    try:
        if not executor.wait_connected(30):
            print(f"Error: not connected to {ws_url}; is `kyronix serve` running?", file=sys.stderr)
            return 1
        print("Custom Agent local executor listening over WebSocket tunnel...", flush=True)

        agent_id = find_or_create_agent(base_url, api_key)
        print("Custom agent:", AGENT["name"], agent_id, flush=True)

        # Section 4: the runtime side.
        with Kyronix() as kyronix:
            print("1. Generating plan with Custom Agent...", flush=True)
            run = kyronix.run_custom_agent(agent_id=agent_id, input=args.input)
            print("2. LLM KML Response received:", run.response, sep="\n", flush=True)

            print("3. Dispatching execution over WebSocket...", flush=True)
            outcomes = kyronix.execute_kml_over_ws(
                run.response, executer_id=EXECUTER_ID, session_id=run.session_id
            )
            print("4. Execution Outcomes from local executor:", flush=True)
            print(json.dumps(outcomes, indent=2), flush=True)
        return 0 if all(entry["result"]["success"] for entry in outcomes) else 1
    except (KyronixError, httpx2.HTTPError) as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    finally:
        executor.close()


if __name__ == "__main__":
    sys.exit(main())
