"""FastMCP's ``Provider`` extension point for every upstream's exposed tools.

The server's middleware chain runs for them exactly as for native tools; the tools
themselves are ``tools.py``'s, the servers that decide them ``server.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable

from fastmcp.prompts import Prompt
from fastmcp.resources import Resource, ResourceTemplate
from fastmcp.server.providers import Provider
from fastmcp.tools import Tool
from fastmcp.utilities.versions import VersionSpec

from nexus_mcp.policy.catalog import MAX_URI_CHARS, backend_uri
from nexus_mcp.providers.upstream.catalog import UpstreamCatalog
from nexus_mcp.providers.upstream.server import UpstreamServer

# How long the first tools/list after start-up may wait for upstreams still connecting
# (never for one known to be down): a desktop client lists once, right after starting.
# Each upstream is waited for at most its own connect timeout, and never longer than this.
FIRST_LIST_WAIT_SECONDS = 10.0
WARM_UP_WINDOW_SECONDS = 60.0


class UpstreamProvider(Provider):
    """FastMCP's ``Provider`` for every upstream's exposed tools (one enforcement path:
    the server's middleware chain runs for these tools exactly as for native ones)."""

    # Its names never collide with the local provider's (``server.py`` refuses a prefix
    # that could), so the ToolIndex may answer native lookups without asking it.
    disjoint_from_local = True

    def __init__(self, servers: Iterable[UpstreamServer]) -> None:
        super().__init__()
        self.servers = list(servers)
        self._started = time.monotonic()
        self._warm = False

    async def start(self) -> None:
        for server in self.servers:
            await server.start()

    async def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                await server.close()

    def warming(self) -> bool:
        """True while some upstream is on its first connection, within the start-up window
        (or this event loop has not started the upstreams yet), or while an upstream's
        lock file changed unread (a re-pinned tool is arriving: one stat per upstream)."""
        return self._starting() or any(server.pins_stale() for server in self.servers)

    def _starting(self) -> bool:
        if self._warm:
            return False
        loop = asyncio.get_running_loop()
        if any(server._loop is not loop for server in self.servers):
            return True
        if time.monotonic() - self._started > WARM_UP_WINDOW_SECONDS or all(
            server.first_attempt_done for server in self.servers
        ):
            self._warm = True
            return False
        return True

    async def warm_up(self) -> None:
        """Right after start-up, let upstreams still on their first connection finish it,
        together, each for at most its connect timeout (``FIRST_LIST_WAIT_SECONDS`` at
        most): a client lists (or calls) once, right after it starts the server. A server
        known to be down is never waited for; after the window nothing waits here.
        A rewritten lock file is read first (a tool re-pinned by an operator is decided
        again before the lookup that follows)."""
        for server in self.servers:
            if server._loop is asyncio.get_running_loop():
                await server.refresh_pins()
        if not self._starting():
            return
        await asyncio.gather(*(s.wait_first_attempt(FIRST_LIST_WAIT_SECONDS) for s in self.servers))

    async def _list_tools(self) -> list[Tool]:
        await self.warm_up()
        tools: list[Tool] = []
        for server in self.servers:
            server._bind_loop()
            tools.extend(server.visible_tools().values())
        return tools

    async def _get_tool(self, name: str, version: VersionSpec | None = None) -> Tool | None:
        for server in self.servers:
            server._bind_loop()
            tool = server.visible_tools().get(name)
            if tool is not None:
                return tool
        return None

    # Prompts, resources and resource templates (``catalog.py``): the same warm-up, the
    # same one enforcement path.

    async def _catalogs(self) -> list[UpstreamCatalog]:
        await self.warm_up()
        for server in self.servers:
            server._bind_loop()
        return [server.catalog for server in self.servers]

    async def _list_prompts(self) -> list[Prompt]:
        return [p for c in await self._catalogs() for p in c.visible_prompts().values()]

    async def _get_prompt(self, name: str, version: VersionSpec | None = None) -> Prompt | None:
        for catalog in await self._catalogs():
            found = catalog.visible_prompts().get(name)
            if found is not None:
                return found
        return None

    async def _list_resources(self) -> list[Resource]:
        return [r for c in await self._catalogs() for r in c.visible_resources().values()]

    async def _get_resource(self, uri: str, version: VersionSpec | None = None) -> Resource | None:
        for catalog in await self._catalogs():
            found = catalog.visible_resources().get(uri)
            if found is not None:
                return found
        return None

    async def _get_resource_template(
        self, uri: str, version: VersionSpec | None = None
    ) -> ResourceTemplate | None:
        """The template that reads ``uri``: only one of the upstream the URI names (its
        prefix), only within ``MAX_URI_CHARS`` (a template's regular expression never
        sees a crafted megabyte), and never for a URI the upstream's catalog keeps from
        its templates (``template_may_read``): hidden exactly like a missing one."""
        for catalog in await self._catalogs():
            backend = backend_uri(catalog.server_id, uri)
            if backend is None:
                continue
            if len(backend) > MAX_URI_CHARS:
                return None
            for template in catalog.visible_templates().values():
                if template.matches(uri) is not None:
                    key = template._view.key
                    return template if catalog.template_may_read(backend, key) else None
            return None
        return None

    async def _list_resource_templates(self) -> list[ResourceTemplate]:
        return [t for c in await self._catalogs() for t in c.visible_templates().values()]


__all__ = ["FIRST_LIST_WAIT_SECONDS", "UpstreamProvider"]
