"""Which principal a request speaks for, given the transport (DESIGN.md, "Identity").

- stdio and in-process: the launch principal from settings (environment or CLI flags).
  FastMCP skips its own auth on stdio, so this is ours to decide.
- HTTP: only the claims of a bearer token that FastMCP's verifier already accepted.
- dev mode: a configured default principal when neither gives one; prod: none, so the
  chain fails closed.
Tool arguments and ``ctx.client_id`` (client-controlled ``_meta``) are never consulted.

Launch settings given without a subject are never dropped (``build_identity``): in dev they
narrow the dev principal (``policy/launch.py``), in prod they stop a stdio server from
starting. On HTTP they do not apply (tokens decide) and start-up says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nexus_mcp.policy.claims import ClaimsMapper
from nexus_mcp.policy.launch import (
    LAUNCH_FIELDS,
    SUBJECT,
    LaunchFields,
    narrow_principal,
    require_subject,
)
from nexus_mcp.policy.profiles import ToolProfileConfig
from nexus_mcp.principal import Principal, principal_from_fields
from nexus_mcp.settings import Settings

HTTP_TRANSPORTS = frozenset({"streamable-http", "http", "sse"})
MODERN_PROTOCOL = "2026-07-28"
_LAUNCH_KEYS = (SUBJECT, *LAUNCH_FIELDS)


class IdentityResolver:
    """Resolves the principal of a request from the start-up principals and verified claims.

    Built by ``build_identity``, which decides the launch and dev principals once.
    """

    def __init__(
        self,
        *,
        launch: Principal | None,
        dev_default: Principal | None,
        http_auth: bool,
        narrowed_by: tuple[str, ...] = (),
        ignored: tuple[str, ...] = (),
        mapper: ClaimsMapper | None = None,
    ) -> None:
        self.launch = launch
        # Verified claims to the principal, once per token (policy/claims.py).
        self.mapper = mapper if mapper is not None else ClaimsMapper(None)
        self.dev_default = dev_default
        self.http_auth = http_auth
        # Launch settings that narrowed the dev default, and those that do not apply here.
        self.narrowed_by = narrowed_by
        self.ignored = ignored

    def describe(self, transport: str) -> dict[str, Any]:
        """Who callers on ``transport`` act as, for the start-up log (nothing secret)."""
        if transport in HTTP_TRANSPORTS:
            if self.http_auth:
                return {"transport": transport, "source": "token", "tokens_decide": True}
            # Without a verifier (dev only) every HTTP caller acts as the dev default.
            return {
                "transport": transport,
                "tokens_decide": False,
                **self._fields(self.dev_default),
            }
        return {"transport": transport, **self._fields(self.launch or self.dev_default)}

    def _fields(self, principal: Principal | None) -> dict[str, Any]:
        if principal is None:
            return {"source": "none", "subject": None}  # fail closed: nothing is visible
        fields: dict[str, Any] = {
            "source": principal.source,
            "subject": principal.log_subject,
            "role": principal.effective_role,
            "profile": principal.profile,
            "read_only": principal.read_only,
            "scopes": sorted(principal.scopes),
        }
        if principal is self.dev_default and self.narrowed_by:
            fields["narrowed_by"] = list(self.narrowed_by)
        return fields

    def resolve(
        self,
        *,
        transport: str | None,
        token_claims: Mapping[str, Any] | None,
        token_subject: str | None,
        token: str | None = None,
        expires_at: float | None = None,
    ) -> Principal | None:
        if transport in HTTP_TRANSPORTS:
            if token_claims is not None:
                return self.mapper.principal(
                    token_claims, token=token, subject=token_subject, expires_at=expires_at
                )
            # No verifier configured (dev only; prod refuses to start like this).
            return None if self.http_auth else self.dev_default
        return self.launch or self.dev_default


def check_launch_settings(settings: Settings) -> LaunchFields:
    """The launch settings given; a prod stdio server refuses them without a subject."""
    fields = LaunchFields.from_values(_launch_values(settings))
    if not settings.is_dev and settings.transport != "http":
        require_subject(fields)
    return fields


def _launch_values(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in _LAUNCH_KEYS}


def build_identity(
    settings: Settings,
    *,
    profiles: ToolProfileConfig,
    profile_of: Callable[[Principal], str | None],
    mapper: ClaimsMapper | None = None,
) -> IdentityResolver:
    """Decide at start-up who stdio callers (and unverified dev HTTP callers) act as.

    ``profile_of`` is the namespace's profile selection, so the dev principal is compared
    with what it really sees (its profile, its subject's assignment or its role's).
    Raises ``ConfigError`` for launch settings that cannot apply: without a subject in a
    prod stdio server, or widening the dev principal.
    """
    fields = check_launch_settings(settings)
    http = settings.transport == "http"
    launch = principal_from_fields(_launch_values(settings), source="env")
    dev_default = None
    narrowed_by: tuple[str, ...] = ()
    if settings.is_dev:
        dev_default = principal_from_fields(
            settings.dev_principal.model_dump(), source="dev-default"
        )
        if dev_default is not None and launch is None and fields.given:
            dev_default = narrow_principal(
                dev_default,
                fields,
                profiles=profiles,
                base_profile=profile_of(dev_default),
                approver_roles=settings.approver_roles,
            )
            narrowed_by = fields.given
    given = ((SUBJECT,) if fields.subject is not None else ()) + fields.given
    # On HTTP tokens decide; launch settings reach an HTTP caller only as the narrowing of
    # the dev default that serves unverified callers (dev without a verifier).
    applies_on_http = not settings.auth.enabled and launch is None
    ignored = given if http and not applies_on_http else ()
    return IdentityResolver(
        launch=launch,
        dev_default=dev_default,
        http_auth=settings.auth.enabled,
        narrowed_by=narrowed_by,
        ignored=ignored,
        mapper=mapper if mapper is not None else ClaimsMapper(settings.auth.claims),
    )


def session_key(
    principal: Principal | None,
    *,
    session_id: str | None,
    protocol: str | None,
    stateless: bool = False,
) -> str:
    """Key for per-session state: the MCP session where the protocol has one, else the principal.

    On the 2026-07-28 era every request is its own connection and ``session_id`` changes
    per call (FASTMCP4_GUIDE 2.3), so state keyed by it would reset on every call. Under
    stateless HTTP no session is issued either: the id is a fresh one per request or
    whatever ``Mcp-Session-Id`` the client chose to send, so it keys nothing. A session key
    always carries the principal, so no caller can count calls against another's session.
    """
    # log_subject: the key lands in audit records, so a secret-looking subject is hashed.
    subject = principal.log_subject if principal is not None else "anonymous"
    if protocol != MODERN_PROTOCOL and session_id and not stateless:
        return f"session:{subject}:{session_id}"
    return f"principal:{subject}"


__all__ = [
    "HTTP_TRANSPORTS",
    "MODERN_PROTOCOL",
    "IdentityResolver",
    "build_identity",
    "check_launch_settings",
    "session_key",
]
