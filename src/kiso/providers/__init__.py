"""Model adapters. Provider SDKs are imported lazily, inside the adapters that need them."""

from kiso.providers.base import (
    Adapter,
    ModelRequest,
    ProviderError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolSpec,
    TurnDone,
)
from kiso.providers.faux import FauxAdapter, ScriptError, load_script

__all__ = [
    "Adapter",
    "FauxAdapter",
    "ModelRequest",
    "ProviderError",
    "ScriptError",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolSpec",
    "TurnDone",
    "load_script",
]
