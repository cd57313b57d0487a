"""``kiso login``, ``kiso logout``, ``kiso auth``: stored credentials.

A key is typed hidden (or piped on stdin), never passed on the command line, where it would land
in shell history and in every ``ps`` listing. ``kiso login chatgpt`` is the subscription sign-in
instead: a browser round trip (:mod:`kiso.cli.login_chatgpt`), no key.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
import time

import click

from kiso.kernel import kiso_home
from kiso.runtime.auth import VENDORS, AuthError, AuthStore, Credential, OAuthCredential, mask
from kiso.runtime.oauth import CHATGPT


def _read_key(provider: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(f"API key for {provider} (input hidden): ")
    return sys.stdin.readline()


def login(provider: str, extra: tuple[str, ...]) -> None:
    if extra and provider == CHATGPT:
        raise click.UsageError(
            "`kiso login chatgpt` takes no arguments (the callback port is "
            "KISO_CHATGPT_CALLBACK_PORT; docs/providers.md)"
        )
    if extra:
        raise click.UsageError(
            "never put a key on the command line (it lands in shell history and in `ps`); "
            f"run `kiso login {provider}` and type it, or pipe it in: "
            f"`kiso login {provider} < keyfile`"
        )
    if provider == CHATGPT:
        _login_chatgpt()
        return
    if provider not in VENDORS:
        known = ", ".join([*VENDORS, CHATGPT])
        raise click.UsageError(f"unknown provider {provider!r}; choose one of {known}")
    store = AuthStore(kiso_home())
    try:
        store.store(provider, _read_key(provider))
    except AuthError as exc:
        raise click.ClickException(str(exc)) from None
    vendor = VENDORS[provider]
    click.echo(f"stored a key for {provider} in {store.path} (mode 0600)")
    _example(provider, vendor.kind, vendor.default_model, vendor.base_url)


def _example(name: str, kind: str, model: str, base_url: str) -> None:
    example = {"model": name, "models": {name: {"kind": kind, "model": model, "baseUrl": base_url}}}
    click.echo(
        "A credential alone does not choose a model: kiso stays in its keyless scripted mode "
        f"until a profile selects one. For example, in {kiso_home() / 'config.json'}:"
    )
    click.echo(json.dumps(example, indent=2))


def _login_chatgpt() -> None:
    from kiso.cli.login_chatgpt import sign_in
    from kiso.runtime.oauth import chatgpt_settings

    store = AuthStore(kiso_home())
    try:
        settings = chatgpt_settings()
    except AuthError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        credential = sign_in(settings, store)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from None
    account = f" (account {mask(credential.account_id)})" if credential.account_id else ""
    click.echo(f"signed in to ChatGPT{account}; stored in {store.path} (mode 0600)")
    click.echo(
        f"It is only ever sent to {settings.origin}, and it renews itself before it expires."
    )
    _example(CHATGPT, "openai-responses", "gpt-5.5", settings.example_base_url())


def logout(provider: str) -> None:
    store = AuthStore(kiso_home())
    try:
        removed = store.remove(provider)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from None
    if removed and provider == CHATGPT:
        click.echo("removed the ChatGPT sign-in; `kiso login chatgpt` signs in again")
    elif removed:
        env = VENDORS[provider].env if provider in VENDORS else "its environment variable"
        click.echo(f"removed the key for {provider}; {env} is used again if it is set")
    else:
        click.echo(f"no key was stored for {provider}")


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ms / 1000))


def _describe(cred: Credential | OAuthCredential) -> str:
    if isinstance(cred, Credential):
        return mask(cred.key)
    text = f"signed in, access {mask(cred.access)}"
    if cred.account_id:
        text += f", account {mask(cred.account_id)}"
    left = cred.expires - int(time.time() * 1000)
    if left > 0:
        text += f", expires {_when(cred.expires)} (in {_duration(left)})"
    else:
        text += f", expired {_when(cred.expires)} (renewed on next use)"
    if cred.refresh_rejected_at is not None:
        text = (
            f"signed in, access {mask(cred.access)}: refresh refused "
            f"{_when(cred.refresh_rejected_at)} — run kiso login chatgpt"
        )
    return text


def _duration(ms: int) -> str:
    minutes = ms // 60_000
    if minutes < 1:
        return "under a minute"
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h"


def show() -> None:
    store = AuthStore(kiso_home())
    try:
        stored = store.all()
    except AuthError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"stored in {store.path}:")
    if not stored:
        click.echo("  (none)")
    for cred in stored:
        click.echo(f"  {cred.provider:<10} {_describe(cred)}")
    click.echo("environment:")
    for vendor in VENDORS.values():
        value = os.environ.get(vendor.env)
        state = mask(value) if value else "not set"
        owner = (
            " (a stored key owns this provider)"
            if value and any(c.provider == vendor.name for c in stored)
            else ""
        )
        click.echo(f"  {vendor.env:<18} {state}{owner}")
