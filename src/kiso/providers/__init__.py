"""Model adapters. Provider SDKs are imported lazily, inside the adapters that need them."""

from kiso.providers.anthropic import AnthropicAdapter
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
from kiso.providers.openai_compat import OpenAICompatAdapter
from kiso.providers.openai_responses import OpenAIResponsesAdapter

__all__ = [
    "Adapter",
    "AnthropicAdapter",
    "FauxAdapter",
    "ModelRequest",
    "OpenAICompatAdapter",
    "OpenAIResponsesAdapter",
    "ProviderError",
    "ScriptError",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolSpec",
    "TurnDone",
    "load_script",
]
