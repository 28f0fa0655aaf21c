"""What the console's Upstream pins page reads and does (``console/pins.py``).

Inside a running server the page reads the gateway's own ``UpstreamServer`` objects (what
the server decided, on its own evidence; a rewritten lock file is read first); beside a
stdio server (``nexus-mcp console``) there is no gateway, so each upstream is connected
to as ``nexus-mcp upstream check`` does (``review.inspect``).

A re-pin is ``nexus-mcp upstream pin SERVER --tool T --yes`` (or, for every changed tool
of the server, without ``--tool``): always on a fresh connection, whichever the host, and
only of the definitions the person reviewed. The form carries the digest of what the page
showed (one tool's definition digest, or ``review.selection_digest`` of every tool about
to be pinned); when the upstream shows anything else now, nothing is written and the
outcome is ``moved``, with the new report to show. A running server reads the new lock
file at once (its stamp makes it forget the re-pinned tools' evidence).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from nexus_mcp.errors import ConfigError, UnavailableError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.catalog import Kind
from nexus_mcp.policy.pins import PinnedDefinitions
from nexus_mcp.policy.sandbox import isolation
from nexus_mcp.policy.upstreams import UpstreamConfig
from nexus_mcp.providers.upstream.review import (
    ReviewContext,
    inspect,
    items_to_pin,
    keep_definitions,
    pin_items,
    pin_reviewed,
    selection_digest,
    server_report,
    to_pin,
)

if TYPE_CHECKING:
    from nexus_mcp.providers.upstream.server import UpstreamServer

log = get_logger(__name__)

RepinStatus = Literal["pinned", "nothing", "moved", "refused"]


@dataclass(frozen=True)
class RepinOutcome:
    """``pinned``: the pins written (tool -> digest); ``nothing``: every selected tool was
    pinned already; ``moved``: the upstream shows another definition than the one
    reviewed, nothing written (``report`` is what it shows now); ``refused``: ``why``
    (``unreachable``, ``pins_unusable``, ``unlisted``, ``evidence``, ``configuration``)."""

    status: RepinStatus
    report: Mapping[str, Any] | None = None
    pinned: Mapping[str, str] = field(default_factory=dict)
    why: str | None = None
    kept: bool = True
    # The items pinned (a prompt, resource template or resource: kind -> key -> digest).
    items: Mapping[Kind, Mapping[str, str]] = field(default_factory=dict)


class PinsView:
    def __init__(
        self, context: ReviewContext, live: Mapping[str, UpstreamServer] | None = None
    ) -> None:
        self.context = context
        self.live = dict(live or {})
        self._writing = asyncio.Lock()  # one re-pin at a time (read, change, write)

    @property
    def host(self) -> str:
        return "gateway" if self.live else "connected"

    @property
    def server_ids(self) -> list[str]:
        return self.context.server_ids

    async def reports(self) -> list[Mapping[str, Any]]:
        return [await self.report(server_id) for server_id in self.server_ids]

    async def report(self, server_id: str) -> Mapping[str, Any]:
        """What the page shows of ``server_id``: the running server's own decisions, or
        a fresh connection's (no gateway here)."""
        live = self.live.get(server_id)
        if live is None:
            return await self.review(server_id)
        if live.bound_here():
            await live.refresh_pins()
        return await asyncio.to_thread(server_report, live, self.context.registry_dir)

    async def review(self, server_id: str) -> Mapping[str, Any]:
        """A fresh connection's report (``upstream check``); an upstream whose
        configuration cannot be used (a secret that does not resolve) is reported down."""
        try:
            return await inspect(self.context, server_id)
        except ConfigError:
            log.warning("console_upstream_unusable", server_id=server_id)
            config = self.context.config.get(server_id)
            return unreachable(server_id, "configuration", config)

    async def repin(self, server_id: str, tool: str | None, shown: str) -> RepinOutcome:
        """Pin ``tool`` (None: every changed tool of the server), only if the upstream
        still shows what was reviewed (``shown``, module docstring)."""
        async with self._writing:
            report = await self.review(server_id)
            if report["state"] != "ready":
                return RepinOutcome("refused", report, why="unreachable")
            if report["pins_unusable"]:
                return RepinOutcome("refused", report, why="pins_unusable")
            tools: Mapping[str, Any] = report["tools"]
            if tool is not None:
                listed = tools.get(tool)
                if listed is None or not listed["allowed"]:
                    return RepinOutcome("refused", report, why="unlisted")
                changes = to_pin(report, [tool])
                now = listed["sha256"]
            else:
                changes = to_pin(report, None)
                now = selection_digest(changes)
            if now != shown:
                return RepinOutcome("moved", report)
            if not changes:
                return RepinOutcome("nothing", report)
            try:
                await asyncio.to_thread(pin_reviewed, self.context, server_id, report, changes)
            except (ConfigError, UnavailableError):
                return RepinOutcome("refused", report, why="evidence")
            kept = await asyncio.to_thread(self._keep, server_id, report)
        live = self.live.get(server_id)
        if live is not None and live.bound_here():
            await live.refresh_pins()
        return RepinOutcome("pinned", report, pinned=changes, kept=kept)

    async def repin_item(self, server_id: str, kind: Kind, key: str, shown: str) -> RepinOutcome:
        """Pin one prompt, resource template or resource (``upstream pin --prompt`` or
        ``--resource``, through ``review.pin_items`` as the CLI does), only if the upstream
        still shows the definition reviewed (``shown``: its digest)."""
        async with self._writing:
            report = await self.review(server_id)
            if report["state"] != "ready":
                return RepinOutcome("refused", report, why="unreachable")
            if report["pins_unusable"]:
                return RepinOutcome("refused", report, why="pins_unusable")
            listed = next(
                (i for i in report.get("items", ()) if i["kind"] == kind and i["key"] == key),
                None,
            )
            if listed is None or not listed["allowed"]:
                return RepinOutcome("refused", report, why="unlisted")
            if listed["sha256"] != shown:
                return RepinOutcome("moved", report)
            changes = items_to_pin(report, {kind: {key}})
            if not changes:
                return RepinOutcome("nothing", report)
            try:
                await asyncio.to_thread(pin_items, self.context, server_id, changes)
            except (ConfigError, OSError):
                return RepinOutcome("refused", report, why="write")
        live = self.live.get(server_id)
        if live is not None and live.bound_here():
            await live.refresh_pins()
        return RepinOutcome("pinned", report, items=changes)

    def _keep(self, server_id: str, report: Mapping[str, Any]) -> bool:
        try:
            keep_definitions(self.context, server_id, report["tools"], report["kept"])
        except OSError:
            log.warning("console_pinned_definitions_not_kept", server_id=server_id)
            return False
        return True


def unreachable(
    server_id: str, failure: str, config: UpstreamConfig | None = None
) -> dict[str, Any]:
    """The report of an upstream that could not be reviewed (its isolation: what its
    configuration asks for)."""
    return {
        "server_id": server_id,
        "state": "degraded",
        "isolation": isolation(config.transport, config.sandbox) if config else None,
        "failure": failure,
        "tools": {},
        "missing": [],
        "pinned_missing": {},
        "kept": PinnedDefinitions(server_id),
        "invalid": [],
        "cut": None,
        "pin_problems": [],
        "pins_unusable": False,
        "items": [],
    }


__all__ = ["PinsView", "RepinOutcome", "unreachable"]
