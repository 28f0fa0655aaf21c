"""The repo read tools never hand over an object from outside the served repository.

The attacker can write the served repository's ``.git`` (not the repository outside
``repos.allowed_roots`` whose files they are after: the server can read it, they cannot).
Each test points some part of the object store or the refs at that other repository, by
an alternates file, a link, a ``commondir`` or a bare sha, at start-up or after it, and
checks that no read tool returns its content, its file names or its commit ids, and that
the refusal names neither a path nor a sha.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.errors import ConfigError
from tests.support.git_repos import commit, git, make_repo, rev

from .repo_harness import Builder, build, call, envelope, ok, project

__all__ = ["build", "project"]  # the harness's fixtures, re-exported for pytest

REPO = "proj"
SECRET = "zqOUTSIDESECRET42"
SECRET_FILE = "secret-plans.md"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A repository outside ``repos.allowed_roots`` holding the secret, loose and packed."""
    repo = make_repo(tmp_path / "outside" / "vault", {SECRET_FILE: f"{SECRET}\n"})
    git(repo, "gc", "-q")  # packed...
    commit(repo, {"loose.md": f"{SECRET} loose\n"}, "loose")  # ...and one loose commit
    return repo


def objects_of(repo: Path) -> Path:
    return repo / ".git" / "objects"


def loose_paths(repo: Path) -> list[Path]:
    return [p for p in objects_of(repo).glob("[0-9a-f][0-9a-f]/*") if p.is_file()]


def leaked(result: Mapping[str, Any], outside: Path) -> list[str]:
    """What of the outside repository shows in a result: its content, names, ids, path."""
    text = json.dumps(result)
    heads = {rev(outside, "HEAD"), rev(outside, "HEAD~1")}
    found = [s for s in (SECRET, SECRET_FILE, "loose.md", str(outside)) if s in text]
    found += [h[:12] for h in heads if h[:12] in text]
    return found


async def read_everything(client: Client[Any], ref: str) -> list[dict[str, Any]]:
    """Every read tool, asked for the outside's content through ``ref``."""
    return [
        await call(client, "read_repo_file", {"repo": REPO, "path": SECRET_FILE, "ref": ref}),
        await call(client, "read_repo_file", {"repo": REPO, "path": "loose.md", "ref": ref}),
        await call(client, "list_repo_files", {"repo": REPO, "ref": ref, "recursive": True}),
        await call(client, "search_content", {"repo": REPO, "pattern": SECRET, "ref": ref}),
        await call(client, "locate_component", {"repo": REPO, "name": "loose", "ref": ref}),
    ]


def assert_refused(results: list[dict[str, Any]], outside: Path, *codes: str) -> None:
    for result in results:
        assert not leaked(result, outside), (leaked(result, outside), result)
        payload = envelope(result)
        assert payload["code"] in codes, payload
        assert "/" not in payload["error"], payload


def start_up_refused(build: Builder, outside: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        build()
    assert str(outside) not in str(caught.value)
    assert rev(outside, "HEAD") not in str(caught.value)


# --- the attacks, each a change to the served repository's .git ---------------------------


def alternates(project: Path, outside: Path) -> str:
    info = objects_of(project) / "info"
    info.mkdir(exist_ok=True)
    (info / "alternates").write_text(f"{objects_of(outside)}\n")
    # A ref file that is a link to the outside's branch: the tip to read there.
    (project / ".git" / "refs" / "heads" / "leak").symlink_to(
        outside / ".git" / "refs" / "heads" / "main"
    )
    return "leak"


def alternates_relative(project: Path, outside: Path) -> str:
    info = objects_of(project) / "info"
    info.mkdir(exist_ok=True)
    (info / "alternates").write_text(os.path.relpath(objects_of(outside), info.parent) + "\n")
    return rev(outside, "HEAD")  # the outside's commit, named by its sha


def alternates_abbreviated_sha(project: Path, outside: Path) -> str:
    alternates_relative(project, outside)
    return rev(outside, "HEAD")[:10]


def alternates_via_packed_refs(project: Path, outside: Path) -> str:
    info = objects_of(project) / "info"
    info.mkdir(exist_ok=True)
    (info / "alternates").write_text(f"{objects_of(outside)}\n")
    packed = project / ".git" / "packed-refs"
    packed.write_text(
        f"# pack-refs with: peeled fully-peeled sorted\n{rev(outside, 'HEAD')} refs/tags/v9\n"
    )
    return "v9"


def objects_link(project: Path, outside: Path) -> str:
    shutil.rmtree(objects_of(project))
    objects_of(project).symlink_to(objects_of(outside))
    return rev(outside, "HEAD")


def pack_folder_link(project: Path, outside: Path) -> str:
    git(project, "gc", "-q")
    pack = objects_of(project) / "pack"
    shutil.rmtree(pack)
    pack.symlink_to(objects_of(outside) / "pack")
    return rev(outside, "HEAD~1")  # the packed one


def pack_file_links(project: Path, outside: Path) -> str:
    for found in (objects_of(outside) / "pack").iterdir():
        (objects_of(project) / "pack" / found.name).symlink_to(found)
    return rev(outside, "HEAD~1")


def fan_out_links(project: Path, outside: Path) -> str:
    for loose in loose_paths(outside):
        target = objects_of(project) / loose.parent.name
        if not target.exists():
            target.symlink_to(loose.parent)
        elif not (target / loose.name).exists():
            (target / loose.name).symlink_to(loose)
    for found in (objects_of(outside) / "pack").iterdir():
        (objects_of(project) / "pack" / found.name).symlink_to(found)
    return rev(outside, "HEAD")


def loose_object_links(project: Path, outside: Path) -> str:
    for loose in loose_paths(outside):
        target = objects_of(project) / loose.parent.name
        target.mkdir(exist_ok=True)
        if not (target / loose.name).exists():
            (target / loose.name).symlink_to(loose)
    for found in (objects_of(outside) / "pack").iterdir():
        (objects_of(project) / "pack" / found.name).symlink_to(found)
    return rev(outside, "HEAD")


def git_dir_link(project: Path, outside: Path) -> str:
    (project / ".git").rename(project.parent / "moved.git")
    (project / ".git").symlink_to(outside / ".git")
    return "HEAD"


ATTACKS = {
    "alternates+ref-link": alternates,
    "alternates-relative+sha": alternates_relative,
    "alternates+abbreviated-sha": alternates_abbreviated_sha,
    "alternates+packed-refs": alternates_via_packed_refs,
    "objects-link": objects_link,
    "pack-folder-link": pack_folder_link,
    "pack-file-links": pack_file_links,
    "fan-out-links": fan_out_links,
    "loose-object-links": loose_object_links,
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_object_store_reaching_outside_is_refused_at_start_up(
    build: Builder, project: Path, outside: Path, attack: str
) -> None:
    ATTACKS[attack](project, outside)
    start_up_refused(build, outside)


@pytest.mark.parametrize("attack", sorted([*ATTACKS, "git-dir-link"]))
async def test_an_object_store_changed_after_start_up_is_refused_at_read_time(
    build: Builder, project: Path, outside: Path, attack: str
) -> None:
    server = build()
    ref = (ATTACKS | {"git-dir-link": git_dir_link})[attack](project, outside)
    async with Client(server.mcp) as client:
        assert_refused(await read_everything(client, ref), outside, "CONFLICT")


async def test_a_sha_from_outside_is_not_found_and_not_echoed(
    build: Builder, project: Path, outside: Path
) -> None:
    # No alternates at all: the outside's commits are simply not the repository's.
    server = build()
    async with Client(server.mcp) as client:
        for ref in (rev(outside, "HEAD"), rev(outside, "HEAD~1")[:12]):
            assert_refused(await read_everything(client, ref), outside, "NOT_FOUND")


def test_http_alternates_are_refused_at_start_up(
    build: Builder, project: Path, outside: Path
) -> None:
    info = objects_of(project) / "info"
    info.mkdir(exist_ok=True)
    (info / "http-alternates").write_text(f"file://{objects_of(outside)}\n")
    start_up_refused(build, outside)


def test_alternates_inside_the_allowed_roots_are_refused_too(
    build: Builder, project: Path, tmp_path: Path
) -> None:
    # Confining alternates would mean checking a second store (and its own alternates)
    # on every read; a repository that borrows objects is refused instead (README).
    neighbour = make_repo(tmp_path / "roots" / "neighbour", {"n.md": "n\n"})
    info = objects_of(project) / "info"
    info.mkdir(exist_ok=True)
    (info / "alternates").write_text(f"{objects_of(neighbour)}\n")
    with pytest.raises(ConfigError):
        build()


@pytest.mark.parametrize("where", ["refs-link", "ref-file-link", "packed-refs-link", "head-link"])
async def test_refs_that_are_links_are_refused(
    build: Builder, project: Path, outside: Path, where: str
) -> None:
    server = build()
    git_dir = project / ".git"
    if where == "refs-link":
        shutil.rmtree(git_dir / "refs")
        (git_dir / "refs").symlink_to(outside / ".git" / "refs")
        ref = "main"
    elif where == "ref-file-link":
        (git_dir / "refs" / "tags").mkdir(exist_ok=True)
        (git_dir / "refs" / "tags" / "t").symlink_to(outside / ".git" / "refs" / "heads" / "main")
        ref = "t"
    elif where == "packed-refs-link":
        git(outside, "pack-refs", "--all")
        (git_dir / "packed-refs").symlink_to(outside / ".git" / "packed-refs")
        ref = "main"
    else:
        os.unlink(git_dir / "HEAD")
        (git_dir / "HEAD").symlink_to(outside / ".git" / "HEAD")
        ref = "HEAD"
    async with Client(server.mcp) as client:
        assert_refused(await read_everything(client, ref), outside, "CONFLICT")
    with pytest.raises(ConfigError):
        build()


async def test_a_worktree_whose_commondir_is_rewritten_is_refused(
    build: Builder, project: Path, outside: Path, tmp_path: Path
) -> None:
    linked = tmp_path / "roots" / "linked"
    git(project, "worktree", "add", "-q", str(linked), "-b", "feature/wt")
    server = build(repository={"path": str(linked)})
    worktree_git_dir = project / ".git" / "worktrees" / "linked"
    pointer = (worktree_git_dir / "commondir").read_text()
    (worktree_git_dir / "commondir").write_text(f"{outside / '.git'}\n")
    async with Client(server.mcp) as client:
        assert_refused(await read_everything(client, "main"), outside, "CONFLICT")
        (worktree_git_dir / "commondir").write_text(pointer)  # put back: served again
        listed = ok(await call(client, "list_repo_files", {"repo": REPO, "ref": "feature/wt"}))
        assert "README.md" in {e["path"] for e in listed["entries"]}
    (worktree_git_dir / "commondir").write_text(f"{outside / '.git'}\n")
    # At start-up, a commondir pointing outside is refused.
    with pytest.raises(ConfigError):
        build(repository={"path": str(linked)})


async def test_a_clean_repository_still_reads_after_git_itself_repacks(
    build: Builder, project: Path
) -> None:
    # The checks refuse links and borrowed stores, not ordinary git housekeeping.
    server = build()
    commit(project, {"src/new.py": "def fresh():\n    pass\n"}, "more")
    git(project, "gc", "-q", "--aggressive")
    git(project, "pack-refs", "--all")
    async with Client(server.mcp) as client:
        read = ok(await call(client, "read_repo_file", {"repo": REPO, "path": "src/new.py"}))
        assert "fresh" in read["content"]
        found = ok(await call(client, "locate_component", {"repo": REPO, "name": "fresh"}))
        assert [m["path"] for m in found["matches"]] == ["src/new.py"]


async def test_a_commondir_planted_in_a_plain_git_dir_is_refused(
    build: Builder, project: Path, outside: Path
) -> None:
    # git's ref store reads ``commondir`` in any git directory, not only a worktree's,
    # and takes the refs from the folder it names (GIT_COMMON_DIR notwithstanding).
    server = build()
    pointer = project / ".git" / "commondir"
    pointer.write_text(f"{outside / '.git'}\n")
    async with Client(server.mcp) as client:
        assert_refused(await read_everything(client, "main"), outside, "CONFLICT")
        pointer.unlink()
        listed = ok(await call(client, "list_repo_files", {"repo": REPO, "ref": "main"}))
        assert "README.md" in {e["path"] for e in listed["entries"]}
    os.mkdir(pointer)  # whatever its kind
    start_up_refused(build, outside)
    os.rmdir(pointer)
    pointer.write_text(f"{outside / '.git'}\n")
    start_up_refused(build, outside)
