"""``kiso login``, ``kiso logout``, ``kiso auth``: stored credentials.

A key is typed hidden (or piped on stdin), never passed on the command line, where it would land
in shell history and in every ``ps`` listing.
"""

from __future__ import annotations

import getpass
import json
import os
import sys

import click

from kiso.kernel import kiso_home
from kiso.runtime.auth import VENDORS, AuthError, AuthStore, mask


def _read_key(provider: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(f"API key for {provider} (input hidden): ")
    return sys.stdin.readline()


def login(provider: str, extra: tuple[str, ...]) -> None:
    if extra:
        raise click.UsageError(
            "never put a key on the command line (it lands in shell history and in `ps`); "
            f"run `kiso login {provider}` and type it, or pipe it in: "
            f"`kiso login {provider} < keyfile`"
        )
    if provider == "chatgpt":
        raise click.ClickException(
            "the ChatGPT subscription sign-in needs a browser round trip, which this build does "
            "not ship yet; use an API key: `kiso login openai`"
        )
    if provider not in VENDORS:
        raise click.UsageError(f"unknown provider {provider!r}; choose one of {', '.join(VENDORS)}")
    store = AuthStore(kiso_home())
    try:
        store.store(provider, _read_key(provider))
    except AuthError as exc:
        raise click.ClickException(str(exc)) from None
    vendor = VENDORS[provider]
    click.echo(f"stored a key for {provider} in {store.path} (mode 0600)")
    example = {
        "model": provider,
        "models": {provider: {"kind": vendor.kind, "model": vendor.default_model,
                              "baseUrl": vendor.base_url}},
    }  # fmt: skip
    click.echo(
        "A credential alone does not choose a model: kiso stays in its keyless scripted mode "
        f"until a profile selects one. For example, in {kiso_home() / 'config.json'}:"
    )
    click.echo(json.dumps(example, indent=2))


def logout(provider: str) -> None:
    store = AuthStore(kiso_home())
    try:
        removed = store.remove(provider)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from None
    if removed:
        env = VENDORS[provider].env if provider in VENDORS else "its environment variable"
        click.echo(f"removed the key for {provider}; {env} is used again if it is set")
    else:
        click.echo(f"no key was stored for {provider}")


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
        click.echo(f"  {cred.provider:<10} {mask(cred.key)}")
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
