"""Rulings on uncertain executions (``resolve``), sent to the executer that holds them, and
their answers (``resolved`` or ``error``), believed only from that executer.

A ``resolve`` waits for its answer at most :data:`RESOLVE_WAIT_S` seconds (then it is forgotten:
the runtime may send it again), and one connection may have at most ``tunnel.maxPending`` of them
waiting.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kyronix import wire
from kyronix.server.config import TunnelLimits
from kyronix.server.relay.connections import Connections, no_executer_message
from kyronix.server.relay.peer import Peer

if TYPE_CHECKING:
    from kyronix.server.relay.remote import Remote

__all__ = ["RESOLVE_WAIT_S", "Rulings"]

RESOLVE_WAIT_S = 120.0


class _Sink(Protocol):
    async def send(self, frame: dict[str, Any]) -> bool: ...


@dataclass
class _Asked:
    sink: _Sink
    executer: Peer | None
    """The executer connection it was sent to (None: sent on to another replica)."""
    at: float


class Rulings:
    def __init__(
        self, connections: Connections, remote: Remote | None, limits: TunnelLimits
    ) -> None:
        self.connections = connections
        self.remote = remote
        self.limits = limits
        self.asked: dict[tuple[str, str], _Asked] = {}

    async def ask(
        self, sink: _Sink, frame: wire.Resolve, project_id: str, *, local_only: bool
    ) -> None:
        request_id = frame.request_id or f"res_{secrets.token_hex(8)}"
        if isinstance(sink, Peer) and sink.resolving >= self.limits.max_pending:
            await sink.send(
                wire.error(
                    "too_many_pending",
                    "this connection has the most resolve frames waiting for an answer it may "
                    "(tunnel.maxPending); wait for their answers",
                    execution_id=frame.execution_id, request_id=request_id,
                )
            )  # fmt: skip
            return
        route = await self.connections.route(project_id, frame.executer_id)
        if local_only and not isinstance(route, Peer):
            route = None
        if route is None:
            message = no_executer_message(project_id, frame.executer_id)
            await sink.send(
                wire.error(
                    "no_executer", message, execution_id=frame.execution_id, request_id=request_id
                )
            )
            return
        key = (project_id, request_id)
        self._forget(key)
        executer = route if isinstance(route, Peer) else None
        self.asked[key] = _Asked(sink, executer, time.monotonic())
        if isinstance(sink, Peer):
            sink.resolving += 1
        if executer is None:
            assert self.remote is not None and not isinstance(route, Peer)
            ruling = wire.Resolve(
                frame.execution_id, frame.resolution, request_id, frame.base_path, frame.executer_id
            )
            await self.remote.send_resolve(route, ruling, project_id)
            return
        await executer.send(
            wire.resolve(
                frame.execution_id, frame.resolution, request_id, base_path=frame.base_path
            )
        )

    async def answered(self, peer: Peer, answer: wire.Resolved | wire.ErrorFrame) -> bool:
        """An executer's answer: False (refused) unless it answers a resolve sent to it."""
        if answer.request_id is None:
            return False
        asked = self.asked.get((peer.project_id, answer.request_id))
        if asked is None or asked.executer is not peer:
            return False
        await self.answer(peer.project_id, answer)
        return True

    async def answer(self, project_id: str, answer: wire.Resolved | wire.ErrorFrame) -> None:
        if answer.request_id is None:
            return
        asked = self._forget((project_id, answer.request_id))
        if asked is not None:
            await asked.sink.send(wire.as_dict(answer))

    def forget(self, peer: Peer) -> None:
        """A connection went away: the rulings it waited for are answered to nobody."""
        for key in [k for k, a in self.asked.items() if a.sink is peer]:
            self._forget(key)

    def expire(self, now: float) -> None:
        for key in [k for k, a in self.asked.items() if now - a.at > RESOLVE_WAIT_S]:
            self._forget(key)

    def _forget(self, key: tuple[str, str]) -> _Asked | None:
        asked = self.asked.pop(key, None)
        if asked is not None and isinstance(asked.sink, Peer):
            asked.sink.resolving -= 1
        return asked
