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

Readiness, for a load balancer (the status code) and an operator (the body) alike:

- ``not_ready`` (503): the state store does not answer (the shared backend's Redis or
  PostgreSQL), so every call would be refused ``UNAVAILABLE``; take the replica out.
- ``degraded`` (200): the server serves its own tools, but an upstream is starting, down
  or has quarantined tools. Every replica shares its upstreams, so a balancer must not
  take them all out for it.
- ``ready`` (200).

``reasons`` names each component that is not ready with a fixed word of this module
(``unreachable``, ``timeout``, ``starting``, ``quarantined``), never exception text, an
address or an upstream's answer. The plain answer names components (``state_store``,
``upstreams``); the operator's also names each upstream (``upstream:<id>``). The registry
is no component: start-up refuses a registry that differs from its pin, so a serving
process has its registry (the operator's detail shows its version and digest). The store
is probed at most once a second, off the event loop, whoever asks.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from pydantic import SecretStr

from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.readiness import (
    DEGRADED,
    NOT_READY,
    QUARANTINED,
    READY,
    STARTING,
    STORE_PROBE_INTERVAL_SECONDS,
    TIMEOUT,
    UNAVAILABLE,
    UNREACHABLE,
    StoreProbe,
    operator_reasons,
    public_readiness,
    readiness_status_code,
    upstream_reason,
    upstreams_component,
    upstreams_reason,
)
from nexus_mcp.policy.upstreams import resolve_secret
from nexus_mcp.settings import Settings

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


__all__ = [
    "DEGRADED",
    "NOT_READY",
    "NO_STORE",
    "QUARANTINED",
    "READY",
    "STARTING",
    "STORE_PROBE_INTERVAL_SECONDS",
    "TIMEOUT",
    "UNAVAILABLE",
    "UNREACHABLE",
    "StoreProbe",
    "is_operator",
    "operator_reasons",
    "operator_token",
    "public_readiness",
    "readiness_status_code",
    "upstream_reason",
    "upstreams_component",
    "upstreams_reason",
]
