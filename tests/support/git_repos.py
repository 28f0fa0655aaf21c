"""Real git repositories for tests: made with the git program, inspected with it too.

Nothing here goes through nexus-mcp's own git runner: the tests look at what a repository
really holds (refs, commits, trees, the working tree, the index) with plain git, so a
bug in the runner cannot hide itself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

GIT = shutil.which("git") or "git"
IDENTITY = ("-c", "user.name=Test Author", "-c", "user.email=author@example.com")
_HOME = tempfile.mkdtemp(prefix="nexus-tests-git-home-")
ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": _HOME,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "LC_ALL": "C",
    "GIT_TERMINAL_PROMPT": "0",
}

Files = Mapping[str, str | bytes | None]  # None: remove the file


def git(repo: Path, *args: str, stdin: bytes | None = None, check: bool = True) -> str:
    result = subprocess.run(
        [GIT, *IDENTITY, "-C", str(repo), *args],
        input=stdin,
        capture_output=True,
        env=ENV,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"git {args[0]} failed: {result.stderr.decode(errors='replace')}")
    return result.stdout.decode("utf-8", "replace")


def write_files(root: Path, files: Files) -> None:
    for name, content in files.items():
        path = root / name
        if content is None:
            if path.is_symlink() or path.is_file():
                path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def make_repo(path: Path, files: Files, *, branch: str = "main") -> Path:
    """A repository at ``path`` with one commit of ``files`` on ``branch``."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", branch)
    commit(path, files, "initial")
    return path


def commit(repo: Path, files: Files, message: str) -> str:
    write_files(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return rev(repo, "HEAD")


def rev(repo: Path, ref: str) -> str:
    return git(repo, "rev-parse", "--verify", ref).strip()


def refs(repo: Path) -> dict[str, str]:
    """Every ref and what it points at."""
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    return dict(line.split(" ", 1) for line in out.splitlines())  # type: ignore[misc]


def tree_files(repo: Path, ref: str) -> dict[str, str]:
    """path -> blob id of every file at ``ref``."""
    out = git(repo, "ls-tree", "-r", "-z", ref)
    entries = {}
    for record in out.split("\0"):
        if record:
            meta, path = record.split("\t", 1)
            entries[path] = meta.split()[2]
    return entries


def state(repo: Path) -> dict[str, object]:
    """Everything a write must leave alone when refused: refs, HEAD, index, working tree,
    the object store's loose objects and packs, and the config."""
    git_dir = repo / ".git" if (repo / ".git").is_dir() else repo
    worktree: dict[str, str] = {}
    if git_dir != repo:
        for dirpath, dirnames, filenames in os.walk(repo):
            dirnames[:] = [d for d in dirnames if d != ".git"]
            for name in filenames:
                full = Path(dirpath) / name
                data = os.readlink(full).encode() if full.is_symlink() else full.read_bytes()
                worktree[full.relative_to(repo).as_posix()] = hashlib.sha256(data).hexdigest()
    objects = sorted(
        p.relative_to(git_dir).as_posix() for p in (git_dir / "objects").rglob("*") if p.is_file()
    )
    index = git_dir / "index"
    return {
        "refs": refs(repo),
        "head": git(repo, "symbolic-ref", "-q", "HEAD", check=False).strip(),
        "index": hashlib.sha256(index.read_bytes()).hexdigest() if index.exists() else None,
        "worktree": worktree,
        "objects": objects,
        "config": (git_dir / "config").read_text(),
    }


def make_patch(repo: Path, base: str, files: Files, *, scratch: Path, binary: bool = False) -> str:
    """The ``git diff`` that turns ``base`` into ``base`` plus ``files``, made in a clone."""
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:8]
    clone = scratch / f"clone-{digest}"
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.run(
        [GIT, "clone", "-q", "--no-checkout", str(repo), str(clone)], env=ENV, check=True
    )
    git(clone, "checkout", "-q", "--detach", rev(repo, base))
    write_files(clone, files)
    git(clone, "add", "-A")
    extra = ["--binary"] if binary else []
    patch = git(clone, "diff", "--cached", "--no-ext-diff", "--no-color", *extra, "HEAD")
    shutil.rmtree(clone)
    return patch


Entry = tuple[str, str | bytes] | None  # (mode, content or a gitlink's commit id); None: remove


def plumb_commit(
    repo: Path,
    parents: Sequence[str],
    files: Mapping[str, Entry],
    *,
    base: str | None = None,
    message: str = "plumbed",
) -> str:
    """A commit made with plumbing, touching no working tree, index or ref: the tree of
    ``base`` (default: the first parent; no parent: the empty tree) with ``files`` set or
    removed, on ``parents`` (none: a root commit; two: a merge, with any tree at all).
    Modes are git's: ``100644``, ``100755``, ``120000`` (a link: the content is its target),
    ``160000`` (a submodule: the content is the commit id it points at)."""
    with tempfile.TemporaryDirectory(prefix="nexus-tests-index-") as scratch:
        env = {**ENV, "GIT_INDEX_FILE": str(Path(scratch) / "index")}

        def run(*args: str, stdin: bytes | None = None) -> str:
            result = subprocess.run(
                [GIT, *IDENTITY, "-C", str(repo), *args],
                input=stdin,
                capture_output=True,
                env=env,
                check=False,
            )
            if result.returncode != 0:
                raise AssertionError(f"git {args[0]} failed: {result.stderr.decode()}")
            return result.stdout.decode().strip()

        start = base if base is not None else (parents[0] if parents else None)
        run("read-tree", start) if start is not None else run("read-tree", "--empty")
        for path, entry in files.items():
            if entry is None:
                run("update-index", "--force-remove", "--", path)
                continue
            mode, content = entry
            if mode == "160000":
                sha = str(content)
            else:
                data = content.encode() if isinstance(content, str) else content
                sha = run("hash-object", "-w", "--stdin", stdin=data)
            run("update-index", "--add", "--cacheinfo", f"{mode},{sha},{path}")
        tree = run("write-tree")
        parent_args = [arg for parent in parents for arg in ("-p", parent)]
        return run("commit-tree", tree, *parent_args, "-m", message)


def init_bare(path: Path) -> Path:
    subprocess.run([GIT, "init", "-q", "--bare", str(path)], env=ENV, check=True)
    return path


__all__ = [
    "GIT",
    "commit",
    "git",
    "init_bare",
    "make_patch",
    "make_repo",
    "plumb_commit",
    "refs",
    "rev",
    "state",
    "tree_files",
    "write_files",
]
