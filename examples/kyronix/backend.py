"""Getting Started, step 3 (``server.ts``) in Python: your backend.

A tiny HTTP server with one route, ``POST /api/run`` ``{"prompt": ..., "agent": "coding"}``. It
asks Kyronix for a plan (``kyronix.run``), sends that plan through the WebSocket tunnel to the
executer connected for your project (``kyronix.execute_kml_over_ws``) and answers with what the
executer reported:

    {"success": true, "executionResults": [...], "creditsRemaining": 99.5, "sessionId": "sess_..."}

or ``500 {"error": "..."}`` when Kyronix said no (a bad key, no credits, no executer, ...).

Run it (standard library + the ``kyronix`` package only):

    export KYRONIX_API_KEY=kyr_...                # kyronix keys create --project demo
    export KYRONIX_BASE_URL=http://127.0.0.1:8080  # the default: a local `kyronix serve`
    python examples/kyronix/backend.py --port 3000  # or PORT=3000; --port 0 picks a free one

Then start ``client.py`` (the executer and the trigger). See README.md beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from kyronix import Kyronix, KyronixError


def make_handler(kyronix: Kyronix) -> type[BaseHTTPRequestHandler]:
    """The request handler, bound to one Kyronix client (it is safe to share between threads:
    ThreadingHTTPServer answers each request on a thread of its own)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/api/run":
                self.answer(404, {"error": f"no route POST {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self.answer(400, {"error": "the body is not JSON"})
                return
            if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
                self.answer(400, {"error": 'send {"prompt": "...", "agent"?: "coding"}'})
                return
            prompt: str = body["prompt"]
            agent = body.get("agent") or "coding"

            try:
                print("1. Dispatching prompt to Kyronix...", flush=True)
                run = kyronix.run(agent=agent, input=prompt)

                print("2. Dispatching KML plan over WebSocket tunnel...", flush=True)
                # The plan runs at the executer connected for this key's project (client.py).
                # Naming the run's session makes the server record the results there, so the
                # session's next turn tells the model what actually happened. Each <tool> carries
                # a server-assigned executionId: its receipt at the executer, so a re-sent plan
                # never runs a tool twice.
                results = kyronix.execute_kml_over_ws(run.response, session_id=run.session_id)
            except KyronixError as error:
                self.answer(500, {"error": str(error)})
                return

            # A tool that failed (say `npm test` in a folder with no package.json) is one entry
            # with "success": false: that is the plan's outcome, not an error of this route.
            self.answer(
                200,
                {
                    "success": True,
                    "executionResults": results,
                    "creditsRemaining": run.credits_remaining,
                    "sessionId": run.session_id,  # beyond the document: where to look it up later
                },
            )

        def answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The Getting Started backend (server.ts).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PORT", "3000")),
        help="port to listen on (default: $PORT or 3000; 0 picks a free one)",
    )
    args = parser.parse_args(argv)

    try:
        # KYRONIX_API_KEY and KYRONIX_BASE_URL (default http://127.0.0.1:8080) come from the
        # environment. The client opens the tunnel (<base_url>/ws) itself on its first
        # execute_kml_over_ws; the document's `ws` option is there for a connection of your own.
        kyronix = Kyronix()
    except KyronixError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2

    server = ThreadingHTTPServer((args.host, args.port), make_handler(kyronix))
    server.daemon_threads = True

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # SIGTERM ends it like Ctrl-C does

    signal.signal(signal.SIGTERM, stop)
    print(f"Kyronix Backend running on port {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        kyronix.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
