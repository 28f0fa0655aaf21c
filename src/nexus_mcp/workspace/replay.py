"""The workspace where no folder is served (``serve --replay``): paths judged by name
(``LexicalPaths``) and the stand-in a replayed tool body runs against
(``ReplayWorkspace``), which stops the body when it reaches the files (``ReachedTheWorld``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nexus_mcp.errors import InvalidPathError
from nexus_mcp.workspace.paths import ResolvedPath, is_below, normalize_relative


class LexicalPaths:
    """The write policy's view of paths where no folder is served (``serve --replay``).

    A replay touches no file, so a write's paths are judged as named, normalized (hostile
    names are still ``INVALID_PATH``): nothing is resolved, no link is followed and no
    folder is walked, because there is nothing to resolve them in. ``hidden`` are the
    server's own state paths (relative parts) inside the configured workspace, refused
    by name as a live ``Workspace`` refuses them (``server_state``), so a write into the
    recording folder is ``INVALID_PATH`` in a replay as it is live.
    """

    def __init__(self, hidden: Iterable[Sequence[str]] = ()) -> None:
        self.hidden_parts = tuple(tuple(parts) for parts in hidden if parts)

    def is_hidden_parts(self, parts: Sequence[str]) -> bool:
        return any(is_below(parts, hidden) for hidden in self.hidden_parts)

    def touched_paths(self, targets: Sequence[str]) -> list[str]:
        touched: list[str] = []
        for raw in targets:
            path = normalize_relative(raw)
            if path and self.is_hidden_parts(path.split("/")):
                raise InvalidPathError(reason="server_state")
            if path not in touched:
                touched.append(path)
        return touched

    def named(self, raw: str) -> str:
        return normalize_relative(raw)

    def check_subtree(self, operation: str, target: Any, moved_to: str | None = None) -> None:
        """Nothing to walk: the folder's entries are not known without the folder."""


class ReachedTheWorld(BaseException):
    """A replayed tool's own body reached what a replay never touches (a file, a vault, a
    repository): every check it makes from its arguments alone has passed by then.

    A ``BaseException`` so that no ``except Exception`` in a tool body turns it into an
    answer."""


class ReplayWorkspace:
    """The workspace a replayed native tool's body runs against (``serve --replay``), to
    make the refusals the tool makes from its arguments before it touches any file, with
    the tool's own code: ``named`` validates a path as ``Workspace.named`` does; any other
    use is the body reaching the files, where a live ``Workspace`` would refuse hidden
    server state (``server_state``), and otherwise ``ReachedTheWorld``."""

    ROOT = Path("/nonexistent-replay-workspace")

    def __init__(self, paths: LexicalPaths) -> None:
        self._paths = paths

    def named(self, raw: str) -> ResolvedPath:
        relative = normalize_relative(raw)
        return ResolvedPath(relative=relative, absolute=self.ROOT / relative)

    def __getattr__(self, name: str) -> Any:
        paths = self._paths

        def reached(*args: Any, **kwargs: Any) -> Any:
            for value in (*args, *kwargs.values()):
                relative = value.relative if isinstance(value, ResolvedPath) else None
                if relative and paths.is_hidden_parts(relative.split("/")):
                    raise InvalidPathError(reason="server_state")
            raise ReachedTheWorld(name)

        return reached


__all__ = ["LexicalPaths", "ReachedTheWorld", "ReplayWorkspace"]
