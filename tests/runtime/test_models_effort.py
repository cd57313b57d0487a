"""A profile's effort reaches the adapter that sends it."""

from __future__ import annotations

import pytest

from kiso.runtime.config import Profile
from kiso.runtime.models import THINKING_BUDGETS, ResolvedModel, build_adapter


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_an_anthropic_profiles_effort_becomes_its_thinking_budget(effort: str) -> None:
    profile = Profile("claude", "anthropic", "claude-sonnet-4-5", effort=effort)
    adapter = build_adapter(ResolvedModel(profile, "sk-ant-test", "none"))
    assert adapter.thinking_budget == THINKING_BUDGETS[effort]  # type: ignore[attr-defined]


def test_no_effort_no_thinking() -> None:
    profile = Profile("claude", "anthropic", "claude-sonnet-4-5")
    adapter = build_adapter(ResolvedModel(profile, "sk-ant-test", "none"))
    assert adapter.thinking_budget is None  # type: ignore[attr-defined]


def test_budgets_grow_with_effort() -> None:
    assert THINKING_BUDGETS["low"] < THINKING_BUDGETS["medium"] < THINKING_BUDGETS["high"]
