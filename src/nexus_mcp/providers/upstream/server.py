"""Upstream MCP servers as tool providers (seed 002's MCP tool provider; DESIGN.md, Gateway).

This module holds ``UpstreamServer``: its sessions, health, listings and calls. It is
built on ``pinning.py`` (what its tools are: pins, decisions, the tools published) and
``evidence.py`` (the quarantine evidence, kept and shared); its sessions are in
``sessions.py``, its tools in ``tools.py``, the FastMCP provider in ``provider.py``.

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
  the identity fields the configuration names, never a credential; where the upstream
  needs the caller's identity, a credential obtained for that caller (``credentials.py``);
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
- listings are fair (issue 22, item 9; issue 29): one listing of an upstream at a time
  (the ``_list_gate``); its CPU work on the event loop paced (``pacing.py``: parsing a
  large message, validating, dumping and measuring, a definition at a time, 2 ms of work
  then 2 ms for other callers; a worker thread would hold the GIL the loop needs),
  screening and sha256 in a worker thread (the collector's full collections over what
  it leaves alive are not avoided: ``pacing.py``); and a verified listing shared: a session opened
  while one is in flight, or within ``recheck_seconds`` of the last, is verified by it
  instead of fetching its own;
- definitions are re-checked every ``recheck_seconds`` without any list_changed: on the
  gateway's own session and on the caller sessions in turn (one a round), so a silent
  change on an open session is found within a bounded time (item 15).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastmcp import Client
from mcp_types import ListToolsResult
from pydantic import SecretStr

from nexus_mcp.connector import Connector
from nexus_mcp.observability.audit import AuditLog
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.pins import (
    PinFile,
    load_pins,
    lock_path,
    renewed_items,
    renewed_pins,
)
from nexus_mcp.policy.quarantine import (
    MemorySeenDigests,
    PersistedEvidence,
    Proof,
    SeenDigests,
)
from nexus_mcp.policy.registry import RegistrySet
from nexus_mcp.policy.sandbox import SandboxLaunch, isolation
from nexus_mcp.policy.upstreams import ResolvedSecrets, UpstreamConfig
from nexus_mcp.principal import Principal
from nexus_mcp.providers.upstream.catalog import UpstreamCatalog
from nexus_mcp.providers.upstream.credentials import CallerCredentials
from nexus_mcp.providers.upstream.evidence import Unsent
from nexus_mcp.providers.upstream.forwarding import Forwarding
from nexus_mcp.providers.upstream.listing import (
    InvalidDefinition,
    fetch_listing,
)
from nexus_mcp.providers.upstream.pinning import (
    EVENT_UPSTREAM_DOWN,
    EVENT_UPSTREAM_UP,
    PinnedTools,
    ServerState,
    mtime_ns,
    screened,
)
from nexus_mcp.providers.upstream.sessions import (
    GATEWAY_SESSION,
    SessionKey,
    UpstreamFailure,
    UpstreamSession,
    build_client,
)
from nexus_mcp.providers.upstream.tools import (
    ToolView,
    UpstreamTool,
)

log = get_logger(__name__)

MAX_RESULT_BYTES_DEFAULT = 10 * 1024 * 1024


class UpstreamServer(PinnedTools, CallerCredentials, Forwarding):
    """One upstream server: its sessions, its tools' pins and classification, its health."""

    sandbox: SandboxLaunch | None = None  # a sandboxed stdio upstream (set once, at build)

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
        client_factory: Callable[..., Client[Any]] | None = None,
        seen: SeenDigests | None = None,
        connector: Connector | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        """``connector``: the one connector sequence its tools' calls run through (None:
        a server that only lists, as ``upstream inspect``; its tools refuse every call).
        ``audit``: the server's audit log (quarantine and pin events)."""
        self.config = config
        self.server_id = config.server_id
        self.secrets = secrets
        self.setup_credentials(secrets)  # per-caller credentials (credentials.py)
        self.registry = registry
        self.registry_dir = registry_dir
        self.mode = mode
        self.audit = audit
        self.on_change = on_change
        # A subscribed resource's update on one session (``subscriptions.py``).
        self.on_resource_updated: Callable[[UpstreamServer, SessionKey, str], None] | None = None
        self.max_result_bytes = max_result_bytes
        self._client_factory = client_factory or build_client
        self.pins: PinFile = load_pins(registry_dir, config.server_id)
        # Audited when started (``_note_pins(logged=False)``), as when the audit log was
        # bound after construction: one event per start, not one more per build.
        self._note_pins(audited=False)
        self._pins_mtime = mtime_ns(lock_path(registry_dir, config.server_id))
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
        self.connector = connector
        self._sessions: dict[SessionKey, UpstreamSession] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._key_locks: dict[SessionKey, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reconnect: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
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
        # Its prompts, resources and resource templates (``catalog.py``).
        self.catalog = UpstreamCatalog(self)

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
        self._first_attempt = asyncio.Event()
        self._note_pins(logged=False)
        self._list_gate = asyncio.Lock()
        self._flight = None
        self._verified = None
        self._listed_at = {}
        self._reconnect = self._spawn(self._connect_gateway())
        self._spawn(self._reap())  # held in _tasks until it ends
        self._recheck = self._spawn(self._recheck_loop())

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self) -> None:
        self._bind_loop()

    def bound_here(self) -> bool:
        """Its sessions live on the running event loop (where it may list and refresh)."""
        return self._loop is not None and self._loop is asyncio.get_running_loop()

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

    async def _open(self, key: SessionKey, credential: SecretStr | None) -> UpstreamSession:
        client = self._client_factory(self, key, credential)
        session = UpstreamSession(key, client, credential)
        session.task = self._spawn(session.run())
        try:
            await asyncio.wait_for(session.ready.wait(), self.config.timeouts.connect_seconds)
        except TimeoutError:
            await session.close()
            raise UpstreamFailure("unavailable", "connect_timeout") from None
        if not session.alive:
            raise UpstreamFailure("unavailable", "connect_failed")
        return session

    async def _session_for(
        self, key: SessionKey, credential: SecretStr | None = None
    ) -> UpstreamSession:
        self._bind_loop()
        session = self._sessions.get(key)
        if session is not None and session.alive and self.fits(session, credential):
            session.last_used = time.monotonic()
            return session
        # One lock per session key: a principal whose session is connecting never holds
        # up another principal, nor the gateway's own session.
        lock = self._key_locks.get(key)
        if lock is None:
            lock = self._key_locks[key] = asyncio.Lock()
        async with lock:
            session = self._sessions.get(key)
            if session is not None and session.alive and self.fits(session, credential):
                return session
            if session is not None:
                self._sessions.pop(key, None)
                self.retire(session)  # dead, or its caller's credential was renewed
            if key != GATEWAY_SESSION:
                self._make_room()  # refuses at the cap; says nothing about the upstream
            try:
                session = await self._open(key, credential)
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
        idle = sorted(
            (s for s in principals if s.busy == 0 and not s.subscribed), key=lambda s: s.last_used
        )
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
                if key == GATEWAY_SESSION or session.busy or session.subscribed:
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

    def resource_updated(self, key: SessionKey, uri: str) -> None:
        if self.on_resource_updated is not None:
            self.on_resource_updated(self, key, uri)

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
            definitions, invalid, digests = await asyncio.to_thread(screened, listing)
            if authoritative:
                self._report_listing(listing, invalid)
            await self._evaluate(definitions, authoritative=authoritative, digests=digests)
            await self.catalog.list_on(session, authoritative=authoritative)
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

    async def refresh_pins(self) -> None:
        """A rewritten lock file counts at once (a stat, unless it changed): at every
        lookup of an upstream tool, so a re-pinned (or newly pinned) tool comes back
        without waiting for a listing."""
        before = self.pins
        if not self._reload_pins():
            return
        gateway = self._sessions.get(GATEWAY_SESSION)
        renewed = renewed_pins(before, self.pins) or renewed_items(before, self.pins)
        if renewed and gateway is not None and gateway.alive:
            # Re-pinned (a tool, or a prompt, resource template or resource): decide on
            # what the upstream shows now (the definitions the operator reviewed), not on
            # the last listing, which may predate the change or a revert.
            with contextlib.suppress(Exception):
                await self._list_on(gateway, authoritative=True)
                return
        await self._evaluate({}, authoritative=False)

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
            "isolation": isolation(self.config.transport, self.sandbox),
            "tools": sorted(self.visible_tools()),
            "quarantined": quarantined,
            "unclassified": sorted(
                v.upstream_name for v in self.views.values() if v.status == "unclassified"
            ),
            "sessions": self.session_count(),
            **self.catalog.summary(),
        }


__all__ = ["UpstreamServer"]
