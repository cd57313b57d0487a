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
            "tasks",
            "transport",
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


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
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
    return cycles


def test_no_import_cycle() -> None:
    assert _cycles(graph()) == []


PACKAGES = ("runs", "relay", "dashboard", "migrations")


def _package(name: str) -> str:
    rest = name[len(PREFIX) :].lstrip(".")
    head = rest.split(".", 1)[0]
    return f"{PREFIX}.{head}" if head in PACKAGES else name


def test_no_import_cycle_between_packages_either() -> None:
    """``runs/`` and ``relay/`` (and the dashboard) are wholes: no cycle runs through them."""
    edges: dict[str, set[str]] = {}
    for a, targets in graph().items():
        edges.setdefault(_package(a), set()).update(
            _package(b) for b in targets if _package(b) != _package(a)
        )
    assert _cycles(edges) == []


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


# --------------------------------------------------------------------------- one owner per table

WRITERS: dict[str, set[str]] = {
    "projects": {"accounts", "billing"},  # billing keeps the credits balance, in the ledger's tx
    "api_keys": {"accounts"},
    "ledger": {"billing"},
    "holds": {"billing"},
    "sessions": {"sessions"},
    "runs": {"runs.records"},
    "executions": {"runs.records"},
    "custom_agents": {"custom_agents"},
    "users": {"users"},
    "memberships": {"users"},
    "signin_links": {"users"},
    "web_sessions": {"users"},
    "spent_states": {"users"},
    "replicas": {"cluster"},
    "presence": {"cluster"},
    "mailbox": {"mailbox"},
}
"""Each table of db.py, and the only modules that write it (insert, update, delete)."""


def _tables() -> set[str]:
    tree = ast.parse((SERVER / "db.py").read_text())
    found = set()
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "Table"
        ):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return found


def _table_uses(path: Path) -> tuple[set[str], set[str]]:
    """(the tables of db.py the module touches at all, the tables it writes)."""
    tables = _tables()
    tree = ast.parse(path.read_text())
    names: dict[str, str] = {}  # local name -> table
    modules: set[str] = set()  # local names of the db module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == f"{PREFIX}.db":
            for alias in node.names:
                if alias.name in tables:
                    names[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module == PREFIX:
            modules.update(a.asname or a.name for a in node.names if a.name == "db")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == f"{PREFIX}.db":
                    modules.add(alias.asname or alias.name)

    def table(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return names.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr in tables:
            base = ast.unparse(node.value)
            return node.attr if base in modules else None
        return None

    touched: set[str] = set()
    written: set[str] = set()
    for node in ast.walk(tree):
        found = table(node)
        if found is not None:
            touched.add(found)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("insert", "update", "delete") and node.args:
            target = table(node.args[0])
        elif isinstance(func, ast.Attribute) and func.attr in ("insert", "update", "delete"):
            target = table(func.value)
        else:
            target = None
        if target is not None:
            written.add(target)
    return touched, written


def test_every_table_has_its_owners() -> None:
    assert set(WRITERS) == _tables()


@pytest.mark.parametrize("name", sorted(modules()))
def test_a_table_is_written_only_by_the_module_that_owns_it(name: str) -> None:
    if name.startswith(f"{PREFIX}.migrations"):
        return
    short = name[len(PREFIX) :].lstrip(".")
    _, written = _table_uses(modules()[name])
    strays = sorted(t for t in written if short not in WRITERS[t])
    assert strays == [], f"{name} writes {strays}: go through the module that owns them"


@pytest.mark.parametrize("name", sorted(modules()))
def test_the_routes_the_cli_and_the_entry_points_touch_no_table(name: str) -> None:
    """The dashboard, the API, /ws, the CLI and ``serve`` go through the owning modules."""
    if floor(name) < 4:
        return
    touched, _ = _table_uses(modules()[name])
    assert touched == set(), f"{name} reads or writes {sorted(touched)} itself"


def test_the_ownership_check_sees_every_way_to_reach_a_table(tmp_path: Path) -> None:
    """The checks above would catch a table reached through the module, an alias, or a
    method of the table (so they fail if the feature breaks)."""
    path = tmp_path / "probe.py"
    path.write_text(
        "from kyronix.server import db\n"
        "import kyronix.server.db as tables\n"
        "from kyronix.server.db import runs as r\n"
        "from sqlalchemy import delete\n"
        "def f(conn):\n"
        "    conn.execute(db.sessions.update())\n"
        "    conn.execute(delete(r))\n"
        "    return tables.ledger.c.amount\n"
    )
    touched, written = _table_uses(path)
    assert touched == {"sessions", "runs", "ledger"}
    assert written == {"sessions", "runs"}
