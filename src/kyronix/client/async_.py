""":class:`AsyncKyronix`, the asyncio runtime client, and :class:`AsyncTextStream`.

The same methods as :class:`kyronix.Kyronix`, as coroutines, over one ``httpx2.AsyncClient``;
the requests, retries, errors and stream handling are the shared modules' (``_base``,
``_retry``, ``_errors``, ``streaming``). Several tunnel calls may be in flight at once on the
one connection. Callbacks may be plain functions or coroutine functions. See docs/sdk.md.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

import httpx2

from kyronix.client import _base
from kyronix.client._base import DEFAULT_TIMEOUT, MAX_RETRIES, Call, ClientConfig
from kyronix.client._frames import OnProgress, kml_request, prepare_kml, resolve_frame
from kyronix.client._http import connection_failure, error_of, json_of, new_timeout, request_args
from kyronix.client._retry import Retrier
from kyronix.client.response import RunResponse, parse_run
from kyronix.client.session import AsyncSession, session_id_of
from kyronix.client.streaming import RunStream, SseDecoder
from kyronix.errors import APIConnectionError, KyronixError, KyronixUsageError

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from kyronix.client.tunnel import AsyncTunnel

__all__ = ["AsyncKyronix", "AsyncTextStream"]

OnChunk = Callable[[str], object]
OnComplete = Callable[[RunResponse], object]
OnError = Callable[[KyronixError], object]


async def _call_back(callback: Callable[[Any], object] | None, value: object) -> None:
    if callback is not None:
        done = callback(value)
        if inspect.isawaitable(done):
            await done


class AsyncKyronix:
    """The Kyronix runtime client for asyncio: :class:`kyronix.Kyronix`'s methods, awaited.

    ``ws``: a ``websockets.asyncio.client`` connection for the tunnel (by default the client
    opens ``<base_url>/ws`` itself on the first :meth:`execute_kml_over_ws`).
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
        self._tunnel: AsyncTunnel | None = None
        if ws is not None:  # checked now; the websockets library is loaded only when needed
            self._tunnel = self._tunnel_with(ws)
        self._http = httpx2.AsyncClient(
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
        return f"AsyncKyronix(base_url={self.base_url!r}, project_id={self.project_id!r})"

    # ------------------------------------------------------------------ HTTP

    async def _open(self, call: Call, retrier: Retrier, *, stream: bool = False) -> httpx2.Response:
        """A successful response to ``call``, retrying what may be retried."""
        self._check_open()
        while True:
            request = self._http.build_request(
                call.method, call.path, **request_args(self._config, call)
            )
            try:
                response = await self._http.send(request, stream=stream)
            except httpx2.TransportError as exc:
                error, delay = connection_failure(exc, self._config, call, retrier)
            else:
                if response.is_success:
                    return response
                try:
                    await response.aread()
                except httpx2.TransportError as exc:
                    error, delay = connection_failure(exc, self._config, call, retrier)
                else:
                    error, delay = error_of(response, call, retrier)
                finally:
                    await response.aclose()
            if delay is None:
                raise error
            await asyncio.sleep(delay)

    async def _send(self, call: Call) -> Any:
        return json_of(await self._open(call, Retrier(self._config.max_retries)))

    # ------------------------------------------------------------------ runs

    async def run(
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
        return parse_run(await self._send(call))

    async def run_custom_agent(
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
        return parse_run(await self._send(call))

    @overload
    async def stream(
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
    ) -> AsyncTextStream: ...
    @overload
    async def stream(
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
    async def stream(
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
    ) -> AsyncTextStream | RunResponse | None:
        """Run a built-in agent, streaming its KML (``POST /api/agents/{agent}/stream``).

        With a callback: runs to the end and returns the result (None after ``on_error``).
        Without: returns the stream of text chunks (:class:`AsyncTextStream`); its ``result`` is
        set at the end.
        """
        try:
            call = _base.run_call(
                self._config, agent=agent, input=input, project_id=project_id,
                session_id=session_id, custom_agent_id=custom_agent_id, stream=True,
            )  # fmt: skip
            return await self._stream(call, on_chunk, on_complete, on_error)
        except KyronixError as exc:
            return await _failed(exc, on_error)

    @overload
    async def stream_custom_agent(
        self,
        agent_id: str,
        input: str,
        *,
        on_chunk: None = None,
        on_complete: None = None,
        on_error: None = None,
        project_id: str | None = ...,
        session_id: str | None = ...,
    ) -> AsyncTextStream: ...
    @overload
    async def stream_custom_agent(
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
    async def stream_custom_agent(
        self,
        agent_id: str,
        input: str,
        *,
        on_chunk: OnChunk | None = None,
        on_complete: OnComplete | None = None,
        on_error: OnError | None = None,
        project_id: str | None = None,
        session_id: str | None = None,
    ) -> AsyncTextStream | RunResponse | None:
        """:meth:`stream` for a custom agent (``POST /api/customagents/run/stream``)."""
        try:
            call = _base.custom_run_call(
                self._config, agent_id=agent_id, input=input, project_id=project_id,
                session_id=session_id, stream=True,
            )  # fmt: skip
            return await self._stream(call, on_chunk, on_complete, on_error)
        except KyronixError as exc:
            return await _failed(exc, on_error)

    async def _stream(
        self,
        call: Call,
        on_chunk: OnChunk | None,
        on_complete: OnComplete | None,
        on_error: OnError | None,
    ) -> AsyncTextStream | RunResponse | None:
        stream = await AsyncTextStream.open(self, call)
        if on_chunk is None and on_complete is None and on_error is None:
            return stream
        async with stream:
            async for chunk in stream:
                await _call_back(on_chunk, chunk)
        assert stream.result is not None
        await _call_back(on_complete, stream.result)
        return stream.result

    # ------------------------------------------------------------------ sessions

    async def create_session(
        self,
        agent: str = "coding",
        project_id: str | None = None,
        custom_agent_id: str | None = None,
    ) -> AsyncSession:
        """Make a session (``POST /api/sessions``) for multi-turn runs."""
        call = _base.session_call(
            self._config, agent=agent, project_id=project_id, custom_agent_id=custom_agent_id
        )
        made = await self._send(call)
        return AsyncSession(self, session_id_of(made), agent, custom_agent_id, project_id)

    def session(
        self, session_id: str, agent: str = "coding", custom_agent_id: str | None = None
    ) -> AsyncSession:
        """The :class:`AsyncSession` of an existing session id (no request is sent)."""
        return AsyncSession(self, session_id, agent, custom_agent_id, None)

    # ------------------------------------------------------------------ tunnel

    def _tunnel_with(self, ws: object = None) -> AsyncTunnel:
        from kyronix.client.tunnel import AsyncTunnel

        return AsyncTunnel(self._config, ws)

    def _the_tunnel(self) -> AsyncTunnel:
        self._check_open()
        if self._tunnel is None:
            self._tunnel = self._tunnel_with()
        return self._tunnel

    async def execute_kml_over_ws(
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
        results: list[dict[str, Any]] = await self._the_tunnel().call(frame, seconds, on_progress)
        return results

    async def resolve(
        self, execution_id: str, resolution: str, *, executer_id: str | None = None
    ) -> dict[str, Any]:
        """Rule on an uncertain tool execution at the executer; the ``resolved`` frame."""
        self._check_open()
        frame = resolve_frame(execution_id, resolution, executer_id=executer_id)
        resolved: dict[str, Any] = await self._the_tunnel().call(frame, self._config.timeout)
        return resolved

    # ------------------------------------------------------------------ lifetime

    def _check_open(self) -> None:
        if self._closed:
            raise KyronixUsageError("this AsyncKyronix client is closed; make a new one")

    async def close(self) -> None:
        """Close the HTTP connections and the tunnel (a ``ws`` passed in too). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._tunnel is not None:
            await self._tunnel.close()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncKyronix:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def _failed(exc: KyronixError, on_error: OnError | None) -> RunResponse | None:
    """A stream that failed: to ``on_error`` when there is one, else raised."""
    if on_error is None:
        raise exc
    await _call_back(on_error, exc)
    return None


class AsyncTextStream(AsyncIterator[str]):
    """:class:`kyronix.client.TextStream` for asyncio: ``async for chunk in stream``."""

    def __init__(
        self, client: AsyncKyronix, call: Call, response: httpx2.Response, retrier: Retrier
    ) -> None:
        """Use :meth:`open` (it sends the request); ``response`` is its opened reply, and
        ``retrier`` the retries it took (reconnects draw on the same budget, as in the sync
        stream)."""
        self._client = client
        self._call = call
        self._state = RunStream()
        self._retrier = retrier
        self._response = response
        self._chunks = self._read()
        self.result: RunResponse | None = None

    @classmethod
    async def open(cls, client: AsyncKyronix, call: Call) -> AsyncTextStream:
        """Send the request (its errors raise here) and return the stream of its events."""
        retrier = Retrier(client._config.max_retries)
        stream = cls(client, call, await client._open(call, retrier, stream=True), retrier)
        await stream._check(stream._response)
        return stream

    @property
    def run_id(self) -> str | None:
        """The run's id (``X-Run-Id``): ``GET /api/runs/{id}`` returns its result."""
        return self._state.run_id

    @property
    def attempt(self) -> int:
        """0, or the number of the model's corrected answer the chunks now belong to."""
        return self._state.attempt

    def __aiter__(self) -> AsyncTextStream:
        return self

    async def __anext__(self) -> str:
        return await anext(self._chunks)

    async def _read(self) -> AsyncGenerator[str, None]:
        try:
            while True:
                failure: Exception | None = None
                decoder = SseDecoder()
                try:
                    async for line in self._response.aiter_lines():
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
                    await self._response.aclose()
                await self._resume(failure)
        finally:
            await self._response.aclose()

    async def _resume(self, failure: Exception | None) -> None:
        """The stream ended before its last event: wait, then reconnect after its last id."""
        delay = self._retrier.after_connection_error(reached=True, idempotent=True)
        if delay is None:
            raise APIConnectionError(
                f"the stream of run {self._state.run_id or '(unknown)'} kept dropping; "
                f"GET /api/runs/{{id}} has its result"
            ) from failure
        await asyncio.sleep(delay)
        self._response = await self._opened(
            self._call.resumed(self._state.run_id, self._state.resume_from())
        )

    async def _opened(self, call: Call) -> httpx2.Response:
        return await self._check(await self._client._open(call, self._retrier, stream=True))

    async def _check(self, response: httpx2.Response) -> httpx2.Response:
        """``response`` if it is the run's event stream; else it is closed and the error raised."""
        try:
            self._state.opened(response.headers)
        except KyronixError:
            await response.aclose()
            raise
        return response

    async def aclose(self) -> None:
        await self._chunks.aclose()
        await self._response.aclose()

    async def __aenter__(self) -> AsyncTextStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
