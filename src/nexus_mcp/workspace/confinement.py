"""Path resolution beneath one root folder, on opened directory descriptors.

``ConfinedRoot`` resolves a caller's relative path the way the kernel would (symbolic
links followed, ``..`` in link targets applied to the real folder reached so far) but
one component at a time, from a descriptor of the root, with every folder opened
``O_NOFOLLOW | O_DIRECTORY`` and checked to be the very object that ``lstat`` saw. It is
the userspace form of Linux's ``openat2(RESOLVE_BENEATH)``, which Python does not expose
and macOS does not have. What it hands back is the *real* path of the entry (no link
left in it), a descriptor of the entry's parent folder and the entry's name: the caller
decides policy on the real path and then acts through ``dir_fd=`` on that descriptor, so
no symbolic link swapped in later can redirect the operation outside the root.

A link whose target leaves the root (relative or absolute), a loop of links, a name
longer than the file system allows, a path whose absolute form would pass its
``PATH_MAX`` and a name with a lone surrogate are refused as ``INVALID_PATH``. When the
tree changes under a walk (a folder replaced by a link between ``lstat`` and ``open``),
the walk starts again, a bounded number of times, then answers ``CONFLICT``.

What no userspace check can close: a folder that another process *moves* out of the
root after it was opened. ``attached`` narrows that window to the instant between its
check and the operation; see ``files.py`` for the guarantee as a whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nexus_mcp.errors import ConflictError, InvalidPathError, NotFoundError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not hang the worker; O_NOFOLLOW: the final link, if
# any, was resolved by the walk, so a link found here now was swapped in since.
FILE_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_SYMLINKS = 40  # what Linux allows in one resolution (MAXSYMLINKS)
MAX_WALKS = 4  # one walk plus retries when the tree changes under it
# POSIX's (and Linux's) limits, for file systems that do not report their own.
DEFAULT_NAME_MAX = 255
DEFAULT_PATH_MAX = 4096

REASON_ESCAPES = "escapes_root"
REASON_LOOP = "symlink_loop"
REASON_NAME_TOO_LONG = "name_too_long"
REASON_PARENT_MISSING = "parent_missing"
REASON_PARENT_NOT_FOLDER = "parent_not_folder"  # a file where a folder of the path must be
PARENT_REASONS = frozenset({REASON_PARENT_MISSING, REASON_PARENT_NOT_FOLDER})
REASON_CHANGED = "path_changed"
REASON_PERMISSION = "permission_denied"
REASON_MOUNT = "mount_point"
REASON_NOT_UNICODE = "not_unicode"

SUPPORTED = (
    os.open in os.supports_dir_fd
    and os.stat in os.supports_dir_fd
    and os.readlink in os.supports_dir_fd
    and hasattr(os, "O_NOFOLLOW")
    and hasattr(os, "O_DIRECTORY")
)


# Where the kernel names open descriptors by their current path (Linux); elsewhere
# ``attached`` walks the path again.
_PROC_FD = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None


def is_unicode_text(text: str) -> bool:
    """True unless ``text`` holds a lone surrogate: JSON can carry one (``"\\ud800"``), but
    it is no character, so no UTF-8 file name, URL or JSON text of another client has it.
    The file system would reject it with ``UnicodeEncodeError``, or (``\\udc80``-``\\udcff``)
    take it as a raw byte and create a name no client can send back."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class PathChangedError(Exception):
    """The tree changed between a check and the use it guards; walk again."""


def identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


@dataclass
class Located:
    """An entry reached beneath the root.

    ``parts`` is its real path below the root (``()`` for the root itself), ``parent_fd``
    an open descriptor of the folder holding it (the root's own descriptor for the root),
    ``name`` its name there (``None`` for the root), ``info`` its ``lstat`` (``None`` when
    it does not exist yet). ``through_link`` says the caller's final name was a link that
    the walk followed, so the entry the caller named differs from the one located.
    """

    parts: tuple[str, ...]
    parent_fd: int
    name: str | None
    info: os.stat_result | None
    through_link: bool = False  # a link in the final position was followed to get here

    @property
    def relative(self) -> str:
        return "/".join(self.parts)

    @property
    def exists(self) -> bool:
        return self.info is not None

    @property
    def is_dir(self) -> bool:
        return self.info is not None and stat.S_ISDIR(self.info.st_mode)

    @property
    def is_file(self) -> bool:
        return self.info is not None and stat.S_ISREG(self.info.st_mode)

    @property
    def is_link(self) -> bool:
        return self.info is not None and stat.S_ISLNK(self.info.st_mode)


class ConfinedRoot:
    """A folder whose descendants are resolved and opened without leaving it."""

    def __init__(self, root: Path) -> None:
        if not SUPPORTED:  # pragma: no cover - every POSIX CPython has these
            raise OSError(errno.ENOSYS, "directory-descriptor file operations are unavailable")
        self.path = root.resolve(strict=True)
        info = os.stat(self.path)
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder")
        self._identity = identity(info)
        self._prefix = str(self.path).rstrip(os.sep) + os.sep
        self._root_bytes = len(os.fsencode(str(self.path)))
        self._name_max = _limit(self.path, "PC_NAME_MAX", DEFAULT_NAME_MAX)
        self._path_max = _limit(self.path, "PC_PATH_MAX", DEFAULT_PATH_MAX)

    # -- resolution ----------------------------------------------------------------------

    @contextlib.contextmanager
    def locate(self, parts: Sequence[str], *, follow_final: bool = True) -> Iterator[Located]:
        """The entry at ``parts`` (normalized, no ``..``), its parent held open meanwhile.

        The parent of the entry must exist (``NOT_FOUND``); the entry itself may not.
        With ``follow_final`` a final link is resolved too; without it the link itself is
        the entry (what ``unlink`` and ``rename`` act on).
        """
        for _ in range(MAX_WALKS):
            try:
                located = self._walk(parts, follow_final=follow_final, partial=False)
            except PathChangedError:
                continue
            break
        else:
            raise ConflictError(reason=REASON_CHANGED)
        assert located is not None
        try:
            yield located
        finally:
            os.close(located.parent_fd)

    def real_parts(self, parts: Sequence[str], *, follow_final: bool = True) -> tuple[str, ...]:
        """The real path ``parts`` leads to, as far as it exists, then lexically.

        For policy decisions before an operation: a missing folder on the way is taken
        as its name (it would be created there), never as an error.
        """
        for _ in range(MAX_WALKS):
            try:
                located = self._walk(parts, follow_final=follow_final, partial=True)
            except PathChangedError:
                continue
            os.close(located.parent_fd)
            return located.parts
        raise ConflictError(reason=REASON_CHANGED)

    def attached(self, located: Located) -> bool:
        """Whether ``located``'s parent folder is still at its real path below the root.

        A folder moved elsewhere after the walk keeps its descriptor; checked right
        before an operation commits, this narrows what a concurrent move can redirect.
        """
        if _PROC_FD is not None:
            # Linux names an open folder by where it is now: one readlink, no walk. A
            # path past PATH_MAX cannot be named so (ENAMETOOLONG): walk it instead.
            expected = os.path.join(str(self.path), *located.parts[:-1])
            try:
                return os.readlink(f"{_PROC_FD}/{located.parent_fd}") == expected
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:
                    return False
        try:
            current = identity(os.fstat(located.parent_fd))
            fd = self._open_root()
        except OSError:
            return False
        try:
            for name in located.parts[:-1]:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            return identity(os.fstat(fd)) == current
        except OSError:
            return False
        finally:
            os.close(fd)

    def open_prefix(self, parts: Sequence[str]) -> tuple[int, int]:
        """Open the longest existing prefix of the real path ``parts`` (a folder created
        on the way must go there): its descriptor (the caller closes it) and its length.
        Every folder is opened ``O_NOFOLLOW``; a link found on the way means the tree
        changed since ``parts`` was resolved, a file means something is in the way."""
        fd = self._open_root()
        count = 0
        try:
            for name in parts:
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    break
                except NotADirectoryError:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISLNK(info.st_mode):
                        raise PathChangedError() from None
                    raise ConflictError(reason="exists") from None
                except OSError as exc:
                    raise _os_refusal(exc) from None
                os.close(fd)
                fd = child
                count += 1
        except BaseException:
            os.close(fd)
            raise
        return fd, count

    @staticmethod
    def enter(fd: int, name: str) -> int:
        """Open folder ``name`` of ``fd`` ``O_NOFOLLOW`` and close ``fd`` (kept on error)."""
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise _os_refusal(exc) from None
        os.close(fd)
        return child

    @staticmethod
    def open_entry(located: Located, flags: int) -> int:
        """Open a located entry (not the root) on its parent's descriptor, only if it is
        still the object the walk saw; ``PathChangedError`` otherwise."""
        assert located.name is not None and located.info is not None
        try:
            fd = os.open(located.name, flags, dir_fd=located.parent_fd)
        except OSError:
            raise PathChangedError() from None
        if identity(os.fstat(fd)) != identity(located.info):
            os.close(fd)
            raise PathChangedError()
        return fd

    def inside(self, absolute: str) -> tuple[str, ...] | None:
        """The parts below the root of an absolute link target, or None when outside.

        Only the root's own real path counts: a target spelled through a link outside the
        root would let that outside link decide where a workspace link leads.
        """
        if absolute == str(self.path):
            return ()
        if absolute.startswith(self._prefix):
            return tuple(absolute[len(self._prefix) :].split("/"))
        return None

    # -- the walk -------------------------------------------------------------------------

    def _check_names(self, parts: Sequence[str]) -> None:
        """Refuse, before any system call, what no file of this root can be named: a lone
        surrogate, a name longer than the file system's ``NAME_MAX`` or a path whose
        absolute form would pass its ``PATH_MAX``, so nothing is created that ordinary
        tools could not open by its path."""
        total = self._root_bytes
        for part in parts:
            if not is_unicode_text(part):
                raise InvalidPathError(reason=REASON_NOT_UNICODE)
            size = len(os.fsencode(part))
            if size > self._name_max:
                raise InvalidPathError(reason=REASON_NAME_TOO_LONG)
            total += size + 1
        if total >= self._path_max:  # PATH_MAX counts the terminating NUL
            raise InvalidPathError(reason=REASON_NAME_TOO_LONG)

    def _open_root(self) -> int:
        try:
            fd = os.open(self.path, DIR_FLAGS)
        except OSError:
            raise ConflictError(reason="root_changed") from None
        if identity(os.fstat(fd)) != self._identity:
            os.close(fd)
            raise ConflictError(reason="root_changed")
        return fd

    def _walk(self, parts: Sequence[str], *, follow_final: bool, partial: bool) -> Located:
        # ``pending`` is a stack (next component last); ``real`` the real folders walked so
        # far and ``ids`` their identities; ``fd`` the one descriptor held (of ``real``).
        self._check_names(parts)
        pending = _components(parts)
        real: list[str] = []
        ids: list[tuple[int, int]] = []
        fd = self._open_root()
        links = 0
        through_link = False
        try:
            while pending:
                name = pending.pop()
                if name == "..":
                    fd = self._ascend(fd, real, ids)
                    continue
                last = not pending
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        return Located((*real, name), fd, name, None, through_link)
                    if partial:
                        return _lexical_rest(fd, real, name, pending)
                    raise NotFoundError(reason=REASON_PARENT_MISSING) from None
                except OSError as exc:
                    raise _os_refusal(exc) from None
                if stat.S_ISLNK(info.st_mode) and (follow_final or not last):
                    links += 1
                    through_link = through_link or last
                    if links > MAX_SYMLINKS:
                        raise InvalidPathError(reason=REASON_LOOP)
                    try:
                        target = os.readlink(name, dir_fd=fd)
                    except OSError as exc:
                        if exc.errno == errno.EINVAL:  # no longer a link: swapped since lstat
                            raise PathChangedError() from None
                        raise _os_refusal(exc) from None
                    if target.startswith("/"):
                        inner = self.inside(target)
                        if inner is None:
                            raise InvalidPathError(reason=REASON_ESCAPES)
                        os.close(fd)
                        fd = -1
                        fd = self._open_root()
                        real.clear()
                        ids.clear()
                        pending.extend(_components(inner))
                    else:
                        pending.extend(_components(target.split("/")))
                    continue
                if last:
                    return Located((*real, name), fd, name, info, through_link)
                if not stat.S_ISDIR(info.st_mode):
                    if partial:
                        return _lexical_rest(fd, real, name, pending)
                    raise NotFoundError(reason=REASON_PARENT_NOT_FOLDER)
                fd = self._descend(fd, name, info)
                real.append(name)
                ids.append(identity(info))
            if not real:
                return Located((), fd, None, os.fstat(fd), through_link)
            # The walk ended inside a folder (a link target ending in ``..``): hand back
            # that folder as an entry of its parent, like any other entry.
            name = real[-1]
            fd = self._ascend(fd, real, ids)
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                raise PathChangedError() from None
            return Located((*real, name), fd, name, info, through_link)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise

    def _descend(self, fd: int, name: str, info: os.stat_result) -> int:
        """Open folder ``name`` of ``fd`` (closing ``fd``), only if it is what lstat saw."""
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise _os_refusal(exc) from None
        if identity(os.fstat(child)) != identity(info):
            os.close(child)
            raise PathChangedError()
        os.close(fd)
        return child

    def _ascend(self, fd: int, real: list[str], ids: list[tuple[int, int]]) -> int:
        """Go up one real folder (closing ``fd``): never above the root, and only back to
        the folder the walk came through."""
        if not real:
            raise InvalidPathError(reason=REASON_ESCAPES)
        try:
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise _os_refusal(exc) from None
        expected = ids[-2] if len(ids) > 1 else self._identity
        if identity(os.fstat(parent)) != expected:
            os.close(parent)
            raise PathChangedError()
        os.close(fd)
        real.pop()
        ids.pop()
        return parent


def _limit(path: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(path, name)
    except (OSError, ValueError):
        return default
    return value if value > 0 else default


@dataclass
class Folder:
    """One folder of a ``walk_tree``: its parts below the walk's start, its descriptor
    (valid until the walk moves on), its real sub-folders (prune the list to skip some)
    and every other entry (files, links, FIFOs, ...), each sorted."""

    parts: tuple[str, ...]
    fd: int
    dirs: list[str]
    others: list[str]


def walk_tree(
    fd: int,
    *,
    strict: bool,
    stop: Callable[[], bool] | None = None,
    on_leave: Callable[[int, str], None] | None = None,
) -> Iterator[Folder]:
    """Every folder below the open folder ``fd``, top-down, without recursion.

    Sub-folders are opened ``O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK`` on their parent's
    descriptor and must be the object ``lstat`` listed, so a link (or a FIFO swapped in
    for a folder) is never entered nor even opened; the walk goes back up through
    ``..``, checked to be the folder it came from, so it holds one descriptor at a time
    and has no depth limit but the file system's. ``on_leave(parent_fd, name)`` runs
    once a sub-folder is done (a removal uses it to remove the emptied folder).

    Not ``strict`` (listings, searches): an unreadable or changed folder is skipped.
    ``strict`` (removing or moving a folder, where every entry must be judged): any
    such folder, or a mount point, refuses the whole operation (``CONFLICT``).
    ``stop`` is asked before each folder; True ends the walk.
    """
    current = os.dup(fd)
    mount = _mount_id(current) if strict else None
    # Each level: (its parts, its identity, the sub-folders still to visit, reversed).
    stack: list[tuple[tuple[str, ...], tuple[int, int], list[str]]] = []
    try:
        folder = _list_folder(current, (), strict=strict)
        if folder is None:
            return
        yield folder
        stack.append(((), identity(os.fstat(current)), sorted(folder.dirs, reverse=True)))
        while stack:
            parts, _ident, pending = stack[-1]
            if not pending:
                stack.pop()
                if not stack:
                    return
                parent_fd = _up(current, stack[-1][1])
                if parent_fd is None:
                    if strict:
                        raise ConflictError(reason=REASON_CHANGED)
                    return
                current = parent_fd
                if on_leave is not None:
                    on_leave(current, parts[-1])
                continue
            name = pending.pop()
            if stop is not None and stop():
                return
            child = _down(current, name, strict=strict, mount=mount)
            if child is None:
                continue
            child_fd, child_ident = child
            child_parts = (*parts, name)
            sub = _list_folder(child_fd, child_parts, strict=strict)
            if sub is None:
                os.close(child_fd)
                continue
            os.close(current)
            current = child_fd
            yield sub
            stack.append((child_parts, child_ident, sorted(sub.dirs, reverse=True)))
    finally:
        os.close(current)


def _list_folder(fd: int, parts: tuple[str, ...], *, strict: bool) -> Folder | None:
    dirs: list[str] = []
    others: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                (dirs if is_dir else others).append(entry.name)
    except OSError as exc:
        if strict:
            raise _os_refusal(exc) from None
        return None
    dirs.sort()
    others.sort()
    return Folder(parts, fd, dirs, others)


def _down(
    fd: int, name: str, *, strict: bool, mount: int | None
) -> tuple[int, tuple[int, int]] | None:
    """Open sub-folder ``name`` of ``fd`` (never a link, never anything but a folder)."""
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            raise PathChangedError()
        child = os.open(name, DIR_FLAGS | os.O_NONBLOCK, dir_fd=fd)
    except (OSError, PathChangedError) as exc:
        if strict:
            refusal = _os_refusal(exc) if isinstance(exc, OSError) else exc
            raise (
                ConflictError(reason=REASON_CHANGED)
                if isinstance(refusal, PathChangedError)
                else refusal
            ) from None
        return None
    child_ident = identity(os.fstat(child))
    changed = child_ident != identity(info)
    crosses = strict and mount is not None and _mount_id(child) != mount
    if changed or crosses:
        os.close(child)
        if strict:
            raise ConflictError(reason=REASON_MOUNT if crosses else REASON_CHANGED)
        return None
    return child, child_ident


def _up(fd: int, expected: tuple[int, int]) -> int | None:
    """Back to the parent folder, only if it is still the one the walk came through."""
    try:
        parent = os.open("..", DIR_FLAGS, dir_fd=fd)
    except OSError:
        return None
    if identity(os.fstat(parent)) != expected:
        os.close(parent)
        return None
    os.close(fd)
    return parent


def _mount_id(fd: int) -> int | None:
    """The mount a descriptor lies on (Linux ``fdinfo``), to refuse crossing into another
    one where a removal or a move must stay on the workspace's own mount."""
    if _PROC_FD is None:
        return None
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
            for line in info:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def read_bounded(fd: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes from ``fd``: one byte more than allowed tells the caller
    the file is over its limit without reading the rest of it."""
    chunks: list[bytes] = []
    remaining = limit + 1
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _components(parts: Sequence[str]) -> list[str]:
    """``parts`` as a stack (next component last), without empty and ``.`` components."""
    return [p for p in reversed(parts) if p not in ("", ".")]


def _lexical_rest(fd: int, real: list[str], name: str, pending: list[str]) -> Located:
    """For ``real_parts``: from a missing folder on, the rest of the path as written."""
    rest = list(reversed(pending))
    if ".." in rest:
        raise NotFoundError(reason=REASON_PARENT_MISSING)
    parts = (*real, name, *rest)
    return Located(parts, fd, parts[-1], None)


def _os_refusal(exc: OSError) -> Exception:
    """A typed refusal for what a caller's path can meet; anything else stays internal.

    ``ELOOP`` and ``ENOTDIR`` from an ``O_NOFOLLOW | O_DIRECTORY`` open mean a folder
    became a link (or a file) since ``lstat``: the tree changed, so walk again.
    """
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidPathError(reason=REASON_NAME_TOO_LONG)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
        return PathChangedError()
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ConflictError(reason=REASON_PERMISSION)
    return exc


__all__ = [
    "DIR_FLAGS",
    "FILE_READ_FLAGS",
    "MAX_SYMLINKS",
    "PARENT_REASONS",
    "REASON_PARENT_MISSING",
    "REASON_PARENT_NOT_FOLDER",
    "ConfinedRoot",
    "Folder",
    "Located",
    "PathChangedError",
    "identity",
    "is_unicode_text",
    "read_bounded",
    "walk_tree",
]
