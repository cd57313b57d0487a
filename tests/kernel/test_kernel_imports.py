"""The kernel imports nothing else of ours: only ``kiso.kernel.*`` and ``kiso._version``.

Every module of src/kiso/kernel is parsed with ``ast`` (so imports inside functions and under
``TYPE_CHECKING`` count too); an import of ``kiso`` itself (the package face, whose lazy names
lead back up to the runtime and the tools) or of any ``kiso.<...>`` module outside the kernel
fails the test. Relative imports are resolved against the module's own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
KERNEL = SRC / "kiso" / "kernel"
MODULES = sorted(KERNEL.rglob("*.py"))
ALLOWED = ("kiso.kernel", "kiso._version")


def _allowed(module: str) -> bool:
    return module.split(".", maxsplit=1)[0] != "kiso" or any(
        module == ok or module.startswith(ok + ".") for ok in ALLOWED
    )


def _package_of(path: Path) -> list[str]:
    """The dotted package a module file belongs to (an ``__init__.py`` is its own package)."""
    return list(path.relative_to(SRC).parent.parts)


def forbidden_imports(source: str, package: list[str], filename: str = "<src>") -> list[str]:
    """Each import in ``source`` of a ``kiso`` module outside :data:`ALLOWED`, as ``line: what``.

    ``package`` is the dotted package the source lives in (for relative imports)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if not _allowed(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # ``from kiso import x`` may take a submodule: judge ``kiso.x`` then, not ``kiso``.
            targets = [module] if module != "kiso" else [f"kiso.{a.name}" for a in node.names]
            if not all(_allowed(t) for t in targets):
                names = ", ".join(a.name for a in node.names)
                found.append(f"{node.lineno}: from {'.' * node.level}{node.module or ''} "
                             f"import {names}")  # fmt: skip
    return found


def test_the_kernel_has_modules() -> None:
    assert len(MODULES) > 10
    assert KERNEL / "jsonl.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(KERNEL).as_posix())
def test_kernel_module_imports_only_the_kernel(path: Path) -> None:
    found = forbidden_imports(path.read_text(encoding="utf-8"), _package_of(path), str(path))
    assert not found, f"{path.relative_to(SRC)} imports outside kiso.kernel: {found}"


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("from kiso import __version__", True),
        ("import kiso", True),
        ("from kiso import kernel", False),
        ("from kiso import _version", False),
        ("from kiso import runtime", True),
        ("from kiso.runtime import Agent", True),
        ("import kiso.tools.base", True),
        ("def f():\n    from kiso.providers import faux", True),
        ("from .. import runtime", True),
        ("from ..tools import base", True),
        ("from .events import Event", False),
        ("from . import ids", False),
        ("from kiso._version import __version__", False),
        ("from kiso.kernel.events import Event", False),
        ("import kiso.kernel.ids", False),
        ("import kisotherapy", False),
        ("import json", False),
    ],
)
def test_the_checker(source: str, bad: bool) -> None:
    assert bool(forbidden_imports(source, ["kiso", "kernel"])) is bad
