"""Server-sent events, read without I/O: lines in, events out, and what a run's events mean.

The server's streams (``POST /api/agents/{agent}/stream``, ``/api/customagents/run/stream``,
``GET /api/runs/{id}/stream``) send, each with an ``id``:

- ``chunk`` ``{"text"}``: more of the model's KML (id ``<attempt>:<offset>``);
- ``attempt`` ``{"attempt", "reason"}``: the answer was sent back to the model for
  correction; the text so far is to be discarded;
- then exactly one ``complete`` (the run result) or ``error`` (``{"error": …}``), id ``end``.

:class:`SseDecoder` turns lines into :class:`SseEvent`; :class:`RunStream` follows one run
across reconnects: it remembers the last event id (sent back as ``Last-Event-ID``) and the run
id (from ``X-Run-Id``), so a dropped connection is resumed where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from kyronix.client._errors import api_error
from kyronix.client.response import RunResponse, parse_run
from kyronix.errors import APIError

__all__ = ["RunStream", "SseDecoder", "SseEvent", "Step"]


@dataclass(frozen=True)
class SseEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None


class SseDecoder:
    """The SSE line protocol (the WHATWG rules the server's events use): ``field: value``
    lines, a blank line ends an event, ``:`` starts a comment (the server's pings)."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> SseEvent | None:
        """One line, without its line break; the event it completes, if any."""
        line = line.rstrip("\r\n")
        if not line:
            if not self._data and not self._event:
                self._id = None
                return None
            event = SseEvent(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id = "", [], None
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


@dataclass(frozen=True)
class Step:
    """What one event means to the reader: text to hand on, or the end (a result or error)."""

    text: str | None = None
    result: RunResponse | None = None
    error: APIError | None = None
    new_attempt: bool = False

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


def _json(event: SseEvent) -> object:
    try:
        return json.loads(event.data)
    except ValueError:
        return None


class RunStream:
    """One run's stream, across reconnects: which event came last, which run it is."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.last_event_id: str | None = None
        self.attempt = 0
        self.result: RunResponse | None = None

    def opened(self, headers: Mapping[str, str]) -> None:
        """A response started: the run's id from its ``X-Run-Id``; an :class:`APIError` if it
        is not an event stream (something other than a Kyronix server answered)."""
        kind = headers.get("content-type", "")
        if not kind.startswith("text/event-stream"):
            raise APIError(
                f"the server answered a stream request with {kind or 'no content type'}, not "
                f"text/event-stream; is base_url a Kyronix server?",
                code="invalid_response",
            )
        run_id = headers.get("x-run-id")
        if run_id:
            self.run_id = run_id

    def handle(self, event: SseEvent) -> Step:
        if event.id is not None:
            self.last_event_id = event.id
        data = _json(event)
        if event.event == "chunk":
            text = data.get("text") if isinstance(data, dict) else None
            return Step(text=text) if isinstance(text, str) and text else Step()
        if event.event == "attempt":
            if isinstance(data, dict) and isinstance(data.get("attempt"), int):
                self.attempt = data["attempt"]
            return Step(new_attempt=True)
        if event.event == "complete":
            self.result = parse_run(data)
            if not self.run_id:
                self.run_id = self.result.run_id or None
            return Step(result=self.result)
        if event.event == "error":
            return Step(error=api_error(None, data, text=event.data))
        return Step()  # an event this client does not know: ignored, as SSE says

    def resume_from(self) -> str | None:
        """The ``Last-Event-ID`` to reconnect with (None: from the start)."""
        return self.last_event_id
