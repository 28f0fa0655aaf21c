"""ToolIndex: FastMCP finds a registered tool by its name instead of asking every provider.

For every ``tools/call``, FastMCP's ``get_tool`` asks each of the server's providers for
the name in an anyio task group (one task per provider), and its local provider then scans
every component it holds: about 75 µs of a 2 ms in-memory call on the project's
machine, against 9 µs for a lookup by key (benchmarks/README.md). This is FastMCP's own
extension point for lookups, a ``Transform`` whose ``get_tool`` answers or passes the
request on; nothing of FastMCP is patched.

It answers only what FastMCP would answer, and passes everything else on unchanged:

- only names the composition root registered (``add``), looked up under their key in the
  local provider as it is now, so a tool removed or replaced since is never answered
  from the index; any other name is first asked of the providers whose names are
  disjoint from the local one's (the upstream tools), each through its own lookup;
- only a plain lookup: no version constraint, no hashed app-tool lookup in progress, no
  provider beside the local one but providers whose names are disjoint from it, no
  transform on the local provider;
- a ``tools/list`` the namespace narrowed (``calls.current_listing``) keeps only the names
  the caller may see before FastMCP's per-tool checks run over them (its enabled check,
  component auth, app URI rewrite: about two thirds of listing 1,000 tools); the
  namespace still filters what comes back, so this only saves work, it never shows more;
- it is the server's innermost transform (added before any other), so transforms added
  later still see its answer, and FastMCP's ``get_tool`` still applies session
  transforms, the enabled check and component auth after it, as for any lookup.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.providers.base import hashed_lookup_target
from fastmcp.server.transforms import GetToolNext, Transform
from fastmcp.tools import Tool
from fastmcp.utilities.versions import VersionSpec

from nexus_mcp.calls import current_listing


class ToolIndex(Transform):
    """Name -> key of each tool the composition root registered on ``server``."""

    def __init__(self, server: FastMCP[Any]) -> None:
        if server.transforms:
            raise ValueError("ToolIndex must be the server's first transform")
        self._server = server
        self._local = server.local_provider
        self._keys: dict[str, str] = {}

    def add(self, tool: Tool) -> None:
        self._keys[tool.name] = tool.key

    def _plain_lookup(self) -> bool:
        server = self._server
        # Other providers may sit beside the local one only when they say their names
        # never collide with it (the upstream provider: server/build.py refuses a prefix that
        # could), so the local provider's answer is the answer.
        return (
            all(
                provider is self._local or getattr(provider, "disjoint_from_local", False)
                for provider in server.providers
            )
            and not self._local.transforms
            and hashed_lookup_target(server) is None
        )

    async def list_tools(self, tools: Sequence[Tool]) -> Sequence[Tool]:
        listing = current_listing()
        if listing is None or listing.task is not asyncio.current_task():
            return tools
        names = listing.names
        kept = [tool for tool in tools if tool.name in names]
        listing.dropped += len(tools) - len(kept)
        return kept

    async def get_tool(
        self, name: str, call_next: GetToolNext, *, version: VersionSpec | None = None
    ) -> Tool | None:
        if version is None and self._plain_lookup():
            key = self._keys.get(name)
            if key is not None:
                # The local provider's own storage, by key: what its scan would find.
                tool = self._local._get_component(key)
                if isinstance(tool, Tool) and tool.name == name:
                    return tool
            else:
                # Not a native name: ask the providers whose names are disjoint from the
                # local one's (upstream tools) directly, before any local scan.
                for provider in self._server.providers:
                    if provider is not self._local:
                        found = await provider.get_tool(name)
                        if found is not None:
                            return found
        return await call_next(name, version=version)


__all__ = ["ToolIndex"]
