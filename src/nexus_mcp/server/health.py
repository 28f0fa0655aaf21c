"""``/healthz`` and ``/readyz``: what whoever reaches the port may know, and the detail
only an operator may.

Both routes answer without a caller's token (load balancers and orchestrators probe them),
so their plain answer says only whether the server is up, whether it is ready, and which
component is not: never a tool name, an upstream's id, a session count, a version or the
registry. Hidden upstream tools stay indistinguishable from unknown ones there too. The
detail (each upstream's state, exposed, quarantined and unclassified tools, sessions; the
version, mode and registry) is for the operator, who sends ``health.bearer_token`` as
``Authorization: Bearer <token>`` (compared in constant time). A request carrying any other
credential gets 401 and nothing else; with no token configured there is no detail at all.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.upstreams import resolve_secret
from nexus_mcp.settings import Settings

READY = "ready"
DEGRADED = "degraded"
STARTING = "starting"
NO_STORE = {"Cache-Control": "no-store"}


def operator_token(settings: Settings, environ: Mapping[str, str]) -> SecretStr | None:
    """``health.bearer_token`` resolved: by reference, or inline in dev only."""
    token = settings.health.bearer_token
    if isinstance(token, SecretStr):
        if not settings.is_dev:
            raise ConfigError(
                "invalid setting 'health.bearer_token': give it by reference ({env: NAME} or "
                "{file: path}); inline secrets are for dev mode only"
            )
        return token
    return resolve_secret(token, environ) if token is not None else None


def is_operator(token: SecretStr | None, header: str | None) -> bool:
    """The request carries the operator's bearer token (never true without one set)."""
    if token is None or header is None:
        return False
    scheme, _, given = header.partition(" ")
    expected = token.get_secret_value().encode()
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)


def upstreams_component(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """One word for every upstream together: ``degraded`` while any is down or has a
    quarantined tool, ``starting`` while any is still on its first connection."""
    states = [summary["state"] for summary in summaries.values()]
    if any(s == DEGRADED for s in states) or any(s["quarantined"] for s in summaries.values()):
        return DEGRADED
    if any(s != READY for s in states):
        return STARTING
    return READY


def public_readiness(summaries: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """The unauthenticated ``/readyz``: status and components, nothing more."""
    components = {"server": READY}
    if summaries is not None:
        components["upstreams"] = upstreams_component(summaries)
    ready = components.get("upstreams", READY) == READY
    return {"status": READY if ready else DEGRADED, "components": components}


__all__ = [
    "is_operator",
    "operator_token",
    "public_readiness",
    "upstreams_component",
]
