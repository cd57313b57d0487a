"""A real model, offline: the coding agent on llama.cpp's server (SmolLM2-135M) with the KML
grammar, so a tiny model still answers with a valid envelope of the agent's tools."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kyronix import kml
from kyronix.server.agents import builtin_persona
from tests.providers.llama import llama_server

from .helpers import auth, project_with_key


@pytest.fixture(scope="module")
def llama() -> Iterator[str]:
    with llama_server() as url:
        yield url


def test_a_tiny_real_model_with_the_kml_grammar_answers_valid_kml(
    llama: str, make_client: Any, kx_home: Path
) -> None:
    kx_home.mkdir(parents=True, exist_ok=True)
    (kx_home / "config.json").write_text(
        json.dumps(
            {
                "model": "smol",
                "models": {
                    "smol": {"kind": "openai-compat", "model": "smollm2", "baseUrl": f"{llama}/v1"}
                },
            }
        )
    )
    (kx_home / "server.json").write_text(json.dumps({"kmlGrammar": True}))
    client, app = make_client()
    assert not app.state.kx.runs.models.scripted
    _, key = project_with_key(app)
    r = client.post(
        "/api/agents/coding", json={"input": "Create hello.py that prints hello"}, headers=auth(key)
    )
    assert r.status_code == 200, r.text
    plan = kml.parse(r.json()["response"])
    allowed = {t.name for t in builtin_persona("coding").tools}
    assert plan.tools and {t.name for t in plan.tools} <= allowed
    assert r.json()["usage"]["output"] > 0  # the server's own count
    assert r.json()["cost"] == 0.5  # a local model has no price: the minimum
