"""IdentityMiddleware: binds the request's principal for every layer below it."""

from __future__ import annotations

from typing import Any, Protocol

from fastmcp.server.dependencies import get_access_token
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.calls import SubjectToken, bind_principal, bind_subject_token, current_call
from nexus_mcp.identity.resolver import HTTP_TRANSPORTS, IdentityResolver, session_key
from nexus_mcp.principal import Principal


class SessionTracker(Protocol):
    """Told of every request's connection and principal (``server/notify.py``: who is
    connected, for the list-changed notifications)."""

    async def track(self, ctx: Any, principal: Principal | None) -> None: ...


class IdentityMiddleware(Middleware):
    """Resolves the principal on every request (never cached across requests)."""

    def __init__(
        self,
        resolver: IdentityResolver,
        *,
        stateless_http: bool = False,
        tracker: SessionTracker | None = None,
    ) -> None:
        self.resolver = resolver
        self.stateless_http = stateless_http
        self.tracker = tracker

    async def on_request(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        ctx = context.fastmcp_context
        transport = ctx.transport if ctx is not None else None
        # Only HTTP carries bearer tokens; elsewhere FastMCP's lookup would only fail (and
        # raise and catch internally) on every request.
        token = get_access_token() if transport in HTTP_TRANSPORTS else None
        principal = self.resolver.resolve(
            transport=transport,
            token_claims=token.claims if token is not None else None,
            token_subject=token.subject if token is not None else None,
            token=token.token if token is not None else None,
            expires_at=token.expires_at if token is not None else None,
        )
        state = current_call()
        if state is not None:
            state.principal = principal
            request = ctx.request_context if ctx is not None else None
            state.session_key = session_key(
                principal,
                session_id=_safe_session_id(ctx),
                protocol=getattr(request, "protocol_version", None),
                stateless=self.stateless_http,
            )
        # The token the principal was mapped from, for an upstream's token exchange only
        # (calls.SubjectToken): not on the call state, so never audited or recorded.
        subject = (
            SubjectToken(token.token, token.expires_at)
            if token is not None and principal is not None and token.token
            else None
        )
        if self.tracker is not None:
            await self.tracker.track(ctx, principal)
        with bind_principal(principal), bind_subject_token(subject):
            return await call_next(context)


def _safe_session_id(ctx: Any) -> str | None:
    if ctx is None:
        return None
    try:
        value = ctx.session_id
    except RuntimeError:
        return None
    return str(value) if value else None


__all__ = ["IdentityMiddleware", "SessionTracker"]
