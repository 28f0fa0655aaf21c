"""Every object git reads for a served repository comes from that repository's own store.

Whoever can write a repository's ``.git`` can make git read another repository's objects:
an ``objects/info/alternates`` file (git follows it, and the alternates' own, recursively),
``objects`` or ``objects/pack`` or a loose-object folder or file that is a link, a ``refs``
folder, ref file, ``packed-refs`` or ``HEAD`` that is a link, a worktree's ``commondir``
rewritten, or the ``.git`` folder itself swapped for a link. git has no setting that turns
alternates off (``GIT_ALTERNATE_OBJECT_DIRECTORIES`` only adds stores;
``core.alternateRefsCommand`` is about advertised refs), so ``StoreGuard`` checks the files
themselves:

- the git directory and the common directory still resolve to the very folders checked at
  start-up (below ``repos.allowed_roots``): no component became a link. git is handed
  those resolved paths, the common one through ``GIT_COMMON_DIR`` (which git's objects
  follow); a worktree's ``commondir`` file, which git's ref store still reads on every
  run, must keep naming that common directory;
- ``objects/info/alternates`` and ``objects/info/http-alternates`` do not exist. Borrowed
  stores are refused rather than confined: confining them would mean checking every
  store of the chain (each may name more) on every read, and a repository made with
  ``clone --shared`` or ``--reference`` is made self-contained with ``git repack -a -d``
  and removing the file;
- a plain git directory (not a worktree's) has no ``commondir`` file: git's ref store
  would take its refs from the folder it names;
- nothing below ``objects/`` (folders, packs, indexes, loose objects, commit-graphs) and
  nothing below ``refs/`` (and ``reftable/``) is a link, nor ``packed-refs`` or any
  ``*HEAD`` file of the git directory, the common directory and its worktrees.

With that, any object git finds is in the repository's own files: a ``ref`` given as a
sha (whole or abbreviated) of another repository's commit names nothing and is
``NOT_FOUND``. Reachability from the repository's refs is not asked: an unreachable
object of the repository's own store is still the repository's, and the walk would cost
a ``rev-list`` per call.

The check runs at start-up (a repository failing it is not served) and before every git
command, and read tools check again after the command so that a change made while it ran
is refused too. What is left is a change made and undone within one git command, which
only pinning the files git opens could close. Hard links are not looked at: making one to
a file needs the right to read it, which is what the attacker lacks.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

_ALTERNATES = ("alternates", "http-alternates")
# A deep walk is a hostile one: git's own layout is at most objects/info/commit-graphs/x.
_MAX_DEPTH = 16
_SETTLED_NS = 2_000_000_000


class UnsafeStoreError(Exception):
    """The repository's object store or refs reach outside it. The message names the
    kind of problem for the operator's log, never a path."""


class StoreGuard:
    """The checks of the module docstring for one repository's git and common dirs."""

    def __init__(self, git_dir: Path, common_dir: Path) -> None:
        self.git_dir = Path(os.path.realpath(git_dir))
        self.common_dir = Path(os.path.realpath(common_dir))
        self._folders = _LinkFreeFolders()

    @property
    def objects_dir(self) -> Path:
        return self.common_dir / "objects"

    def check(self) -> None:
        """Raise ``UnsafeStoreError`` unless the store is the repository's own alone."""
        for place, expected in ((self.git_dir, self.git_dir), (self.common_dir, self.common_dir)):
            if os.path.realpath(place) != str(expected) or not _is_dir(place):
                raise UnsafeStoreError("git directory moved or became a link")
        if self.git_dir != self.common_dir:
            self._check_commondir()
        elif os.path.lexists(self.git_dir / "commondir"):
            # git's ref store reads a ``commondir`` file in any git directory, a plain
            # one too, and takes every ref but HEAD from the folder it names, whatever
            # ``GIT_COMMON_DIR`` says: reads would resolve another repository's refs and
            # writes would create branches in it.
            raise UnsafeStoreError("the git directory names another one's refs (commondir)")
        objects = self.objects_dir
        if not _is_dir(objects):
            raise UnsafeStoreError("objects is not a folder")
        for name in _ALTERNATES:
            if os.path.lexists(objects / "info" / name):
                raise UnsafeStoreError("the object store borrows another one (alternates)")
        self._folders.check(objects, "objects")
        bases = dict.fromkeys([self.git_dir, self.common_dir])
        worktrees = self.common_dir / "worktrees"
        if _is_dir(worktrees):
            for entry in _scan(worktrees, "worktrees"):
                if entry.is_symlink():
                    raise UnsafeStoreError("a worktree's git directory is a link")
                if entry.is_dir(follow_symlinks=False):
                    bases.setdefault(Path(entry.path))
        for base in bases:
            self._check_refs(base)

    def _check_commondir(self) -> None:
        """A worktree's ``commondir`` file still names the common directory: git's ref
        store reads that file itself, whatever ``GIT_COMMON_DIR`` says."""
        pointer = self.git_dir / "commondir"
        try:
            if not stat.S_ISREG(os.lstat(pointer).st_mode):
                raise UnsafeStoreError("a worktree's commondir is not a file")
            named = pointer.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise UnsafeStoreError("a worktree's commondir cannot be read") from None
        if os.path.realpath(self.git_dir / named) != str(self.common_dir):
            raise UnsafeStoreError("a worktree's commondir names another repository")

    def _check_refs(self, base: Path) -> None:
        for entry in _scan(base, "git directory"):
            name = entry.name
            is_ref_file = name.endswith("HEAD") or name == "packed-refs"
            if (is_ref_file or name in ("refs", "reftable", "objects")) and entry.is_symlink():
                raise UnsafeStoreError("a ref or ref folder is a link")
            if name in ("refs", "reftable") and entry.is_dir(follow_symlinks=False):
                self._folders.check(Path(entry.path), name)


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _scan(folder: Path, what: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:
        raise UnsafeStoreError(f"{what} cannot be read") from None


class _LinkFreeFolders:
    """Which folders were found free of links, keyed by their identity and change time.

    A folder whose entries change gets a new ctime (an entry added, removed or renamed
    over; ctime cannot be set back by a user), so a folder whose (device, inode, ctime,
    mtime) is unchanged since it was listed clean is not listed again: a check then costs
    one ``lstat`` per folder. File systems stamp times at a coarse tick, so a folder is
    remembered only once its last change is ``_SETTLED_NS`` old: a change in the same tick
    as the listing could otherwise keep the stamp it was listed with.
    """

    def __init__(self) -> None:
        self._clean: dict[str, tuple[tuple[int, int, int, int], list[str]]] = {}

    def check(self, folder: Path, what: str) -> None:
        """No entry below ``folder`` is a link (``DirEntry`` answers from the listing
        itself: one ``getdents`` per changed folder, not a stat per file)."""
        pending = [(str(folder), 0)]
        while pending:
            current, depth = pending.pop()
            if depth > _MAX_DEPTH:
                raise UnsafeStoreError(f"{what} is nested too deep")
            try:
                found = os.lstat(current)
            except OSError:
                raise UnsafeStoreError(f"{what} cannot be read") from None
            if not stat.S_ISDIR(found.st_mode):
                raise UnsafeStoreError(f"something below {what} is a link")
            key = (found.st_dev, found.st_ino, found.st_ctime_ns, found.st_mtime_ns)
            cached = self._clean.get(current)
            if cached is not None and cached[0] == key:
                folders = cached[1]
            else:
                folders = []
                for entry in _scan(Path(current), what):
                    if entry.is_symlink():
                        raise UnsafeStoreError(f"something below {what} is a link")
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                if time.time_ns() - found.st_ctime_ns > _SETTLED_NS:
                    self._clean[current] = (key, folders)
            pending.extend((child, depth + 1) for child in folders)


__all__ = ["StoreGuard", "UnsafeStoreError"]
