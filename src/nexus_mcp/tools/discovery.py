"""The ``discovery`` toolset: search, list servers, details and load, post-filtered per caller.

Every answer passes through the caller's visible set (seed 004 phase 4): a hidden tool is
answered exactly as a missing one, a server with no visible tool is not named, and search
keeps going down the ranking until it has ``top_k`` visible results. Loaded-tool state
is per MCP session and per subject, never shared.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from cachetools import TTLCache
from pydantic import BaseModel, Field

from nexus_mcp.book import CatalogEntry, ToolCatalog, tokenize
from nexus_mcp.calls import current_call, current_principal
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import NotFoundError
from nexus_mcp.principal import Principal

TOOLSET = "discovery"
MAX_TOP_K = 50
MAX_LOAD_NAMES = 64
SESSION_STATE_TTL_SECONDS = 3600.0

VisibleTools = Callable[[Principal], frozenset[str]]


class ToolMatch(BaseModel):
    name: str
    server_id: str
    description: str
    score: float


class SearchToolsResult(BaseModel):
    query_terms: int
    results: list[ToolMatch]


class ServerInfo(BaseModel):
    server_id: str
    tool_count: int
    toolsets: list[str]


class ListServersResult(BaseModel):
    servers: list[ServerInfo]


class ToolDetails(BaseModel):
    name: str
    server_id: str
    toolset: str
    description: str
    risk: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]


class LoadToolsResult(BaseModel):
    loaded: list[str] = Field(description="Every tool loaded in this session so far.")
    tools: list[ToolDetails] = Field(description="Details of the tools loaded by this call.")
    not_found: int = Field(description="How many requested names are not available.")


def _details(entry: CatalogEntry) -> ToolDetails:
    return ToolDetails(
        name=entry.name,
        server_id=entry.server_id,
        toolset=entry.toolset,
        description=entry.description,
        risk=entry.risk,
        input_schema=entry.input_schema,
        annotations=entry.annotations,
    )


class LoadedTools:
    """Per-(subject, session) loaded tool names, bounded and expiring."""

    def __init__(self) -> None:
        self._state: TTLCache[tuple[str, str], frozenset[str]] = TTLCache(
            maxsize=10_000, ttl=SESSION_STATE_TTL_SECONDS
        )
        self._lock = threading.Lock()

    def add(self, key: tuple[str, str], names: list[str]) -> frozenset[str]:
        with self._lock:
            merged = self._state.get(key, frozenset()) | frozenset(names)
            self._state[key] = merged
            return merged


def build_discovery_tools(
    catalog: ToolCatalog, visible_tools: VisibleTools
) -> list[Callable[..., Awaitable[Any]]]:
    loaded = LoadedTools()

    def visible() -> frozenset[str]:
        principal = current_principal()
        return visible_tools(principal) if principal is not None else frozenset()

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("top_k",))
    async def nexus_discovery_search_tools(
        query: Annotated[
            str, Field(min_length=1, max_length=512, description="What you need to do.")
        ],
        top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = 5,
    ) -> SearchToolsResult:
        """Search the tools available to you by name and description, best match first."""
        allowed = visible()
        results: list[ToolMatch] = []
        # Walk the whole ranking (over-fetch) so hidden tools never cost the caller results.
        for score, entry in catalog.rank(query):
            if entry.name not in allowed:
                continue
            results.append(
                ToolMatch(
                    name=entry.name,
                    server_id=entry.server_id,
                    description=entry.description,
                    score=round(score, 4),
                )
            )
            if len(results) >= top_k:
                break
        return SearchToolsResult(query_terms=len(tokenize(query)), results=results)

    @nexus_tool(risk="read", toolset=TOOLSET)
    async def nexus_discovery_list_servers() -> ListServersResult:
        """List the servers that offer you at least one tool."""
        allowed = visible()
        grouped: dict[str, set[str]] = {}
        counts: dict[str, int] = {}
        for entry in catalog.entries():
            if entry.name in allowed:
                grouped.setdefault(entry.server_id, set()).add(entry.toolset)
                counts[entry.server_id] = counts.get(entry.server_id, 0) + 1
        return ListServersResult(
            servers=[
                ServerInfo(server_id=sid, tool_count=counts[sid], toolsets=sorted(grouped[sid]))
                for sid in sorted(grouped)
            ]
        )

    @nexus_tool(risk="read", toolset=TOOLSET, loggable_args=("name",))
    async def nexus_discovery_get_tool_details(
        name: Annotated[str, Field(min_length=1, max_length=128)],
    ) -> ToolDetails:
        """Describe one tool available to you: description, input schema and annotations."""
        entry = catalog.get(name)
        if entry is None or name not in visible():
            raise NotFoundError("tool not found")  # the same answer for hidden and missing
        return _details(entry)

    @nexus_tool(risk="read", toolset=TOOLSET)
    async def nexus_discovery_load_tools(
        names: Annotated[
            list[Annotated[str, Field(max_length=128)]],
            Field(min_length=1, max_length=MAX_LOAD_NAMES),
        ],
    ) -> LoadToolsResult:
        """Load tools into this session and get their schemas; unavailable names are counted."""
        allowed = visible()
        found = [n for n in dict.fromkeys(names) if n in allowed and catalog.get(n) is not None]
        state = current_call()
        principal = current_principal()
        key = (
            principal.subject if principal is not None else "",
            state.session_key if state is not None and state.session_key else "",
        )
        session_loaded = loaded.add(key, found)
        return LoadToolsResult(
            loaded=sorted(session_loaded & allowed),
            tools=[_details(e) for n in found if (e := catalog.get(n)) is not None],
            not_found=len(dict.fromkeys(names)) - len(found),
        )

    return [
        nexus_discovery_search_tools,
        nexus_discovery_list_servers,
        nexus_discovery_get_tool_details,
        nexus_discovery_load_tools,
    ]


__all__ = ["TOOLSET", "build_discovery_tools"]
