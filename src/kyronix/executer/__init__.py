"""The Kyronix executer: parse KML and run its tools locally, safely, exactly once.

    from kyronix.executer import KyronixExecuter, PermissionManager, ROOT_POLICIES

    executer = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES))
    results = executer.execute_sync(kml_text, "/path/to/project")

See docs/executer.md.
"""

from kyronix.executer.executer import CustomHandler, KyronixExecuter
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
from kyronix.executer.tools.base import Param, SecurityError, ToolFailure, ToolOutput
from kyronix.kml import KmlError

__all__ = [
    "ROOT_POLICIES",
    "SAFE_POLICIES",
    "CustomHandler",
    "Decision",
    "KmlError",
    "KyronixExecuter",
    "Param",
    "PermissionManager",
    "Policy",
    "Receipt",
    "ReceiptStore",
    "Sandbox",
    "SecurityError",
    "ToolFailure",
    "ToolOutput",
    "allow",
    "deny",
]
