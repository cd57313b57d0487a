"""The Kyronix exception tree: one root, the families, and nothing bare raised on purpose."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

import kyronix
import kyronix.executer
from kyronix import errors
from kyronix.errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    ConflictError,
    ExecuterDisconnectedError,
    ExecutionRunningError,
    InsufficientCreditsError,
    KmlError,
    KyronixError,
    KyronixRefusedError,
    KyronixRunError,
    KyronixSignal,
    KyronixTypeError,
    KyronixUsageError,
    NoExecuterError,
    NotFoundError,
    NotUncertainError,
    ProjectNotFoundError,
    RateLimitError,
    ReceiptConflict,
    ReceiptError,
    ReceiptStoreError,
    RunningLoopError,
    SecurityError,
    ToolFailure,
    TunnelError,
    UnknownExecutionError,
    UnsupportedError,
)
from kyronix.executer import (
    KyronixExecuter,
    PermissionManager,
    Policy,
    ReceiptStore,
    Sandbox,
)
from kyronix.kml import Plan, ToolCall, parse, serialize

SRC = Path(__file__).resolve().parents[2] / "src" / "kyronix"

FAMILIES = (KyronixUsageError, KyronixRunError, KyronixRefusedError, KyronixSignal)

# Each class of the tree, its family, and the builtin it is also (for callers from before).
TREE: list[tuple[type[KyronixError], type[KyronixError], type[Exception] | None]] = [
    (KyronixTypeError, KyronixUsageError, TypeError),
    (UnsupportedError, KyronixUsageError, NotImplementedError),
    (RunningLoopError, KyronixUsageError, RuntimeError),
    (KmlError, KyronixUsageError, ValueError),
    (ReceiptError, KyronixUsageError, ValueError),
    (ReceiptConflict, ReceiptError, ValueError),
    (UnknownExecutionError, ReceiptError, KeyError),
    (NotUncertainError, ReceiptError, ValueError),
    (ExecutionRunningError, ReceiptError, ValueError),
    (ReceiptStoreError, KyronixRunError, RuntimeError),
    (APIError, KyronixRunError, None),
    (AuthenticationError, APIError, None),
    (InsufficientCreditsError, APIError, None),
    (NotFoundError, APIError, None),
    (ProjectNotFoundError, NotFoundError, None),
    (ConflictError, APIError, None),
    (RateLimitError, APIError, None),
    (TunnelError, APIError, None),
    (NoExecuterError, TunnelError, None),
    (ExecuterDisconnectedError, TunnelError, None),
    (APIConnectionError, KyronixRunError, None),
    (APITimeoutError, APIConnectionError, None),
    (SecurityError, KyronixRefusedError, None),
    (ToolFailure, KyronixSignal, None),
]


@pytest.mark.parametrize(("cls", "family", "builtin"), TREE, ids=[c.__name__ for c, _, _ in TREE])
def test_each_error_is_in_its_family(
    cls: type[KyronixError], family: type[KyronixError], builtin: type[Exception] | None
) -> None:
    assert issubclass(cls, family) and issubclass(cls, KyronixError)
    if builtin is not None:
        assert issubclass(cls, builtin)
    # in exactly one family, except the two that are also carried as results
    families = [f for f in FAMILIES if issubclass(cls, f)]
    expected = 2 if cls in (SecurityError, ReceiptConflict) else 1
    assert len(families) == expected, families


# The runtime SDK's errors (what the server or the tunnel answered): exported from kyronix,
# and not needed by the executer's callers.
SDK_ERRORS = {
    "APIConnectionError", "APIError", "APITimeoutError", "AuthenticationError", "ConflictError",
    "ExecuterDisconnectedError", "InsufficientCreditsError", "NoExecuterError", "NotFoundError",
    "ProjectNotFoundError", "RateLimitError", "TunnelError",
}  # fmt: skip


def test_the_tree_is_exported_from_kyronix_and_the_executer() -> None:
    assert set(errors.__all__) >= SDK_ERRORS
    for name in errors.__all__:
        assert getattr(kyronix, name) is getattr(errors, name), name
        assert name in kyronix.__all__
        if name not in SDK_ERRORS:
            assert getattr(kyronix.executer, name) is getattr(errors, name), name
            assert name in kyronix.executer.__all__, name
        # and drawn in the module's docstring
        assert name in (errors.__doc__ or ""), name
    from kyronix.executer.tools.base import SecurityError as Sec
    from kyronix.executer.tools.base import ToolFailure as TF
    from kyronix.kml import KmlError as Kml

    assert (Sec, TF, Kml) == (SecurityError, ToolFailure, KmlError)


def test_the_root_has_status_code_and_details() -> None:
    plain = KyronixError("something")
    assert plain.status_code is None and plain.details == {} and str(plain) == "something"
    assert plain.message == "something"
    http = KyronixError("no key", status_code=401, details={"code": "unauthorized"})
    assert http.status_code == 401 and http.details == {"code": "unauthorized"}
    for cls, _, _ in TREE:
        assert cls.status_code is None  # nothing here crossed HTTP until raised with one
    err = KmlError(12, "</tool>", "truncated")
    assert err.details == {"offset": 12, "expected": "</tool>", "detail": "truncated"}
    # a KeyError subclass still reads as its message, not its repr
    assert str(UnknownExecutionError("no execution 'x'")) == "no execution 'x'"


def test_security_error_is_refused_and_still_a_result() -> None:
    exc = SecurityError("denied")
    assert isinstance(exc, ToolFailure) and isinstance(exc, KyronixRefusedError)
    assert (
        exc.error_type == "SecurityError" and ReceiptConflict("x").error_type == "ReceiptConflict"
    )
    assert ToolFailure("x").error_type == "ToolError"


def test_raised_errors_are_in_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KmlError) as kml_info:
        parse("<kyronix><tool name='x'>")
    assert isinstance(kml_info.value, ValueError)
    with pytest.raises(KyronixUsageError, match="duplicate execution_id"):
        serialize(Plan((ToolCall("a", {}, "same"), ToolCall("b", {}, "same"))))
    with pytest.raises(KyronixUsageError, match="unknown status"):
        serialize(Plan(status="maybe"))
    with pytest.raises(KyronixUsageError, match="effect"):
        Policy("tool:*", "perhaps")  # type: ignore[arg-type]
    with pytest.raises(KyronixTypeError, match="Policy"):
        PermissionManager(["tool:*"])  # type: ignore[list-item]
    with pytest.raises(KyronixTypeError, match="bytes"):
        Sandbox(tmp_path).resolve(b"a")
    # the tunnel exists now: what was UnsupportedError is a missing key, said plainly
    monkeypatch.delenv("KYRONIX_API_KEY", raising=False)
    with pytest.raises(KyronixUsageError, match="KYRONIX_API_KEY"):
        KyronixExecuter(ws_url="ws://localhost/ws")
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(ReceiptStoreError, match="receipt store"):
        ReceiptStore(junk)
    with pytest.raises(ReceiptStoreError, match="cannot open the receipt store"):
        ReceiptStore(junk / "inside-a-file.sqlite3")  # its "directory" is a file
    ex = KyronixExecuter(receipts=":memory:")
    with ex:
        with pytest.raises(KyronixUsageError, match="built-in"):
            ex.register("write_file", lambda args: None)
        with pytest.raises(KyronixUsageError, match="tool name"):
            ex.register("no spaces", lambda args: None)
        with pytest.raises(KyronixTypeError, match="callable"):
            ex.register("x", "not a function")  # type: ignore[arg-type]
        with pytest.raises(KyronixUsageError, match="not an existing directory"):
            ex.execute_sync("<tool name='list_dir'></tool>", tmp_path / "missing")
        with pytest.raises(UnknownExecutionError, match="no execution 'nope'"):
            ex.resolve("nope", "rerun", tmp_path)

        async def inside() -> None:
            with pytest.raises(RunningLoopError, match="await execute"):
                ex.execute_sync("<tool name='list_dir'></tool>", tmp_path)

        asyncio.run(inside())


_BARE = {"ValueError", "TypeError", "KeyError", "RuntimeError", "NotImplementedError", "Exception"}


def test_nothing_bare_is_raised_on_purpose_in_kyronix() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in _BARE:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: raise {target.id}")
    assert not found, found


def test_every_kyronix_exception_class_is_in_the_tree() -> None:
    """An exception class defined anywhere in src/kyronix derives from KyronixError."""
    import importlib
    import inspect

    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == name:
                assert issubclass(obj, KyronixError), f"{name}.{obj.__name__}"
