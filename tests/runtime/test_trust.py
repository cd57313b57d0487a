"""The project trust gate's pure parts: the scan and its digest, the verdict store, the policy."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kiso.kernel import KisoError, RefusedError, UsageError
from kiso.runtime.config import load_config
from kiso.runtime.trust import (
    Status,
    TrustCheck,
    TrustError,
    TrustStore,
    UntrustedProjectError,
    check,
    gate,
    scan,
)


def put(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def project(workspace: Path) -> Path:
    put(workspace / ".kiso" / "config.json", '{"mode": "bypass"}')
    return workspace


def test_no_kiso_dir_or_an_empty_one_needs_no_trust(workspace: Path, home: Path) -> None:
    assert scan(workspace).empty and check(workspace, home).status is Status.NOTHING
    (workspace / ".kiso" / "empty-folder").mkdir(parents=True)
    assert scan(workspace).empty and check(workspace, home).status is Status.NOTHING
    assert gate(workspace, home).applied is False  # no ask needed, no error
    assert not (home / "trust.json").exists()


def test_the_digest_changes_with_any_file_changed_added_removed_or_renamed(project: Path) -> None:
    kiso = project / ".kiso"
    digests = [scan(project).digest]
    assert scan(project).digest == digests[0]  # stable while nothing changes
    put(kiso / "config.json", '{"mode": "plan"}')
    digests.append(scan(project).digest)
    put(kiso / "skills" / "a.md", "# a")
    digests.append(scan(project).digest)
    (kiso / "skills" / "a.md").rename(kiso / "skills" / "b.md")
    digests.append(scan(project).digest)
    put(kiso / "skills" / "b.md", "# b")  # same size, other bytes
    digests.append(scan(project).digest)
    assert len(set(digests)) == len(digests)
    (kiso / "skills" / "b.md").unlink()
    assert scan(project).digest == digests[1]  # back to what it was: the same digest
    snap = scan(project)
    assert [(e.path, e.size) for e in snap.entries] == [("config.json", 16)]
    assert snap.contents == {"config.json": b'{"mode": "plan"}'}


def test_every_file_under_kiso_is_listed_with_its_size(project: Path) -> None:
    put(project / ".kiso" / "extensions" / "safe.mjs", "export default 1\n")
    put(project / ".kiso" / "mcp.json", "{}")
    snap = scan(project)
    assert [(e.path, e.kind, e.size) for e in snap.entries] == [
        ("config.json", "file", 18),
        ("extensions/safe.mjs", "file", 17),
        ("mcp.json", "file", 2),
    ]
    assert snap.listing()[1] == "extensions/safe.mjs (17 bytes)"


def test_a_symlink_is_never_followed_and_can_never_be_trusted(
    project: Path, home: Path, tmp_path: Path
) -> None:
    secret = put(tmp_path / "outside" / "secret.txt", "SECRET")
    os.symlink(secret, project / ".kiso" / "notes.txt")
    os.symlink(secret.parent, project / ".kiso" / "dir")
    snap = scan(project)
    assert {e.path: e.kind for e in snap.entries} == {
        "config.json": "file",
        "dir": "link",
        "notes.txt": "link",
    }
    assert b"SECRET" not in b"".join(snap.contents.values())  # the target was never read
    assert "notes.txt" not in snap.contents
    with pytest.raises(UntrustedProjectError, match=r"notes.txt -> .*secret.txt \(symbolic link\)"):
        TrustStore(home).record(snap, trusted=True)
    with pytest.raises(UntrustedProjectError, match="cannot be trusted"):
        gate(project, home, ask=lambda c: True)  # not even a yes applies it
    TrustStore(home).record(snap, trusted=False)  # refusing is always possible
    refused = gate(project, home)
    assert refused.applied is False and "you refused it" in refused.notices[0]
    os.replace(secret, tmp_path / "outside" / "moved")  # a link's target is part of its entry
    assert scan(project).digest == snap.digest
    (project / ".kiso" / "notes.txt").unlink()
    os.symlink("/elsewhere", project / ".kiso" / "notes.txt")
    assert scan(project).digest != snap.digest


def test_a_kiso_dir_that_is_itself_a_link_is_not_followed(
    workspace: Path, home: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    put(elsewhere / "config.json", '{"mode": "bypass"}')
    os.symlink(elsewhere, workspace / ".kiso")
    snap = scan(workspace, home=home)
    assert [(e.path, e.kind) for e in snap.entries] == [(".", "link")] and not snap.contents
    with pytest.raises(UntrustedProjectError):
        gate(workspace, home, ask=lambda c: True)


def test_kiso_home_itself_is_not_a_project_dir(tmp_path: Path) -> None:
    user = tmp_path / "user"
    put(user / ".kiso" / "config.json", '{"floor": "off"}')  # the user's own, in their home
    assert check(user, user / ".kiso").status is Status.NOTHING
    nested = tmp_path / "ws"
    put(nested / ".kiso" / "config.json", "{}")
    inner = nested / ".kiso" / "state"
    put(inner / "trust.json", "{}")
    assert [e.path for e in scan(nested, home=inner).entries] == ["config.json"]


def test_a_fifo_is_listed_not_opened(project: Path, home: Path) -> None:
    os.mkfifo(project / ".kiso" / "pipe")
    snap = scan(project)  # opening it for reading would block forever
    assert ("pipe", "other") in [(e.path, e.kind) for e in snap.entries]
    with pytest.raises(UntrustedProjectError, match="pipe"):
        TrustStore(home).record(snap, trusted=True)


def test_the_verdict_store_round_trips_privately(project: Path, home: Path) -> None:
    store = TrustStore(home)
    assert store.get(project) is None
    snap = scan(project)
    v = store.record(snap, trusted=True, now=1_790_000_000)
    assert v.at == "2026-09-21T14:13:20Z"
    again = TrustStore(home).get(project)
    assert again == v and again is not None and again.trusted
    assert again.project == str(project) and again.digest == snap.digest
    assert stat.S_IMODE((home / "trust.json").stat().st_mode) == 0o600
    data = json.loads((home / "trust.json").read_text())
    assert data["version"] == 1
    assert data["projects"][str(project)]["verdict"] == "trusted"
    assert data["projects"][str(project)]["files"][0]["path"] == "config.json"
    other = put(project.parent / "other" / ".kiso" / "config.json", "{}").parent.parent
    store.record(scan(other), trusted=False)
    assert [x.trusted for x in store.verdicts()] == [False, True]  # sorted by path
    assert store.forget(project) and not store.forget(project)
    assert store.get(project) is None and store.get(other) is not None
    assert not [p for p in os.listdir(home) if p.endswith(".kiso-tmp")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{oops", "not valid JSON"),
        ("[]", "has no 'projects' object"),
        ('{"version": 1, "projects": {"/p": {"digest": "md5:x", "verdict": "trusted", "at": ""}}}',
         "digest: must be a sha256"),
        ('{"version": 1, "projects": {"/p": {"digest": "sha256:x", "verdict": "yes", "at": ""}}}',
         'verdict: must be "trusted" or "refused"'),
        ('{"version": 1, "projects": {"/p": 3}}', "must be an object"),
        ('{"version": 9, "projects": {}}', "written by a newer kiso"),
        ('{"projects": {}}', "unknown version None"),
    ],
)  # fmt: skip
def test_a_corrupt_trust_file_is_a_clear_error(
    project: Path, home: Path, text: str, message: str
) -> None:
    put(home / "trust.json", text)
    with pytest.raises(TrustError) as info:
        gate(project, home, ask=lambda c: True)
    assert isinstance(info.value, UsageError)
    assert str(home / "trust.json") in str(info.value) and message in str(info.value)
    assert "delete it" in str(info.value) or "upgrade kiso" in str(info.value)
    assert (home / "trust.json").read_text() == text  # never overwritten


def test_the_gate_asks_once_records_and_asks_again_only_on_change(
    project: Path, home: Path
) -> None:
    asked: list[TrustCheck] = []

    def yes(c: TrustCheck) -> bool:
        asked.append(c)
        return True

    first = gate(project, home, ask=yes)
    assert first.applied and first.project_files == {"config.json": b'{"mode": "bypass"}'}
    assert len(asked) == 1 and asked[0].status is Status.UNKNOWN
    assert gate(project, home, ask=yes).applied and len(asked) == 1  # remembered
    assert gate(project, home).applied  # headless: trusted is trusted
    put(project / ".kiso" / "config.json", '{"mode": "accept-edits"}')
    with pytest.raises(UntrustedProjectError) as info:
        gate(project, home)  # headless, changed: refused
    assert isinstance(info.value, RefusedError)
    line = str(info.value)
    assert "changed since you trusted it" in line and "changed config.json" in line
    assert "`kiso trust`" in line or "kiso trust " in line
    assert "--revoke" in line and "\n" not in line
    no = gate(project, home, ask=lambda c: False)
    assert not no.applied and no.project_files is None and "you refused it" in no.notices[0]
    assert not gate(project, home, ask=yes).applied and len(asked) == 1  # a refusal is kept too
    assert not gate(project, home).applied  # and headless honours it
    unanswered = gate(project.parent, home, ask=lambda c: None)
    assert not unanswered.applied  # (the parent has no .kiso/: nothing to ask)
    put(project / ".kiso" / "config.json", '{"mode": "plan"}')
    skipped = gate(project, home, ask=lambda c: None)
    assert not skipped.applied and "no answer" in skipped.notices[0]
    assert TrustStore(home).get(project) is not None
    assert check(project, home).status is Status.CHANGED  # no answer recorded nothing


def test_an_untrusted_project_config_is_not_applied(project: Path, home: Path) -> None:
    put(home / "config.json", '{"mode": "plan"}')
    assert load_config(home, project, environ={}).mode == "bypass"  # the layer, on its own
    assert load_config(home, project, environ={}, project=False).mode == "plan"
    trusted = load_config(
        home, project, environ={}, project_files={"config.json": b'{"mode": "accept-edits"}'}
    )
    # the bytes the gate hashed apply, not what is on disk now
    assert trusted.mode == "accept-edits"
    assert trusted.mode_source == str(project / ".kiso" / "config.json")
    assert load_config(home, project, environ={"KISO_MODE": "plan"}).mode_source == "environment"
    assert load_config(home, project, environ={}, mode="plan").mode_source == "flag"
    with pytest.raises(KisoError, match="only your user config"):
        load_config(home, project, environ={}, project_files={"config.json": b'{"floor": "off"}'})
