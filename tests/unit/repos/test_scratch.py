"""Scratch folders are emptied and reused, and removed when they hold anything else."""

from __future__ import annotations

import os
from pathlib import Path

from nexus_mcp.repos.scratch import ScratchFolders


def test_a_folder_handed_back_is_emptied_of_files_and_reused() -> None:
    folders = ScratchFolders()
    with folders.folder() as first:
        (first / "index").write_bytes(b"DIRC")
        (first / "objects" / "ab").mkdir()
        (first / "objects" / "ab" / "cdef").write_bytes(b"blob")
    with folders.folder() as second:
        assert second == first
        assert sorted(os.listdir(second)) == ["objects"]
        assert os.listdir(second / "objects" / "ab") == []
    folders.close()
    assert not first.exists()


def test_a_folder_holding_anything_else_is_removed_not_reused(tmp_path: Path) -> None:
    folders = ScratchFolders()
    with folders.folder() as first:
        (first / "objects" / "pack").mkdir()
    assert not first.exists()
    with folders.folder() as second:
        (second / "link").symlink_to(tmp_path)
    assert not second.exists()
    assert tmp_path.exists()
    with folders.folder() as third:
        assert third not in (first, second)
        assert sorted(os.listdir(third)) == ["objects"]
    folders.close()


def test_at_most_keep_idle_folders_are_kept_and_each_call_has_its_own() -> None:
    folders = ScratchFolders(keep_idle=1)
    with folders.folder() as one, folders.folder() as two:
        assert one != two
    assert [one.exists(), two.exists()].count(True) == 1
    folders.close()
    assert not one.exists() and not two.exists()
