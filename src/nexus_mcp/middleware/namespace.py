"""ToolNamespaceMiddleware: every caller sees and calls exactly the tools granted to it.

``tools/list`` is filtered to the caller's visible set; a ``tools/call`` of a tool that is
not visible gets FastMCP's own unknown-tool answer (``Unknown tool: '<name>'``), byte for
byte, so a hidden tool cannot be told from a missing one. The audit records the real
reason (for an upstream tool hidden from everyone: which one, and why). No principal
means nothing is visible (fail closed), and so does a failed grant lookup (which is
never cached).

Resources and prompts go through the same grants: ``resources/list`` and
``resources/templates/list`` keep what the caller's granted sources expose
(``policy/resources.resource_source``), ``prompts/list`` its granted prompts. A
``resources/read`` or ``prompts/get`` of one the caller is not granted raises FastMCP's own
not-found error, exactly as for one that does not exist, and the envelope answers both with
one fixed error that quotes nothing (``middleware/envelope.py``). While the shared grants
store is down, a read or get is refused ``UNAVAILABLE`` and a listing is empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fastmcp.exceptions import NotFoundError as FastMCPNotFoundError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.calls import ListingFilter, bind_listing, current_call, current_principal
from nexus_mcp.envelope import unknown_tool
from nexus_mcp.errors import UnavailableError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.resources import resource_source
from nexus_mcp.principal import Principal

log = get_logger(__name__)


class Namespace(Protocol):
    """Answers which tool names a principal may see. Raises when the lookup fails."""

    def visible_tools(self, principal: Principal) -> frozenset[str]: ...

    def visible_resource_sources(self, principal: Principal) -> frozenset[str]: ...

    def visible_prompts(self, principal: Principal) -> frozenset[str]: ...

    def record_filtered(self, count: int) -> None: ...

    def record_rejected(self) -> None: ...

    def record_error(self) -> None: ...


class WarmUp(Protocol):
    """Tools that may still be arriving right after start-up (upstream servers)."""

    def warming(self) -> bool: ...

    async def warm_up(self) -> None: ...


# (server_id, upstream tool, reason code) of a name an upstream tool is hidden under.
HiddenLookup = Callable[[str], "tuple[str, str, str] | None"]
Lookup = Callable[[Principal], frozenset[str]]
# What a refused read or get raises: FastMCP's own not-found error, as for a missing one.
HIDDEN_RESOURCE = "Unknown resource"
HIDDEN_PROMPT = "Unknown prompt"


class ToolNamespaceMiddleware(Middleware):
    def __init__(
        self,
        namespace: Namespace,
        warm_up: WarmUp | None = None,
        hidden: HiddenLookup | None = None,
    ) -> None:
        self.namespace = namespace
        self.warm_up = warm_up
        self.hidden = hidden

    async def _settle(self) -> None:
        # Right after start-up only: the set of tools that exist may still be growing.
        warm_up = self.warm_up
        if warm_up is not None and warm_up.warming():
            await warm_up.warm_up()

    def _visible(
        self,
        principal: Principal | None,
        *,
        calling: bool = False,
        lookup: Lookup | None = None,
    ) -> frozenset[str]:
        if principal is None:
            return frozenset()
        try:
            if lookup is not None:
                return lookup(principal)
            return self.namespace.visible_tools(principal)
        except UnavailableError:
            # The shared grants store did not answer: a call is refused with its typed
            # code (UNAVAILABLE: retry later), not as an unknown tool; a listing shows
            # nothing. Fail closed either way.
            self.namespace.record_error()
            log.warning("namespace_lookup_unavailable", subject=principal.log_subject)
            if calling:
                raise
            return frozenset()
        except Exception:  # noqa: BLE001 - fail closed: a failed lookup shows nothing
            self.namespace.record_error()
            log.warning("namespace_lookup_failed", subject=principal.log_subject)
            return frozenset()

    async def on_list_tools(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        await self._settle()
        principal = current_principal()
        listing = ListingFilter(self._visible(principal), asyncio.current_task())
        # FastMCP lists only these names (ToolIndex.list_tools): its per-tool work then
        # runs over the caller's few tools, not over every registered one.
        with bind_listing(listing):
            tools: Sequence[Any] = await call_next(context)
        visible = self._visible(principal)
        if not visible <= listing.names:
            # What the caller may see grew while listing (an upstream's tools arrived):
            # list again in full rather than miss them.
            listing.dropped = 0
            tools = await call_next(context)
        kept = [tool for tool in tools if tool.name in visible]
        self.namespace.record_filtered(listing.dropped + len(tools) - len(kept))
        return kept

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        name = str(context.message.name)
        await self._settle()
        if name not in self._visible(current_principal(), calling=True):
            state = current_call()
            if state is not None:
                ctx = context.fastmcp_context
                exists = ctx is not None and await ctx.fastmcp.get_tool(name) is not None
                state.block_reason = "not_granted" if exists else "unknown_tool"
                found = self.hidden(name) if self.hidden is not None and not exists else None
                if found is not None:
                    state.mark_hidden(*found)
            self.namespace.record_rejected()
            raise unknown_tool(name)
        return await call_next(context)

    # --- resources and prompts (issue 27) -----------------------------------------------

    async def on_list_resources(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        await self._settle()
        resources: Sequence[Any] = await call_next(context)
        sources = self._sources()
        return [r for r in resources if resource_source(str(r.uri)) in sources]

    async def on_list_resource_templates(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        await self._settle()
        templates: Sequence[Any] = await call_next(context)
        sources = self._sources()
        return [t for t in templates if resource_source(str(t.uri_template)) in sources]

    async def on_list_prompts(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        await self._settle()
        prompts: Sequence[Any] = await call_next(context)
        visible = self._visible(current_principal(), lookup=self.namespace.visible_prompts)
        return [p for p in prompts if p.name in visible]

    async def on_read_resource(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        uri = str(context.message.uri)
        await self._settle()
        source = resource_source(uri)
        state = current_call()
        if state is not None:
            state.resource_source = source
        if source is None or source not in self._sources(calling=True):
            if state is not None:
                state.block_reason = "unknown_resource" if source is None else "not_granted"
            self.namespace.record_rejected()
            raise FastMCPNotFoundError(HIDDEN_RESOURCE)
        if state is not None:
            state.executed = True  # past the grants: a failure now is the read's own
        return await call_next(context)

    async def on_get_prompt(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        name = str(context.message.name)
        await self._settle()
        visible = self._visible(
            current_principal(), calling=True, lookup=self.namespace.visible_prompts
        )
        if name not in visible:
            state = current_call()
            if state is not None:
                ctx = context.fastmcp_context
                exists = ctx is not None and await ctx.fastmcp.get_prompt(name) is not None
                state.block_reason = "not_granted" if exists else "unknown_prompt"
                if exists:
                    state.prompt = name  # a real prompt's name: no longer only caller input
            self.namespace.record_rejected()
            raise FastMCPNotFoundError(HIDDEN_PROMPT)
        state = current_call()
        if state is not None:
            state.prompt = name
            state.executed = True  # past the grants: a failure now is the render's own
        return await call_next(context)

    def _sources(self, *, calling: bool = False) -> frozenset[str]:
        return self._visible(
            current_principal(), calling=calling, lookup=self.namespace.visible_resource_sources
        )


__all__ = ["Namespace", "ToolNamespaceMiddleware"]
