"""Health: what ``/readyz`` reports, for a person, and the refusals of late.

The state stores (probed off the event loop, bounded as ``/readyz`` bounds them; the
backend, embedded or shared), each upstream (its summary, when this server has a gateway;
the standalone console beside a stdio server does not know them), the registries' versions
and digests, and the recent refusals by code from the audit log (its newest records within
the last hour). The words are ``/readyz``'s own (``observability/readiness.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nexus_mcp.console.audit import scan
from nexus_mcp.console.pages import PREFIX, Console
from nexus_mcp.observability.audit import TOOL_CALL_BLOCKED
from nexus_mcp.observability.readiness import (
    StoreProbe,
    public_readiness,
    upstream_reason,
)

RECENT_RECORDS = 2000
RECENT_BYTES = 4 * 1024 * 1024
RECENT_SECONDS = 3600
CONSOLE_REFUSED = "console_refused"


def refusals(records: list[dict[str, Any]], since: str) -> list[tuple[str, str, int]]:
    """``(where, code, count)`` of refused calls and console requests since ``since``."""
    counts: Counter[tuple[str, str]] = Counter()
    for record in records:
        if str(record.get("ts") or "") < since:
            continue
        event = record.get("event")
        if event == TOOL_CALL_BLOCKED:
            counts["tools", str(record.get("outcome") or "-")] += 1
        elif event == CONSOLE_REFUSED:
            counts["console", str(record.get("reason") or "-")] += 1
    return [(where, code, n) for (where, code), n in counts.most_common()]


def routes(console: Console) -> list[Route]:
    services = console.services
    settings = services.settings
    # As /readyz: two round trips, each bounded by the store's own timeout.
    probe = StoreProbe(services.state.probe, timeout=2 * settings.state.timeout_seconds + 0.5)

    async def health(request: Request) -> Response:
        user = await console.require(request, "read", in_outage=True)
        if isinstance(user, Response):
            return user
        summaries = services.upstreams() if services.upstreams is not None else None
        store_reason = await probe.reason()
        readiness = public_readiness(summaries, store_reason)
        registry = services.registry_info() if services.registry_info is not None else None
        found = await asyncio.to_thread(
            scan, settings.audit_path, max_bytes=RECENT_BYTES, max_lines=RECENT_RECORDS
        )
        since = (datetime.now(UTC) - timedelta(seconds=RECENT_SECONDS)).isoformat(
            timespec="microseconds"
        )
        upstreams = [
            (server_id, summary, upstream_reason(summary))
            for server_id, summary in sorted((summaries or {}).items())
        ]
        return console.render(
            request,
            "health.html",
            user,
            page="health",
            readiness=readiness,
            store_reason=store_reason,
            backend=settings.state.backend,
            upstreams=upstreams,
            gateway=summaries is not None,
            registry=sorted((registry or {}).items()),
            registry_known=services.registry_info is not None,
            refusals=refusals(found.records, since),
            recent_records=RECENT_RECORDS,
            recent_minutes=RECENT_SECONDS // 60,
            audit_missing=found.missing,
            checked=time.time(),
        )

    return [Route(f"{PREFIX}/health", health, methods=["GET"])]


__all__ = ["refusals", "routes"]
