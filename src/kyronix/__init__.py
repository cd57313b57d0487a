"""Kyronix: an agent platform on the kiso runtime.

Built so far: :mod:`kyronix.kml` (KML v1), :mod:`kyronix.executer` (runs a KML plan's tools
locally under permissions, a path sandbox and durable receipts), :mod:`kyronix.server` (the
API, ``kyronix serve``) and :mod:`kyronix.client`, the runtime SDK::

    from kyronix import Kyronix, AsyncKyronix

:class:`Kyronix`, :class:`AsyncKyronix`, :class:`RunResponse`, :class:`Session` and
:class:`AsyncSession` are imported on first use, so ``import kyronix`` stays cheap (the SDK
needs only httpx2 and websockets, never the server or kiso's runtime).

Everything Kyronix raises on purpose is a :class:`KyronixError`; the tree, with its families
(misuse, run failure, refused by policy, control flow), is drawn in :mod:`kyronix.errors` and
exported here. The execution vocabulary (execution ids, receipt states, the rulings rerun /
skipped / applied, read-only and idempotent tools) is kiso's: :mod:`kiso.kernel.execution`.
"""

from importlib import import_module

from kiso import __version__
from kyronix.errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    ConflictError,
    ExecuterDisconnectedError,
    ExecutionRunningError,
    InsufficientCreditsError,
    KmlError,
    KyronixError,
    KyronixRefusedError,
    KyronixRunError,
    KyronixSignal,
    KyronixTypeError,
    KyronixUsageError,
    NoExecuterError,
    NotFoundError,
    NotUncertainError,
    ProjectNotFoundError,
    RateLimitError,
    ReceiptConflict,
    ReceiptError,
    ReceiptStoreError,
    RunningLoopError,
    SecurityError,
    ToolFailure,
    TunnelError,
    UnknownExecutionError,
    UnsupportedError,
)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost startup time
if TYPE_CHECKING:
    from kyronix.client import AsyncKyronix, AsyncSession, Kyronix, RunResponse, Session

_LAZY = {
    "AsyncKyronix": "kyronix.client",
    "AsyncSession": "kyronix.client",
    "Kyronix": "kyronix.client",
    "RunResponse": "kyronix.client",
    "Session": "kyronix.client",
}

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AsyncKyronix",
    "AsyncSession",
    "AuthenticationError",
    "ConflictError",
    "ExecuterDisconnectedError",
    "ExecutionRunningError",
    "InsufficientCreditsError",
    "KmlError",
    "Kyronix",
    "KyronixError",
    "KyronixRefusedError",
    "KyronixRunError",
    "KyronixSignal",
    "KyronixTypeError",
    "KyronixUsageError",
    "NoExecuterError",
    "NotFoundError",
    "NotUncertainError",
    "ProjectNotFoundError",
    "RateLimitError",
    "ReceiptConflict",
    "ReceiptError",
    "ReceiptStoreError",
    "RunResponse",
    "RunningLoopError",
    "SecurityError",
    "Session",
    "ToolFailure",
    "TunnelError",
    "UnknownExecutionError",
    "UnsupportedError",
    "__version__",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kyronix' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
