"""What kiso knows about common models: context window, output limit, effort levels, prices.

Every row says when and where its figures were taken (``as_of``, ``source``). Prices are list
prices in US dollars per million tokens, copied from the vendor's public pricing page on that
date; a row without a price shows cost as unknown rather than guess. A model missing from the
table still works, with the stated defaults (:data:`DEFAULT`), and its cost is unknown.

Looking a model up matches its id exactly, then the longest row id it starts with, so dated
snapshots (``gpt-4o-2024-08-06``) find their family.

Image input (``vision``), from the vendors' model pages on the rows' dates: every GPT-4o, GPT-4.1,
GPT-5, o3 and o4-mini model and every Claude 4 model takes images; DeepSeek's API models take
text only (its chat API has no image part). Where we could not confirm it (Claude 3.5 Haiku,
whose launch said text only and whose later listings disagree; the rows named only in kiso's
documents; any model not in the table) it is unknown, and an image is sent for the provider to
accept or refuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiso.kernel import Usage, UsageError

__all__ = [
    "DEFAULT",
    "MODELS",
    "ModelInfo",
    "Price",
    "check_effort",
    "cost",
    "lookup",
    "supports_images",
]


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str
    context_window: int
    max_output: int
    efforts: tuple[str, ...] = ()
    """Reasoning effort levels the model accepts; empty: it takes no effort setting."""
    price: Price | None = None
    as_of: str = ""
    source: str = ""
    vision: bool | None = None
    """Whether the model takes images as input: True, False, or None when we do not know (an
    unknown model, a local server's model): then an image is sent and the server decides."""


_OPENAI = "https://openai.com/api/pricing"
_ANTHROPIC = "https://www.anthropic.com/pricing#api"
_DEEPSEEK = "https://api-docs.deepseek.com/quick_start/pricing"
_GPT5_EFFORTS = ("minimal", "low", "medium", "high")
_O_EFFORTS = ("low", "medium", "high")
_THINKING = ("low", "medium", "high")  # mapped to thinking budgets by the anthropic adapter

MODELS: tuple[ModelInfo, ...] = (
    ModelInfo("gpt-5", 400_000, 128_000, _GPT5_EFFORTS, Price(1.25, 10.0, 0.125), "2025-08-07", _OPENAI, vision=True),
    ModelInfo("gpt-5-mini", 400_000, 128_000, _GPT5_EFFORTS, Price(0.25, 2.0, 0.025), "2025-08-07", _OPENAI, vision=True),
    ModelInfo("gpt-5-nano", 400_000, 128_000, _GPT5_EFFORTS, Price(0.05, 0.40, 0.005), "2025-08-07", _OPENAI, vision=True),
    ModelInfo("gpt-4.1", 1_047_576, 32_768, (), Price(2.0, 8.0, 0.50), "2025-04-14", _OPENAI, vision=True),
    ModelInfo("gpt-4.1-mini", 1_047_576, 32_768, (), Price(0.40, 1.60, 0.10), "2025-04-14", _OPENAI, vision=True),
    ModelInfo("gpt-4o", 128_000, 16_384, (), Price(2.50, 10.0, 1.25), "2024-10-01", _OPENAI, vision=True),
    ModelInfo("gpt-4o-mini", 128_000, 16_384, (), Price(0.15, 0.60, 0.075), "2024-10-01", _OPENAI, vision=True),
    ModelInfo("o3", 200_000, 100_000, _O_EFFORTS, Price(2.0, 8.0, 0.50), "2025-06-10", _OPENAI, vision=True),
    ModelInfo("o4-mini", 200_000, 100_000, _O_EFFORTS, Price(1.10, 4.40, 0.275), "2025-04-16", _OPENAI, vision=True),
    ModelInfo("claude-opus-4-1", 200_000, 32_000, _THINKING, Price(15.0, 75.0, 1.50, 18.75), "2025-08-05", _ANTHROPIC, vision=True),
    ModelInfo("claude-opus-4", 200_000, 32_000, _THINKING, Price(15.0, 75.0, 1.50, 18.75), "2025-05-22", _ANTHROPIC, vision=True),
    ModelInfo("claude-sonnet-4-5", 200_000, 64_000, _THINKING, Price(3.0, 15.0, 0.30, 3.75), "2025-09-29", _ANTHROPIC, vision=True),
    ModelInfo("claude-sonnet-4", 200_000, 64_000, _THINKING, Price(3.0, 15.0, 0.30, 3.75), "2025-05-22", _ANTHROPIC, vision=True),
    ModelInfo("claude-haiku-4-5", 200_000, 64_000, _THINKING, Price(1.0, 5.0, 0.10, 1.25), "2025-10-15", _ANTHROPIC, vision=True),
    ModelInfo("claude-3-5-haiku", 200_000, 8_192, (), Price(0.80, 4.0, 0.08, 1.0), "2024-11-04", _ANTHROPIC),
    ModelInfo("deepseek-chat", 128_000, 8_192, (), Price(0.27, 1.10, 0.07), "2025-02-09", _DEEPSEEK, vision=False),
    ModelInfo("deepseek-reasoner", 128_000, 64_000, (), Price(0.55, 2.19, 0.14), "2025-02-09", _DEEPSEEK, vision=False),
    # Named in kiso's documents; their prices were not published where we could check them.
    ModelInfo("claude-opus-5", 200_000, 32_000, _THINKING, None, "2026-11-30", "kiso README (no price)"),
    ModelInfo("claude-sonnet-5", 200_000, 64_000, _THINKING, None, "2026-11-30", "kiso README (no price)"),
    ModelInfo("gpt-5.5", 400_000, 128_000, _GPT5_EFFORTS, None, "2026-11-30", "kiso README (no price)"),
    ModelInfo("deepseek-flash", 128_000, 8_192, (), None, "2026-11-30", "kiso README (no price)"),
)  # fmt: skip

DEFAULT = ModelInfo("(unknown model)", 128_000, 8_192, (), None, "", "kiso default")
"""What an unknown model is assumed to have: a 128K window, 8K output, no effort levels."""

_BY_ID = {m.id: m for m in MODELS}


def lookup(model: str) -> ModelInfo:
    """The row for ``model`` (exact id, else the longest row id it starts with), or DEFAULT."""
    name = model.rsplit("/", 1)[-1]
    found = _BY_ID.get(name)
    if found is not None:
        return found
    prefixes = [m for m in MODELS if name.startswith(m.id + "-")]
    return max(prefixes, key=lambda m: len(m.id)) if prefixes else DEFAULT


def check_effort(model: str, effort: str | None) -> str | None:
    """``effort`` if the model accepts it; a clear error naming the levels otherwise."""
    if effort is None:
        return None
    info = lookup(model)
    if effort not in info.efforts:
        levels = ", ".join(info.efforts) if info.efforts else "none (it takes no effort setting)"
        raise UsageError(f"model {model} has no effort level {effort!r}; its levels: {levels}")
    return effort


def cost(model: str, usage: Usage) -> float | None:
    """Dollars for one request, or None when the price or a needed count is unknown."""
    price = lookup(model).price
    if price is None or usage.input is None or usage.output is None:
        return None
    total = usage.input * price.input + usage.output * price.output
    if usage.cache_read:
        if price.cache_read is None:
            return None
        total += usage.cache_read * price.cache_read
    if usage.cache_write:
        if price.cache_write is None:
            return None
        total += usage.cache_write * price.cache_write
    return total / 1_000_000


def supports_images(model: str) -> bool:
    """False only when the table knows ``model`` takes no image input (see ``vision``)."""
    return lookup(model).vision is not False
