""":class:`Kyronix`, the synchronous runtime client, and :class:`TextStream`, its streams.

One ``httpx2.Client`` per instance (connections are kept and reused); the tunnel connection
is opened on the first :meth:`Kyronix.execute_kml_over_ws`. What a request looks like, when it
is retried and what an error means live in the shared modules (``_base``, ``_retry``,
``_errors``, ``streaming``); this one only sends and waits. See docs/sdk.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

import httpx2

from kyronix.client import _base
from kyronix.client._base import DEFAULT_TIMEOUT, MAX_RETRIES, Call, ClientConfig
from kyronix.client._frames import OnProgress, kml_request, prepare_kml, resolve_frame
from kyronix.client._http import connection_failure, error_of, json_of, new_timeout, request_args
from kyronix.client._retry import Retrier
from kyronix.client.response import RunResponse, parse_run
from kyronix.client.session import Session, session_id_of
from kyronix.client.streaming import RunStream, SseDecoder
from kyronix.errors import APIConnectionError, KyronixError, KyronixUsageError

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

    from kyronix.client.tunnel import SyncTunnel

__all__ = ["Kyronix", "TextStream"]

OnChunk = Callable[[str], object]
OnComplete = Callable[[RunResponse], object]
OnError = Callable[[KyronixError], object]


def _call_back(callback: Callable[[Any], object] | None, value: object) -> None:
    if callback is not None:
        callback(value)


class Kyronix:
    """The Kyronix runtime client (synchronous). ``AsyncKyronix`` has the same methods.

    ``api_key`` defaults to ``$KYRONIX_API_KEY``; ``base_url`` to ``$KYRONIX_BASE_URL``, then
    ``http://127.0.0.1:8080``. ``project_id`` is sent with every run and session unless the call
    names one. ``timeout`` (seconds) bounds each HTTP request and each tunnel call. ``ws``: a
    ``websockets.sync.client`` connection to use for the tunnel (by default the client opens
    ``<base_url>/ws`` itself). ``max_retries``: retries of a retryable failure (docs/sdk.md).
    """

    def __init__(
        self,
        api_key: str | None = None,
        project_id: str | None = None,
        base_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        ws: ClientConnection | None = None,
        *,
        max_retries: int = MAX_RETRIES,
    ) -> None:
        self._config = ClientConfig.resolve(
            api_key=api_key,
            project_id=project_id,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
        )
        self._tunnel: SyncTunnel | None = None
        if ws is not None:  # checked now; the websockets library is loaded only when needed
            self._tunnel = self._tunnel_with(ws)
        self._http = httpx2.Client(
            base_url=self._config.base_url, timeout=new_timeout(self._config.timeout)
        )
        self._closed = False

    @property
    def base_url(self) -> str:
        return self._config.base_url

    @property
    def project_id(self) -> str | None:
        return self._config.project_id

    @property
    def timeout(self) -> float:
        return self._config.timeout

    def __repr__(self) -> str:
        return f"Kyronix(base_url={self.base_url!r}, project_id={self.project_id!r})"

    # ------------------------------------------------------------------ HTTP

    def _open(self, call: Call, retrier: Retrier, *, stream: bool = False) -> httpx2.Response:
        """A successful response to ``call``, retrying what may be retried."""
        self._check_open()
        while True:
            request = self._http.build_request(
                call.method, call.path, **request_args(self._config, call)
            )
            try:
                response = self._http.send(request, stream=stream)
            except httpx2.TransportError as exc:
                error, delay = connection_failure(exc, self._config, call, retrier)
            else:
                if response.is_success:
                    return response
                try:
                    response.read()
                except httpx2.TransportError as exc:
                    error, delay = connection_failure(exc, self._config, call, retrier)
                else:
                    error, delay = error_of(response, call, retrier)
                finally:
                    response.close()
            if delay is None:
                raise error
            time.sleep(delay)

    def _send(self, call: Call) -> Any:
        return json_of(self._open(call, Retrier(self._config.max_retries)))

    # ------------------------------------------------------------------ runs

    def run(
        self,
        agent: str = "coding",
        input: str | None = None,
        *,
        project_id: str | None = None,
        session_id: str | None = None,
        custom_agent_id: str | None = None,
        timeout: float | None = None,
        execute: _base.Execute | None = None,
    ) -> RunResponse:
        """Run a built-in agent once (``POST /api/agents/{agent}``) and return its result."""
        call = _base.run_call(
            self._config, agent=agent, input=input, project_id=project_id,
            session_id=session_id, custom_agent_id=custom_agent_id, timeout=timeout,
            execute=execute,
        )  # fmt: skip
        return parse_run(self._send(call))

    def run_custom_agent(
        self,
        agent_id: str,
        input: str,
        *,
        project_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        execute: _base.Execute | None = None,
    ) -> RunResponse:
        """Run a custom agent once (``POST /api/customagents/run``) and return its result."""
        call = _base.custom_run_call(
            self._config, agent_id=agent_id, input=input, project_id=project_id,
            session_id=session_id, timeout=timeout, execute=execute,
        )  # fmt: skip
        return parse_run(self._send(call))

    @overload
    def stream(
        self,
        agent: str = ...,
        input: str | None = ...,
        *,
        on_chunk: None = None,
        on_complete: None = None,
        on_error: None = None,
        project_id: str | None = ...,
        session_id: str | None = ...,
        custom_agent_id: str | None = ...,
    ) -> TextStream: ...
    @overload
    def stream(
        self,
        agent: str = ...,
        input: str | None = ...,
        *,
        on_chunk: OnChunk | None = ...,
        on_complete: OnComplete | None = ...,
        on_error: OnError | None = ...,
        project_id: str | None = ...,
        session_id: str | None = ...,
        custom_agent_id: str | None = ...,
    ) -> RunResponse | None: ...
    def stream(
        self,
        agent: str = "coding",
        input: str | None = None,
        *,
        on_chunk: OnChunk | None = None,
        on_complete: OnComplete | None = None,
        on_error: OnError | None = None,
        project_id: str | None = None,
        session_id: str | None = None,
        custom_agent_id: str | None = None,
    ) -> TextStream | RunResponse | None:
        """Run a built-in agent, streaming its KML (``POST /api/agents/{agent}/stream``).

        With a callback: runs to the end and returns the result (None after ``on_error``).
        Without: returns the stream of text chunks (:class:`TextStream`); its ``result`` is set
        at the end.
        """
        try:
            call = _base.run_call(
                self._config, agent=agent, input=input, project_id=project_id,
                session_id=session_id, custom_agent_id=custom_agent_id, stream=True,
            )  # fmt: skip
            return self._stream(call, on_chunk, on_complete, on_error)
        except KyronixError as exc:
            return _failed(exc, on_error)

    @overload
    def stream_custom_agent(
        self,
        agent_id: str,
        input: str,
        *,
        on_chunk: None = None,
        on_complete: None = None,
        on_error: None = None,
        project_id: str | None = ...,
        session_id: str | None = ...,
    ) -> TextStream: ...
    @overload
    def stream_custom_agent(
        self,
        agent_id: str,
        input: str,
        *,
        on_chunk: OnChunk | None = ...,
        on_complete: OnComplete | None = ...,
        on_error: OnError | None = ...,
        project_id: str | None = ...,
        session_id: str | None = ...,
    ) -> RunResponse | None: ...
    def stream_custom_agent(
        self,
        agent_id: str,
        input: str,
        *,
        on_chunk: OnChunk | None = None,
        on_complete: OnComplete | None = None,
        on_error: OnError | None = None,
        project_id: str | None = None,
        session_id: str | None = None,
    ) -> TextStream | RunResponse | None:
        """:meth:`stream` for a custom agent (``POST /api/customagents/run/stream``)."""
        try:
            call = _base.custom_run_call(
                self._config, agent_id=agent_id, input=input, project_id=project_id,
                session_id=session_id, stream=True,
            )  # fmt: skip
            return self._stream(call, on_chunk, on_complete, on_error)
        except KyronixError as exc:
            return _failed(exc, on_error)

    def _stream(
        self,
        call: Call,
        on_chunk: OnChunk | None,
        on_complete: OnComplete | None,
        on_error: OnError | None,
    ) -> TextStream | RunResponse | None:
        stream = TextStream(self, call)
        if on_chunk is None and on_complete is None and on_error is None:
            return stream
        with stream:
            for chunk in stream:
                _call_back(on_chunk, chunk)
        assert stream.result is not None
        _call_back(on_complete, stream.result)
        return stream.result

    # ------------------------------------------------------------------ sessions

    def create_session(
        self,
        agent: str = "coding",
        project_id: str | None = None,
        custom_agent_id: str | None = None,
    ) -> Session:
        """Make a session (``POST /api/sessions``) for multi-turn runs."""
        call = _base.session_call(
            self._config, agent=agent, project_id=project_id, custom_agent_id=custom_agent_id
        )
        made = self._send(call)
        return Session(self, session_id_of(made), agent, custom_agent_id, project_id)

    def session(
        self, session_id: str, agent: str = "coding", custom_agent_id: str | None = None
    ) -> Session:
        """The :class:`Session` of an existing session id (no request is sent)."""
        return Session(self, session_id, agent, custom_agent_id, None)

    # ------------------------------------------------------------------ tunnel

    def _tunnel_with(self, ws: object = None) -> SyncTunnel:
        from kyronix.client.tunnel import SyncTunnel

        return SyncTunnel(self._config, ws)

    def _the_tunnel(self) -> SyncTunnel:
        self._check_open()
        if self._tunnel is None:
            self._tunnel = self._tunnel_with()
        return self._tunnel

    def execute_kml_over_ws(
        self,
        kml: str,
        *,
        executer_id: str | None = None,
        timeout: float | None = None,
        session_id: str | None = None,
        on_progress: OnProgress | None = None,
    ) -> list[dict[str, Any]]:
        """Run ``kml`` at a connected executer through the tunnel; its result entries."""
        self._check_open()
        seconds = self._config.timeout if timeout is None else _base.check_timeout(timeout)
        frame = kml_request(
            prepare_kml(kml), timeout=seconds, executer_id=executer_id, session_id=session_id
        )
        results: list[dict[str, Any]] = self._the_tunnel().call(frame, seconds, on_progress)
        return results

    def resolve(
        self, execution_id: str, resolution: str, *, executer_id: str | None = None
    ) -> dict[str, Any]:
        """Rule on an uncertain tool execution at the executer; the ``resolved`` frame."""
        self._check_open()
        frame = resolve_frame(execution_id, resolution, executer_id=executer_id)
        resolved: dict[str, Any] = self._the_tunnel().call(frame, self._config.timeout)
        return resolved

    # ------------------------------------------------------------------ lifetime

    def _check_open(self) -> None:
        if self._closed:
            raise KyronixUsageError("this Kyronix client is closed; make a new one")

    def close(self) -> None:
        """Close the HTTP connections and the tunnel (a ``ws`` passed in too). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._tunnel is not None:
            self._tunnel.close()
        self._http.close()

    def __enter__(self) -> Kyronix:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _failed(exc: KyronixError, on_error: OnError | None) -> RunResponse | None:
    """A stream that failed: to ``on_error`` when there is one, else raised."""
    if on_error is None:
        raise exc
    _call_back(on_error, exc)
    return None


class TextStream(Iterator[str]):
    """A run's KML as it is generated: iterate for the text chunks.

    The request is sent when the stream is made (errors before the first event, a 401 or a
    402, raise there). A dropped connection is resumed with ``Last-Event-ID`` (retried as
    docs/sdk.md says); after an ``attempt`` (the model was asked to correct its answer) the
    chunks start a new answer, and ``result.response`` is the final one. ``result`` is the
    :class:`RunResponse` once the stream has ended; a failed run raises its error from the
    iteration. ``close()`` (or ``with``) drops the connection; the run goes on at the server.
    """

    def __init__(self, client: Kyronix, call: Call) -> None:
        self._client = client
        self._call = call
        self._state = RunStream()
        self._retrier = Retrier(client._config.max_retries)
        self._response = self._opened(call)
        self._chunks = self._read()
        self.result: RunResponse | None = None

    @property
    def run_id(self) -> str | None:
        """The run's id (``X-Run-Id``): ``GET /api/runs/{id}`` returns its result."""
        return self._state.run_id

    @property
    def attempt(self) -> int:
        """0, or the number of the model's corrected answer the chunks now belong to."""
        return self._state.attempt

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        return next(self._chunks)

    def _read(self) -> Generator[str, None, None]:
        try:
            while True:
                failure: Exception | None = None
                decoder = SseDecoder()
                try:
                    for line in self._response.iter_lines():
                        event = decoder.feed(line)
                        if event is None:
                            continue
                        self._retrier.progressed()
                        step = self._state.handle(event)
                        if step.error is not None:
                            raise step.error
                        if step.result is not None:
                            self.result = step.result
                            return
                        if step.text is not None:
                            yield step.text
                except httpx2.TransportError as exc:
                    failure = exc
                finally:
                    self._response.close()
                self._resume(failure)
        finally:
            self._response.close()

    def _resume(self, failure: Exception | None) -> None:
        """The stream ended before its last event: wait, then reconnect after its last id."""
        delay = self._retrier.after_connection_error(reached=True, idempotent=True)
        if delay is None:
            raise APIConnectionError(
                f"the stream of run {self._state.run_id or '(unknown)'} kept dropping; "
                f"GET /api/runs/{{id}} has its result"
            ) from failure
        time.sleep(delay)
        self._response = self._opened(
            self._call.resumed(self._state.run_id, self._state.resume_from())
        )

    def _opened(self, call: Call) -> httpx2.Response:
        return self._check(self._client._open(call, self._retrier, stream=True))

    def _check(self, response: httpx2.Response) -> httpx2.Response:
        """``response`` if it is the run's event stream; else it is closed and the error raised."""
        try:
            self._state.opened(response.headers)
        except KyronixError:
            response.close()
            raise
        return response

    def close(self) -> None:
        self._chunks.close()
        self._response.close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
