"""The embedded workspace: contained path resolution and atomic file operations.

Containment is decided on real paths with a separator-aware check: the reference
filesystem MCP server had CVEs for both symlink escapes and ``root-evil/`` prefix
confusion (a plain ``startswith`` on strings). Every write goes to a temporary file in the
target folder, is fsynced, then renamed over the target, so a failure never leaves a
half-written file.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from nexus_mcp.errors import ConflictError, DocSizeExceededError, InvalidPathError, NotFoundError

_DRIVE_RE = re.compile(r"^[A-Za-z]:")
MAX_PATH_LENGTH = 4096


class CommitGuard:
    """Decides, under one lock, whether a write commits or was cancelled first.

    File I/O runs in a worker thread, which ``asyncio`` cannot interrupt. When a call times
    out, the event loop side calls ``cancel()``; the worker checks ``may_commit()`` right
    before its final rename. Either the rename happens before the cancel (the call then
    reports a timeout whose outcome is unknown, and idempotency records it so) or it never
    happens: a timed-out write never lands later, and never half-lands.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self.committed = False

    def cancel(self) -> bool:
        """Forbid any later commit; True when a commit already happened."""
        with self._lock:
            self._cancelled = True
            return self.committed

    @contextlib.contextmanager
    def commit(self) -> Iterator[None]:
        with self._lock:
            if self._cancelled:
                raise WriteCancelledError()
            yield
            self.committed = True


class WriteCancelledError(Exception):
    """The call was cancelled (timed out) before the write committed; nothing changed."""


_guard: ContextVar[CommitGuard | None] = ContextVar("nexus_commit_guard", default=None)


@contextlib.contextmanager
def guarded(guard: CommitGuard) -> Iterator[None]:
    token = _guard.set(guard)
    try:
        yield
    finally:
        _guard.reset(token)


@contextlib.contextmanager
def _committing() -> Iterator[None]:
    guard = _guard.get()
    if guard is None:
        yield
        return
    with guard.commit():
        yield


@dataclass(frozen=True)
class ResolvedPath:
    """A path inside the workspace: its workspace-relative form and its absolute form."""

    relative: str
    absolute: Path


def normalize_relative(raw: str) -> str:
    """Validate a caller path and return its normalized workspace-relative form.

    Refuses absolute paths, drive letters, UNC paths, NUL bytes, ``..`` segments and
    backslashes (which are separators on Windows and so ambiguous). ``""`` and ``"."``
    mean the workspace root.
    """
    if not isinstance(raw, str) or len(raw) > MAX_PATH_LENGTH:
        raise InvalidPathError(reason="type_or_length")
    if "\x00" in raw:
        raise InvalidPathError(reason="nul_byte")
    if "\\" in raw:
        raise InvalidPathError(reason="backslash")
    text = raw.strip()
    if text.startswith("/") or text.startswith("//"):
        raise InvalidPathError(reason="absolute")
    if _DRIVE_RE.match(text):
        raise InvalidPathError(reason="drive")
    parts = [p for p in PurePosixPath(text).parts if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise InvalidPathError(reason="traversal")
    return "/".join(parts)


def is_within(root: Path, candidate: Path) -> bool:
    """Separator-aware containment: ``/srv/root-evil`` is not within ``/srv/root``."""
    try:
        candidate.relative_to(root)
    except ValueError:
        return False
    return True


class Workspace:
    """File operations confined to one root folder."""

    def __init__(self, root: Path, *, hidden: Iterable[Path] = ()) -> None:
        self.root = root.resolve(strict=True)
        if not self.root.is_dir():
            raise NotADirectoryError(str(root))
        # The server's own state (audit log, grants, idempotency records) when it sits
        # inside the workspace, e.g. `serve --workspace .` with the default data dir:
        # never reachable through the file tools, or a caller could read the audit trail,
        # delete it, or rewrite its own grants.
        self.hidden = tuple(
            path for path in (h.resolve() for h in hidden) if is_within(self.root, path)
        )

    def is_hidden(self, real: Path) -> bool:
        """True for server state (or anything inside a hidden folder)."""
        if not self.hidden:
            return False
        return any(is_within(hidden, real) for hidden in self.hidden)

    def holds_hidden(self, real: Path) -> bool:
        """True when removing or moving ``real`` would take server state with it."""
        return any(is_within(real, hidden) for hidden in self.hidden)

    # -- resolution ---------------------------------------------------------------------

    def resolve(self, raw: str, *, must_exist: bool = False) -> ResolvedPath:
        """Resolve a caller path to a contained absolute path (symlinks followed)."""
        relative = normalize_relative(raw)
        lexical = self.root / relative if relative else self.root
        # resolve(strict=False) follows every symlink that exists along the way, so a link
        # inside the workspace that points outside is caught here, before any I/O on it.
        real = lexical.resolve(strict=False)
        if not is_within(self.root, real):
            raise InvalidPathError(reason="escapes_root")
        if self.hidden and self.is_hidden(real):
            raise InvalidPathError(reason="server_state")
        if must_exist and not real.exists():
            raise NotFoundError()
        return ResolvedPath(relative=relative, absolute=real)

    def resolve_parent(self, raw: str) -> ResolvedPath:
        """Resolve a path whose final component may not exist yet (a write target)."""
        target = self.resolve(raw)
        if target.absolute == self.root:
            raise InvalidPathError(reason="root")
        return target

    def relative_of(self, absolute: Path) -> str:
        return absolute.relative_to(self.root).as_posix()

    # -- reads --------------------------------------------------------------------------

    def read_bytes(self, target: ResolvedPath, *, limit: int) -> bytes:
        """Read at most ``limit`` bytes; a larger file is refused, never truncated."""
        path = target.absolute
        if not path.exists():
            raise NotFoundError()
        if not path.is_file():
            raise ConflictError(reason="not_a_file")
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise DocSizeExceededError(limit_name="max_read_bytes", limit_bytes=limit)
        return data

    # -- writes -------------------------------------------------------------------------

    def write_atomic(self, target: ResolvedPath, data: bytes, *, overwrite: bool) -> bool:
        """Write ``data`` to ``target`` atomically; returns True when a file was replaced."""
        path = target.absolute
        if path.is_dir():
            raise ConflictError(reason="is_directory")
        existed = path.exists()
        if existed and not overwrite:
            raise ConflictError(reason="exists")
        parent = path.parent
        if not parent.is_dir():
            raise NotFoundError(reason="parent_missing")
        mode = stat.S_IMODE(path.stat().st_mode) if existed else None
        fd, tmp_name = tempfile.mkstemp(prefix=".nexus-", suffix=".tmp", dir=parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            if mode is not None:
                os.chmod(tmp_name, mode)
            with _committing():
                os.replace(tmp_name, path)
        except BaseException:
            # Cancellation (a timeout) included: never leave the temporary file behind.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            raise
        self._fsync_dir(parent)
        return existed

    def delete_file(self, target: ResolvedPath) -> None:
        path = target.absolute
        if not path.exists() and not path.is_symlink():
            raise NotFoundError()
        if path.is_dir():
            raise ConflictError(reason="is_directory")
        with _committing():
            path.unlink()
        self._fsync_dir(path.parent)

    def make_dir(self, target: ResolvedPath, *, parents: bool) -> bool:
        path = target.absolute
        if path.exists():
            if path.is_dir():
                return False
            raise ConflictError(reason="exists")
        if not parents and not path.parent.is_dir():
            raise NotFoundError(reason="parent_missing")
        with _committing():
            path.mkdir(parents=parents, exist_ok=False)
        return True

    def remove_dir(self, target: ResolvedPath, *, recursive: bool) -> int:
        """Remove a directory; recursive only when asked. Returns entries removed."""
        path = target.absolute
        if path == self.root:
            raise InvalidPathError(reason="root")
        if not path.exists():
            raise NotFoundError()
        if not path.is_dir() or path.is_symlink():
            raise ConflictError(reason="not_a_directory")
        if self.holds_hidden(path):
            raise InvalidPathError(reason="server_state")
        entries = sum(1 for _ in path.rglob("*"))
        if entries and not recursive:
            raise ConflictError(reason="not_empty")
        with _committing():
            if recursive:
                shutil.rmtree(path)
            else:
                path.rmdir()
        self._fsync_dir(path.parent)
        return entries + 1

    def rename(self, source: ResolvedPath, destination: ResolvedPath, *, overwrite: bool) -> None:
        src, dst = source.absolute, destination.absolute
        if not src.exists():
            raise NotFoundError()
        if src == self.root or dst == self.root:
            raise InvalidPathError(reason="root")
        if self.holds_hidden(src):
            raise InvalidPathError(reason="server_state")
        if src.is_dir() and is_within(src, dst):
            raise ConflictError(reason="into_itself")
        if dst.exists() and (not overwrite or dst.is_dir() or src.is_dir()):
            raise ConflictError(reason="exists")
        if not dst.parent.is_dir():
            raise NotFoundError(reason="parent_missing")
        with _committing():
            os.replace(src, dst)
        self._fsync_dir(dst.parent)

    @staticmethod
    def _fsync_dir(folder: Path) -> None:
        # Makes the rename itself durable; not every platform allows opening a directory.
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


__all__ = [
    "MAX_PATH_LENGTH",
    "CommitGuard",
    "ResolvedPath",
    "Workspace",
    "WriteCancelledError",
    "guarded",
    "is_within",
    "normalize_relative",
]
