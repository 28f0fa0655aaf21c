"""``StoreGuard`` on its own: links and borrowed stores are found, also once the folders
it listed clean are remembered (a changed folder is listed again)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nexus_mcp.repos import store
from nexus_mcp.repos.store import StoreGuard, UnsafeStoreError
from tests.support.git_repos import commit, git, make_repo


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Remember every folder at once (in use: only folders unchanged for two seconds).
    monkeypatch.setattr(store, "_SETTLED_NS", -(10**12))
    repo = make_repo(tmp_path / "repo", {"a.md": "a\n"})
    commit(repo, {"b.md": "b\n"}, "b")
    return repo


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "outside", {"secret.md": "s\n"})


def guard_of(repo: Path) -> StoreGuard:
    guard = StoreGuard(repo / ".git", repo / ".git")
    guard.check()
    guard.check()  # now answered from what it remembers
    return guard


def loose_folder(repo: Path) -> Path:
    return next(p for p in (repo / ".git" / "objects").iterdir() if len(p.name) == 2)


def test_a_link_added_to_a_remembered_folder_is_found(repo: Path, outside: Path) -> None:
    guard = guard_of(repo)
    folder = loose_folder(repo)
    target = next(p for p in loose_folder(outside).iterdir())
    (folder / ("f" * 38)).symlink_to(target)
    with pytest.raises(UnsafeStoreError):
        guard.check()


def test_a_file_renamed_over_by_a_link_is_found(repo: Path, outside: Path) -> None:
    guard = guard_of(repo)
    victim = next(loose_folder(repo).iterdir())
    link = victim.parent / "tmp-link"
    link.symlink_to(next(loose_folder(outside).iterdir()))
    os.replace(link, victim)
    with pytest.raises(UnsafeStoreError):
        guard.check()


def test_a_remembered_folder_swapped_for_a_link_is_found(repo: Path, outside: Path) -> None:
    guard = guard_of(repo)
    folder = loose_folder(repo)
    shutil.rmtree(folder)
    folder.symlink_to(loose_folder(outside))
    with pytest.raises(UnsafeStoreError):
        guard.check()


def test_alternates_appearing_later_are_found(repo: Path, outside: Path) -> None:
    guard = guard_of(repo)
    (repo / ".git" / "objects" / "info" / "alternates").write_text(
        str(outside / ".git" / "objects") + "\n"
    )
    with pytest.raises(UnsafeStoreError) as caught:
        guard.check()
    assert str(outside) not in str(caught.value)


def test_housekeeping_is_not_refused(repo: Path) -> None:
    guard = guard_of(repo)
    git(repo, "gc", "-q")
    git(repo, "commit-graph", "write", "--reachable")
    guard.check()
