"""Which principal a request speaks for, given the transport (DESIGN.md, "Identity").

- stdio and in-process: the launch principal from settings (environment or CLI flags).
  FastMCP skips its own auth on stdio, so this is ours to decide.
- HTTP: only the claims of a bearer token that FastMCP's verifier already accepted.
- dev mode: a configured default principal when neither gives one; prod: none, so the
  chain fails closed.
Tool arguments and ``ctx.client_id`` (client-controlled ``_meta``) are never consulted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nexus_mcp.principal import Principal, principal_from_claims, principal_from_fields
from nexus_mcp.settings import Settings

HTTP_TRANSPORTS = frozenset({"streamable-http", "http", "sse"})
MODERN_PROTOCOL = "2026-07-28"


class IdentityResolver:
    """Resolves the principal of a request from settings and verified token claims."""

    def __init__(self, settings: Settings) -> None:
        self.mode = settings.mode
        self.launch = principal_from_fields(
            {
                "subject": settings.subject,
                "role": settings.role,
                "profile": settings.profile,
                "vault_id": settings.vault_id,
                "user_id": settings.user_id,
                "canister_user_id": settings.canister_user_id,
                "scopes": settings.scopes,
                "read_only": settings.read_only,
            },
            source="env",
        )
        dev = settings.dev_principal
        self.dev_default = (
            principal_from_fields(dev.model_dump(), source="dev-default")
            if settings.is_dev
            else None
        )
        self.http_auth = settings.auth.enabled

    def resolve(
        self,
        *,
        transport: str | None,
        token_claims: Mapping[str, Any] | None,
        token_subject: str | None,
    ) -> Principal | None:
        if transport in HTTP_TRANSPORTS:
            if token_claims is not None:
                return principal_from_claims(token_claims, subject=token_subject)
            # No verifier configured (dev only; prod refuses to start like this).
            return None if self.http_auth else self.dev_default
        return self.launch or self.dev_default


def session_key(
    principal: Principal | None, *, session_id: str | None, protocol: str | None
) -> str:
    """Key for per-session state: the MCP session where the protocol has one, else the principal.

    On the 2026-07-28 era every request is its own connection and ``session_id`` changes
    per call (FASTMCP4_GUIDE 2.3), so state keyed by it would reset on every call.
    """
    if protocol != MODERN_PROTOCOL and session_id:
        return f"session:{session_id}"
    # log_subject: the key lands in audit records, so a secret-looking subject is hashed.
    subject = principal.log_subject if principal is not None else "anonymous"
    return f"principal:{subject}"


__all__ = ["HTTP_TRANSPORTS", "MODERN_PROTOCOL", "IdentityResolver", "session_key"]
