"""The Kyronix executer: parse KML and run its tools locally, safely, exactly once.

    from kyronix.executer import KyronixExecuter, PermissionManager, ROOT_POLICIES

    executer = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES))
    results = executer.execute_sync(kml_text, "/path/to/project")

    # serve the WebSocket tunnel of `kyronix serve` (key from $KYRONIX_API_KEY)
    executer = KyronixExecuter(ws_url="ws://localhost:8080/ws", base_path="/path/to/project")
    executer.start()  # a background thread; or `async with executer:` in async code

The exception tree (:mod:`kyronix.errors`) is exported here too. See docs/executer.md.
"""

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
from kyronix.executer.daemon import Tunnel, TunnelEvent, TunnelRefusedError, TunnelReplacedError
from kyronix.executer.executer import (
    CustomHandler,
    KyronixExecuter,
    Progress,
    ProgressCallback,
    RulingName,
)
from kyronix.executer.permissions import (
    ROOT_POLICIES,
    SAFE_POLICIES,
    Decision,
    PermissionManager,
    Policy,
    Sandbox,
    allow,
    deny,
)
from kyronix.executer.receipts import Receipt, ReceiptStore
from kyronix.executer.tools.base import Param, ToolOutput, ToolSpec

__all__ = [
    "ROOT_POLICIES",
    "SAFE_POLICIES",
    "CustomHandler",
    "Decision",
    "ExecutionRunningError",
    "KmlError",
    "KyronixError",
    "KyronixExecuter",
    "KyronixRefusedError",
    "KyronixRunError",
    "KyronixSignal",
    "KyronixTypeError",
    "KyronixUsageError",
    "NotUncertainError",
    "Param",
    "PermissionManager",
    "Policy",
    "Progress",
    "ProgressCallback",
    "Receipt",
    "ReceiptConflict",
    "ReceiptError",
    "ReceiptStore",
    "ReceiptStoreError",
    "RulingName",
    "RunningLoopError",
    "Sandbox",
    "SecurityError",
    "ToolFailure",
    "ToolOutput",
    "ToolSpec",
    "Tunnel",
    "TunnelEvent",
    "TunnelRefusedError",
    "TunnelReplacedError",
    "UnknownExecutionError",
    "UnsupportedError",
    "allow",
    "deny",
]
