"""Upstream MCP servers as tool providers (seed 002's MCP tool provider; DESIGN.md, Gateway).

This module holds ``UpstreamServer``; its sessions are in ``sessions.py``, its
tools and the FastMCP provider in ``upstream_tools.py``.

One ``UpstreamServer`` per configured upstream. It owns the connections to that server and
decides which of its tools callers may see; the chain decides who may call them, exactly
as for native tools. Its ``UpstreamTool`` objects are ordinary FastMCP tools whose ``run``
is the connector (DESIGN.md step 9) for an upstream call: the same connector checks as
``@nexus_tool`` (classification and documents against the same loaded registry object),
then the bytes go upstream.

What FastMCP provides is used as is: its ``Client`` and transports (stdio subprocess,
streamable HTTP, ``httpx`` for mutual TLS) and its ``Provider`` extension point. What it
is *not* used for is the forwarding itself: FastMCP's ``ProxyTool`` opens a backend
session per request, forwards the caller's ``_meta`` and, through ``ProxyClient``, the
caller's HTTP headers (FASTMCP4_GUIDE section 7). Here:

- sessions are reused per (principal, server), never shared between principals (unless
  the server is configured ``shared: true``: stateless servers only), closed when idle,
  capped per server;
- nothing the caller sent travels upstream but the tool's arguments: no header (the
  client transport is built without ``forward_incoming_headers``), no ``_meta`` except
  the identity fields the configuration names, never a credential;
- upstream failures become ``UPSTREAM_ERROR`` with a fixed message; an upstream's own
  ``isError`` result is that tool's result, without its ``structuredContent``;
- every tool definition is pinned (``policy/pins.py``): on connect and on every list
  refresh (``notifications/tools/list_changed`` included), on every session, a tool whose
  definition differs from its pin, or has none, is quarantined and audited;
- the evidence (every digest any session showed for a tool) is a ``SeenDigests``
  (``policy/quarantine.py``): process memory, or on the shared backend a Redis set every
  replica adds to and reads, so a rug pull one replica sees quarantines the tool on all
  of them. On that backend every call first reads the tool's evidence (one round trip):
  a replica refuses a tool another one quarantined at the moment of the call, and an
  unreachable store refuses the call (``UNAVAILABLE``), never forwards it unverified.
  Every call also checks the lock file's mtime, so a new pin counts at once. On the
  embedded backend the evidence against a pin is also kept in the data directory
  (``PersistedEvidence``), read at start-up: a reverted definition stays quarantined
  across a restart until an operator re-pins the tool (a new stamp in the lock file
  makes every process forget that tool's evidence);
- listings are fair (issue 22, item 9): one listing of an upstream at a time (the
  ``_list_gate``), its CPU work (dumping, canonical JSON, sha256) in worker threads, a
  page at a time, and a verified listing shared: a session opened while one is in flight, or
  within ``recheck_seconds`` of the last, is verified by it instead of fetching its own;
- definitions are re-checked every ``recheck_seconds`` without any list_changed: on the
  gateway's own session and on the caller sessions in turn (one a round), so a silent
  change on an open session is found within a bounded time (item 15).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from fastmcp import Client
from mcp_types import ListToolsResult

from nexus_mcp.calls import CallState
from nexus_mcp.contracts import FinishedHook, ToolContract
from nexus_mcp.errors import UnavailableError
from nexus_mcp.ids import new_id
from nexus_mcp.observability.audit import AUDIT_SCHEMA_VERSION, AuditEvent, AuditLog, utc_timestamp
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.classification import DEV_MODE
from nexus_mcp.policy.hashing import sha256_hex
from nexus_mcp.policy.pins import (
    PinFile,
    PinState,
    definition_digest,
    load_pins,
    lock_path,
    renewed_pins,
)
from nexus_mcp.policy.quarantine import (
    STORE_UPSTREAM_QUARANTINE,
    MemorySeenDigests,
    Observation,
    PersistedEvidence,
    Proof,
    SeenDigests,
    proofs_in,
)
from nexus_mcp.policy.registry import RegistrySet
from nexus_mcp.policy.upstreams import ResolvedSecrets, UpstreamConfig, name_key
from nexus_mcp.principal import Principal
from nexus_mcp.providers.upstream.listing import (
    MAX_TOOLS_PER_UPSTREAM,
    InvalidDefinition,
    Listing,
    fetch_listing,
    listing_digest,
    screen,
)
from nexus_mcp.providers.upstream.sessions import (
    GATEWAY_SESSION,
    SessionKey,
    UpstreamFailure,
    UpstreamSession,
    build_client,
    caller_context,
    is_transport_failure,
    relay_failure,
)
from nexus_mcp.providers.upstream.tools import (
    UPSTREAM_TOOLSET_PREFIX,
    ConnectorHooks,
    ToolView,
    UpstreamTool,
)

log = get_logger(__name__)

MAX_RESULT_BYTES_DEFAULT = 10 * 1024 * 1024
MAX_REPORTED_INVALID = 50  # skipped definitions named (by position) in one audit event
# Observations kept to send once the shared evidence store answers again.
MAX_UNSENT_OBSERVATIONS = 16 * MAX_TOOLS_PER_UPSTREAM

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
Unsent = tuple[str, str, str | None]  # (tool, digest, pin) the shared store has not got yet


class UpstreamServer:
    """One upstream server: its sessions, its tools' pins and classification, its health."""

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        secrets: ResolvedSecrets,
        registry: RegistrySet,
        registry_dir: Path,
        mode: str,
        on_change: Callable[[UpstreamServer], None],
        max_result_bytes: int = MAX_RESULT_BYTES_DEFAULT,
        client_factory: Callable[[UpstreamServer, SessionKey], Client[Any]] | None = None,
        seen: SeenDigests | None = None,
    ) -> None:
        self.config = config
        self.server_id = config.server_id
        self.secrets = secrets
        self.registry = registry
        self.registry_dir = registry_dir
        self.mode = mode
        self.audit: AuditLog | None = None  # the server's audit log, set when bound
        self.on_change = on_change
        self.max_result_bytes = max_result_bytes
        self._client_factory = client_factory or build_client
        self.pins: PinFile = load_pins(registry_dir, config.server_id)
        self._note_pins()
        self._pins_mtime = _mtime(lock_path(registry_dir, config.server_id))
        self._pins_unreadable: float | None = None  # the mtime a reload failed at
        self.state: ServerState = "starting"
        self.last_failure: str | None = None
        self.views: dict[str, ToolView] = {}
        # The last listing's skipped definitions and cut (listing.py).
        self.invalid: list[InvalidDefinition] = []
        self.listing_cut: tuple[str, int] | None = None
        # Every digest any session showed for a tool under its pin: a tool is exposed
        # only while every one of them equals its pin (an upstream that shows one
        # principal, or one replica, another definition is quarantined for all).
        # ``_local``: this process's own copy (what it saw, and what it read from the
        # shared store); ``evidence``: the store every replica shares (``seen``), or the
        # local copy itself on the embedded backend.
        self._local = MemorySeenDigests()
        self.evidence: SeenDigests = seen if seen is not None else self._local
        self._unsent: set[Unsent] = set()
        self.tools: dict[str, UpstreamTool] = {}  # exposed name -> tool
        self.hooks: ConnectorHooks | None = None
        self.on_finished: FinishedHook | None = None  # serve --record (providers/fixtures.py)
        self._sessions: dict[SessionKey, UpstreamSession] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._key_locks: dict[SessionKey, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reconnect: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._first_attempt: asyncio.Event | None = None
        self._backoff = config.reconnect.initial_seconds
        self._refreshing: set[SessionKey] = set()
        self._refresh_again: set[SessionKey] = set()
        # ``name_key`` of every native tool name (the whole catalog, set by the gateway):
        # a tool that would be exposed under one of them never is.
        self.reserved_keys: frozenset[str] = frozenset()
        # Fair listings (module docstring): the gate, the listing in flight, when the
        # last one was verified (and under which lock file), and when each session was.
        self._list_gate: asyncio.Lock | None = None
        self._flight: asyncio.Task[None] | None = None
        self._verified: tuple[float, float | None] | None = None
        self._listed_at: dict[SessionKey, float] = {}
        self._verified_tools: list[Any] | None = None
        self._recheck: asyncio.Task[None] | None = None
        # Evidence kept across restarts (embedded backend), and what it already holds.
        self.persisted: PersistedEvidence | None = None
        self._kept: set[Proof] = set()

    # -- life cycle -------------------------------------------------------------------

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        # A new event loop (a test, a restart inside one process): sessions of the old
        # one cannot be used from this one; forget them (their loop closed them).
        self._loop = loop
        self._key_locks = {}
        self._sessions = {}
        self._tasks = set()
        self._reconnect = None
        self._probe = None
        self._reaper = None
        self._first_attempt = asyncio.Event()
        self._note_pins(logged=False)
        self._list_gate = asyncio.Lock()
        self._flight = None
        self._verified = None
        self._listed_at = {}
        self._reconnect = self._spawn(self._connect_gateway())
        self._reaper = self._spawn(self._reap())
        self._recheck = self._spawn(self._recheck_loop())

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self) -> None:
        self._bind_loop()

    @property
    def first_attempt_done(self) -> bool:
        return self._first_attempt is not None and self._first_attempt.is_set()

    async def wait_first_attempt(self, timeout: float) -> None:
        self._bind_loop()
        assert self._first_attempt is not None
        if self._first_attempt.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first_attempt.wait(), timeout)

    async def close(self) -> None:
        if self._loop is not asyncio.get_running_loop():
            return
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        sessions = list(self._sessions.values())
        self._sessions = {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    # -- sessions ---------------------------------------------------------------------

    def session_key(self, principal: Principal) -> SessionKey:
        if self.config.shared:
            return GATEWAY_SESSION
        return (
            "principal",
            principal.subject,
            principal.effective_role,
            principal.vault_id or "",
            principal.user_id or "",
        )

    async def _open(self, key: SessionKey) -> UpstreamSession:
        client = self._client_factory(self, key)
        session = UpstreamSession(key, client)
        session.task = self._spawn(session.run())
        try:
            await asyncio.wait_for(session.ready.wait(), self.config.timeouts.connect_seconds)
        except TimeoutError:
            await session.close()
            raise UpstreamFailure("unavailable", "connect_timeout") from None
        if not session.alive:
            raise UpstreamFailure("unavailable", "connect_failed")
        return session

    async def _session_for(self, key: SessionKey) -> UpstreamSession:
        self._bind_loop()
        session = self._sessions.get(key)
        if session is not None and session.alive:
            session.last_used = time.monotonic()
            return session
        # One lock per session key: a principal whose session is connecting never holds
        # up another principal, nor the gateway's own session.
        lock = self._key_locks.get(key)
        if lock is None:
            lock = self._key_locks[key] = asyncio.Lock()
        async with lock:
            session = self._sessions.get(key)
            if session is not None and session.alive:
                return session
            if session is not None:
                self._sessions.pop(key, None)
            if key != GATEWAY_SESSION:
                self._make_room()  # refuses at the cap; says nothing about the upstream
            try:
                session = await self._open(key)
                # Verify this session's tool definitions before it carries a call.
                await self._verify_new(session)
            except Exception as exc:  # an upstream's failure: typed, never its text
                if session is not None:
                    await session.close()
                self._connection_failed(key)
                if isinstance(exc, UpstreamFailure):
                    raise
                raise UpstreamFailure("unavailable", "connect_failed") from None
            self._sessions[key] = session
            if key == GATEWAY_SESSION:
                session.on_lost = self._gateway_lost
            return session

    def _connection_failed(self, key: SessionKey) -> None:
        """A connection failed: the gateway's own means the upstream is down; a caller's
        makes the gateway check its own (the upstream's health is the gateway's call)."""
        if key == GATEWAY_SESSION:
            self._degraded("connect_failed")
        elif self._probe is None or self._probe.done():
            self._probe = self._spawn(self._check_gateway())

    async def _check_gateway(self) -> None:
        gateway = self._sessions.get(GATEWAY_SESSION)
        if gateway is None or not gateway.alive:
            if self.state == "ready":
                self._degraded("connection_lost")
            return
        try:
            await asyncio.wait_for(gateway.client.ping(), self.config.timeouts.connect_seconds)
        except Exception:  # noqa: BLE001 - any failure: the session is gone
            await self._drop(gateway)
            self._degraded("connection_lost")

    def _gateway_lost(self) -> None:
        """The gateway's own session ended without being asked to (the process died, the
        connection dropped): the upstream is down until it reconnects."""
        self._sessions.pop(GATEWAY_SESSION, None)
        self._degraded("connection_lost")

    def _make_room(self) -> None:
        principals = [s for k, s in self._sessions.items() if k != GATEWAY_SESSION]
        if len(principals) < self.config.max_sessions:
            return
        idle = sorted((s for s in principals if s.busy == 0), key=lambda s: s.last_used)
        if not idle:
            raise UpstreamFailure("unavailable", "session_cap")
        victim = idle[0]
        self._sessions.pop(victim.key, None)
        self._spawn(victim.close())

    async def _drop(self, session: UpstreamSession) -> None:
        if self._sessions.get(session.key) is session:
            self._sessions.pop(session.key, None)
        await session.close()

    async def _reap(self) -> None:
        idle_after = self.config.idle_timeout_seconds
        interval = max(0.05, min(idle_after / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for key, session in list(self._sessions.items()):
                if key == GATEWAY_SESSION or session.busy:
                    continue
                if not session.alive or now - session.last_used > idle_after:
                    await self._drop(session)

    def session_count(self) -> int:
        return sum(1 for k, s in self._sessions.items() if k != GATEWAY_SESSION and s.alive)

    # -- health -----------------------------------------------------------------------

    async def _connect_gateway(self) -> None:
        """The gateway's own session: lists, pins and hears list_changed; reconnects with
        bounded exponential backoff and full jitter while the upstream is down."""
        while True:
            try:
                await self._session_for(GATEWAY_SESSION)
            except Exception:  # noqa: BLE001 - down, whatever the way: retried below
                self._degraded("connect_failed")
            else:
                self._up()
                if self._first_attempt is not None:
                    self._first_attempt.set()
                return
            if self._first_attempt is not None:
                self._first_attempt.set()
            delay = random.uniform(0, self._backoff)
            self._backoff = min(self._backoff * 2, self.config.reconnect.max_seconds)
            await asyncio.sleep(delay)

    def _degraded(self, reason: str) -> None:
        changed = self.state != "degraded"
        self.state = "degraded"
        self.last_failure = reason
        if changed:
            log.warning("upstream_degraded", server_id=self.server_id, reason=reason)
            self._emit(EVENT_UPSTREAM_DOWN, reason=reason)
            self.on_change(self)
        if self._loop is asyncio.get_running_loop() and (
            self._reconnect is None or self._reconnect.done()
        ):
            # One reconnection loop at a time (``_connect_gateway``), with its backoff.
            self._reconnect = self._spawn(self._connect_gateway())

    def _up(self) -> None:
        self._backoff = self.config.reconnect.initial_seconds
        if self.state != "ready":
            was = self.state
            self.state = "ready"
            self.last_failure = None
            if was == "degraded":
                log.info("upstream_recovered", server_id=self.server_id)
                self._emit(EVENT_UPSTREAM_UP)
            self.on_change(self)

    # -- tool definitions -------------------------------------------------------------

    def schedule_refresh(self, key: SessionKey) -> None:
        """``notifications/tools/list_changed`` from one session: list again on it.

        At most one listing per session runs at a time and at most one more is queued, so
        an upstream that floods notifications costs one tools/list after another, never
        a pile of them.
        """
        if self._loop is None:
            return

        async def refresh() -> None:
            while True:
                session = self._sessions.get(key)
                if session is not None and session.alive:
                    with contextlib.suppress(Exception):
                        await self._list_on(session, authoritative=key == GATEWAY_SESSION)
                if key not in self._refresh_again:
                    break
                self._refresh_again.discard(key)
            self._refreshing.discard(key)

        def start() -> None:
            if key in self._refreshing:
                self._refresh_again.add(key)
                return
            self._refreshing.add(key)
            self._spawn(refresh())

        self._loop.call_soon_threadsafe(start)

    async def _verify_new(self, session: UpstreamSession) -> None:
        """A new session's definitions, verified before it carries a call.

        The gateway's own session always lists (its list is the tool set). A caller's
        session is verified by the listing in flight, or by the last one while it is
        fresh (within ``recheck_seconds``, under the same lock file): N sessions opening
        at once cost one fetch and one verification, not N. Each open session is still
        listed in turn by the re-check, and whenever it says list_changed.
        """
        if session.key == GATEWAY_SESSION:
            # Its listing is authoritative: never a caller's flight; callers join its own.
            own = self._flight = self._spawn(self._list_on(session, authoritative=True))
            await asyncio.shield(own)
            return
        # Right after start-up, the gateway's own first listing (authoritative) is the
        # one to share: wait for it (bounded), rather than fetch a second one beside it.
        await self.wait_first_attempt(self.config.timeouts.connect_seconds)
        verified = self._verified
        if not (
            verified is not None
            and verified[1] == self._pins_mtime
            and time.monotonic() - verified[0] < self.config.recheck_seconds
        ):
            flight = self._flight
            mine = flight is None or flight.done()
            if mine:
                flight = self._flight = self._spawn(self._list_on(session, authoritative=False))
            assert flight is not None
            await asyncio.shield(flight)
            if mine:
                return  # the flight was this session's own listing
        self._prime(session)

    def _prime(self, session: UpstreamSession) -> None:
        """Hand a session verified by another's listing that listing's tools: the MCP
        SDK checks a result against the tool's output schema and, for a tool its session
        never listed, lists first (a whole fetch, outside the gate). Primed, it checks
        against the verified listing instead. ``_absorb_tool_listing`` is the SDK's own
        way to take a listing in; without it (another SDK), the SDK lists as before."""
        tools = self._verified_tools
        absorb = getattr(getattr(session.client, "session", None), "_absorb_tool_listing", None)
        if tools is None or absorb is None:
            return
        with contextlib.suppress(Exception):
            absorb(ListToolsResult(tools=list(tools)), complete=True)

    async def _list_on(self, session: UpstreamSession, *, authoritative: bool) -> None:
        """List on ``session`` and decide every tool again: one listing of this upstream
        at a time (its other listings wait here, other upstreams never do), fetched within
        the caps (``listing.py``), its CPU work in worker threads."""
        gate = self._list_gate
        assert gate is not None, "bound to a loop first"
        async with gate:
            try:
                listing = await asyncio.wait_for(
                    fetch_listing(session.client), self.config.timeouts.connect_seconds
                )
            except TimeoutError:
                raise UpstreamFailure("timeout", "list_timeout") from None
            except Exception:  # noqa: BLE001 - an upstream's failure, never its text
                raise UpstreamFailure("error", "list_failed") from None
            definitions, invalid, digests = await asyncio.to_thread(_screened, listing)
            if authoritative:
                self._report_listing(listing, invalid)
            await self._evaluate(definitions, authoritative=authoritative, digests=digests)
            if authoritative or self._verified_tools is None:
                self._verified_tools = listing.tools
            now = time.monotonic()
            self._listed_at[session.key] = now
            self._verified = (now, self._pins_mtime)

    async def _recheck_loop(self) -> None:
        """List again every ``recheck_seconds``, list_changed or not (module docstring)."""
        interval = self.config.recheck_seconds
        while True:
            await asyncio.sleep(interval)
            for session in self._due_for_recheck(interval):
                with contextlib.suppress(Exception):  # a failed listing decides nothing
                    await self._list_on(session, authoritative=session.key == GATEWAY_SESSION)

    def _due_for_recheck(self, interval: float) -> list[UpstreamSession]:
        """The gateway's session, and the caller session listed longest ago (one per
        round, so the work per round is bounded however many sessions are open)."""
        now = time.monotonic()
        alive = {k: s for k, s in self._sessions.items() if s.alive}
        self._listed_at = {k: t for k, t in self._listed_at.items() if k in alive}
        due = []
        gateway = alive.pop(GATEWAY_SESSION, None)
        if gateway is not None and now - self._listed_at.get(GATEWAY_SESSION, 0.0) >= interval:
            due.append(gateway)
        if alive:
            key = min(alive, key=lambda k: self._listed_at.get(k, 0.0))
            if now - self._listed_at.get(key, 0.0) >= interval:
                due.append(alive[key])
        return due

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

    def _reload_pins(self) -> bool:
        """Read the lock file again if its mtime changed (a stat otherwise); True when
        the pins were reloaded."""
        path = lock_path(self.registry_dir, self.server_id)
        mtime = _mtime(path)
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
        self._note_pins()
        return True

    def _note_pins(self, *, logged: bool = True) -> None:
        """A lock file, or entries of it, that could not be used (``policy/pins.py``):
        logged and audited by position; the tools it cannot vouch for are quarantined.
        (At construction the audit log is not bound yet: audited when started.)"""
        problems = self.pins.problems()
        if problems:
            if logged:
                log.warning("upstream_pins_invalid", server_id=self.server_id, problems=problems)
            self._emit(EVENT_PINS_INVALID, problems=problems)

    def _forget(self, tools: frozenset[str]) -> None:
        """Tools an operator re-pinned: this process forgets their evidence (the command
        cleared the persisted and shared copies first), then reads back what the persisted
        store still holds against them (nothing, unless it was not cleared)."""
        if not tools:
            return
        for tool in tools:
            self._local.forget(self.server_id, tool)
        self._unsent = {u for u in self._unsent if u[0] not in tools}
        self._kept = {k for k in self._kept if k[0] not in tools}
        if self.persisted is None:
            return
        try:
            proofs = [p for p in self.persisted.load(self.server_id) if p[0] in tools]
        except Exception:  # noqa: BLE001 - unreadable: the evidence in memory is gone
            log.warning("upstream_quarantine_unreadable", server_id=self.server_id)
            return
        self._remember(proofs)

    def use_persisted(self, persisted: PersistedEvidence) -> None:
        """Keep evidence against pins in ``persisted`` (embedded backend) and read back
        what it holds from before a restart; before start."""
        self.persisted = persisted
        self._remember(persisted.load(self.server_id))

    def _remember(self, proofs: list[Proof]) -> None:
        for tool, pinned, digest in proofs:
            self._local.add(self.server_id, tool, digest, pinned=pinned)
            self._kept.add((tool, pinned, digest))

    def _persist(self, seen: Mapping[str, Observation]) -> frozenset[Proof]:
        """(Worker thread.) Keep what this listing proved that is not kept yet; the proofs
        kept (none when the store failed: tried again at the next listing)."""
        persisted = self.persisted
        if persisted is None:
            return frozenset()
        new = proofs_in(seen) - self._kept
        if not new:
            return frozenset()
        try:
            persisted.record(self.server_id, new)
        except Exception:  # noqa: BLE001 - kept in memory: quarantined here all the same
            log.warning("upstream_quarantine_unpersisted", server_id=self.server_id)
            return frozenset()
        return new

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

    # -- quarantine evidence (policy/quarantine.py) ---------------------------------

    @property
    def shares_evidence(self) -> bool:
        """The evidence is another store than this process's own copy (shared backend)."""
        return self.evidence is not self._local

    async def _offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A network store is asked from a worker thread (a slow store never stalls the
        event loop); process memory is answered inline."""
        if isinstance(self.evidence, MemorySeenDigests):
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    def _send(
        self, seen: Mapping[str, Observation], unsent: frozenset[Unsent]
    ) -> tuple[dict[str, frozenset[str]] | None, frozenset[Unsent]]:
        """(Worker thread on the shared backend.) Add what could not be sent before
        (``unsent``) and ``seen`` to the shared evidence, read it back. None: the store
        did not answer."""
        if not self.shares_evidence:
            return None, frozenset()
        try:
            self._flush(unsent)
            return self.evidence.observe(self.server_id, seen), unsent
        except Exception:  # noqa: BLE001 - UnavailableError, or a store's own failure
            return None, frozenset()

    def _flush(self, unsent: frozenset[Unsent]) -> None:
        """Send observations in rounds of one per tool (one round trip each)."""
        rounds: list[dict[str, Observation]] = []
        for name, digest, pinned in sorted(unsent, key=lambda o: (o[0], o[1], o[2] or "")):
            free = next((r for r in rounds if name not in r), None)
            if free is None:
                free = {}
                rounds.append(free)
            free[name] = (digest, pinned)
        for batch in rounds:
            self.evidence.observe(self.server_id, batch)

    def _gather(
        self,
        seen: Mapping[str, Observation],
        sent: tuple[dict[str, frozenset[str]] | None, frozenset[Unsent]],
    ) -> dict[str, frozenset[str]]:
        """The evidence for each listed tool: this process's own, and the replicas'. When
        the shared store did not answer, this process's own (the observations are sent
        later; meanwhile every call of the server's tools reads the store, and fails
        closed while it cannot)."""
        shared, flushed = sent
        local = self._local.observe(self.server_id, seen)
        if not self.shares_evidence:
            return local
        self._unsent -= flushed
        if shared is None:
            log.warning("upstream_quarantine_unavailable", server_id=self.server_id)
            for name, (digest, pinned) in seen.items():
                if len(self._unsent) < MAX_UNSENT_OBSERVATIONS:
                    self._unsent.add((name, digest, pinned))
            return local
        gathered: dict[str, frozenset[str]] = {}
        for name, (_digest, pinned) in seen.items():
            theirs = shared.get(name, frozenset())
            self._local.merge(self.server_id, name, theirs, pinned=pinned)
            gathered[name] = local[name] | theirs
        return gathered

    def _read(self, name: str, pinned: str, unsent: frozenset[Unsent]) -> frozenset[str]:
        """(Worker thread.) Send what could not be sent before; read one tool's evidence.

        An exposed tool's own digest is its pin, and it was sent when listed: a set
        without it means the store lost its data (a Redis restart without persistence).
        This process then sends back what it knows against the pins now in force, so the
        other replicas learn it again (once: the set holds the pin afterwards)."""
        self._flush(unsent)
        seen = self.evidence.get(self.server_id, name, pinned=pinned)
        if pinned in seen:
            return seen
        self._flush(self._reseed(name, pinned))
        return self.evidence.get(self.server_id, name, pinned=pinned)

    def _reseed(self, name: str, pinned: str) -> frozenset[Unsent]:
        pins = self.pins.digests
        known = {(name, pinned, pinned)}
        for tool, pin, digests in self._local.entries(self.server_id):
            if pin is not None and pins.get(tool) == pin and any(d != pin for d in digests):
                known.update((tool, digest, pin) for digest in digests)
        return frozenset(known)

    def pins_stale(self) -> bool:
        """The lock file changed since it was read (one stat)."""
        mtime = _mtime(lock_path(self.registry_dir, self.server_id))
        return mtime != self._pins_mtime and mtime != self._pins_unreadable

    async def refresh_pins(self) -> None:
        """A rewritten lock file counts at once (a stat, unless it changed): at every
        lookup of an upstream tool, so a re-pinned (or newly pinned) tool comes back
        without waiting for a listing."""
        before = self.pins
        if not self._reload_pins():
            return
        gateway = self._sessions.get(GATEWAY_SESSION)
        if renewed_pins(before, self.pins) and gateway is not None and gateway.alive:
            # Re-pinned: decide on what the upstream shows now (the definitions the
            # operator reviewed), not on the last listing, which may predate a revert.
            with contextlib.suppress(Exception):
                await self._list_on(gateway, authoritative=True)
                return
        await self._evaluate({}, authoritative=False)

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

    # -- calls ------------------------------------------------------------------------

    def identity_meta(self, principal: Principal) -> dict[str, Any] | None:
        wanted = self.config.identity_meta
        meta: dict[str, Any] = {}
        if wanted.subject is not None:
            meta[wanted.subject] = principal.subject
        if wanted.role is not None:
            meta[wanted.role] = principal.effective_role
        return meta or None

    async def forward(
        self, state: CallState, upstream_name: str, arguments: dict[str, Any], retryable: bool
    ) -> Any:
        """Send one tools/call upstream on the caller's session; retries only reads, only
        transport failures, bounded in count and total time."""
        principal = state.principal
        assert principal is not None
        if self.state == "degraded" and (
            self._reconnect is not None and not self._reconnect.done()
        ):
            # Known down and waiting to reconnect: refuse at once, block nobody.
            raise UpstreamFailure("unavailable", "upstream_down")
        retry = self.config.retry
        attempts = retry.attempts if retryable else 1
        deadline = time.monotonic() + retry.max_total_seconds
        key = self.session_key(principal)
        meta = self.identity_meta(principal)
        for attempt in range(1, attempts + 1):
            try:
                return await self._call_once(key, upstream_name, arguments, meta)
            except UpstreamFailure as failure:
                last_try = attempt == attempts or time.monotonic() >= deadline
                if not failure.transport or last_try:
                    raise
                delay = retry.backoff_seconds * (2 ** (attempt - 1))
                delay = min(delay, max(0.0, deadline - time.monotonic()))
                await asyncio.sleep(random.uniform(0, delay))
        raise UpstreamFailure("unavailable", "retries_exhausted")  # pragma: no cover

    async def _call_once(
        self,
        key: SessionKey,
        upstream_name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None,
    ) -> Any:
        session = await self._session_for(key)
        session.busy += 1
        caller = caller_context() if self._relays else None
        if caller is not None:
            session.callers.append(caller)
        try:
            async with asyncio.timeout(self.config.timeouts.call_seconds):
                return await session.client.call_tool_mcp(upstream_name, arguments, meta=meta)
        except TimeoutError:
            raise UpstreamFailure("timeout", "call_timeout") from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified, never echoed
            if not session.alive or is_transport_failure(exc):
                await self._drop(session)
                self._connection_failed(key)
                raise UpstreamFailure("unavailable", "transport_failure") from None
            raise UpstreamFailure("error", "jsonrpc_error") from None
        finally:
            if caller is not None:
                session.callers.remove(caller)
            session.busy -= 1
            session.last_used = time.monotonic()

    # -- relays: an upstream's own requests to the caller (off unless configured) -----

    @property
    def _relays(self) -> bool:
        forward = self.config.forward
        return forward.sampling or forward.elicitation or forward.roots

    def _caller_for(self, key: SessionKey, kind: str) -> Any:
        """The caller to relay to: one whose call is in flight on this very session."""
        session = self._sessions.get(key)
        if session is None or not session.callers:
            raise RuntimeError(f"{kind} refused: no call of this session is in flight")
        ctx = session.callers[-1]
        log.info("upstream_request_relayed", server_id=self.server_id, kind=kind)
        return ctx

    async def relay_sampling(self, key: SessionKey, params: Any) -> Any:
        ctx = self._caller_for(key, "sampling")
        # The upstream's messages and limits only; never "include_context" (that would
        # hand it the caller's other servers' context) nor its free-form metadata.
        with relay_failure("sampling"):
            return await ctx.session.create_message(
                messages=list(params.messages),
                max_tokens=params.max_tokens,
                system_prompt=params.system_prompt,
                temperature=params.temperature,
                stop_sequences=params.stop_sequences,
                model_preferences=params.model_preferences,
                related_request_id=ctx.request_id,
            )

    async def relay_elicitation(self, key: SessionKey, params: Any) -> Any:
        ctx = self._caller_for(key, "elicitation")
        schema = getattr(params, "requested_schema", None)
        if schema is None:
            raise RuntimeError("elicitation refused: only form elicitation is relayed")
        with relay_failure("elicitation"):
            return await ctx.session.elicit_form(
                params.message, schema, related_request_id=ctx.request_id
            )

    async def relay_roots(self, key: SessionKey) -> list[Any]:
        ctx = self._caller_for(key, "roots")
        with relay_failure("roots"):
            listed = await ctx.session.list_roots()
        return list(listed.roots)

    def summary(self) -> dict[str, Any]:
        """For /readyz and ``upstream list``: state, tools, quarantine (names only)."""
        quarantined = [
            {"tool": v.upstream_name, "reason": v.reason}
            for v in sorted(self.views.values(), key=lambda v: v.upstream_name)
            if v.status == "quarantined"
        ]
        return {
            "state": self.state,
            "transport": self.config.transport,
            "tools": sorted(self.visible_tools()),
            "quarantined": quarantined,
            "unclassified": sorted(
                v.upstream_name for v in self.views.values() if v.status == "unclassified"
            ),
            "sessions": self.session_count(),
        }

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


def _screened(
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


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


__all__ = ["UpstreamServer"]
