"""The relay's rounds: what it checks every so often, each a loop the server runs.

* :func:`heartbeats_forever`: executers heard nothing from for ``SILENT_S`` are dropped (their
  pending requests wait for them to come back), and :meth:`Relay.tidy` sweeps what expired;
* :func:`revocations_forever`: the connections of a key revoked since are closed (4401);
* :func:`replicas_forever`: with several replicas, when each executer here was last heard from
  is recorded, and requests whose executer moved are sent again where it is now.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kyronix import wire
from kyronix.server.relay.core import SILENT_S, Relay

__all__ = ["REVOKE_POLL_S", "heartbeats_forever", "replicas_forever", "revocations_forever"]

log = logging.getLogger("kyronix.server")

REVOKE_POLL_S = 0.5
"""How often the keys of the open connections are checked for revocation."""


async def heartbeats_forever(relay: Relay, every: float = wire.HEARTBEAT_S) -> None:
    while True:
        await asyncio.sleep(every)
        now = time.monotonic()
        relay.tidy(now)
        for peer in relay.connections.silent(now, SILENT_S):
            log.info(
                "executer %s of project %s went silent; dropped", peer.executer_id, peer.project_id
            )
            relay.detach(peer)
            await peer.close(wire.CLOSE_SILENT, f"no heartbeat for {SILENT_S:g} s")


async def revocations_forever(relay: Relay, every: float = REVOKE_POLL_S) -> None:
    """Close, within ``every`` seconds, the connections whose key was revoked (by the CLI, the
    dashboard, another replica): the key check is not only at the door."""
    assert relay.revoked is not None
    while True:
        await asyncio.sleep(every)
        keys = relay.key_ids()
        if not keys:
            continue
        try:
            revoked = await asyncio.to_thread(relay.revoked, keys)
        except Exception:
            log.warning("could not check the open connections' keys; trying again")
            continue
        for key_id in revoked:
            closed = await relay.close_key(key_id, "the API key was revoked")
            if closed:
                log.info("closed %d tunnel connection(s) of a revoked key", closed)


async def replicas_forever(relay: Relay) -> None:
    """With several replicas, each beat: record when each executer here was last heard from,
    and send again the requests whose executer moved."""
    cluster = relay.cluster
    assert cluster is not None
    while True:
        await asyncio.sleep(cluster.beat)
        try:
            await asyncio.to_thread(cluster.seen, relay.heard())
            await relay.reroute()
        except Exception:
            log.exception("routing between replicas failed; it runs again in %gs", cluster.beat)
