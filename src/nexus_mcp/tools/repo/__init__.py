"""The ``repo`` toolset: seed 003's git operations, each declared with ``@nexus_tool``.

Reads (``list_repo_files``, ``read_repo_file``, ``search_content``, ``locate_component``
and ``propose_patch``, a dry run) look at git objects at a commit, never at the working
tree (``repos/repository.py``). Writes (``create_branch``, ``apply_patch``,
``open_pull_request``, ``merge_guarded``) need an idempotency key, pass the repository's
write policy and, where it asks, an approval (``repos/writes.py`` decides them in the
chain's approval layer; each tool checks again and acts on exactly what was decided).
Every write names what it changed in its tool effect's ``target_ref``: the branch it
created, the commit it made, the head it proposed or the merge commit.

The repository is named by its configured name (``repo``), never by a path. git runs in
worker threads, so the event loop and the chain's timeouts stay live.

``models.py`` holds the toolset's name, argument types and result models; ``read.py`` the
reads of files; ``write.py`` the patch review and the writes; ``scan.py`` the git worker
and the bounded scans the reads share.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nexus_mcp.repos.catalog import RepoCatalog
from nexus_mcp.repos.writes import RepoWrites
from nexus_mcp.settings import Settings
from nexus_mcp.tools.repo.models import TOOLSET
from nexus_mcp.tools.repo.read import build_read_tools
from nexus_mcp.tools.repo.write import build_write_tools


def build_repo_tools(
    catalog: RepoCatalog, writes: RepoWrites, settings: Settings
) -> list[Callable[..., Awaitable[Any]]]:
    """The repo toolset over the configured repositories, reads first, in the order they
    are listed."""
    return [*build_read_tools(catalog, settings), *build_write_tools(catalog, writes)]


__all__ = ["TOOLSET", "build_repo_tools"]
