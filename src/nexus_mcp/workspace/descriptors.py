"""Descriptor-level steps the workspace's operations share: a bounded read, making a
rename or an unlink durable, and emptying a folder moved to its trash name (links
removed, never followed; another mount never entered)."""

from __future__ import annotations

import contextlib
import os

from nexus_mcp.errors import DocSizeExceededError, NexusError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.workspace.confinement import DIR_FLAGS, read_bounded, walk_tree

log = get_logger(__name__)


def empty_and_remove(parent_fd: int, name: str) -> None:
    """Remove folder ``name`` of ``parent_fd`` and all it holds, on descriptors: links are
    removed, never followed; another mount is never entered (what cannot be removed stays
    under its trash name, and is logged)."""
    try:
        fd = os.open(name, DIR_FLAGS | os.O_NONBLOCK, dir_fd=parent_fd)
    except OSError:
        log.warning("trash_left", reason="open_failed")
        return
    try:
        for folder in walk_tree(
            fd, strict=True, on_leave=lambda parent, child: os.rmdir(child, dir_fd=parent)
        ):
            for entry in folder.others:
                os.unlink(entry, dir_fd=folder.fd)
    except (OSError, NexusError) as exc:
        log.warning("trash_left", reason=type(exc).__name__)
        return
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except OSError as exc:
        log.warning("trash_left", reason=type(exc).__name__)


def read_fd(fd: int, limit: int) -> bytes:
    data = read_bounded(fd, limit)
    if len(data) > limit:
        raise DocSizeExceededError(limit_name="max_read_bytes", limit_bytes=limit)
    return data


def fsync_fd(fd: int) -> None:
    # Makes a rename or unlink itself durable; not every platform allows it on a folder.
    with contextlib.suppress(OSError):
        os.fsync(fd)


__all__ = ["empty_and_remove", "fsync_fd", "read_fd"]
