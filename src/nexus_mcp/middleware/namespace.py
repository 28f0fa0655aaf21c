"""ToolNamespaceMiddleware: every caller sees and calls exactly the tools granted to it.

``tools/list`` is filtered to the caller's visible set; a ``tools/call`` of a tool that is
not visible gets FastMCP's own unknown-tool answer (``Unknown tool: '<name>'``), byte for
byte, so a hidden tool cannot be told from a missing one. The audit records the real
reason (for an upstream tool hidden from everyone: which one, and why). No principal
means nothing is visible (fail closed), and so does a failed grant lookup (which is
never cached).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.calls import current_call, current_principal
from nexus_mcp.envelope import unknown_tool
from nexus_mcp.errors import UnavailableError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.principal import Principal

log = get_logger(__name__)


class Namespace(Protocol):
    """Answers which tool names a principal may see. Raises when the lookup fails."""

    def visible_tools(self, principal: Principal) -> frozenset[str]: ...

    def record_filtered(self, count: int) -> None: ...

    def record_rejected(self) -> None: ...

    def record_error(self) -> None: ...


class WarmUp(Protocol):
    """Tools that may still be arriving right after start-up (upstream servers)."""

    def warming(self) -> bool: ...

    async def warm_up(self) -> None: ...


# (server_id, upstream tool, reason code) of a name an upstream tool is hidden under.
HiddenLookup = Callable[[str], "tuple[str, str, str] | None"]


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

    def _visible(self, principal: Principal | None, *, calling: bool = False) -> frozenset[str]:
        if principal is None:
            return frozenset()
        try:
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
        tools: Sequence[Any] = await call_next(context)
        visible = self._visible(current_principal())
        kept = [tool for tool in tools if tool.name in visible]
        self.namespace.record_filtered(len(tools) - len(kept))
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


__all__ = ["Namespace", "ToolNamespaceMiddleware"]
