"""``http_request``: one HTTP request, with every hop checked by the network guard.

- The URL must be ``http://`` or ``https://``. Before each hop (the request and every redirect)
  :func:`~kyronix.executer.tools.net.guard_host` resolves the host and refuses private, loopback,
  link-local and cloud metadata addresses unless ``net:private`` allows ``host:port``.
- The connection is pinned to an address the guard checked: the request goes to the IP literal,
  with the original ``Host`` header and, for https, the original name as TLS SNI and for
  certificate verification (the ``sni_hostname`` extension). The name is never resolved again,
  so a DNS answer that changes between the check and the connection (rebinding) cannot redirect
  the request. Addresses are tried in resolver order until one connects.
- Redirects are followed by hand (at most :data:`MAX_REDIRECTS`); a cross-origin hop drops the
  ``Authorization`` and ``Cookie`` headers. No cookie survives from one hop or call to the next,
  and nothing is taken from the environment (no proxies, no ``.netrc``).
- Timeouts: :data:`CONNECT_TIMEOUT_S` to connect, :data:`TOTAL_TIMEOUT_S` for the whole call.
- The body is streamed and at most :data:`MAX_BODY_BYTES` of it (after content decoding) is kept;
  ``truncated`` says when it was cut. Text is decoded by its charset; anything else is returned as
  base64 in ``data["body_base64"]``. A compressed body is decoded one network read at a time, so
  memory is bounded by one read's expansion, not by the cap alone.
- Status 400 and above is a failure (``errorType`` ``HTTPError``) with the same ``output`` and
  ``data`` (status, headers, body) as a success.

Credentials in the URL (``https://user:pass@host/``) are sent as Basic authentication and shown
only as ``user:***``.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, unquote, urljoin

import httpx2

from kyronix.executer.tools.base import Call, Param, ToolFailure, ToolOutput, ToolSpec
from kyronix.executer.tools.net import DEFAULT_PORTS, guard_host, redact_url, split_url

__all__ = [
    "CONNECT_TIMEOUT_S",
    "MAX_BODY_BYTES",
    "MAX_REDIRECTS",
    "METHODS",
    "TOOLS",
    "TOTAL_TIMEOUT_S",
    "http_request",
]

CONNECT_TIMEOUT_S = 10.0
TOTAL_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 1024 * 1024
MAX_REDIRECTS = 5
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

_SCHEMES = ("http", "https")
_USER_AGENT = "kyronix-executer"
# Framing and routing headers the tool sets itself; a caller's value would desynchronise them.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "keep-alive"}
)
_CROSS_ORIGIN_DROPPED = ("authorization", "cookie", "proxy-authorization")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_SHOWN_HEADERS = (
    "content-type",
    "content-length",
    "content-encoding",
    "location",
    "last-modified",
    "etag",
    "cache-control",
    "retry-after",
    "www-authenticate",
)
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/ecmascript",
        "application/x-www-form-urlencoded",
        "application/x-ndjson",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/graphql",
        "image/svg+xml",
    }
)
_ERROR_SNIPPET = 300


async def http_request(call: Call) -> ToolOutput:
    url: str = call.args["url"].strip()
    method = _method(call.args.get("method", "GET"))
    headers = _headers(call.args.get("headers"))
    body = call.args.get("body")
    content = body.encode("utf-8") if isinstance(body, str) else None
    if content is not None and method in ("GET", "HEAD") and not content:
        content = None
    started = time.monotonic()
    shown = f"{method} {redact_url(url)}"
    try:
        async with asyncio.timeout(TOTAL_TIMEOUT_S):
            result = await _fetch(call, url, method, headers, content)
    except TimeoutError:
        raise ToolFailure(
            f"{shown} did not complete within {TOTAL_TIMEOUT_S:g} s and was abandoned; "
            f"the server is slow or not answering",
            error_type="Timeout",
        ) from None
    result.data["elapsed_ms"] = int((time.monotonic() - started) * 1000)
    if result.data["status"] >= 400:
        snippet = result.text[:_ERROR_SNIPPET] if result.text else ""
        more = f": {snippet}" if snippet else ""
        raise ToolFailure(
            f"{method} {result.data['url']} returned HTTP {result.data['status']} "
            f"{result.data['reason']}{more}",
            error_type="HTTPError",
            data=result.data,
            output=result.render(),
            truncated=result.truncated,
        )
    return ToolOutput(result.render(), data=result.data, truncated=result.truncated)


class _Result:
    def __init__(self, data: dict[str, Any], text: str | None, truncated: bool, note: str) -> None:
        self.data = data
        self.text = text
        self.truncated = truncated
        self.note = note

    def render(self) -> str:
        headers: Mapping[str, str] = self.data["headers"]
        lines = [f"HTTP {self.data['status']} {self.data['reason']}".rstrip()]
        lines += [f"{name}: {headers[name]}" for name in _SHOWN_HEADERS if name in headers]
        body = self.text if self.text is not None else self.note
        out = "\n".join(lines) + "\n\n" + body
        if self.truncated:
            out += f"\n[body truncated: only the first {self.data['bytes']} bytes were read]"
        return out


async def _fetch(
    call: Call, url: str, method: str, headers: dict[str, bytes], content: bytes | None
) -> _Result:
    timeout = httpx2.Timeout(TOTAL_TIMEOUT_S, connect=min(CONNECT_TIMEOUT_S, TOTAL_TIMEOUT_S))
    current = url
    redirects: list[str] = []
    async with httpx2.AsyncClient(
        trust_env=False,
        follow_redirects=False,
        timeout=timeout,
        headers={"User-Agent": _USER_AGENT},
    ) as client:
        while True:
            parts, host, port = split_url(current, schemes=_SCHEMES)
            addresses = await asyncio.to_thread(
                guard_host, call, host, port, what=f"{method} {redact_url(current)}"
            )
            hop_headers = dict(headers)
            if parts.username is not None and "authorization" not in hop_headers:
                hop_headers["authorization"] = _basic(parts)
            response = await _send_pinned(
                client,
                method=method,
                parts=parts,
                host=host,
                port=port,
                addresses=addresses,
                headers=hop_headers,
                content=content,
            )
            try:
                location = response.headers.get("location")
                if response.is_redirect and location is not None:
                    if len(redirects) >= MAX_REDIRECTS:
                        raise ToolFailure(
                            f"{method} {redact_url(url)} was redirected more than "
                            f"{MAX_REDIRECTS} times (last to {redact_url(location)}); "
                            f"request the final URL directly",
                            error_type="TooManyRedirects",
                            data={"redirects": redirects, "status": response.status_code},
                        )
                    target = urljoin(current, location)
                    redirects.append(redact_url(target))
                    method, content = _redirect_method(response.status_code, method, content)
                    if _origin(target) != _origin(current):
                        for name in _CROSS_ORIGIN_DROPPED:
                            headers.pop(name, None)
                    current = target
                    continue
                return await _read(response, method, current, redirects)
            finally:
                await response.aclose()


async def _send_pinned(
    client: httpx2.AsyncClient,
    *,
    method: str,
    parts: SplitResult,
    host: str,
    port: int,
    addresses: list[str],
    headers: dict[str, bytes],
    content: bytes | None,
) -> httpx2.Response:
    """Send to each checked address in turn until one connects; never resolve ``host`` again."""
    scheme = parts.scheme.lower()
    ascii_host = _ascii_host(host)
    default = port == DEFAULT_PORTS[scheme]
    literal_host = f"[{ascii_host}]" if ":" in ascii_host else ascii_host
    host_header = literal_host if default else f"{literal_host}:{port}"
    path = parts.path or "/"
    query = f"?{parts.query}" if parts.query else ""
    extensions = {"sni_hostname": ascii_host} if scheme == "https" else {}
    last: Exception | None = None
    for address in addresses:
        pinned = f"[{address.replace('%', '%25')}]" if ":" in address else address
        client.cookies.clear()
        try:
            request = client.build_request(
                method,
                f"{scheme}://{pinned}:{port}{path}{query}",
                headers={
                    **{k.encode("ascii"): v for k, v in headers.items()},
                    b"host": host_header.encode("ascii"),
                },
                content=content,
                extensions=extensions,
            )
            return await client.send(request, stream=True)
        except httpx2.ConnectError as exc:
            last = exc
        except httpx2.TimeoutException as exc:
            raise ToolFailure(
                f"{method} {scheme}://{host_header}{path} timed out ({type(exc).__name__}) "
                f"talking to {address}; the server is slow or unreachable",
                error_type="Timeout",
            ) from None
        except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
            raise ToolFailure(
                f"{method} {scheme}://{host_header}{path} failed: {type(exc).__name__}: {exc}",
                error_type="NetworkError",
            ) from None
    tried = ", ".join(addresses)
    raise ToolFailure(
        f"could not connect to {host_header} (tried {tried}): {last}; check that the server is "
        f"up and the port is right",
        error_type="NetworkError",
    )


async def _read(response: httpx2.Response, method: str, url: str, redirects: list[str]) -> _Result:
    limit = MAX_BODY_BYTES
    buffer = bytearray()
    truncated = False
    try:
        async for chunk in response.aiter_bytes():
            room = limit - len(buffer)
            if len(chunk) > room:
                buffer += chunk[:room]
                truncated = True
                break
            buffer += chunk
    except httpx2.TimeoutException:
        raise ToolFailure(
            f"{method} {redact_url(url)} timed out while reading the response body "
            f"(HTTP {response.status_code}, {len(buffer)} bytes read)",
            error_type="Timeout",
        ) from None
    except httpx2.HTTPError as exc:
        raise ToolFailure(
            f"{method} {redact_url(url)}: reading the response body failed after "
            f"{len(buffer)} bytes: {type(exc).__name__}: {exc}",
            error_type="NetworkError",
        ) from None
    headers: dict[str, str] = {}
    for name, value in response.headers.multi_items():
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    data: dict[str, Any] = {
        "status": response.status_code,
        "reason": response.reason_phrase,
        "headers": headers,
        "url": redact_url(url),
        "method": method,
        "bytes": len(buffer),
        "redirects": redirects,
    }
    raw = bytes(buffer)
    mime = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    text = _decode(raw, mime, response.charset_encoding, final=not truncated)
    note = ""
    if text is None:
        data["body_base64"] = base64.b64encode(raw).decode("ascii")
        kind = mime or "an unknown type"
        note = f"[binary body: {len(raw)} bytes of {kind}; base64 in data.body_base64]"
    return _Result(data, text, truncated, note)


def _decode(raw: bytes, mime: str, charset: str | None, *, final: bool) -> str | None:
    """The body as text, or None when it is binary."""
    if not raw:
        return ""
    if mime:
        textual = (
            mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith(("+json", "+xml"))
        )
        if not textual:
            return None
        encoding = "utf-8"
        if charset:
            try:
                encoding = codecs.lookup(charset).name
            except LookupError:
                encoding = "utf-8"
        decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        return decoder.decode(raw, final=final)
    # No declared type: text only when it is NUL-free UTF-8.
    if b"\x00" in raw[:8192]:
        return None
    try:
        return codecs.getincrementaldecoder("utf-8")(errors="strict").decode(raw, final=final)
    except UnicodeDecodeError:
        return None


def _redirect_method(status: int, method: str, content: bytes | None) -> tuple[str, bytes | None]:
    """What the next hop sends: 303 (and 301/302 after POST) become GET without a body."""
    if status == 303 and method != "HEAD":
        return "GET", None
    if status in (301, 302) and method == "POST":
        return "GET", None
    return method, content


def _origin(url: str) -> tuple[str, str, int]:
    parts, host, port = split_url(url, schemes=_SCHEMES)
    return parts.scheme.lower(), host, port


def _basic(parts: SplitResult) -> bytes:
    user = unquote(parts.username or "")
    password = unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}".encode("ascii")


def _ascii_host(host: str) -> str:
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ToolFailure(
            f"the host name {host!r} is not a valid internationalised domain name ({exc})",
            error_type="InvalidArguments",
        ) from None


def _method(raw: object) -> str:
    method = str(raw).strip().upper()
    if method not in METHODS:
        raise ToolFailure(
            f"the method {raw!r} is not supported; use one of {', '.join(METHODS)}",
            error_type="InvalidArguments",
        )
    return method


def _headers(raw: object) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ToolFailure(
            f'headers must be a JSON object of strings, such as {{"Accept": "text/html"}}; '
            f"got {type(raw).__name__}",
            error_type="InvalidArguments",
        )
    headers: dict[str, bytes] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise ToolFailure(
                f"the header name {name!r} is not a valid HTTP header name",
                error_type="InvalidArguments",
            )
        if not isinstance(value, str):
            raise ToolFailure(
                f"the header {name!r} must have a string value, not {type(value).__name__} "
                f"({value!r}); quote it in the JSON object",
                error_type="InvalidArguments",
            )
        if name.lower() in _RESERVED_HEADERS:
            raise ToolFailure(
                f"the header {name!r} is set by http_request itself and cannot be given; "
                f"leave it out",
                error_type="InvalidArguments",
            )
        if any(c in value for c in "\r\n\x00"):
            raise ToolFailure(
                f"the value of the header {name!r} contains a line break or NUL byte",
                error_type="InvalidArguments",
            )
        try:
            headers[name.lower()] = value.encode("latin-1")
        except UnicodeEncodeError:
            raise ToolFailure(
                f"the value of the header {name!r} has characters outside Latin-1; HTTP header "
                f"values must be plain ASCII text (percent-encode or base64 anything else)",
                error_type="InvalidArguments",
            ) from None
    return headers


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="http_request",
        params=(
            Param("url", "string", description="an absolute http:// or https:// URL"),
            Param("method", "string", required=False, description="GET (default), POST, ..."),
            Param("headers", "object", required=False, description="request headers"),
            Param("body", "string", required=False, description="request body (UTF-8)"),
        ),
        handler=http_request,
        description=(
            "Send one HTTP request and return the status, headers and (capped) body; redirects "
            "are followed and private addresses are refused unless net:private allows them."
        ),
        # A POST (or any method but GET) may act each time it is sent.
        read_only=False,
        idempotent=False,
    ),
)
