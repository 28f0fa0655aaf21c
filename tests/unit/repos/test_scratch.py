"""Scratch folders are emptied and reused, and removed when they hold anything else; the
blobs git wrote there are read back only when they hash to their id."""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

from nexus_mcp.repos.scratch import ScratchFolders, read_loose_blobs
from tests.support.git_repos import ENV, GIT


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


def loose(tmp_path: Path, content: bytes) -> tuple[Path, str]:
    """A loose object written by git itself into a fresh object folder."""
    objects, repo = tmp_path / "objects", tmp_path / "repo"
    if not repo.exists():
        objects.mkdir()
        subprocess.run([GIT, "init", "-q", str(repo)], env=ENV, check=True)
    env = {**ENV, "GIT_OBJECT_DIRECTORY": str(objects), "GIT_DIR": str(repo / ".git")}
    done = subprocess.run(
        [GIT, "hash-object", "-w", "--stdin"],
        input=content,
        env=env,
        capture_output=True,
        check=True,
    )
    return objects, done.stdout.decode().strip()


def test_loose_blobs_are_read_back_only_when_they_hash_to_their_id(tmp_path: Path) -> None:
    objects, good = loose(tmp_path, b"text\n")
    _objects, forged = loose(tmp_path, b"other\n")
    path = objects / forged[:2] / forged[2:]
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"blob 5\0text\n"))  # content of another id
    missing = "0" * 40
    assert read_loose_blobs(objects, [good, forged, missing], 1024) == {good: b"text\n"}
    assert read_loose_blobs(objects, [good], 3) is None  # more than the bound
