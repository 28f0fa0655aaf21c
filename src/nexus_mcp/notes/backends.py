"""Where notes come from: the ``NoteBackend`` role and the embedded local vault.

A backend reads exactly one note per call and never writes. It raises only
``UpstreamError``: ``status(404)`` for a missing note, ``invalid_path()`` for a path that
escapes the vault, ``runtime_failure()`` for anything else. Errors never carry the path,
the content or an OS error text.

``NoteFileReader`` is the narrower role of the note resources (``nexus://notes/{path*}``):
the note file's bytes through the same walk and refusals, under the caller's read limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from nexus_mcp.errors import (
    ConflictError,
    DocSizeExceededError,
    InvalidPathError,
    NotFoundError,
    UpstreamError,
)
from nexus_mcp.notes.frontmatter import parse_note_frontmatter
from nexus_mcp.notes.paths import PATH_SEPARATOR, check_normalized_path
from nexus_mcp.notes.source import NoteSource
from nexus_mcp.principal import Principal
from nexus_mcp.workspace.confinement import (
    MAX_WALKS,
    ConfinedRoot,
    PathChangedError,
    identity,
    read_bounded,
)

NOT_FOUND_STATUS = 404
# A body at the 1,000,000-unit cap is at most 3 MB of UTF-8; the rest is headroom for
# frontmatter and trailing whitespace. Larger files are refused without being read.
DEFAULT_MAX_NOTE_FILE_BYTES = 8 * 1024 * 1024
# The limit a note resource's refusal names (the setting is limits.max_read_bytes).
MAX_READ_LIMIT_NAME = "max_read_bytes"

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)  # the walk resolved links; a swapped-in one fails
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block the open
    | getattr(os, "O_CLOEXEC", 0)
)


@runtime_checkable
class NoteBackend(Protocol):
    """Reads one note of the caller's vault. ``path`` is already normalized."""

    async def read_note(self, path: str, caller: Principal) -> NoteSource: ...


@runtime_checkable
class NoteFileReader(Protocol):
    """Reads one note file of the caller's vault as bytes. ``path`` is already normalized.

    Refuses as ``NoteBackend`` does; a file over ``max_bytes`` is ``DocSizeExceededError``
    (``max_read_bytes``), found without reading past the limit.
    """

    async def read_note_bytes(self, path: str, caller: Principal, *, max_bytes: int) -> bytes: ...


class _TooLarge(Exception):
    """The note file is over the byte limit of this read (each caller words the refusal)."""


class LocalVaultBackend:
    """A folder on disk is the vault; containment is checked on real paths.

    The request path is joined under the root, must exist, and its real path (symlinks
    resolved) must be the root or inside it by a separator-aware prefix check, so a
    symlink out of the vault or a sibling folder such as ``root-evil`` is refused.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_file_bytes: int = DEFAULT_MAX_NOTE_FILE_BYTES,
        hidden: Iterable[Path] = (),
    ) -> None:
        self._root = Path(root)
        self._max_file_bytes = max_file_bytes
        # Server state inside this folder (its audit log, grants): never a note.
        self._root_real = root_real = os.path.realpath(self._root)
        self._hidden = tuple(
            real
            for real in (os.path.realpath(path) for path in hidden)
            if is_path_inside(root_real, real)
        )

    async def read_note(self, path: str, caller: Principal) -> NoteSource:
        safe_path = check_normalized_path(path)
        try:
            data = await asyncio.to_thread(self._read_bytes, safe_path, self._max_file_bytes)
        except _TooLarge:
            raise _failure("note_file_too_large") from None
        # Node reads notes as UTF-8 with replacement characters and keeps a BOM.
        content = data.decode("utf-8", errors="replace")
        frontmatter, body = parse_note_frontmatter(content)
        return NoteSource(body=body, frontmatter=frontmatter)

    async def read_note_bytes(self, path: str, caller: Principal, *, max_bytes: int) -> bytes:
        """The note file's bytes as stored (no decoding), for a note resource."""
        safe_path = check_normalized_path(path)
        try:
            return await asyncio.to_thread(self._read_bytes, safe_path, max_bytes)
        except _TooLarge:
            raise DocSizeExceededError(
                limit_name=MAX_READ_LIMIT_NAME, limit_bytes=max_bytes
            ) from None

    def _read_bytes(self, safe_path: str, limit: int) -> bytes:
        # Resolved and opened beneath the vault on directory descriptors (the same
        # walk as the workspace's): a link swapped in after the check cannot redirect
        # the read outside the vault.
        try:
            vault = ConfinedRoot(self._root)
        except OSError:
            raise _failure("vault_root_unavailable") from None
        parts = safe_path.split(PATH_SEPARATOR)
        for _ in range(MAX_WALKS):
            try:
                return self._read_confined(vault, parts, limit)
            except PathChangedError:
                continue
        raise _failure("path_changed")

    def _read_confined(self, vault: ConfinedRoot, parts: list[str], limit: int) -> bytes:
        try:
            with vault.locate(parts) as located:
                real = os.path.join(str(vault.path), *located.parts)
                if any(is_path_inside(hidden, real) for hidden in self._hidden):
                    raise UpstreamError.invalid_path()
                if located.info is None or located.name is None:
                    raise UpstreamError.status(NOT_FOUND_STATUS)
                fd = vault.open_entry(located, _OPEN_FLAGS)
                try:
                    if not vault.attached(located):
                        raise _failure("path_changed")
                    return _read_regular_file(fd, limit, self._is_hidden_inode)
                finally:
                    os.close(fd)
        except NotFoundError:
            # A missing folder on the way: inside hidden state it is refused like the rest
            # of it, so a 404 never tells which of its folders exist.
            lexical = os.path.join(self._root_real, *parts)
            if any(is_path_inside(hidden, lexical) for hidden in self._hidden):
                raise UpstreamError.invalid_path() from None
            raise UpstreamError.status(NOT_FOUND_STATUS) from None
        except (InvalidPathError, ConflictError):
            raise UpstreamError.invalid_path() from None

    def _is_hidden_inode(self, info: os.stat_result) -> bool:
        """A file with other names may be server state under another name (a hard link
        someone made in the vault): compared with the hidden files, only then (as the
        file tools do, ``workspace/files.py``)."""
        if info.st_nlink < 2 or not self._hidden:
            return False
        found: set[tuple[int, int]] = set()
        for path in self._hidden:
            with contextlib.suppress(OSError):
                hidden = os.stat(path, follow_symlinks=False)
                found.add(identity(hidden))
                if stat.S_ISDIR(hidden.st_mode):
                    with os.scandir(path) as entries:
                        for entry in entries:
                            with contextlib.suppress(OSError):
                                found.add(identity(entry.stat(follow_symlinks=False)))
        return identity(info) in found


def _read_regular_file(fd: int, limit: int, is_hidden: Callable[[os.stat_result], bool]) -> bytes:
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UpstreamError.status(NOT_FOUND_STATUS)
        if is_hidden(info):
            raise UpstreamError.invalid_path()
        if info.st_size > limit:
            raise _TooLarge
        data = read_bounded(fd, limit)
    except OSError:
        raise _failure("read_failed") from None
    if len(data) > limit:
        raise _TooLarge
    return data


def is_path_inside(root: str, candidate: str) -> bool:
    """True when ``candidate`` is ``root`` or below it (both absolute real paths)."""
    if candidate == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return candidate.startswith(prefix)


def _failure(reason: str) -> UpstreamError:
    error = UpstreamError.runtime_failure()
    error.facts["reason"] = reason
    return error
