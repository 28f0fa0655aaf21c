"""Throwaway folders for git's scratch indexes and objects, emptied and kept for reuse.

Measuring or committing a patch runs git with a private index (``GIT_INDEX_FILE``) and,
for a measurement, a private object folder. Making and removing folders is what such a
call spends outside git: every new object lands in a fan-out folder of its own
(``objects/ab/``), and on this project's ext4 machine each ``rmdir`` took about 2 ms
under load, a dozen per call. So a folder handed back is emptied of its files (the
index, lock files, loose objects) and kept, with its fan-out folders, for the next call:
one call at a time per folder, at most ``KEEP_IDLE`` idle. A folder holding anything
else, or that cannot be emptied, is removed instead; every kept one is removed on
``close``. Nothing of a call is left for the next one but empty folders of our own.

``read_loose_blobs`` reads back the new content a call's git wrote there (loose objects:
zlib of ``blob <size>\\0<content>``), each checked against its object id, instead of one
more ``cat-file`` process; an object not found there (content the repository already
had) is left to ``cat-file``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

KEEP_IDLE = 4
OBJECTS = "objects"


class ScratchFolders:
    """The scratch folders of one repository (module docstring)."""

    def __init__(self, *, keep_idle: int = KEEP_IDLE) -> None:
        self._idle: list[Path] = []
        self._keep_idle = keep_idle
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def folder(self) -> Iterator[Path]:
        """A private, empty folder holding an empty ``objects`` folder, for one call."""
        with self._lock:
            folder = self._idle.pop() if self._idle else None
        if folder is None:
            folder = Path(tempfile.mkdtemp(prefix="nexus-repo-"))
            (folder / OBJECTS).mkdir()
        try:
            yield folder
        finally:
            kept = False
            if _emptied(folder):
                with self._lock:
                    if len(self._idle) < self._keep_idle:
                        self._idle.append(folder)
                        kept = True
            if not kept:
                shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for folder in idle:
            shutil.rmtree(folder, ignore_errors=True)


def read_loose_blobs(objects: Path, ids: Iterable[str], max_bytes: int) -> dict[str, bytes] | None:
    """The blobs among ``ids`` found as loose objects in ``objects`` whose content hashes
    to their id (a 40-hex id: SHA-1, a 64-hex one: SHA-256); None when together they
    hold more than ``max_bytes``."""
    found: dict[str, bytes] = {}
    total = 0
    for object_id in ids:
        try:
            data = (objects / object_id[:2] / object_id[2:]).read_bytes()
            inflater = zlib.decompressobj()
            raw = inflater.decompress(data, max_bytes - total + 64)
        except (OSError, zlib.error):
            continue
        header, _, content = raw.partition(b"\0")
        kind, _, size = header.partition(b" ")
        if kind != b"blob" or not size.isdigit():
            continue
        if total + int(size) > max_bytes:
            return None
        digest = hashlib.sha1 if len(object_id) == 40 else hashlib.sha256
        if len(content) != int(size) or digest(raw).hexdigest() != object_id:
            continue
        found[object_id] = content
        total += len(content)
    return found


def _emptied(folder: Path) -> bool:
    """Remove every file of ``folder`` and of its objects' fan-out folders; False when it
    holds anything else (a link, another folder, a pack) or a removal fails."""
    try:
        for entry in _listed(folder):
            if entry.name == OBJECTS and entry.is_dir(follow_symlinks=False):
                if not _emptied_objects(Path(entry.path)):
                    return False
            elif entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
            else:
                return False
        return os.path.isdir(folder / OBJECTS)
    except OSError:
        return False


def _emptied_objects(objects: Path) -> bool:
    for fan_out in _listed(objects):
        if len(fan_out.name) != 2 or not fan_out.is_dir(follow_symlinks=False):
            return False
        for entry in _listed(Path(fan_out.path)):
            if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                return False
            os.unlink(entry.path)
    return True


def _listed(folder: Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as entries:
        return list(entries)


__all__ = ["KEEP_IDLE", "ScratchFolders", "read_loose_blobs"]
