"""Containment and atomic writes of the embedded workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nexus_mcp.errors import Code, InvalidPathError, NexusError
from nexus_mcp.policy.write_policy import DEV_WRITE_POLICY, PathGate
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.paths import is_within, normalize_relative


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("A")
    evil = tmp_path / "root-evil"
    evil.mkdir()
    (evil / "x.txt").write_text("outside")
    (root / "link-out").symlink_to(evil)
    (root / "link-file-out").symlink_to(evil / "x.txt")
    (root / "sub").mkdir()
    (root / "link-in").symlink_to(root / "sub")
    return Workspace(root, gate=PathGate(DEV_WRITE_POLICY))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a.txt", "a.txt"),
        ("./a.txt", "a.txt"),
        ("sub//b", "sub/b"),
        ("", ""),
        (".", ""),
        (" sub/ ", "sub"),
    ],
)
def test_normalize_accepts_relative_paths(raw: str, expected: str) -> None:
    assert normalize_relative(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "../a",
        "sub/../../a",
        "/etc/passwd",
        "//server/share",
        "C:/x",
        "c:x",
        "a\\b",
        "\\\\srv\\s",
        "a\x00b",
        "x" * 5000,
    ],
)
def test_normalize_refuses_hostile_paths(raw: str) -> None:
    with pytest.raises(NexusError) as info:
        normalize_relative(raw)
    assert info.value.code == Code.INVALID_PATH
    assert raw not in info.value.message


def test_prefix_confusion_is_not_containment(tmp_path: Path) -> None:
    assert not is_within(tmp_path / "root", tmp_path / "root-evil" / "x")
    assert is_within(tmp_path / "root", tmp_path / "root" / "x")


@pytest.mark.parametrize("raw", ["link-out/x.txt", "link-out", "link-file-out"])
def test_symlinks_pointing_outside_are_refused(ws: Workspace, raw: str) -> None:
    with pytest.raises(NexusError) as info:
        ws.resolve(raw)
    assert info.value.code == Code.INVALID_PATH


def test_symlinks_inside_resolve_to_their_target(ws: Workspace) -> None:
    assert ws.resolve("link-in").absolute == ws.root / "sub"


def test_atomic_write_leaves_no_temporary_file_on_failure(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = ws.resolve_parent("a.txt")

    def failing_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        ws.write_atomic(target, b"NEW CONTENT", overwrite=True)
    assert (ws.root / "a.txt").read_text() == "A"
    assert sorted(p.name for p in ws.root.iterdir()) == [
        "a.txt",
        "link-file-out",
        "link-in",
        "link-out",
        "sub",
    ]


def test_atomic_write_keeps_the_file_mode(ws: Workspace) -> None:
    os.chmod(ws.root / "a.txt", 0o640)
    ws.write_atomic(ws.resolve_parent("a.txt"), b"B", overwrite=True)
    assert (ws.root / "a.txt").stat().st_mode & 0o777 == 0o640


def test_the_root_itself_cannot_be_written_or_removed(ws: Workspace) -> None:
    for raw in ("", "."):
        with pytest.raises(NexusError) as info:
            ws.resolve_parent(raw)
        assert info.value.code == Code.INVALID_PATH


def test_reads_over_the_limit_are_refused(ws: Workspace) -> None:
    (ws.root / "big").write_bytes(b"x" * 11)
    with pytest.raises(NexusError) as info:
        ws.read_bytes(ws.resolve("big"), limit=10)
    assert info.value.code == Code.DOC_SIZE_EXCEEDED
    assert ws.read_bytes(ws.resolve("big"), limit=11) == b"x" * 11


def test_hidden_server_state_is_refused_by_real_path_and_separator_aware(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "state").mkdir(parents=True)
    (root / "state-evil").mkdir()
    (root / "link").symlink_to(root / "state")
    outside = tmp_path / "elsewhere"
    ws = Workspace(root, hidden=[root / "state", outside])
    assert ws.hidden == ((root / "state").resolve(),)  # state outside the root is not ours
    for raw in ("state", "state/audit.jsonl", "link/audit.jsonl", "./state/../state/x"):
        with pytest.raises(InvalidPathError):
            ws.resolve(raw)
    assert ws.resolve("state-evil/x").relative == "state-evil/x"
    assert ws.holds_hidden(ws.root) and not ws.holds_hidden(root / "state-evil")
