"""The server's settings: ``$KYRONIX_HOME``, ``server.json``, the environment, the flags.

State lives in ``$KYRONIX_HOME`` (default ``~/.kyronix``, created 0700):

* ``kyronix.sqlite3`` — projects, keys, credits, sessions, runs (unless ``--db`` or
  ``KYRONIX_DATABASE_URL`` names another database: ``sqlite:///path`` or
  ``postgresql://user@host/db``, docs/deploy.md);
* ``sessions/`` — the kiso session logs (until the SQL session store holds them);
* ``secret.key`` — the key that API keys are hashed with (0600, made on first use);
* ``config.json`` — the model, in kiso's profile shapes (``{"model": ..., "models": {...}}``);
* ``server.json`` — the settings below, all optional::

    {"multiplier": 1.5, "minimumCharge": 0.5, "initialCredits": 100, "creditsPerUsd": 85,
     "hold": 5, "holdTtl": 900, "runTimeout": 600, "drainTimeout": 30,
     "rateLimit": {"perMinute": 600, "burst": 120}, "cors": ["https://app.example"],
     "scriptedDelayMs": 0, "kmlGrammar": false, "maxBody": 1048576,
     "authFailures": {"perMinute": 30, "burst": 20},
     "trustedProxies": ["10.0.0.5"],
     "tunnel": {"maxFrameBytes": 4194304, "framesPerSecond": 1000, "frameBurst": 2000,
                "bytesPerSecond": 4194304, "byteBurst": 16777216,
                "parseSecondsPerSecond": 0.1, "parseBurstSeconds": 1, ...}}

``authFailures``: failed authentications (an unknown, malformed or revoked key, a used sign-in
link) each client address may make, as a token bucket; past it, 429 / close 4429 with
``Retry-After``. ``tunnel``: the limits of one ``/ws`` connection and of one project on it
(docs/tunnel.md, "Limits").

Environment variables override the file: ``KYRONIX_DATABASE_URL`` (``--db`` wins over it),
``KYRONIX_MODEL`` (a profile name or
``provider/model``), ``KYRONIX_MULTIPLIER``, ``KYRONIX_RATE_LIMIT`` (requests per minute per key),
``KYRONIX_RATE_BURST``, ``KYRONIX_CORS`` (comma-separated origins), ``KYRONIX_SCRIPTED_DELAY_MS``,
``KYRONIX_DRAIN_TIMEOUT``, ``KYRONIX_KEY_SECRET``; with several replicas on PostgreSQL
``KYRONIX_REPLICA_TIMEOUT`` and ``KYRONIX_NOTIFY`` (docs/deploy.md); the dashboard's sign-in:
``KYRONIX_GITHUB_CLIENT_ID``, ``KYRONIX_GITHUB_CLIENT_SECRET``, ``KYRONIX_GITHUB_URL``,
``KYRONIX_GITHUB_API_URL``, ``KYRONIX_PUBLIC_URL`` (docs/dashboard.md). Credits are kept as
integer millicredits inside; the API shows credits as numbers (``99.5``).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kyronix.errors import KyronixUsageError

__all__ = [
    "MILLI",
    "ServerConfig",
    "TunnelLimits",
    "check_db_url",
    "credits_text",
    "kyronix_home",
    "load_server_config",
    "to_credits",
]

MILLI = 1000
"""Millicredits per credit."""


def to_credits(milli: int) -> float:
    return milli / MILLI


def credits_text(milli: int | None) -> str:
    """Millicredits as people read them: ``99.5``, ``1,000``, ``0.001``."""
    return f"{(milli or 0) / MILLI:,.3f}".rstrip("0").rstrip(".")


def kyronix_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$KYRONIX_HOME``, or ``~/.kyronix`` when it is unset or empty."""
    env = os.environ if environ is None else environ
    value = env.get("KYRONIX_HOME", "")
    return Path(value).expanduser() if value else Path.home() / ".kyronix"


def ensure_home(home: Path) -> Path:
    """Create ``home`` 0700 if missing (an existing one keeps its owner's mode)."""
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise KyronixUsageError(
            f"cannot create the Kyronix home {home}: {exc.strerror or exc}; set KYRONIX_HOME to "
            f"a directory you can write"
        ) from None
    return home


@dataclass(frozen=True)
class TunnelLimits:
    """What one tunnel connection, and one project, may take of the server (docs/tunnel.md)."""

    max_frame: int = 4 * 1024 * 1024
    """The largest frame, in bytes (a larger one closes the connection: 1009)."""
    frames_per_second: float = 1000.0
    frame_burst: int = 2000
    """A token bucket of frames per connection: past it, an ``error`` frame ``rate_limited``;
    as many frames again while limited, and the connection is closed (1008)."""
    bytes_per_second: int = 4 * 1024 * 1024
    byte_burst: int = 16 * 1024 * 1024
    """A token bucket of bytes per connection (frames past it are dropped, as above)."""
    parse_seconds_per_second: float = 0.1
    parse_burst: float = 1.0
    """A token bucket of the server's time reading one connection's frames (seconds a second):
    the frames after one that overdrew it are dropped until it is above zero again."""
    project_frames_per_second: float = 5000.0
    project_frame_burst: int = 10000
    project_bytes_per_second: int = 16 * 1024 * 1024
    project_byte_burst: int = 64 * 1024 * 1024
    project_parse_seconds_per_second: float = 0.25
    project_parse_burst: float = 2.0
    """The same, for all the connections of one project together."""
    max_pending: int = 256
    """Requests one runtime connection may have in flight."""
    max_pending_project: int = 1024
    """Requests one project may have in flight, over all its connections."""
    max_pending_bytes: int = 16 * 1024 * 1024
    max_pending_bytes_project: int = 64 * 1024 * 1024
    """The bytes of the KML of those requests, per connection and per project."""
    kept_bytes: int = 64 * 1024 * 1024
    """Bytes of answered results the relay keeps for re-sent requests, all projects."""
    kept_bytes_project: int = 16 * 1024 * 1024
    """The same, for one project (the oldest go first)."""
    orphan_s: float = 60.0
    """Seconds a request nobody waits for any more (its runtime connection went away) stays
    pending; the runtime may send it again, the executer's receipts answer it."""
    max_refused: int = 100
    """Frames a connection may have refused (results of requests it was not sent, over the rate)
    before it is closed (1008)."""


@dataclass(frozen=True)
class ServerConfig:
    home: Path
    db_url: str | None = None
    """``--db`` or ``KYRONIX_DATABASE_URL``: a ``sqlite:`` or ``postgresql:`` URL (PostgreSQL
    through psycopg 3: ``postgresql://`` means ``postgresql+psycopg://``); None:
    ``sqlite:///$KYRONIX_HOME/kyronix.sqlite3``."""
    multiplier: float = 1.5
    minimum_charge: int = 500
    """Millicredits: the least a run costs (0.5 credits)."""
    initial_credits: int = 100 * MILLI
    credits_per_usd: float = 85.0
    """Provider cost is in US dollars; 1 credit is about 1 INR."""
    hold: int = 5 * MILLI
    """What a run with a configured model reserves before the model is called (millicredits).
    The scripted model reserves exactly its price, the minimum charge."""
    hold_ttl: float = 900.0
    """Seconds after which a hold no live run settles is released by the sweep."""
    run_timeout: float = 600.0
    drain_timeout: float = 30.0
    rate_per_minute: float = 600.0
    rate_burst: int = 120
    auth_failures_per_minute: float = 30.0
    auth_failure_burst: int = 20
    """Failed authentications per client address (a token bucket; past it 429 / 4429)."""
    tunnel: TunnelLimits = field(default_factory=TunnelLimits)
    trusted_proxies: tuple[str, ...] = ()
    """Addresses whose ``X-Forwarded-For`` names the client (a load balancer, a reverse proxy):
    the address failed authentications count against. None by default: the socket's peer."""
    cors: tuple[str, ...] = ()
    scripted_delay_ms: int = 0
    kml_grammar: bool = False
    max_body: int = 1024 * 1024
    model: str | None = None
    """``KYRONIX_MODEL``: a profile of config.json or ``provider/model``; None: config.json's."""
    sweep_interval: float = 60.0
    replica_timeout: float = 15.0
    """Seconds without a heartbeat after which a replica is dead and its runs are taken over
    (PostgreSQL, several replicas; one on the same host is seen dead at once)."""
    notify: bool = True
    """Replicas wake each other with LISTEN/NOTIFY; False: the mailbox sweep alone (a pooler in
    transaction mode, where LISTEN does not work)."""
    key_secret: bytes | None = field(default=None, repr=False)
    github_client_id: str | None = None
    """``KYRONIX_GITHUB_CLIENT_ID``: with the secret, the dashboard signs in with GitHub."""
    github_client_secret: str | None = field(default=None, repr=False)
    github_url: str = "https://github.com"
    """``KYRONIX_GITHUB_URL``: GitHub's web origin (GitHub Enterprise's, or a test's fake)."""
    github_api_url: str | None = None
    """``KYRONIX_GITHUB_API_URL``; None: ``https://api.github.com`` for github.com, else
    ``<github_url>/api/v3`` (GitHub Enterprise's)."""
    public_url: str | None = None
    """``KYRONIX_PUBLIC_URL``: where browsers reach this server (sign-in links, the OAuth
    callback, ``Secure`` cookies when it is https); None: the address it serves on."""

    @property
    def github_enabled(self) -> bool:
        return bool(self.github_client_id and self.github_client_secret)

    @property
    def github_api(self) -> str:
        if self.github_api_url:
            return self.github_api_url.rstrip("/")
        base = self.github_url.rstrip("/")
        return "https://api.github.com" if base == "https://github.com" else f"{base}/api/v3"

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'kyronix.sqlite3'}"

    @property
    def sessions_dir(self) -> Path:
        return self.home / "sessions"

    def with_(self, **changes: Any) -> ServerConfig:
        return replace(self, **changes)


_KEYS = {
    "multiplier": "a number >= 1",
    "minimumCharge": "a number of credits >= 0",
    "initialCredits": "a number of credits >= 0",
    "creditsPerUsd": "a number > 0",
    "hold": "a number of credits > 0",
    "holdTtl": "seconds > 0",
    "runTimeout": "seconds > 0",
    "drainTimeout": "seconds >= 0",
    "rateLimit": 'an object {"perMinute": number, "burst": integer}',
    "cors": "a list of origins",
    "scriptedDelayMs": "an integer >= 0",
    "kmlGrammar": "true or false",
    "maxBody": "an integer number of bytes > 0",
    "sweepInterval": "seconds > 0",
    "replicaTimeout": "seconds > 0",
    "notify": "true or false",
    "authFailures": 'an object {"perMinute": number, "burst": integer}',
    "tunnel": "an object of tunnel limits (docs/tunnel.md)",
    "trustedProxies": "a list of the proxies' IP addresses",
}
_TUNNEL = {
    "maxFrameBytes": ("max_frame", 1024, int),
    "framesPerSecond": ("frames_per_second", 0.001, float),
    "frameBurst": ("frame_burst", 1, int),
    "bytesPerSecond": ("bytes_per_second", 1024, int),
    "byteBurst": ("byte_burst", 1024, int),
    "parseSecondsPerSecond": ("parse_seconds_per_second", 0.001, float),
    "parseBurstSeconds": ("parse_burst", 0.001, float),
    "parseSecondsPerSecondPerProject": ("project_parse_seconds_per_second", 0.001, float),
    "parseBurstSecondsPerProject": ("project_parse_burst", 0.001, float),
    "framesPerSecondPerProject": ("project_frames_per_second", 0.001, float),
    "frameBurstPerProject": ("project_frame_burst", 1, int),
    "bytesPerSecondPerProject": ("project_bytes_per_second", 1024, int),
    "byteBurstPerProject": ("project_byte_burst", 1024, int),
    "maxPendingBytes": ("max_pending_bytes", 1024, int),
    "maxPendingBytesPerProject": ("max_pending_bytes_project", 1024, int),
    "maxPending": ("max_pending", 1, int),
    "maxPendingPerProject": ("max_pending_project", 1, int),
    "keptBytes": ("kept_bytes", 0, int),
    "keptBytesPerProject": ("kept_bytes_project", 0, int),
    "orphanTimeout": ("orphan_s", 0.001, float),
    "maxRefused": ("max_refused", 1, int),
}


def check_db_url(url: str) -> str:
    """``url`` if it names a database kyronix can use (SQLite or PostgreSQL), else a usage error."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if not (scheme.split("+")[0] == "sqlite" or scheme in _POSTGRES):
        shown = url.rsplit("@", maxsplit=1)[-1]  # never a password
        raise KyronixUsageError(
            f"--db / KYRONIX_DATABASE_URL: not a database kyronix can use ({shown!r}); give "
            f"sqlite:///path/to/kyronix.sqlite3 or postgresql://user@host/dbname"
        )
    return url


_POSTGRES = ("postgresql", "postgres", "postgresql+psycopg")


def _number(path: Path, key: str, value: Any, *, low: float, strict: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or value < low or (strict and value == low):
        raise KyronixUsageError(f"{path}: {key}: must be {_KEYS[key]}, got {value!r}")
    return float(value)


def _is_ip(value: object) -> bool:
    try:
        ipaddress.ip_address(value if isinstance(value, str) else "")
    except ValueError:
        return False
    return True


def _tunnel(path: Path, value: Any) -> TunnelLimits:
    if not isinstance(value, dict):
        raise KyronixUsageError(f"{path}: tunnel: must be {_KEYS['tunnel']}")
    changes: dict[str, Any] = {}
    for name, given in value.items():
        if name not in _TUNNEL:
            raise KyronixUsageError(
                f"{path}: tunnel: unknown key {name!r}; known keys: {', '.join(sorted(_TUNNEL))}"
            )
        field_name, low, kind = _TUNNEL[name]
        ok = isinstance(given, int | float) and not isinstance(given, bool)
        if not ok or given < low or (kind is int and given != int(given)):
            want = f"an integer >= {low:g}" if kind is int else f"a number >= {low:g}"
            raise KyronixUsageError(f"{path}: tunnel.{name}: must be {want}, got {given!r}")
        changes[field_name] = kind(given)
    limits = replace(TunnelLimits(), **changes)
    if limits.byte_burst < limits.max_frame or limits.project_byte_burst < limits.max_frame:
        raise KyronixUsageError(
            f"{path}: tunnel.byteBurst and tunnel.byteBurstPerProject must be at least "
            f"tunnel.maxFrameBytes ({limits.max_frame}): a frame must fit in the burst"
        )
    return limits


def _milli(value: float) -> int:
    return round(value * MILLI)


def load_server_config(
    home: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    db_url: str | None = None,
) -> ServerConfig:
    """The settings from ``server.json`` in ``home`` and the environment (see the module)."""
    env = os.environ if environ is None else environ
    home = home if home is not None else kyronix_home(env)
    if db_url is None and env.get("KYRONIX_DATABASE_URL", "").strip():
        db_url = env["KYRONIX_DATABASE_URL"].strip()
    cfg = ServerConfig(home=home, db_url=check_db_url(db_url) if db_url else None)
    path = home / "server.json"
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        data: dict[str, Any] = {}
    except (OSError, UnicodeDecodeError) as exc:
        raise KyronixUsageError(f"{path}: cannot read it ({exc})") from None
    else:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise KyronixUsageError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise KyronixUsageError(f"{path}: must be a JSON object")
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _KEYS:
            raise KyronixUsageError(
                f"{path}: unknown key {key!r}; known keys: {', '.join(sorted(_KEYS))}"
            )
        if key == "multiplier":
            changes["multiplier"] = _number(path, key, value, low=1)
        elif key == "minimumCharge":
            changes["minimum_charge"] = _milli(_number(path, key, value, low=0))
        elif key == "initialCredits":
            changes["initial_credits"] = _milli(_number(path, key, value, low=0))
        elif key == "creditsPerUsd":
            changes["credits_per_usd"] = _number(path, key, value, low=0, strict=True)
        elif key == "hold":
            changes["hold"] = _milli(_number(path, key, value, low=0, strict=True))
        elif key == "holdTtl":
            changes["hold_ttl"] = _number(path, key, value, low=0, strict=True)
        elif key == "runTimeout":
            changes["run_timeout"] = _number(path, key, value, low=0, strict=True)
        elif key == "drainTimeout":
            changes["drain_timeout"] = _number(path, key, value, low=0)
        elif key == "sweepInterval":
            changes["sweep_interval"] = _number(path, key, value, low=0, strict=True)
        elif key == "rateLimit":
            if not isinstance(value, dict) or set(value) - {"perMinute", "burst"}:
                raise KyronixUsageError(f"{path}: rateLimit: must be {_KEYS[key]}")
            if "perMinute" in value:
                changes["rate_per_minute"] = _number(
                    path, key, value["perMinute"], low=0, strict=True
                )
            if "burst" in value:
                changes["rate_burst"] = int(_number(path, key, value["burst"], low=1))
        elif key == "authFailures":
            if not isinstance(value, dict) or set(value) - {"perMinute", "burst"}:
                raise KyronixUsageError(f"{path}: authFailures: must be {_KEYS[key]}")
            if "perMinute" in value:
                changes["auth_failures_per_minute"] = _number(
                    path, key, value["perMinute"], low=0, strict=True
                )
            if "burst" in value:
                changes["auth_failure_burst"] = int(_number(path, key, value["burst"], low=1))
        elif key == "tunnel":
            changes["tunnel"] = _tunnel(path, value)
        elif key == "trustedProxies":
            if not isinstance(value, list) or not all(_is_ip(v) for v in value):
                raise KyronixUsageError(f"{path}: trustedProxies: must be {_KEYS[key]}")
            changes["trusted_proxies"] = tuple(value)
        elif key == "cors":
            if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
                raise KyronixUsageError(f"{path}: cors: must be {_KEYS[key]}")
            changes["cors"] = tuple(value)
        elif key == "scriptedDelayMs":
            changes["scripted_delay_ms"] = int(_number(path, key, value, low=0))
        elif key == "kmlGrammar":
            if not isinstance(value, bool):
                raise KyronixUsageError(f"{path}: kmlGrammar: must be true or false")
            changes["kml_grammar"] = value
        elif key == "replicaTimeout":
            changes["replica_timeout"] = _number(path, key, value, low=0, strict=True)
        elif key == "notify":
            if not isinstance(value, bool):
                raise KyronixUsageError(f"{path}: notify: must be true or false")
            changes["notify"] = value
        elif key == "maxBody":
            changes["max_body"] = int(_number(path, key, value, low=0, strict=True))
    changes.update(_from_env(env))
    return replace(cfg, **changes)


def _env_number(env: Mapping[str, str], name: str, *, low: float) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise KyronixUsageError(f"${name}: must be a number, got {raw!r}") from None
    if value < low:
        raise KyronixUsageError(f"${name}: must be at least {low:g}, got {raw!r}")
    return value


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if env.get("KYRONIX_MODEL"):
        out["model"] = env["KYRONIX_MODEL"]
    if (v := _env_number(env, "KYRONIX_MULTIPLIER", low=1)) is not None:
        out["multiplier"] = v
    if (v := _env_number(env, "KYRONIX_RATE_LIMIT", low=0.001)) is not None:
        out["rate_per_minute"] = v
    if (v := _env_number(env, "KYRONIX_RATE_BURST", low=1)) is not None:
        out["rate_burst"] = int(v)
    if (v := _env_number(env, "KYRONIX_SCRIPTED_DELAY_MS", low=0)) is not None:
        out["scripted_delay_ms"] = int(v)
    if (v := _env_number(env, "KYRONIX_DRAIN_TIMEOUT", low=0)) is not None:
        out["drain_timeout"] = v
    if (v := _env_number(env, "KYRONIX_HOLD_TTL", low=0.001)) is not None:
        out["hold_ttl"] = v
    if (v := _env_number(env, "KYRONIX_SWEEP_INTERVAL", low=0.001)) is not None:
        out["sweep_interval"] = v
    if (v := _env_number(env, "KYRONIX_REPLICA_TIMEOUT", low=0.001)) is not None:
        out["replica_timeout"] = v
    raw_notify = env.get("KYRONIX_NOTIFY", "").strip().lower()
    if raw_notify:
        if raw_notify not in ("0", "1", "true", "false", "on", "off"):
            raise KyronixUsageError(f"$KYRONIX_NOTIFY: must be 1 or 0, got {raw_notify!r}")
        out["notify"] = raw_notify in ("1", "true", "on")
    if env.get("KYRONIX_CORS"):
        out["cors"] = tuple(o.strip() for o in env["KYRONIX_CORS"].split(",") if o.strip())
    if env.get("KYRONIX_KEY_SECRET"):
        out["key_secret"] = env["KYRONIX_KEY_SECRET"].encode()
    if env.get("KYRONIX_GITHUB_CLIENT_ID"):
        out["github_client_id"] = env["KYRONIX_GITHUB_CLIENT_ID"].strip()
    if env.get("KYRONIX_GITHUB_CLIENT_SECRET"):
        out["github_client_secret"] = env["KYRONIX_GITHUB_CLIENT_SECRET"].strip()
    for name, key in (
        ("KYRONIX_GITHUB_URL", "github_url"),
        ("KYRONIX_GITHUB_API_URL", "github_api_url"),
        ("KYRONIX_PUBLIC_URL", "public_url"),
    ):
        raw = env.get(name, "").strip()
        if raw:
            if not raw.startswith(("http://", "https://")):
                raise KyronixUsageError(f"${name}: must be an http(s) URL, got {raw!r}")
            out[key] = raw.rstrip("/")
    return out
