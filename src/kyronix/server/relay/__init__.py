"""The tunnel relay (docs/tunnel.md): peers, pending requests, replica routing.

:class:`Relay` (:mod:`.core`) decides; :class:`Peer` (:mod:`.peer`) is one authenticated
connection; :mod:`.pending` holds the requests in flight and the answers kept; :mod:`.remote`
carries requests between replicas. The ``/ws`` route that feeds it is :mod:`kyronix.server.ws`;
the relay knows nothing of the application's state.
"""

from kyronix.server.relay.core import CLOSE_CLAIMED, SILENT_S, Relay, ResultsHook
from kyronix.server.relay.peer import (
    CLOSE_POLICY,
    FrameBudget,
    Peer,
    Verdict,
    connection_budget,
    project_budget,
)
from kyronix.server.relay.pending import Answer, TunnelFailure

__all__ = [
    "CLOSE_CLAIMED",
    "CLOSE_POLICY",
    "SILENT_S",
    "Answer",
    "FrameBudget",
    "Peer",
    "Relay",
    "ResultsHook",
    "TunnelFailure",
    "Verdict",
    "connection_budget",
    "project_budget",
]
