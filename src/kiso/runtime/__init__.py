"""The agent runtime: ``Agent``, ``Session``, the loop, approvals, hooks, resume."""

from kiso.runtime.agent import Agent
from kiso.runtime.approvals import MODES
from kiso.runtime.hooks import CallContext, Hook, HookFailed, Policy, RunInfo, Verdict
from kiso.runtime.rules import Rule, RulesFile
from kiso.runtime.session import Session
from kiso.runtime.stream import (
    STREAM_VERSION,
    ApprovalRequest,
    Compaction,
    CompactionFailed,
    Decision,
    ModelTurn,
    Paused,
    Retry,
    Ruling,
    RunEvent,
    Terminal,
    TextDelta,
    ThinkingDelta,
    ToolEnd,
    ToolOutput,
    ToolStart,
    UncertainPending,
    event_to_json,
)

__all__ = [
    "MODES",
    "STREAM_VERSION",
    "Agent",
    "ApprovalRequest",
    "CallContext",
    "Compaction",
    "CompactionFailed",
    "Decision",
    "Hook",
    "HookFailed",
    "ModelTurn",
    "Paused",
    "Policy",
    "Retry",
    "Rule",
    "RulesFile",
    "Ruling",
    "RunEvent",
    "RunInfo",
    "Session",
    "Terminal",
    "TextDelta",
    "ThinkingDelta",
    "ToolEnd",
    "ToolOutput",
    "ToolStart",
    "UncertainPending",
    "Verdict",
    "event_to_json",
]
