"""The durable kernel: the event log, its stores, projection and recovery.

Everything an agent did is a pure function of its session log. This package owns the log (the
closed event union, the JSONL and in-memory stores, the single-writer lock) and the pure functions
over it: :func:`project` (the model's messages) and :func:`plan` (the one next action after a
crash). It imports nothing else of kiso's and does no I/O but the log's own.

:class:`SqlSessionStore` (:mod:`kiso.kernel.sql`) is imported on first use, so that importing the
kernel never imports SQLAlchemy.
"""

from typing import TYPE_CHECKING, Any

from kiso.kernel._fields import ascii_int
from kiso.kernel.errors import (
    Aborted,
    AppendError,
    ControlSignal,
    CorruptLogError,
    EventError,
    InvalidEventError,
    KisoError,
    RefusedError,
    RunError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    StoreError,
    UsageError,
)
from kiso.kernel.events import (
    SCHEMA_VERSION,
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    Compacted,
    Event,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    ImageBlock,
    ModelRef,
    Outcome,
    RunEnded,
    RunStarted,
    SessionHeader,
    SettingChanged,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    Usage,
    User,
    billed,
    event_from_json,
    header_from_json,
    input_sha256,
)
from kiso.kernel.execution import (
    ExecutionId,
    ReceiptState,
    Rerunnable,
    Ruling,
    is_rerunnable,
    parse_ruling,
)
from kiso.kernel.ids import new_id
from kiso.kernel.jsonl import JsonlSessionStore, parse_log
from kiso.kernel.layout import kiso_home, workspace_slug
from kiso.kernel.listing import SessionInfo, summarize
from kiso.kernel.memory import MemorySessionStore
from kiso.kernel.messages import (
    AssistantMessage,
    Message,
    ToolResultMessage,
    UserMessage,
    dumps_messages,
    to_wire,
)
from kiso.kernel.projection import project
from kiso.kernel.recovery import (
    Action,
    AwaitApproval,
    CallModel,
    Decide,
    EndRun,
    Execute,
    Idle,
    ResolveUncertain,
    SessionState,
    Uncertain,
    plan,
    session_state,
)
from kiso.kernel.replay import replay
from kiso.kernel.store import SessionLog, SessionStore, SessionWriter

if TYPE_CHECKING:
    from kiso.kernel.sql import SqlSessionStore


def __getattr__(name: str) -> Any:
    if name == "SqlSessionStore":  # lazily: SQLAlchemy is heavy
        from kiso.kernel.sql import SqlSessionStore

        return SqlSessionStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHEMA_VERSION",
    "Aborted",
    "Action",
    "AppendError",
    "ApprovalDecided",
    "ApprovalRequested",
    "Assistant",
    "AssistantMessage",
    "AwaitApproval",
    "CallModel",
    "Compacted",
    "ControlSignal",
    "CorruptLogError",
    "Decide",
    "EndRun",
    "Event",
    "EventError",
    "Execute",
    "ExecutionFinished",
    "ExecutionId",
    "ExecutionResolved",
    "ExecutionStarted",
    "Idle",
    "ImageBlock",
    "InvalidEventError",
    "JsonlSessionStore",
    "KisoError",
    "MemorySessionStore",
    "Message",
    "ModelRef",
    "Outcome",
    "ReceiptState",
    "RefusedError",
    "Rerunnable",
    "ResolveUncertain",
    "Ruling",
    "RunEnded",
    "RunError",
    "RunStarted",
    "SessionExistsError",
    "SessionHeader",
    "SessionInfo",
    "SessionLockedError",
    "SessionLog",
    "SessionNotFoundError",
    "SessionState",
    "SessionStore",
    "SessionWriter",
    "SettingChanged",
    "SqlSessionStore",
    "StoreError",
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "ToolResultMessage",
    "Uncertain",
    "Usage",
    "UsageError",
    "User",
    "UserMessage",
    "ascii_int",
    "billed",
    "dumps_messages",
    "event_from_json",
    "header_from_json",
    "input_sha256",
    "is_rerunnable",
    "kiso_home",
    "new_id",
    "parse_log",
    "parse_ruling",
    "plan",
    "project",
    "replay",
    "session_state",
    "summarize",
    "to_wire",
    "workspace_slug",
]
