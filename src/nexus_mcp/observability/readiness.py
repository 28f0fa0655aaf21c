"""Readiness as ``/readyz`` and the console's Health page report it (``server/health.py``
has the rules: which component is not ready and the fixed words that say why).

Pure answers from an upstream gateway's summaries and a state-store probe, shared by the
HTTP route and the console, which may not import the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

READY = "ready"
DEGRADED = "degraded"
STARTING = "starting"
NOT_READY = "not_ready"
UNAVAILABLE = "unavailable"
# Why a component is not ready: the only words ``reasons`` holds.
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
QUARANTINED = "quarantined"
STORE_PROBE_INTERVAL_SECONDS = 1.0


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
    "DEGRADED",
    "NOT_READY",
    "QUARANTINED",
    "READY",
    "STARTING",
    "STORE_PROBE_INTERVAL_SECONDS",
    "TIMEOUT",
    "UNAVAILABLE",
    "UNREACHABLE",
    "StoreProbe",
    "operator_reasons",
    "public_readiness",
    "readiness_status_code",
    "upstream_reason",
    "upstreams_component",
    "upstreams_reason",
]
