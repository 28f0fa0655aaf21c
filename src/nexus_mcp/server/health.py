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

import asyncio
import hmac
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import SecretStr

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.upstreams import resolve_secret
from nexus_mcp.settings import Settings

READY = "ready"
DEGRADED = "degraded"
STARTING = "starting"
NOT_READY = "not_ready"
UNAVAILABLE = "unavailable"
# Why a component is not ready: the only words ``reasons`` holds.
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
QUARANTINED = "quarantined"
NO_STORE = {"Cache-Control": "no-store"}
STORE_PROBE_INTERVAL_SECONDS = 1.0


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


def upstream_reason(summary: Mapping[str, Any]) -> str | None:
    """Why one upstream is not ready (None: it is)."""
    if summary["state"] == DEGRADED:
        return UNREACHABLE
    if summary["state"] != READY:
        return STARTING
    if summary["quarantined"]:
        return QUARANTINED
    return None


def upstreams_reason(summaries: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The gravest reason among all upstreams: unreachable, then quarantined, then starting."""
    found = {upstream_reason(summary) for summary in summaries.values()}
    for reason in (UNREACHABLE, QUARANTINED, STARTING):
        if reason in found:
            return reason
    return None


def public_readiness(
    summaries: Mapping[str, Mapping[str, Any]] | None, store_reason: str | None = None
) -> dict[str, Any]:
    """The unauthenticated ``/readyz``: status, components and why, nothing more.

    ``store_reason``: why the state store did not answer (``StoreProbe``), None if it did.
    """
    components = {
        "server": READY,
        "state_store": READY if store_reason is None else UNAVAILABLE,
    }
    reasons: dict[str, str] = {}
    if store_reason is not None:
        reasons["state_store"] = store_reason
    if summaries is not None:
        components["upstreams"] = upstreams_component(summaries)
        upstreams = upstreams_reason(summaries)
        if upstreams is not None:
            reasons["upstreams"] = upstreams
    if store_reason is not None:
        status = NOT_READY
    elif components.get("upstreams", READY) != READY:
        status = DEGRADED
    else:
        status = READY
    body: dict[str, Any] = {"status": status, "components": components}
    if reasons:
        body["reasons"] = reasons
    return body


def readiness_status_code(body: Mapping[str, Any]) -> int:
    """503 only when no call can be served (a balancer takes the replica out), else 200."""
    return 503 if body["status"] == NOT_READY else 200


def operator_reasons(
    public: Mapping[str, Any], summaries: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, str]:
    """The plain answer's reasons, and each upstream's by id (``upstream:<id>``)."""
    reasons = dict(public.get("reasons", {}))
    for server_id, summary in sorted((summaries or {}).items()):
        reason = upstream_reason(summary)
        if reason is not None:
            reasons[f"upstream:{server_id}"] = reason
    return reasons


class StoreProbe:
    """Asks the state store whether it answers, for ``/readyz``: off the event loop,
    bounded by ``timeout`` and at most once per ``interval`` (concurrent probes of the
    route share one), so probing the route never becomes load on the store."""

    def __init__(
        self,
        probe: Callable[[], None],
        *,
        timeout: float,
        interval: float = STORE_PROBE_INTERVAL_SECONDS,
    ) -> None:
        self._probe = probe
        self._timeout = timeout
        self._interval = interval
        self._checked_at: float | None = None
        self._reason: str | None = None
        self._lock: asyncio.Lock | None = None

    async def reason(self) -> str | None:
        """None when the store answered, else ``unreachable`` or ``timeout``."""
        if self._fresh():
            return self._reason
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._fresh():
                return self._reason
            try:
                await asyncio.wait_for(asyncio.to_thread(self._probe), self._timeout)
            except TimeoutError:
                self._reason = TIMEOUT
            except Exception:  # noqa: BLE001 - any failure: the store does not answer
                self._reason = UNREACHABLE
            else:
                self._reason = None
            self._checked_at = time.monotonic()
            return self._reason

    def _fresh(self) -> bool:
        checked = self._checked_at
        return checked is not None and time.monotonic() - checked < self._interval


__all__ = [
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
