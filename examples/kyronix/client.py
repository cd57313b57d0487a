"""Getting Started, step 4 (``client.ts``) in Python: the executer, and the trigger.

It starts a ``KyronixExecuter`` connected to the server's WebSocket tunnel, so the plans your
backend sends run here, in ``--base``. Then it asks the backend (``backend.py``) to run the
document's prompt and prints what came back. With ``--serve`` it stays connected afterwards,
serving more plans, until Ctrl-C (or SIGTERM).

    export KYRONIX_API_KEY=kyr_...                  # the same project's key as the backend's
    export KYRONIX_WS_URL=ws://127.0.0.1:8080/ws    # default: KYRONIX_BASE_URL's /ws
    python examples/kyronix/client.py --root --base ./project

The coding agent's plan for the prompt writes ``src/components/Button.tsx``, runs ``npm test``
and commits. ``--root`` allows every tool (the terminal and git need it; without it the
executer's safe policies allow the file tools only, and the plan stops at the refused
``terminal``). In a folder that is no npm project or git repository those two steps fail: they
are entries with ``"success": false`` in the printed results, not a failure of this example.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

from kyronix.executer import ROOT_POLICIES, KyronixError, KyronixExecuter, PermissionManager

PROMPT = "Create a React component called Button in src/components/Button.tsx"


def default_ws_url() -> str:
    """$KYRONIX_WS_URL, else the tunnel of $KYRONIX_BASE_URL (http://127.0.0.1:8080)."""
    if os.environ.get("KYRONIX_WS_URL"):
        return os.environ["KYRONIX_WS_URL"]
    base = os.environ.get("KYRONIX_BASE_URL", "http://127.0.0.1:8080").rstrip("/")
    return base.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + "/ws"


def trigger_agent_run(backend: str, prompt: str) -> dict[str, Any]:
    """POST the prompt to the backend's /api/run and return its JSON (an error's too)."""
    print("Sending run request to backend...", flush=True)
    request = urllib.request.Request(
        backend.rstrip("/") + "/api/run",
        data=json.dumps({"prompt": prompt}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            data: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as error:  # the backend's 500 {"error": ...}
        data = json.loads(error.read() or b"{}")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The Getting Started client (client.ts).")
    parser.add_argument("--base", default=".", help="where the tools run (default: here)")
    parser.add_argument("--root", action="store_true", help="allow every tool (ROOT_POLICIES)")
    parser.add_argument("--backend", default="http://127.0.0.1:3000", help="backend.py's URL")
    parser.add_argument("--ws", default=default_ws_url(), help="the server's tunnel URL")
    parser.add_argument("--prompt", default=PROMPT, help="what to ask the coding agent")
    parser.add_argument("--serve", action="store_true", help="keep serving until Ctrl-C")
    args = parser.parse_args(argv)

    try:
        # 1. The executer: its key is $KYRONIX_API_KEY; it runs each plan in base_path, under the
        #    permissions given (the safe defaults, or every tool with --root), exactly once.
        executor = KyronixExecuter(
            ws_url=args.ws,
            base_path=Path(args.base).resolve(),
            permissions=PermissionManager(ROOT_POLICIES) if args.root else None,
        )
    except KyronixError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2

    # start() runs the tunnel on a background thread (it connects, and reconnects, by itself);
    # the document's executer "automatically connects": here we also wait until it has.
    executor.start()
    try:
        try:
            if not executor.wait_connected(30):
                print(
                    f"Error: not connected to {args.ws}; is `kyronix serve` running?",
                    file=sys.stderr,
                )
                return 1
        except KyronixError as error:  # a refused key, another executer with our id
            print(f"Error: {error}", file=sys.stderr)
            return 1
        print(
            "Local executor connected and listening for remote KML requests over WebSocket...",
            flush=True,
        )

        # 2. Trigger the backend: it asks Kyronix for a plan and sends it back here to run.
        data = trigger_agent_run(args.backend, args.prompt)
        print("Agent execution complete:", json.dumps(data, indent=2), flush=True)
        if not args.serve:
            return 0 if data.get("success") else 1

        # 3. --serve: stay connected for more plans until Ctrl-C or SIGTERM.
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        print("Serving until Ctrl-C...", flush=True)
        stop.wait()
        return 0
    except (OSError, ValueError) as error:  # the backend is not there, or sent no JSON
        print(f"Error: the backend at {args.backend}: {error}", file=sys.stderr)
        return 1
    finally:
        executor.close()  # lets a running request finish and answers it, then disconnects


if __name__ == "__main__":
    sys.exit(main())
