"""Caller paths, by name: validation and normalization, separator-aware containment,
and the shapes the workspace hands back (``ResolvedPath``, ``TreeFile``).

Containment of the *names* is separator-aware: the reference filesystem MCP server had
CVEs for both symlink escapes and ``root-evil/`` prefix confusion (a plain
``startswith`` on strings). Nothing here touches the file system.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from nexus_mcp.errors import InvalidPathError
from nexus_mcp.workspace.confinement import REASON_NOT_UNICODE, is_unicode_text

_DRIVE_RE = re.compile(r"^[A-Za-z]:")
MAX_PATH_LENGTH = 4096


class PathAdmission(Protocol):
    """The write policy as the workspace asks it, on real paths at the moment of use
    (``policy.write_policy.PathGate``): whether a write may touch them."""

    def check_paths(self, operation: str, paths: Sequence[str]) -> None:
        """Raise ``WritePolicyDeniedError`` unless ``operation`` may touch every path
        (every entry of a folder removed or moved, too)."""
        ...


@dataclass(frozen=True)
class ResolvedPath:
    """A caller path: as named (normalized) and where it led when it was resolved.

    ``absolute`` is informational (a snapshot); every operation walks ``relative`` again
    on descriptors when it acts, so what it touches is decided then.
    """

    relative: str
    absolute: Path

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.relative.split("/")) if self.relative else ()


@dataclass(frozen=True)
class TreeFile:
    """A regular-file candidate found by ``Workspace.walk_files``; open it with ``open_file``."""

    relative: str  # below the workspace root
    below: str  # below the folder the walk started in
    dir_fd: int  # valid only until the walk moves on
    name: str


def normalize_relative(raw: str) -> str:
    """Validate a caller path and return its normalized workspace-relative form.

    Refuses absolute paths, drive letters, UNC paths, NUL bytes, lone surrogates, ``..``
    segments and backslashes (which are separators on Windows and so ambiguous). ``""`` and ``"."``
    mean the workspace root.
    """
    if not isinstance(raw, str) or len(raw) > MAX_PATH_LENGTH:
        raise InvalidPathError(reason="type_or_length")
    if "\x00" in raw:
        raise InvalidPathError(reason="nul_byte")
    if not is_unicode_text(raw):
        raise InvalidPathError(reason=REASON_NOT_UNICODE)
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


def is_below(parts: Sequence[str], folder: Sequence[str]) -> bool:
    """True when ``parts`` name ``folder`` or an entry below it (segment by segment)."""
    return len(parts) >= len(folder) and tuple(parts[: len(folder)]) == tuple(folder)


def target_paths(operation: str, arguments: dict[str, Any]) -> list[str]:
    """The workspace paths a write names, normalized (``INVALID_PATH`` when hostile).

    As the caller wrote them: for messages. Policy is decided on ``Workspace.touched_paths``.
    """
    keys = ("source", "destination") if operation == "rename" else ("path",)
    return [normalize_relative(arguments[k]) for k in keys if isinstance(arguments.get(k), str)]


__all__ = [
    "MAX_PATH_LENGTH",
    "PathAdmission",
    "ResolvedPath",
    "TreeFile",
    "is_below",
    "is_within",
    "normalize_relative",
    "target_paths",
]
