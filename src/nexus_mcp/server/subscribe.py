"""``resources/subscribe`` and ``resources/unsubscribe``, relayed per caller (issue 27).

FastMCP 4.1.2 registers no handler for either method; the MCP SDK's server takes one
(``add_request_handler``) and then announces ``resources.subscribe: true`` on the
handshake era. The SDK dispatches these methods outside FastMCP's component chain, but the
chain's request hooks still run around them (FastMCP's "outer" pass: envelope, identity),
so the caller's principal is bound here as for any request.

A subscription is taken only for a resource the caller may read: its source granted
(``GrantedTools.visible_resource_sources``, as ``resources/read``) and exposed now by its
upstream; anything else (hidden, unknown, a native resource) answers exactly as an
unknown resource does on ``resources/read``. Every refusal, and every subscription, is
audited by source and URI digest, never the URI. The 2026-07-28 era cannot dispatch the
method at all: there a ``subscriptions/listen`` stream's ``resourceSubscriptions`` are
taken through the same ``Subscriptions.take`` (``server/listen.py``).
"""

from __future__ import annotations

from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import (
    METHOD_NOT_FOUND,
    EmptyResult,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
)

from nexus_mcp.calls import current_principal
from nexus_mcp.envelope import not_found_error, to_request_error
from nexus_mcp.errors import NexusError
from nexus_mcp.identity.access import GrantedTools
from nexus_mcp.observability.audit import AuditLog, caller_event
from nexus_mcp.policy.resources import resource_source, uri_sha256
from nexus_mcp.principal import Principal
from nexus_mcp.providers.upstream.subscriptions import NotExposed, NotSupported, SubscriptionRelay
from nexus_mcp.server.notify import connection_of

RESOURCE_SUBSCRIBED = "resource_subscribed"
RESOURCE_SUBSCRIBE_BLOCKED = "resource_subscribe_blocked"
SUBSCRIBE = "(subscribe)"
NOT_SUPPORTED_MESSAGE = "Resource subscriptions are not supported for this resource"


class _Request:
    """What a handler is handed: the FastMCP-like context ``connection_of`` reads."""

    def __init__(self, ctx: Any) -> None:
        self.request_context = ctx


class Subscriptions:
    """Takes and drops a caller's resource subscriptions: the checks, the relay, the audit
    (one path for ``resources/subscribe`` and a ``subscriptions/listen`` stream's
    ``resourceSubscriptions``)."""

    def __init__(self, relay: SubscriptionRelay, access: GrantedTools, audit: AuditLog) -> None:
        self.relay = relay
        self.access = access
        self.audit = audit

    def _audited(self, principal: Principal | None, uri: str, event: str, **fields: Any) -> None:
        source, digest = resource_source(uri), uri_sha256(uri)
        self.audit.emit(
            caller_event(
                event, SUBSCRIBE, principal, resource_source=source, uri_sha256=digest, **fields
            )
        )

    def _refused(self, principal: Principal | None, uri: str, reason: str, outcome: str) -> None:
        self._audited(principal, uri, RESOURCE_SUBSCRIBE_BLOCKED, outcome=outcome, reason=reason)

    async def take(self, principal: Principal | None, connection: Any, uri: str) -> None:
        """Subscribe ``connection`` to ``uri`` for ``principal``, or raise the MCP error a
        ``resources/subscribe`` answers with (hidden is answered as unknown)."""
        source = resource_source(uri)
        if principal is None or connection is None:
            reason = "no_session" if principal else "no_principal"
            self._refused(principal, uri, reason, "UNKNOWN_RESOURCE")
            raise not_found_error(prompt=False)
        try:
            granted = source is not None and source in self.access.visible_resource_sources(
                principal
            )
        except NexusError as error:
            self._refused(principal, uri, "grants_unavailable", str(error.code))
            raise to_request_error(error) from None
        except Exception:  # noqa: BLE001 - fail closed, as the namespace
            granted = False
        if not granted:
            reason = "not_granted" if source else "unknown_resource"
            self._refused(principal, uri, reason, "UNKNOWN_RESOURCE")
            raise not_found_error(prompt=False)
        try:
            await self.relay.subscribe(connection, principal, uri)
        except NotExposed:
            self._refused(principal, uri, "unknown_resource", "UNKNOWN_RESOURCE")
            raise not_found_error(prompt=False) from None
        except NotSupported:
            self._refused(principal, uri, "not_supported", "NOT_SUPPORTED")
            raise MCPError(code=METHOD_NOT_FOUND, message=NOT_SUPPORTED_MESSAGE) from None
        except NexusError as error:
            self._refused(principal, uri, "upstream", str(error.code))
            raise to_request_error(error) from None
        self._audited(principal, uri, RESOURCE_SUBSCRIBED, outcome="OK")

    async def drop(self, principal: Principal | None, connection: Any, uri: str) -> None:
        if principal is not None and connection is not None:
            await self.relay.unsubscribe(connection, principal, uri)


def add_subscription_handlers(
    mcp: Any, relay: SubscriptionRelay, access: GrantedTools, audit: AuditLog
) -> Subscriptions:
    """Serve ``resources/subscribe`` and ``/unsubscribe``; the ``Subscriptions`` they use."""
    subscriptions = Subscriptions(relay, access, audit)

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        connection = connection_of(_Request(ctx))
        await subscriptions.take(current_principal(), connection, str(params.uri))
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        connection = connection_of(_Request(ctx))
        await subscriptions.drop(current_principal(), connection, str(params.uri))
        return EmptyResult()  # the same answer whatever was (or was not) subscribed

    server = mcp._mcp_server
    server.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    server.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    return subscriptions


__all__ = [
    "RESOURCE_SUBSCRIBED",
    "RESOURCE_SUBSCRIBE_BLOCKED",
    "Subscriptions",
    "add_subscription_handlers",
]
