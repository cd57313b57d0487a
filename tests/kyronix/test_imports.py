"""Kyronix imports only kiso's public modules (ARCHITECTURE.md, rule 8).

Every module of src/kyronix is parsed with ``ast``; an import of ``kiso.<...>`` whose module path
has a component starting with ``_`` (``kiso.tools._filecore``), or that takes a ``_`` name out of
a kiso module (``from kiso.tools import _filecore``, ``from kiso.tools.paths import _helper``),
fails the test. Dunder names (``__version__``) are public.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "kyronix"
MODULES = sorted(SRC.rglob("*.py"))


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_kiso_imports(source: str, filename: str = "<src>") -> list[str]:
    """Each import of a private kiso module or name in ``source``, as ``line: what``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "kiso" and any(_private(p) for p in parts):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "kiso":
                continue
            if any(_private(p) for p in parts):
                found.append(f"{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            parts = node.args[0].value.split(".")
            if parts[0] == "kiso" and any(_private(p) for p in parts):
                found.append(f"{node.lineno}: import_module({node.args[0].value!r})")
    return found


def test_there_are_modules_to_check() -> None:
    names = {p.relative_to(SRC).as_posix() for p in MODULES}
    assert {"kml.py", "errors.py", "cli.py", "executer/executer.py"} <= names
    assert "executer/tools/files.py" in names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(SRC).as_posix())
def test_kyronix_imports_only_public_kiso_modules(path: Path) -> None:
    found = private_kiso_imports(path.read_text(encoding="utf-8"), str(path))
    assert not found, (
        f"{path.relative_to(SRC.parent)} imports private kiso code: {found}; import the public "
        f"module instead (or make the name public in kiso)"
    )


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("from kiso.tools._filecore import atomic_write", True),
        ("import kiso.tools._filecore", True),
        ("import kiso.tools._filecore as fc", True),
        ("from kiso.tools import _filecore", True),
        ("from kiso.tools.paths import _components", True),
        ("import importlib\nimportlib.import_module('kiso._private')", True),
        ("def f():\n    from kiso.kernel._x import y", True),
        ("from kiso.tools.atomic import atomic_write", False),
        ("from kiso import __version__", False),
        ("from kiso.kernel.execution import Ruling", False),
        ("from ._private import x", False),  # relative: not kiso
        ("from kyronix._private import x", False),  # kyronix's own business
    ],
)
def test_the_checker_itself(source: str, bad: bool) -> None:
    assert bool(private_kiso_imports(source)) is bad
