"""The store contract (both implementations) and the JSONL file format on disk."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kiso.kernel import (
    AppendError,
    CorruptLogError,
    JsonlSessionStore,
    MemorySessionStore,
    ModelRef,
    Outcome,
    RunEnded,
    RunStarted,
    User,
    parse_log,
    workspace_slug,
)
from kiso.kernel.doctor import RepairStatus, repair_session
from kiso.kernel.errors import StoreError, describe_os_error
from kiso.kernel.events import (
    Assistant,
    ExecutionFinished,
    ExecutionStarted,
    ToolCall,
    Usage,
)

Store = JsonlSessionStore | MemorySessionStore


def start(run: str = "r1") -> list[RunStarted | User]:
    return [
        RunStarted(run=run, trigger="user", model=ModelRef("faux", "m"), mode="default"),
        User(run=run, content="hello there"),
    ]


# --------------------------------------------------------------------------- JSONL on disk


def test_layout_and_permissions(jsonl_store: JsonlSessionStore, workspace: Path) -> None:
    with jsonl_store.create(workspace, session_id="s1") as w:
        w.append(*start())
    folder = jsonl_store.root / workspace_slug(workspace)
    log = folder / "s1.jsonl"
    assert Path(w.path or "") == log
    for d in (jsonl_store.home, jsonl_store.root, folder):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE((folder / "s1.lock").stat().st_mode) == 0o600
    lines = log.read_bytes().split(b"\n")
    assert lines[-1] == b""
    header = json.loads(lines[0])
    assert list(header) == ["seq", "type", "v", "id", "workspace", "created", "kiso", "parent"]
    assert header["seq"] == 0 and header["type"] == "session" and header["parent"] is None
    first = json.loads(lines[1])
    assert list(first)[:4] == ["seq", "ts", "run", "type"]


def test_existing_folders_keep_their_modes(home: Path, workspace: Path) -> None:
    folder = home / "projects" / workspace_slug(workspace)
    folder.mkdir(parents=True)
    os.chmod(folder, 0o755)
    JsonlSessionStore(home).create(workspace, session_id="s1").close()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755


def test_slug_is_readable_and_collision_free(tmp_path: Path) -> None:
    (tmp_path / "a-b").mkdir()
    (tmp_path / "a" / "b").mkdir(parents=True)
    one, two = workspace_slug(tmp_path / "a-b"), workspace_slug(tmp_path / "a" / "b")
    assert one != two
    assert one.rsplit("-", 1)[0].endswith("a-b")


def _log_path(store: JsonlSessionStore, workspace: Path) -> Path:
    with store.create(workspace, session_id="s1") as w:
        w.append(*start())
    return store.path_of("s1")


def test_a_torn_tail_is_ignored_on_load_and_cut_before_the_next_append(
    jsonl_store: JsonlSessionStore, workspace: Path
) -> None:
    path = _log_path(jsonl_store, workspace)
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"seq":3,"ts":1,"run":"r1","type":"run_en')
    log = jsonl_store.load("s1")
    assert log.torn_tail and len(log.events) == 2
    with jsonl_store.open("s1") as w:
        assert path.read_bytes() == whole  # cut at open, before anything is appended
        w.append(RunEnded(run="r1", outcome=Outcome.completed()))
    log = jsonl_store.load("s1")
    assert not log.torn_tail and [e.seq for e in log.events] == [1, 2, 3]


@pytest.mark.parametrize(
    ("garbage", "line", "reason"),
    [
        (b"not json\n", 4, "not valid JSON"),
        (b'{"seq":3,"ts":1,"run":"r1","type":"bogus"}\n', 4, "unknown event type"),
        (b'{"seq":5,"ts":1,"run":"r1","type":"run_ended","outcome":{"kind":"completed"}}\n', 4,
         "seq 5 where 3 was expected"),
        (b'{"seq":2,"ts":1,"run":"r1","type":"run_ended","outcome":{"kind":"completed"}}\n', 4,
         "seq 2 where 3 was expected"),
        (b"\n", 4, "not valid JSON"),
        (b'{"seq":3,"ts":1,"run":"\xff"}\n', 4, "not UTF-8"),
        (b'\x00{\x00}\x00\n', 4, "not valid JSON"),
    ],
)  # fmt: skip
def test_anything_else_malformed_names_the_file_and_line(
    jsonl_store: JsonlSessionStore, workspace: Path, garbage: bytes, line: int, reason: str
) -> None:
    path = _log_path(jsonl_store, workspace)
    with open(path, "ab") as f:
        f.write(garbage)
    before = path.read_bytes()
    for attempt in (lambda: jsonl_store.load("s1"), lambda: jsonl_store.open("s1")):
        with pytest.raises(CorruptLogError) as info:
            attempt()
        assert info.value.line == line
        assert str(path) in str(info.value) and reason in str(info.value)
        assert f"line {line}" in str(info.value)
        # never advise cutting the log (that would drop receipts after the line): the doctor
        assert "was not changed" in str(info.value) and "`kiso doctor s1`" in str(info.value)
        assert "remove line" not in str(info.value)
        assert "everything after" not in str(info.value)
    assert path.read_bytes() == before  # a damaged log is never modified
    (row,) = jsonl_store.list(workspace)  # a listing still works, naming it corrupt
    assert row.state.value == "corrupt" and f"line {line}" in (row.error or "")
    assert row.workspace == os.path.realpath(workspace)
    # repaired as the message says; the refusals left no lock behind
    assert repair_session(jsonl_store, "s1").status is RepairStatus.REPAIRED
    with jsonl_store.open("s1") as w:
        kept = ["run_started", "user"] + (["run_ended"] if reason.startswith("seq") else [])
        assert [e.type for e in w.events] == kept  # a readable record is kept, renumbered
        assert [e.seq for e in w.events] == list(range(1, len(kept) + 1))


def test_a_corrupt_line_in_the_middle_is_not_a_torn_tail() -> None:
    header = b'{"seq":0,"type":"session","v":1,"id":"s","workspace":"/w","created":1,"kiso":"x","parent":null}\n'  # noqa: E501
    ok = b'{"seq":1,"ts":1,"run":"r","type":"user","content":"a","source":"user"}\n'
    with pytest.raises(CorruptLogError, match="line 2"):
        parse_log(header + b'{"seq":1,"ts"\n' + ok, "x.jsonl")
    assert parse_log(header + ok + b'{"seq":2,"ts"', "x.jsonl").torn_tail
    with pytest.raises(CorruptLogError, match="line 1: the file is empty"):
        parse_log(b"", "x.jsonl")
    with pytest.raises(CorruptLogError, match="header line is incomplete"):
        parse_log(header[:20], "x.jsonl")
    newer = header.replace(b'"v":1', b'"v":9')
    with pytest.raises(CorruptLogError, match="upgrade kiso"):
        parse_log(newer, "x.jsonl")


def test_a_file_changed_underneath_the_writer_is_refused(
    jsonl_store: JsonlSessionStore, workspace: Path
) -> None:
    with jsonl_store.create(workspace, session_id="s1") as w:
        w.append(*start())
        with open(jsonl_store.path_of("s1"), "ab") as f:
            f.write(b"{}\n")
        with pytest.raises(AppendError, match="changed underneath"):
            w.append(RunEnded(run="r1", outcome=Outcome.completed()))


def test_each_append_is_one_write_and_one_fsync(
    jsonl_store: JsonlSessionStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_write, real_fsync = os.write, os.fsync
    with jsonl_store.create(workspace, session_id="s1") as w:

        def write(fd: int, data: bytes) -> int:
            calls.append(f"write {bytes(data).count(10)}")
            return real_write(fd, data)

        def fsync(fd: int) -> None:
            calls.append("fsync")
            real_fsync(fd)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "fsync", fsync)
        w.append(*start(), RunEnded(run="r1", outcome=Outcome.completed()))
        w.append(User(run="r1", content="again"))
    assert calls == ["write 3", "fsync", "write 1", "fsync"]


def test_the_index_is_a_cache_rebuilt_when_stale(
    jsonl_store: JsonlSessionStore, workspace: Path
) -> None:
    from kiso.kernel.index import INDEX_NAME, SidecarIndex

    with jsonl_store.create(workspace, session_id="s1") as w:
        w.append(*start())
    jsonl_store.create(workspace, session_id="s2").close()
    folder = jsonl_store.project_dir(workspace)
    index = SidecarIndex(folder)
    first = {r.id: r.state.value for r in index.refresh(jsonl_store.load_path)}
    assert first == {"s1": "interrupted", "s2": "empty"}
    assert sorted(index.rebuilt) == ["s1", "s2"]
    index.refresh(jsonl_store.load_path)
    assert index.rebuilt == []  # nothing changed: no log was read
    with jsonl_store.open("s1") as w:
        w.append(RunEnded(run="r1", outcome=Outcome.aborted("user")))
    rows = {r.id: r.state.value for r in index.refresh(jsonl_store.load_path)}
    assert index.rebuilt == ["s1"] and rows["s1"] == "ended"
    # a lying cache (same stamp, wrong row) is believed only while the stamp holds ...
    (folder / INDEX_NAME).write_text("{not json")
    assert {r.id: r.state.value for r in index.refresh(jsonl_store.load_path)} == {
        "s1": "ended",
        "s2": "empty",
    }
    assert sorted(index.rebuilt) == ["s1", "s2"]
    os.unlink(jsonl_store.path_of("s2"))
    assert [r.id for r in index.refresh(jsonl_store.load_path)] == ["s1"]
    assert set(json.loads((folder / INDEX_NAME).read_text())["sessions"]) == {"s1"}
    assert stat.S_IMODE((folder / INDEX_NAME).stat().st_mode) == 0o600


def test_a_header_naming_another_session_is_corruption(
    jsonl_store: JsonlSessionStore, workspace: Path
) -> None:
    path = _log_path(jsonl_store, workspace)
    copy = path.with_name("s2.jsonl")  # a copy under another session's name
    copy.write_bytes(path.read_bytes())
    for attempt in (lambda: jsonl_store.load("s2"), lambda: jsonl_store.open("s2")):
        with pytest.raises(CorruptLogError) as info:
            attempt()
        assert info.value.line == 1
        assert "'s1'" in str(info.value) and "s2.jsonl" in str(info.value)
    rows = {r.id: r for r in jsonl_store.list(workspace)}
    assert rows["s2"].state.value == "corrupt" and rows["s1"].state.value == "interrupted"
    header = path.read_bytes().split(b"\n")[0] + b"\n"
    assert parse_log(header, "anything.jsonl").header.id == "s1"  # no file name given: no check
    with pytest.raises(CorruptLogError, match="names session 's1'"):
        parse_log(header, "x", session_id="s2")


def _turn(call_input: dict[str, object], started_input: dict[str, object]) -> list[object]:
    call = ToolCall("c1", "shell", call_input)
    return [
        *start(),
        Assistant(run="r1", blocks=(call,), stop="tool_use", usage=Usage(), model="m", ms=1),
        ExecutionStarted(
            run="r1", execution_id="s1:4", call_id="c1", name="shell", input=started_input
        ),
        ExecutionFinished(
            run="r1", execution_id="s1:4", call_id="c1", ok=True, content="", is_error=False, ms=1
        ),
    ]


def test_os_errors_become_store_errors_that_say_what_to_do(
    jsonl_store: JsonlSessionStore, workspace: Path
) -> None:
    folder = jsonl_store.project_dir(workspace)
    folder.parent.mkdir(parents=True)
    folder.write_text("a file where the project folder should be")
    with pytest.raises(StoreError) as info:
        jsonl_store.create(workspace, session_id="s1")
    assert str(info.value).startswith(f"could not create the session log {folder}/s1.jsonl: ")
    assert "session s1 was not created" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)  # kept as the cause, never shown raw


def test_describe_os_error_names_the_full_file_system(tmp_path: Path) -> None:
    import errno

    full = OSError(errno.ENOSPC, "No space left on device")
    text = describe_os_error(tmp_path / "missing" / "k9.jsonl", full, "append to")
    mount = Path(tmp_path)
    while mount.parent != mount and mount.parent.stat().st_dev == mount.stat().st_dev:
        mount = mount.parent
    assert text.startswith(f"could not append to {tmp_path}/missing/k9.jsonl: ")
    assert f"the file system mounted at {mount} is full" in text
    assert "free some space there and try again" in text
    quota = describe_os_error(tmp_path, OSError(errno.EDQUOT, "Disk quota exceeded"), "write")
    assert "no quota left" in quota
    assert "read-only" in describe_os_error(tmp_path, OSError(errno.EROFS, "ro"), "write")
    assert "failing" in describe_os_error(tmp_path, OSError(errno.EIO, "I/O error"), "read")
