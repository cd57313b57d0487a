"""``kiso update``: upgrade the installation kiso runs from, the way it was installed.

pipx (``pipx upgrade kiso``), uv (``uv tool upgrade kiso``), else pip in kiso's own environment
(``<python> -m pip install --upgrade kiso``). The plan is :func:`kiso.runtime.release.plan_update`;
this module finds the facts it needs and runs the installer: the exact command is printed first,
the installer gets the user's environment and the terminal (it is a program the user launched),
and the version after is read by a fresh Python, since the files of this one were just replaced.
Exit status: 0 when the installer succeeded, the installer's own status when it failed, 1 when
kiso cannot tell how it was installed (it says what to run instead).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from kiso._version import __version__
from kiso.runtime.release import DIST, CannotUpdate, Installation, plan_update

__all__ = ["installation", "installed_version", "update_command"]

_READ_VERSION = f"import importlib.metadata as m; print(m.version({DIST!r}))"


def update_command() -> int:
    """Run ``kiso update``; the process exit status."""
    inst = installation()
    plan = plan_update(inst, shutil.which)
    if isinstance(plan, CannotUpdate):
        print(f"kiso update: {plan.message}", file=sys.stderr)
        return 1
    before = inst.version
    print(f"kiso {before}, installed with {plan.tool} in {inst.prefix}")
    print(f"running: {shlex.join(plan.argv)}", flush=True)
    try:
        code = subprocess.run(plan.argv, env=dict(os.environ), check=False).returncode
    except OSError as exc:
        print(f"kiso update: could not run {plan.argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nkiso update: interrupted; kiso was {before}", file=sys.stderr)
        return 130
    if code != 0:
        print(
            f"kiso update: {plan.tool} failed (exit status {code}); kiso is still {before}",
            file=sys.stderr,
        )
        return code if code > 0 else 1
    after = installed_version(inst.executable)
    if after is None:
        print(
            f"kiso update: {plan.tool} finished, but the version now installed could not be read "
            f"(`{inst.executable} -c {shlex.quote(_READ_VERSION)}` failed); "
            "`kiso --version` tells it",
            file=sys.stderr,
        )
        return 1
    if after == before:
        print(f"kiso {before}: already the newest ({plan.tool} changed nothing)")
    else:
        print(f"kiso {before} → {after}")
    return 0


def installed_version(executable: str) -> str | None:
    """The version of kiso installed for ``executable``, read by a fresh process."""
    try:
        done = subprocess.run(
            [executable, "-c", _READ_VERSION],
            env=dict(os.environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout.strip()
    return text if done.returncode == 0 and text else None


def installation() -> Installation:
    """The facts about the installation this process runs from."""
    prefix = Path(sys.prefix)
    try:
        dist: metadata.Distribution | None = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        dist = None
    location = None if dist is None else _real(Path(str(dist.locate_file(""))))
    site_dirs = tuple(
        dict.fromkeys(
            _real(Path(p)) for p in (sysconfig.get_path("purelib"), sysconfig.get_path("platlib"))
        )
    )
    user_site = _real(Path(site.getusersitepackages())) if site.ENABLE_USER_SITE else None
    stdlib = Path(sysconfig.get_path("stdlib"))
    return Installation(
        executable=sys.executable,
        prefix=prefix,
        version=dist.version if dist is not None else __version__,
        location=location,
        editable=_editable(dist),
        site_dirs=site_dirs,
        user_site=user_site,
        writable=location is not None and os.access(location, os.W_OK | os.X_OK),
        has_pip=importlib.util.find_spec("pip") is not None,
        pipx=(prefix / "pipx_metadata.json").is_file() or _under(prefix, "pipx", "venvs"),
        uv_tool=(prefix / "uv-receipt.toml").is_file() or _under(prefix, "uv", "tools"),
        externally_managed=sys.prefix == sys.base_prefix
        and (stdlib / "EXTERNALLY-MANAGED").is_file(),
    )


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _under(prefix: Path, tool: str, folder: str) -> bool:
    """``prefix`` is ``.../<tool>/<folder>/<name>``, where that tool keeps its environments."""
    return prefix.parent.name == folder and prefix.parent.parent.name == tool


def _editable(dist: metadata.Distribution | None) -> str | None:
    """The source of an editable install (PEP 610 ``direct_url.json``), or None."""
    if dist is None:
        return None
    try:
        raw = dist.read_text("direct_url.json")
        data = json.loads(raw) if raw else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    info = data.get("dir_info")
    if isinstance(info, dict) and info.get("editable") is True:
        return str(data.get("url") or "an unknown directory")
    return None
