"""The SDK is light: importing it and making clients loads no server and no kiso runtime."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import kyronix
light = sorted(sys.modules)
from kyronix import AsyncKyronix, AsyncSession, Kyronix, RunResponse, Session
kx = Kyronix(api_key="kyr_probe", base_url="http://127.0.0.1:9")
akx = AsyncKyronix(api_key="kyr_probe")
kx.close()
print(json.dumps({"light": light, "client": sorted(sys.modules)}))
"""

FORBIDDEN = (
    "kyronix.server", "kyronix.executer", "kiso.runtime", "kiso.providers", "kiso.kernel",
    "fastapi", "starlette", "sqlalchemy", "pydantic", "uvicorn", "openai", "anthropic",
)  # fmt: skip


def _loaded(prefixes: tuple[str, ...], modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_importing_the_sdk_and_making_clients_loads_nothing_heavy() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    modules = json.loads(done.stdout)
    assert _loaded(FORBIDDEN, modules["client"]) == []
    # `import kyronix` alone does not even load the HTTP client
    assert _loaded(("httpx2", "websockets", "kyronix.client"), modules["light"]) == []
    assert "httpx2" in modules["client"]
    assert _loaded(("websockets",), modules["client"]) == []  # until the tunnel is used


def test_the_lazy_names_are_the_client_packages() -> None:
    import kyronix
    import kyronix.client

    for name in ("Kyronix", "AsyncKyronix", "RunResponse", "Session", "AsyncSession"):
        assert getattr(kyronix, name) is getattr(kyronix.client, name)
        assert name in kyronix.__all__
