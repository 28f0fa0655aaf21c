"""DocumentsMiddleware: the gateway's document checks (DESIGN.md chain step 7).

Before a write document op: extract content at the registry's write pointers, decode,
enforce item and batch limits, hash, compare expected hashes; refuse before the tool runs.
After a read document op: the same on the structured result, and the hashes must agree
with the tool effect the connector attached (or the gateway attaches its own when the
connector did not run, e.g. a tool registered without ``@nexus_tool``).
"""

from __future__ import annotations

from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.calls import META_TOOL_EFFECT, current_call
from nexus_mcp.enforcement import RegistryEnforcer
from nexus_mcp.errors import InternalError


class DocumentsMiddleware(Middleware):
    def __init__(self, enforcer: RegistryEnforcer) -> None:
        self.enforcer = enforcer

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = current_call()
        if state is None:  # pragma: no cover - the envelope always opens one
            return await call_next(context)
        classification = self.enforcer.ensure_classified(state)
        state.document_check = self.enforcer.check_write(state, classification, state.arguments)
        result = await call_next(context)
        if self.enforcer.read_spec(classification) is None or result.structured_content is None:
            return result
        check = self.enforcer.check_read(classification, result.structured_content)
        state.document_check = check
        meta = dict(result.meta or {})
        effect = meta.get(META_TOOL_EFFECT)
        hashes = [h.to_dict() for h in check.hashes]
        connector_checked = state.connector_classification is not None
        if effect is None or not connector_checked:
            # No connector check ran (a tool outside @nexus_tool, or the check removed):
            # the effect is the gateway's own.
            meta[META_TOOL_EFFECT] = self.enforcer.effect(state, check)
            state.effect = meta[META_TOOL_EFFECT]
            result.meta = meta
        elif effect.get("document_hashes") != hashes:
            # Connector and gateway disagree about the same bytes: refuse, never guess.
            raise InternalError(ref="document_split_brain")
        return result


__all__ = ["DocumentsMiddleware"]
