"""The Kyronix runtime SDK: run agents, stream them, hold sessions, drive the tunnel.

    from kyronix import Kyronix

    with Kyronix(api_key="kyr_…") as kx:           # or KYRONIX_API_KEY / KYRONIX_BASE_URL
        run = kx.run(agent="coding", input="Create src/hello.py")
        results = kx.execute_kml_over_ws(run.response)   # at your executer, exactly once

:class:`Kyronix` (sync) and :class:`AsyncKyronix` (asyncio) have the same methods. It needs
``httpx2`` and ``websockets`` and nothing of the server or of kiso's runtime. See docs/sdk.md.
"""

from kyronix.client.async_ import AsyncKyronix, AsyncTextStream
from kyronix.client.response import RunResponse, Usage
from kyronix.client.session import AsyncSession, Session
from kyronix.client.sync import Kyronix, TextStream

__all__ = [
    "AsyncKyronix",
    "AsyncSession",
    "AsyncTextStream",
    "Kyronix",
    "RunResponse",
    "Session",
    "TextStream",
    "Usage",
]
