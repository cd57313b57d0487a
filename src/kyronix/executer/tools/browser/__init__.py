"""The browser tools: ``navigate``, ``click``, ``type`` and ``screenshot`` on one headless Chromium.

An executer owns at most one :class:`BrowserSession` (``Resources.browser``), started on the
first ``navigate``: the system Chromium (``$KYRONIX_CHROMIUM``, Debian's ``chromium``) driven by
Playwright's sync API. Playwright objects belong to the thread that created them, so every call
is run on the session's single worker thread; handlers may call the session from any thread.
The tools act on one page: ``navigate`` loads it, ``click``, ``type`` and ``screenshot`` use it.

The browser must not become a way into the machine's network. Unless ``net:private`` allows the
``host:port``, nothing may reach a loopback, private, shared (CGNAT), link-local, unspecified,
multicast or cloud metadata address. Three layers enforce it:

1. ``navigate`` checks its URL up front: only ``http``/``https``; the host is resolved and every
   address is checked (:func:`kyronix.executer.tools.net.is_private_address`).
2. A ``context.route("**/*")`` guard checks every request the pages make (images, scripts,
   fetches, frames, popups) and aborts those bound for such an address.
3. Chromium sends all its traffic through a small forward proxy on 127.0.0.1 owned by the
   session (:class:`_GuardProxy`). Playwright does not route redirects, so a public page could
   otherwise redirect the browser to ``http://169.254.169.254``; the proxy sees every hop,
   WebSockets included, resolves the host itself and connects only to the addresses it checked
   (so a DNS answer that changes between check and use does not get through).

The package, by what each part owns: :mod:`.guard` (which hosts and URLs may be reached),
:mod:`.launch` (finding and starting Chromium), :mod:`.proxy` (the guard proxy),
:mod:`.session` (the browser, its page and its route guard) and :mod:`.actions` (the tools).
Every name is importable from here, as from the single module this package was.
"""

from __future__ import annotations

from kyronix.executer.tools.browser import actions, guard, launch, proxy, session
from kyronix.executer.tools.browser.actions import (
    TOOLS,
    _png_size,
    click,
    navigate,
    screenshot,
    type_text,
)
from kyronix.executer.tools.browser.guard import (
    Address,
    BlockedRequest,
    _canonical_host,
    _is_ip,
    _kind,
    _split_url,
    _vet,
)
from kyronix.executer.tools.browser.launch import (
    CHROMIUM_PATHS,
    LAUNCH_ARGS,
    VIEWPORT,
    find_chromium,
)
from kyronix.executer.tools.browser.proxy import PROXY_IDLE, _GuardProxy
from kyronix.executer.tools.browser.session import (
    DEFAULT_TIMEOUT,
    POPUP_WAIT,
    SNAPSHOT_CHARS,
    BrowserSession,
)

__all__ = [
    "CHROMIUM_PATHS",
    "DEFAULT_TIMEOUT",
    "LAUNCH_ARGS",
    "POPUP_WAIT",
    "PROXY_IDLE",
    "SNAPSHOT_CHARS",
    "TOOLS",
    "VIEWPORT",
    "Address",
    "BlockedRequest",
    "BrowserSession",
    "actions",
    "click",
    "find_chromium",
    "guard",
    "launch",
    "navigate",
    "proxy",
    "screenshot",
    "session",
    "type_text",
]

# Private helpers kept importable from here too (tests and callers of the single module).
_PRIVATE = (_GuardProxy, _canonical_host, _is_ip, _kind, _png_size, _split_url, _vet)
