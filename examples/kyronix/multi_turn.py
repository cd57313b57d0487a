"""Custom Agents Guide, section 5, in Python: a multi-turn session over the WebSocket tunnel.

One session, two turns. Each turn's plan is sent to your executer with
``execute_kml_over_ws``, naming the session: the server records what the executer reported in
it, so the second turn's model is told what the first turn's tools actually did. At the end the
session's messages are printed: the user turns, the agent's answers (role ``assistant``) and the
recorded tool results (role ``tool``).

It needs an executer of the same project connected to the tunnel, for instance the daemon:

    export KYRONIX_API_KEY=kyr_...                # kyronix keys create --project demo
    kyronix executer --ws ws://127.0.0.1:8080/ws --base ./project --root &
    python examples/kyronix/multi_turn.py

The document's section sends its turns to a custom agent (``session.send(prompt,
custom_agent_id=ID)``, whose tools must then be registered at the executer, as custom_agent.py
does); this example talks to the built-in coding agent, which the daemon can serve as it is.
Its plans write a file, run it and commit: in a folder that is no git repository the commit is
an entry with ``"success": false``, the plan's outcome, not a failure of this example.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from kyronix import Kyronix, KyronixError

TURNS = (
    "Create src/migrate.py, a migration script for the users table",
    "Now add an index on the email field in src/migrate.py",
)


def brief(results: list[dict[str, Any]]) -> list[str]:
    """One line per tool result: `write_file: ok`, `git_commit: failed (...)`."""
    lines = []
    for entry in results:
        result = entry["result"]
        state = "ok" if result["success"] else f"failed ({result.get('error', '')[:80]})"
        lines.append(f"{entry['tool']}: {state}")
    return lines


def main() -> int:
    try:
        # KYRONIX_API_KEY, KYRONIX_BASE_URL (default http://127.0.0.1:8080)
        with Kyronix() as kyronix:
            session = kyronix.create_session(agent="coding")
            print("Session:", session.get_id(), flush=True)

            for number, prompt in enumerate(TURNS, start=1):
                response = session.send(prompt)  # the model sees the session so far
                outcomes = kyronix.execute_kml_over_ws(response.response, session_id=session.id)
                print(f"Turn {number} Outcomes:", *brief(outcomes), sep="\n  ", flush=True)

            # The server records an executer's results just after relaying them: give the last
            # turn's a moment to land before reading the history.
            deadline = time.monotonic() + 10
            messages = session.get_messages()
            while sum(m["role"] == "tool" for m in messages) < len(TURNS):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
                messages = session.get_messages()

            print(f"Messages ({len(messages)}):", flush=True)
            for message in messages:
                shown = {k: v for k, v in message.items() if k != "results"}  # content says it
                print(json.dumps(shown, indent=2), flush=True)
    except KyronixError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
