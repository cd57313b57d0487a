"""What the sync and async clients share and that does no I/O: configuration, URLs, bodies.

Everything here is pure: the environment is read once, by :meth:`ClientConfig.resolve`, from the
mapping it is given. Each request the clients send is described by a :class:`Call` (method,
path, JSON body, whether retrying it is safe) built by the functions below, so the two clients
differ only in how they wait.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from kiso import __version__
from kyronix.errors import KyronixTypeError, KyronixUsageError

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_TIMEOUT",
    "MAX_RETRIES",
    "Call",
    "ClientConfig",
    "Execute",
    "custom_run_call",
    "history_call",
    "new_idempotency_key",
    "run_call",
    "session_call",
    "stream_join_call",
    "ws_url",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 60.0
MAX_RETRIES = 3
"""Retries after the first attempt (so at most four requests) for a retryable failure."""

Execute = Literal["tunnel"]
_AGENT = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")


@dataclass(frozen=True)
class ClientConfig:
    """A client's settings, checked once when it is created."""

    api_key: str
    base_url: str
    """No trailing ``/``: paths (``/api/...``) are appended to it."""
    project_id: str | None
    timeout: float
    max_retries: int

    @classmethod
    def resolve(
        cls,
        *,
        api_key: str | None,
        project_id: str | None,
        base_url: str | None,
        timeout: float,
        max_retries: int,
        environ: Mapping[str, str] | None = None,
    ) -> ClientConfig:
        env = os.environ if environ is None else environ
        key = api_key if api_key is not None else env.get("KYRONIX_API_KEY", "")
        _check_str("api_key", key)
        if not key:
            raise KyronixUsageError(
                "no Kyronix API key: pass Kyronix(api_key='kyr_…') or set KYRONIX_API_KEY "
                "(make one with `kyronix keys create --project NAME`)"
            )
        if not _KEY_CHARS.fullmatch(key):
            raise KyronixUsageError(
                "the API key contains spaces or control characters; copy it again exactly as "
                "`kyronix keys create` printed it (kyr_…)"
            )
        url = base_url if base_url is not None else env.get("KYRONIX_BASE_URL") or ""
        url = url or DEFAULT_BASE_URL
        _check_str("base_url", url)
        if project_id is not None:
            _check_str("project_id", project_id)
        return cls(
            api_key=key,
            base_url=_normal_base_url(url),
            project_id=project_id,
            timeout=check_timeout(timeout),
            max_retries=_check_retries(max_retries),
        )

    def headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.api_key}",
            "Accept": "application/json",
            "User-Agent": f"kyronix-python/{__version__}",
        }


def _check_str(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise KyronixTypeError(f"{name} must be a string, not {type(value).__name__}")


def check_timeout(value: object, name: str = "timeout") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KyronixTypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise KyronixUsageError(f"{name} must be a positive number of seconds, not {value!r}")
    return seconds


def _check_retries(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KyronixUsageError(f"max_retries must be a whole number >= 0, not {value!r}")
    return value


def _normal_base_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise KyronixUsageError(
            f"base_url must be an http:// or https:// URL such as {DEFAULT_BASE_URL}, not {url!r}"
        )
    if parts.query or parts.fragment:
        raise KyronixUsageError(f"base_url must not carry a query or a fragment: {url!r}")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def ws_url(base_url: str) -> str:
    """The tunnel's address: the base URL with ``http`` → ``ws``, ``https`` → ``wss``, + ``/ws``."""
    scheme, rest = base_url.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws"


def new_idempotency_key() -> str:
    """``idem_`` + 32 random hex digits: sent with every run request, reused by its retries."""
    return f"idem_{secrets.token_hex(16)}"


# --------------------------------------------------------------------------- calls


@dataclass(frozen=True)
class Call:
    """One API request, before any I/O.

    ``idempotent``: a retry can never do the work twice (a GET, or a run carrying an
    ``Idempotency-Key``); other calls are retried only when the request surely did not reach the
    server. ``timeout`` None means the client's.
    """

    method: Literal["GET", "POST"]
    path: str
    body: dict[str, Any] | None = None
    idempotency_key: str | None = None
    timeout: float | None = None
    idempotent: bool = True
    stream: bool = False
    """Server-sent events are asked for (``Accept: text/event-stream``)."""
    last_event_id: str | None = None

    def headers(self, base: Mapping[str, str]) -> dict[str, str]:
        out = dict(base)
        if self.idempotency_key is not None:
            out["Idempotency-Key"] = self.idempotency_key
        if self.stream:
            out["Accept"] = "text/event-stream"
        if self.last_event_id is not None:
            out["Last-Event-ID"] = self.last_event_id
        return out

    def resumed(self, run_id: str | None, last_event_id: str | None) -> Call:
        """The call that continues a dropped stream: join the run by id when it is known,
        else the same POST with the same Idempotency-Key (the server attaches it to the run)."""
        if run_id is not None:
            return stream_join_call(run_id, last_event_id)
        return replace(self, last_event_id=last_event_id)


def _text(name: str, value: object) -> str:
    if value is None:
        raise KyronixUsageError(f"{name} is required")
    _check_str(name, value)
    assert isinstance(value, str)
    if not value.strip():
        raise KyronixUsageError(f"{name} must be a non-empty string")
    return value


def _optional(name: str, value: object) -> str | None:
    if value is None:
        return None
    return _text(name, value)


def _agent(agent: object) -> str:
    slug = _text("agent", agent)
    if not _AGENT.fullmatch(slug):
        raise KyronixUsageError(
            f"agent must be an agent's slug (coding, research, database, sales), not {slug!r}; "
            f"a custom agent goes in custom_agent_id"
        )
    return slug


def _execute(execute: object) -> Execute | None:
    if execute is None:
        return None
    if execute == "tunnel":
        return "tunnel"
    raise KyronixUsageError(
        f"execute must be None (the response is KML for you to run) or 'tunnel' (the server "
        f"runs the tools through your executer), not {execute!r}"
    )


def _seconds(timeout: object) -> float | None:
    return None if timeout is None else check_timeout(timeout)


def _segment(value: str) -> str:
    return quote(value, safe="")


def _body(**fields: object) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def run_call(
    config: ClientConfig,
    *,
    agent: object,
    input: object,
    project_id: object = None,
    session_id: object = None,
    custom_agent_id: object = None,
    timeout: object = None,
    execute: object = None,
    stream: bool = False,
) -> Call:
    """``POST /api/agents/{agent}[/stream]`` with a new Idempotency-Key."""
    slug = _agent(agent)
    body = _body(
        input=_text("input", input),
        projectId=_optional("project_id", project_id) or config.project_id,
        sessionId=_optional("session_id", session_id),
        customAgentId=_optional("custom_agent_id", custom_agent_id),
        execute=_execute(execute),
    )
    path = f"/api/agents/{_segment(slug)}" + ("/stream" if stream else "")
    return Call("POST", path, body, new_idempotency_key(), _seconds(timeout), stream=stream)


def custom_run_call(
    config: ClientConfig,
    *,
    agent_id: object,
    input: object,
    project_id: object = None,
    session_id: object = None,
    timeout: object = None,
    execute: object = None,
    stream: bool = False,
) -> Call:
    """``POST /api/customagents/run[/stream]`` with a new Idempotency-Key."""
    body = _body(
        agentId=_text("agent_id", agent_id),
        input=_text("input", input),
        projectId=_optional("project_id", project_id) or config.project_id,
        sessionId=_optional("session_id", session_id),
        execute=_execute(execute),
    )
    path = "/api/customagents/run" + ("/stream" if stream else "")
    return Call("POST", path, body, new_idempotency_key(), _seconds(timeout), stream=stream)


def stream_join_call(run_id: str, last_event_id: str | None) -> Call:
    """``GET /api/runs/{id}/stream``: the rest of a run's events after ``last_event_id``."""
    path = f"/api/runs/{_segment(run_id)}/stream"
    return Call("GET", path, stream=True, last_event_id=last_event_id)


def session_call(
    config: ClientConfig, *, agent: object, project_id: object, custom_agent_id: object
) -> Call:
    """``POST /api/sessions``: not idempotent (a retry could make a second session)."""
    body = _body(
        agent=_agent(agent),
        customAgentId=_optional("custom_agent_id", custom_agent_id),
        projectId=_optional("project_id", project_id) or config.project_id,
    )
    return Call("POST", "/api/sessions", body, idempotent=False)


def history_call(session_id: str) -> Call:
    """``GET /api/sessions/{id}``."""
    return Call("GET", f"/api/sessions/{_segment(_text('session_id', session_id))}")
