"""Kyronix: an agent platform on the kiso runtime.

Built so far: :mod:`kyronix.kml` (KML v1) and :mod:`kyronix.executer` (runs a KML plan's tools
locally under permissions, a path sandbox and durable receipts). The server, the runtime SDK and
the WebSocket tunnel arrive with their issues.

Everything Kyronix raises on purpose is a :class:`KyronixError`; the tree, with its families
(misuse, run failure, refused by policy, control flow), is drawn in :mod:`kyronix.errors` and
exported here. The execution vocabulary (execution ids, receipt states, the rulings rerun /
skipped / applied, read-only and idempotent tools) is kiso's: :mod:`kiso.kernel.execution`.
"""

from kiso import __version__
from kyronix.errors import (
    ExecutionRunningError,
    KmlError,
    KyronixError,
    KyronixRefusedError,
    KyronixRunError,
    KyronixSignal,
    KyronixTypeError,
    KyronixUsageError,
    NotUncertainError,
    ReceiptConflict,
    ReceiptError,
    ReceiptStoreError,
    RunningLoopError,
    SecurityError,
    ToolFailure,
    UnknownExecutionError,
    UnsupportedError,
)

__all__ = [
    "ExecutionRunningError",
    "KmlError",
    "KyronixError",
    "KyronixRefusedError",
    "KyronixRunError",
    "KyronixSignal",
    "KyronixTypeError",
    "KyronixUsageError",
    "NotUncertainError",
    "ReceiptConflict",
    "ReceiptError",
    "ReceiptStoreError",
    "RunningLoopError",
    "SecurityError",
    "ToolFailure",
    "UnknownExecutionError",
    "UnsupportedError",
    "__version__",
]
