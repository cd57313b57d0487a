"""The server's floor plan (docs/server.md), measured from the code: imports point down only,
no module imports another in a cycle, nothing imports the composition root but the entry points,
and no module or class grows past what one person can hold in their head.

Every ``import`` counts: at the top, inside a function, and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3] / "src"
SERVER = ROOT / "kyronix" / "server"
PREFIX = "kyronix.server"

FLOORS: list[tuple[int, tuple[str, ...]]] = [
    (6, ("app", "serve", "cli", "")),  # entry points ("" is the package face)
    (5, ("api", "ws", "dashboard")),  # routes
    (4, ("state",)),
    (3, ("runs", "sessions", "users", "relay")),  # services
    (2, ("accounts", "billing", "custom_agents", "cluster", "mailbox")),  # tables
    (
        1,
        (
            "db",
            "config",
            "errors",
            "schemas",
            "ratelimit",
            "agents",
            "models",
            "scripted",
            "migrations",
        ),
    ),  # base
]
NAMES = {
    6: "entry points",
    5: "routes",
    4: "state",
    3: "services",
    2: "tables",
    1: "base",
}
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SERVER.rglob("*.py"))}


def floor(name: str) -> int:
    rest = name[len(PREFIX) :].lstrip(".")
    head = rest.split(".", 1)[0]
    for level, heads in FLOORS:
        if head in heads:
            return level
    raise AssertionError(f"{name} is on no floor: add it to docs/server.md and to FLOORS")


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of kyronix.server that ``name`` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            found = target
            while found and found not in known:
                found = found.rsplit(".", 1)[0] if "." in found else ""
            if found.startswith(PREFIX) and found != name:
                out.add(found)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_every_module_is_on_a_floor() -> None:
    for name in modules():
        floor(name)


def test_imports_point_down_only() -> None:
    upward = [
        f"{a} ({NAMES[floor(a)]}) imports {b} ({NAMES[floor(b)]})"
        for a, targets in graph().items()
        for b in sorted(targets)
        if floor(b) > floor(a)
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert cycles == []


def test_only_the_entry_points_import_the_composition_root() -> None:
    importers = sorted(a for a, targets in graph().items() if f"{PREFIX}.app" in targets)
    assert importers == [f"{PREFIX}.serve"]


def test_the_relay_knows_no_application_state() -> None:
    edges = graph()
    for name, targets in edges.items():
        if name.startswith(f"{PREFIX}.relay"):
            assert f"{PREFIX}.state" not in targets and f"{PREFIX}.app" not in targets, name


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_and_classes_stay_small(name: str) -> None:
    path = modules()[name]
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{name}: split it by step"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            assert size <= MAX_CLASS_LINES, f"{name}.{node.name} is {size} lines"


def test_no_raw_sql_outside_the_owning_modules() -> None:
    """The dashboard, the CLI and the routes go through the modules that own the tables."""
    edges = graph()
    for name, targets in edges.items():
        if floor(name) >= 4 and name != f"{PREFIX}.app":
            assert f"{PREFIX}.db" not in targets or _only_helpers(name), (
                f"{name} reads tables itself"
            )


def _only_helpers(name: str) -> bool:
    """Whether ``name`` takes from db.py only what is not a table (``now_ms``, ``Database``)."""
    path = modules()[name]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == f"{PREFIX}.db"
            and any(alias.name not in ("now_ms", "Database") for alias in node.names)
        ):
            return False
    return True
