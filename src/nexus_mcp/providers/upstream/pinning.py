"""What an upstream's tools are: pinned, quarantined, exposed (``policy/pins.py``).

The lock file is read again when it changes; every listed tool is decided (allowlist,
name, registry, pin, and the evidence of ``evidence.py``) and the exposed ones are
published as ``UpstreamTool`` objects. ``UpstreamServer`` (``server.py``) is built on this
layer; it lists and connects, this layer decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Literal

from nexus_mcp.connector import Connector
from nexus_mcp.contracts import ToolContract
from nexus_mcp.errors import UnavailableError
from nexus_mcp.ids import new_id
from nexus_mcp.observability.audit import AUDIT_SCHEMA_VERSION, AuditEvent, AuditLog, utc_timestamp
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.classification import DEV_MODE
from nexus_mcp.policy.hashing import sha256_hex
from nexus_mcp.policy.pins import (
    PinState,
    definition_digest,
    load_pins,
    lock_path,
    renewed_pins,
)
from nexus_mcp.policy.quarantine import STORE_UPSTREAM_QUARANTINE, Observation, proofs_in
from nexus_mcp.policy.registry import RegistrySet
from nexus_mcp.policy.upstreams import UpstreamConfig, name_key
from nexus_mcp.providers.upstream.evidence import QuarantineEvidence
from nexus_mcp.providers.upstream.listing import (
    InvalidDefinition,
    Listing,
    listing_digest,
    screen,
)
from nexus_mcp.providers.upstream.tools import (
    UPSTREAM_TOOLSET_PREFIX,
    ToolView,
    UpstreamTool,
)

log = get_logger(__name__)

MAX_REPORTED_INVALID = 50  # skipped definitions named (by position) in one audit event

EVENT_DEFINITION_CHANGED = "tool_definition_changed"
EVENT_UNPINNED = "tool_unpinned"
# Why a listed tool is hidden, beyond the registry and the pins (``hidden_reason``).
REASON_NATIVE_NAME = "native_name"  # its exposed name is a native tool's
REASON_UPSTREAM_DOWN = "upstream_down"  # ``when_down: hide`` while the upstream is down
EVENT_UPSTREAM_DOWN = "upstream_down"
EVENT_UPSTREAM_UP = "upstream_up"
EVENT_LISTING_CUT = "upstream_listing_cut"
EVENT_TOOL_INVALID = "upstream_tool_invalid"
EVENT_PINS_INVALID = "upstream_pins_invalid"
REASON_PINS_INVALID = "pin_entry_invalid"

ServerState = Literal["starting", "ready", "degraded"]


class PinnedTools(QuarantineEvidence):
    """The decisions layer of an ``UpstreamServer`` (its constructor sets these)."""

    config: UpstreamConfig
    registry: RegistrySet
    registry_dir: Path
    mode: str
    audit: AuditLog | None
    on_change: Callable[[Any], None]  # called with the server itself
    max_result_bytes: int
    state: ServerState
    views: dict[str, ToolView]
    tools: dict[str, UpstreamTool]
    reserved_keys: frozenset[str]
    connector: Connector | None
    invalid: list[InvalidDefinition]
    listing_cut: tuple[str, int] | None
    _pins_mtime: float | None
    _pins_unreadable: float | None
    catalog: Any  # its prompts and resources (``catalog.UpstreamCatalog``)
    # The connections' (``server.py``): what an exposed tool forwards through.
    forward: Callable[..., Coroutine[Any, Any, Any]]

    def _reload_pins(self) -> bool:
        """Read the lock file again if its mtime changed (a stat otherwise); True when
        the pins were reloaded."""
        path = lock_path(self.registry_dir, self.server_id)
        mtime = mtime_ns(path)
        if mtime == self._pins_mtime or mtime == self._pins_unreadable:
            return False
        try:
            pins = load_pins(self.registry_dir, self.server_id)
        except Exception:  # noqa: BLE001 - keep the old pins; say so (once per version)
            self._pins_unreadable = mtime
            log.warning("upstream_pins_unreadable", server_id=self.server_id)
            return False
        before, self.pins = self.pins, pins
        self._pins_mtime = mtime
        self._pins_unreadable = None
        self._forget(renewed_pins(before, pins))
        self.catalog.forget(before)
        self.catalog.redecide()
        self._note_pins()
        return True

    def _note_pins(self, *, logged: bool = True, audited: bool = True) -> None:
        """A lock file, or entries of it, that could not be used (``policy/pins.py``):
        logged and audited by position; the tools it cannot vouch for are quarantined.
        (At construction only logged: audited once, when started.)"""
        problems = self.pins.problems()
        if problems:
            if logged:
                log.warning("upstream_pins_invalid", server_id=self.server_id, problems=problems)
            if audited:
                self._emit(EVENT_PINS_INVALID, problems=problems)

    def pins_stale(self) -> bool:
        """The lock file changed since it was read (one stat)."""
        mtime = mtime_ns(lock_path(self.registry_dir, self.server_id))
        return mtime != self._pins_mtime and mtime != self._pins_unreadable

    def evaluate(
        self, definitions: Mapping[str, Mapping[str, Any]], *, authoritative: bool = True
    ) -> None:
        """Decide every listed tool (allowlist, name, registry, pin) and publish the result.

        The gateway's own session is authoritative: its list is the upstream's tool set. A
        caller's session can only add evidence: a definition it shows that differs from
        the pin quarantines that tool for everyone; what it adds or leaves out is ignored.
        (Synchronous: the evidence store is asked inline; the sessions use ``_evaluate``.)
        """
        self._reload_pins()
        definitions = self._as_listed(definitions, authoritative)
        seen = self._observations(definitions)
        sent = self._send(seen, frozenset(self._unsent))
        self._kept |= self._persist(seen)
        self._decide(definitions, seen, self._gather(seen, sent))

    async def _evaluate(
        self,
        definitions: Mapping[str, Mapping[str, Any]],
        *,
        authoritative: bool,
        digests: Mapping[str, str] | None = None,
    ) -> None:
        """``evaluate``, with the stores asked from a worker thread; ``digests``: those of
        ``definitions``, already computed (off the event loop)."""
        self._reload_pins()
        definitions = self._as_listed(definitions, authoritative)
        seen = self._observations(definitions, digests)
        sent = await self._offload(self._send, seen, frozenset(self._unsent))
        if self.persisted is not None and proofs_in(seen) - self._kept:
            self._kept |= await asyncio.to_thread(self._persist, seen)
        self._decide(definitions, seen, self._gather(seen, sent))

    def _as_listed(
        self, definitions: Mapping[str, Mapping[str, Any]], authoritative: bool
    ) -> Mapping[str, Mapping[str, Any]]:
        if authoritative:
            return definitions
        return {name: definitions.get(name, view.definition) for name, view in self.views.items()}

    def _observations(
        self,
        definitions: Mapping[str, Mapping[str, Any]],
        digests: Mapping[str, str] | None = None,
    ) -> dict[str, Observation]:
        """(digest, pin) of each definition. Not hashed again: those in ``digests`` (this
        listing's, computed off the loop) and a view's own definition object (hashed
        when it was listed)."""
        pins = self.pins.digests
        given = digests or {}
        seen: dict[str, Observation] = {}
        for name, definition in definitions.items():
            digest = given.get(name)
            if digest is None:
                view = self.views.get(name)
                if view is not None and view.definition is definition:
                    digest = view.digest
                else:
                    digest = definition_digest(definition)
            seen[name] = (digest, pins.get(name))
        return seen

    async def check_call(self, tool: UpstreamTool) -> bool:
        """Before a call of ``tool`` is forwarded: is it still exposed?

        The lock file is checked (its mtime; read again if it changed, and every tool
        decided again). On the shared backend the tool's evidence is read (one round
        trip): a digest another replica saw that differs from the pin quarantines it here
        too, now (audited and published as any quarantine). False: quarantined, the call
        is refused as an unknown tool. ``UnavailableError``: the evidence cannot be read,
        the call is refused (fail closed).
        """
        if self._reload_pins():
            await self._evaluate({}, authoritative=False)
            if self.visible_tools().get(tool.name) is not tool:
                return False
        if not self.shares_evidence:
            return True
        name = tool.view.upstream_name
        pinned = self.pins.digests.get(name)
        if pinned is None:
            return True  # unpinned (exposed in dev only): no evidence changes that
        unsent = frozenset(self._unsent)
        try:
            seen: frozenset[str] = await self._offload(self._read, name, pinned, unsent)
        except UnavailableError:
            log.warning("upstream_quarantine_unavailable", server_id=self.server_id)
            raise
        except Exception as exc:  # noqa: BLE001 - a store's own failure: fail closed
            log.warning("upstream_quarantine_unavailable", server_id=self.server_id)
            raise UnavailableError(
                store=STORE_UPSTREAM_QUARANTINE, error=type(exc).__name__
            ) from None
        self._unsent -= unsent
        if all(digest == pinned for digest in seen):
            return True
        self._local.merge(self.server_id, name, seen, pinned=pinned)
        self._decide_again()
        return False

    def _decide_again(self) -> None:
        """Decide the current views again on this process's evidence (no store call)."""
        definitions = {name: view.definition for name, view in self.views.items()}
        seen = self._observations(definitions)
        self._decide(definitions, seen, self._local.observe(self.server_id, seen))

    def _decide(
        self,
        definitions: Mapping[str, Mapping[str, Any]],
        seen: Mapping[str, Observation],
        evidence: Mapping[str, frozenset[str]],
    ) -> None:
        views: dict[str, ToolView] = {}
        for name, definition in definitions.items():
            digest, pinned = seen[name]
            if self.pins.digests.get(name) != pinned:
                # The pins changed while the store was asked: only this process's own
                # evidence under the pin now in force counts (the next list asks again).
                pinned = self.pins.digests.get(name)
                found = self._local.observe(self.server_id, {name: (digest, pinned)})[name]
            else:
                found = evidence.get(name, frozenset()) | {digest}
            views[name] = self._view(name, definition, digest, found)
        previous = self.views
        self.views = views
        for name, view in views.items():
            before = previous.get(name)
            if view.status == "quarantined" and (
                before is None or before.digest != view.digest or before.status != "quarantined"
            ):
                event = (
                    EVENT_DEFINITION_CHANGED
                    if view.pin_state is PinState.CHANGED
                    else EVENT_UNPINNED
                )
                log.warning(event, server_id=self.server_id, tool=name)
                pinned = self.pins.digests.get(name)
                self._emit(
                    event,
                    upstream_tool=name,
                    pinned_sha256=pinned,
                    seen_sha256=self._differing(view, pinned),
                )
            elif (
                view.status == "exposed"
                and view.pin_state is not PinState.PINNED
                and (before is None or before.status != view.status)
            ):
                log.warning("upstream_tool_unpinned_dev", server_id=self.server_id, tool=name)
            if view.status == "unclassified" and (before is None or before.status != view.status):
                # Once per change, not per listing: a listing of thousands of unclassified
                # tools must not cost thousands of log lines each time.
                log.warning("upstream_tool_unclassified", server_id=self.server_id, tool=name)
        self._publish()

    def other_digest(self, name: str) -> str | None:
        """The digest other than its pin a tool was seen with (quarantine evidence) while
        its listing matches the pin (changed, then reverted); None otherwise."""
        view = self.views.get(name)
        pinned = self.pins.digests.get(name)
        if view is None or pinned is None or view.digest != pinned:
            return None
        if view.pin_state is not PinState.CHANGED:
            return None
        return self._differing(view, pinned)

    def _differing(self, view: ToolView, pinned: str | None) -> str:
        """The digest that differs from the pin: this process's own, or one another
        session (or replica) showed."""
        if pinned is None or view.digest != pinned:
            return view.digest
        others = self._local.get(self.server_id, view.upstream_name, pinned=pinned)
        return min((d for d in others if d != pinned), default=view.digest)

    def _view(
        self, name: str, definition: Mapping[str, Any], digest: str, seen: frozenset[str]
    ) -> ToolView:
        exposed = self.config.exposed_name(name)
        entry = self.registry.lookup(self.server_id, name)
        pin_state = self.pins.state_of(name, digest)
        # Any digest seen on any session that differs from the pin counts as a change.
        pinned = self.pins.digests.get(name)
        if pinned is not None and any(d != pinned for d in seen):
            pin_state = PinState.CHANGED

        def view(status: Any, reason: str | None = None) -> ToolView:
            return ToolView(name, exposed, definition, digest, entry, pin_state, status, reason)

        if not self.config.allows(name):
            return view("not_allowed", "allowlist")
        if exposed is None:
            return view("bad_name", "tool_name_rule")
        if name_key(exposed) in self.reserved_keys:
            return view("bad_name", REASON_NATIVE_NAME)
        if entry is None and self.mode != DEV_MODE:
            return view("unclassified", "TOOL_UNCLASSIFIED_DENIED")
        if self.pins.quarantines(name):
            return view("quarantined", REASON_PINS_INVALID)
        if pin_state is PinState.CHANGED:
            return view("quarantined", EVENT_DEFINITION_CHANGED)
        if pin_state is PinState.UNPINNED and self.mode != DEV_MODE:
            return view("quarantined", EVENT_UNPINNED)
        return view("exposed")

    def _publish(self) -> None:
        tools: dict[str, UpstreamTool] = {}
        for view in self.views.values():
            if view.status != "exposed" or view.exposed_name is None:
                continue
            existing = self.tools.get(view.exposed_name)
            if existing is not None and existing.view.digest == view.digest:
                existing.view = view
                tools[view.exposed_name] = existing
            else:
                tools[view.exposed_name] = UpstreamTool.for_view(self, view)
        self.tools = tools
        self.on_change(self)

    def visible_tools(self) -> dict[str, UpstreamTool]:
        """The tools callers may see now (hidden while down when ``when_down: hide``)."""
        if self.state == "degraded" and self.config.when_down == "hide":
            return {}
        return self.tools

    def hidden_reason(self, exposed: str) -> tuple[str, str] | None:
        """Why a name of this upstream is not exposed now: (its tool, the README's reason
        code), for the audit only; the caller's answer is an unknown tool's. None: not a
        name of this upstream's, or exposed."""
        if exposed in self.visible_tools():
            return None
        if exposed in self.tools:
            return self.tools[exposed].view.upstream_name, REASON_UPSTREAM_DOWN
        for view in self.views.values():
            if view.exposed_name == exposed and view.status != "exposed":
                return view.upstream_name, view.reason or view.status
        return None

    def contract_for(self, view: ToolView) -> ToolContract:
        risk: Any = view.tool_class
        description = str(view.definition.get("description") or view.upstream_name)
        return ToolContract(
            name=view.exposed_name or view.upstream_name,
            description=description,
            risk=risk,
            toolset=UPSTREAM_TOOLSET_PREFIX + self.server_id,
            version=view.digest[:12],
            title=view.definition.get("title"),
        )

    def _report_listing(self, listing: Listing, invalid: list[InvalidDefinition]) -> None:
        """A cut listing and skipped definitions (``listing.py``): logged and
        audited when they change, by position and digest (never a name)."""
        cut = (listing.cut, len(listing.wire)) if listing.cut is not None else None
        if cut is not None and cut != self.listing_cut:
            log.warning(
                "upstream_listing_cut", server_id=self.server_id, reason=cut[0], kept=cut[1]
            )
            self._emit(EVENT_LISTING_CUT, reason=cut[0], kept=cut[1], pages=listing.pages)
        self.listing_cut = cut
        digest = listing_digest(invalid) if invalid else None
        if digest is not None and digest != listing_digest(self.invalid):
            records = [i.as_record() for i in invalid[:MAX_REPORTED_INVALID]]
            log.warning("upstream_tool_invalid", server_id=self.server_id, count=len(invalid))
            self._emit(EVENT_TOOL_INVALID, count=len(invalid), definitions=records)
        self.invalid = invalid

    def _emit(self, event: str, **fields: Any) -> None:
        call_id = new_id()
        record: dict[str, Any] = {
            "v": AUDIT_SCHEMA_VERSION,
            "event": event,
            "tool_call_id": call_id,
            "correlation_id": call_id,
            "tool": fields.pop("upstream_tool", None) or "(server)",
            "server_id": self.server_id,
        }
        record.update({k: v for k, v in fields.items() if v is not None})
        record["ts"] = utc_timestamp()
        if self.audit is None:
            return
        try:
            self.audit.emit(AuditEvent.from_record(record))
        except Exception:  # noqa: BLE001 - the audit log reports its own failures
            log.warning("upstream_audit_failed", server_id=self.server_id, event=event)


def screened(
    listing: Listing,
) -> tuple[dict[str, dict[str, Any]], list[InvalidDefinition], dict[str, str]]:
    """(Worker thread: one huge listing never holds the event loop for its screening
    and hashing.) The valid definitions, the skipped ones, and the digests the valid
    ones are pinned by."""
    definitions, invalid = screen(listing.wire, listing.canonical)
    # The bytes each definition is pinned by were made once, when the page was taken
    # (valid names are unique: a name listed twice is skipped).
    pinned_bytes = {
        wire.get("name"): body for wire, body in zip(listing.wire, listing.canonical, strict=True)
    }
    digests = {name: sha256_hex(pinned_bytes[name]) for name in definitions}
    return definitions, invalid, digests


def mtime_ns(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


__all__ = [
    "EVENT_UPSTREAM_DOWN",
    "EVENT_UPSTREAM_UP",
    "PinnedTools",
    "ServerState",
    "mtime_ns",
    "screened",
]
