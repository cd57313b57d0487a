"""The agent runtime: ``Agent``, ``Session``, the loop, approvals, resume."""

from kiso.runtime.agent import Agent
from kiso.runtime.approvals import MODES, CallContext, Policy, Verdict
from kiso.runtime.rules import Rule, RulesFile
from kiso.runtime.session import Session
from kiso.runtime.stream import (
    ApprovalRequest,
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
)

__all__ = [
    "MODES",
    "Agent",
    "ApprovalRequest",
    "CallContext",
    "Decision",
    "ModelTurn",
    "Paused",
    "Policy",
    "Retry",
    "Rule",
    "RulesFile",
    "Ruling",
    "RunEvent",
    "Session",
    "Terminal",
    "TextDelta",
    "ThinkingDelta",
    "ToolEnd",
    "ToolOutput",
    "ToolStart",
    "UncertainPending",
    "Verdict",
]
