"""DocumentsMiddleware: the gateway's document checks (DESIGN.md chain step 7).

Before a write document op: extract content at the registry's write pointers, decode,
enforce item and batch limits, hash, compare expected hashes; refuse before the tool runs.

After a read document op, the result's documents must be checked and their hashes
attached to the tool effect. Seed 000 makes that the connector's duty (it is the PRIMARY
enforcement point and "MUST populate tool_effect.document_hashes"), and every
``@nexus_tool`` does it. So this layer checks the result itself only when the
connector's check did not run (a tool registered without ``@nexus_tool``, or the check
taken out), and attaches its own effect; otherwise it hashes nothing twice, but refuses
unless the connector classified the call from the same registry entry as the gateway and
attached an effect (a split brain is an internal error, never a guess).
"""

from __future__ import annotations

from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.calls import META_TOOL_EFFECT
from nexus_mcp.connector import chained_call
from nexus_mcp.enforcement import RegistryEnforcer
from nexus_mcp.errors import InternalError
from nexus_mcp.policy.classification import Classification


class DocumentsMiddleware(Middleware):
    def __init__(self, enforcer: RegistryEnforcer) -> None:
        self.enforcer = enforcer

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = chained_call(str(context.message.name))
        classification = self.enforcer.ensure_classified(state)
        state.document_check = self.enforcer.check_write(state, classification, state.arguments)
        result = await call_next(context)
        if self.enforcer.read_spec(classification) is None or result.structured_content is None:
            return result
        connector = state.connector_classification
        if isinstance(connector, Classification):
            # The connector checked this result (seed 000's primary point): agree or refuse.
            if (
                (result.meta or {}).get(META_TOOL_EFFECT) is None
                or connector.entry is not classification.entry
                or connector.tool_class != classification.tool_class
            ):
                raise InternalError(ref="document_split_brain")
            return result
        # No connector check ran: the gateway checks the result and the effect is its own.
        check = self.enforcer.check_read(classification, result.structured_content)
        state.document_check = check
        meta = dict(result.meta or {})
        meta[META_TOOL_EFFECT] = self.enforcer.effect(state, check)
        state.effect = meta[META_TOOL_EFFECT]
        result.meta = meta
        return result


__all__ = ["DocumentsMiddleware"]
