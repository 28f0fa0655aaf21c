"""Upstream MCP servers as tool providers (seed 002's MCP tool provider; DESIGN.md, Gateway).

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
  definition differs from its pin, or has none, is quarantined and audited.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import ssl
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import httpx2
from fastmcp import Client
from fastmcp.client.messages import MessageHandler
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from fastmcp.exceptions import NotFoundError as FastMCPNotFoundError
from fastmcp.server.providers import Provider
from fastmcp.tools import Tool, ToolResult
from fastmcp.utilities.versions import VersionSpec
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import TextContent, ToolAnnotations

from nexus_mcp.audit import AUDIT_SCHEMA_VERSION, AuditEvent, AuditLog, utc_timestamp
from nexus_mcp.calls import META_TOOL_EFFECT, PLUMBING_ARGS, CallState, current_call
from nexus_mcp.decorator import ConnectorCheck, ConnectorRefusal, ToolContract
from nexus_mcp.errors import NexusError, UpstreamError
from nexus_mcp.ids import new_id
from nexus_mcp.logs import get_logger
from nexus_mcp.policy.classification import DEV_MODE
from nexus_mcp.policy.hashing import to_canonical_json
from nexus_mcp.policy.pins import PinFile, PinState, definition_digest, load_pins, lock_path
from nexus_mcp.policy.registry import RegistrySet, ToolEntry
from nexus_mcp.policy.upstreams import ResolvedSecrets, UpstreamConfig
from nexus_mcp.principal import Principal

log = get_logger(__name__)

UPSTREAM_TOOLSET_PREFIX = "upstream:"
GATEWAY_SESSION = ("__gateway__",)
SHARED_SESSION = ("__shared__",)
# How long the first tools/list after start-up may wait for upstreams still connecting
# (never for one known to be down): a desktop client lists once, right after starting.
FIRST_LIST_WAIT_SECONDS = 3.0
WARM_UP_WINDOW_SECONDS = 60.0
MAX_RESULT_BYTES_DEFAULT = 10 * 1024 * 1024
MAX_TOOLS_PER_UPSTREAM = 1000  # more are ignored, with a warning

EVENT_DEFINITION_CHANGED = "tool_definition_changed"
EVENT_UNPINNED = "tool_unpinned"
EVENT_UPSTREAM_DOWN = "upstream_down"
EVENT_UPSTREAM_UP = "upstream_up"

ServerState = Literal["starting", "ready", "degraded"]
SessionKey = tuple[str, ...]


class UpstreamFailure(Exception):
    """A failure of the upstream or the way to it; ``kind`` picks the fixed message."""

    def __init__(self, kind: Literal["unavailable", "timeout", "error"], reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason

    @property
    def transport(self) -> bool:
        return self.kind == "unavailable"

    def to_error(self) -> UpstreamError:
        message = {
            "unavailable": "Upstream unavailable",
            "timeout": "Upstream timeout",
            "error": "Upstream error",
        }[self.kind]
        return UpstreamError(message, outcome=f"upstream_{self.kind}", reason=self.reason)


@dataclass(frozen=True)
class ToolView:
    """What nexus decided about one tool an upstream lists."""

    upstream_name: str
    exposed_name: str | None
    definition: Mapping[str, Any]
    digest: str
    entry: ToolEntry | None  # registry classification; None: unclassified
    pin_state: PinState
    status: Literal["exposed", "quarantined", "unclassified", "not_allowed", "bad_name"]
    reason: str | None = None

    @property
    def tool_class(self) -> str:
        return self.entry.tool_class if self.entry is not None else "write"


class _ListChanged(MessageHandler):
    def __init__(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change

    async def on_tool_list_changed(self, message: Any) -> None:
        self._on_change()


@dataclass
class _Session:
    """One live MCP session to the upstream, run by its own task (anyio scopes are
    entered and left by the same task); calls are made from the callers' tasks."""

    key: SessionKey
    client: Client[Any]
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    failed: BaseException | None = None
    busy: int = 0
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False
    on_lost: Callable[[], None] | None = None
    # The FastMCP contexts of the callers whose calls are in flight on this session: an
    # upstream's sampling, elicitation or roots request is relayed to the latest (only
    # where the configuration allows it).
    callers: list[Any] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.ready.is_set() and not self.closed and self.failed is None

    async def run(self) -> None:
        try:
            async with self.client:
                self.ready.set()
                await self.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - recorded; the caller decides
            self.failed = exc
        finally:
            lost = not self.stop.is_set() and self.ready.is_set() and not self.closed
            self.closed = True
            self.ready.set()
            if lost and self.on_lost is not None:
                self.on_lost()

    async def close(self) -> None:
        self.closed = True
        self.stop.set()
        if self.task is not None and not self.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout=5.0)
            except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                self.task.cancel()


ConnectorHooks = tuple[
    list[ConnectorCheck],
    Callable[[ToolContract, CallState], Mapping[str, Any]],
    Callable[[ToolContract, CallState], None],
    Callable[[ToolContract, CallState], None],
]


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
        self._pins_mtime = _mtime(lock_path(registry_dir, config.server_id))
        self.state: ServerState = "starting"
        self.last_failure: str | None = None
        self.views: dict[str, ToolView] = {}
        # Every digest any session showed for a tool since start: a tool is exposed only
        # while every one of them equals its pin (an upstream that shows one principal
        # another definition is quarantined for all).
        self.seen: dict[str, set[str]] = {}
        self.tools: dict[str, UpstreamTool] = {}  # exposed name -> tool
        self.hooks: ConnectorHooks | None = None
        self._sessions: dict[SessionKey, _Session] = {}
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
        self._reconnect = self._spawn(self._connect_gateway())
        self._reaper = self._spawn(self._reap())

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

    async def _open(self, key: SessionKey) -> _Session:
        client = self._client_factory(self, key)
        session = _Session(key, client)
        session.task = self._spawn(session.run())
        try:
            await asyncio.wait_for(session.ready.wait(), self.config.timeouts.connect_seconds)
        except TimeoutError:
            await session.close()
            raise UpstreamFailure("unavailable", "connect_timeout") from None
        if not session.alive:
            raise UpstreamFailure("unavailable", "connect_failed")
        return session

    async def _session_for(self, key: SessionKey) -> _Session:
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
                # Verify this session's own tool definitions before it carries a call.
                await self._list_on(session, authoritative=key == GATEWAY_SESSION)
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

    async def _drop(self, session: _Session) -> None:
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
            except (UpstreamFailure, NexusError, Exception):  # noqa: BLE001
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

    @property
    def available(self) -> bool:
        return self.state == "ready"

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

    async def _list_on(self, session: _Session, *, authoritative: bool) -> None:
        try:
            listed = await asyncio.wait_for(
                session.client.list_tools(), self.config.timeouts.connect_seconds
            )
        except TimeoutError:
            raise UpstreamFailure("timeout", "list_timeout") from None
        except Exception:  # noqa: BLE001 - an upstream's failure, never its text
            raise UpstreamFailure("error", "list_failed") from None
        definitions = {}
        if len(listed) > MAX_TOOLS_PER_UPSTREAM:
            log.warning(
                "upstream_too_many_tools", server_id=self.server_id, kept=MAX_TOOLS_PER_UPSTREAM
            )
        for tool in listed[:MAX_TOOLS_PER_UPSTREAM]:
            wire = tool.model_dump(mode="json", by_alias=True, exclude_none=False)
            definitions[tool.name] = wire
        self.evaluate(definitions, authoritative=authoritative)

    def _reload_pins(self) -> None:
        path = lock_path(self.registry_dir, self.server_id)
        mtime = _mtime(path)
        if mtime != self._pins_mtime:
            try:
                self.pins = load_pins(self.registry_dir, self.server_id)
                self._pins_mtime = mtime
            except Exception:  # noqa: BLE001 - keep the old pins; say so
                log.warning("upstream_pins_unreadable", server_id=self.server_id)

    def evaluate(
        self, definitions: Mapping[str, Mapping[str, Any]], *, authoritative: bool = True
    ) -> None:
        """Decide every listed tool (allowlist, name, registry, pin) and publish the result.

        The gateway's own session is authoritative: its list is the upstream's tool set. A
        caller's session can only add evidence: a definition it shows that differs from
        the pin quarantines that tool for everyone; what it adds or leaves out is ignored.
        """
        self._reload_pins()
        if not authoritative:
            definitions = {
                name: definitions.get(name, view.definition) for name, view in self.views.items()
            }
        views: dict[str, ToolView] = {}
        for name, definition in definitions.items():
            digest = definition_digest(definition)
            seen = self.seen.setdefault(name, set())
            if len(seen) < 16:
                seen.add(digest)
            views[name] = self._view(name, definition, digest, seen)
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
                self._emit(
                    event,
                    upstream_tool=name,
                    pinned_sha256=self.pins.digests.get(name),
                    seen_sha256=view.digest,
                )
            elif view.status == "exposed" and view.pin_state is not PinState.PINNED:
                log.warning("upstream_tool_unpinned_dev", server_id=self.server_id, tool=name)
            if view.status == "unclassified":
                log.warning("upstream_tool_unclassified", server_id=self.server_id, tool=name)
        self._publish()

    def _view(
        self, name: str, definition: Mapping[str, Any], digest: str, seen: set[str]
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
        if entry is None and self.mode != DEV_MODE:
            return view("unclassified", "TOOL_UNCLASSIFIED_DENIED")
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
        caller = _caller_context() if self._relays else None
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
            if not session.alive or _is_transport_failure(exc):
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
        with _relay_failure("sampling"):
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
        with _relay_failure("elicitation"):
            return await ctx.session.elicit_form(
                params.message, schema, related_request_id=ctx.request_id
            )

    async def relay_roots(self, key: SessionKey) -> list[Any]:
        ctx = self._caller_for(key, "roots")
        with _relay_failure("roots"):
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


@contextlib.contextmanager
def _relay_failure(kind: str) -> Iterator[None]:
    """What the upstream learns when the caller cannot answer: that, and nothing of why.

    Sampling, elicitation and roots are the handshake era's (the 2026-07-28 era has no
    back-channel for them); the SDK's deprecation warning says so on every relay.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            yield
    except Exception:  # noqa: BLE001 - never the caller's error text
        raise RuntimeError(f"{kind} is not available") from None


@dataclass(frozen=True)
class _Caller:
    """The caller's MCP session and the id of its tools/call, taken in the caller's task
    (FastMCP's context finds the session through the request being served, which the
    upstream's relay request, arriving on another task, is not)."""

    session: Any
    request_id: Any


def _caller_context() -> _Caller | None:
    """The caller of the tools/call being served, when there is one with a session."""
    from fastmcp.server.dependencies import get_context

    try:
        ctx = get_context()
        return _Caller(ctx.session, ctx.request_id)
    except Exception:  # noqa: BLE001 - no request, or no session: nothing to relay to
        return None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _is_transport_failure(exc: BaseException) -> bool:
    import anyio

    transport_errors: tuple[type[BaseException], ...] = (
        anyio.ClosedResourceError,
        anyio.BrokenResourceError,
        anyio.EndOfStream,
        ConnectionError,
        OSError,
        httpx2.TransportError,
    )
    if isinstance(exc, transport_errors):
        return True
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    # The SDK reports a closed connection as an MCP error with code -32000 or CONNECTION_CLOSED
    return code in (-32000,) and "closed" in str(getattr(error, "message", "")).lower()


def build_client(server: UpstreamServer, key: SessionKey) -> Client[Any]:
    """A FastMCP client for one session, with only the gateway's own credentials.

    Sampling, elicitation and roots handlers are installed only where the upstream's
    ``forward`` section allows them; otherwise the client does not advertise them and the
    SDK refuses an upstream's request for them. An allowed request is relayed only to the
    caller whose call is in flight on this very session (``_caller_for``).
    """
    config = server.config
    handler = _ListChanged(lambda: server.schedule_refresh(key))
    transport: StdioTransport | StreamableHttpTransport
    if config.transport == "stdio":
        env = dict(config.env)
        env.update({k: v.get_secret_value() for k, v in server.secrets.env.items()})
        # The SDK starts the subprocess with a small default environment (PATH, HOME,
        # ...) plus ``env``: nothing of nexus's own environment (its secrets) is inherited.
        transport = StdioTransport(
            command=str(config.command),
            args=list(config.args),
            env=env,
            cwd=str(config.cwd) if config.cwd is not None else None,
            keep_alive=False,
            log_file=Path(os.devnull),
        )
    else:
        headers = {k: v.get_secret_value() for k, v in server.secrets.headers.items()}
        creds = config.credentials
        verify: ssl.SSLContext | bool = True
        if creds.type == "mtls" or creds.ca_file is not None:
            context = ssl.create_default_context(
                cafile=str(creds.ca_file) if creds.ca_file is not None else None
            )
            if creds.type == "mtls":
                assert creds.cert_file is not None and creds.key_file is not None
                context.load_cert_chain(str(creds.cert_file), str(creds.key_file))
            verify = context

        def factory(**kwargs: Any) -> httpx2.AsyncClient:
            # Exactly the headers given here: the caller's are never merged in
            # (forward_incoming_headers stays off), and redirects are not followed,
            # so a credential never leaves for another origin.
            kwargs["follow_redirects"] = False
            kwargs["verify"] = verify
            return httpx2.AsyncClient(**kwargs)

        transport = StreamableHttpTransport(
            str(config.url), headers=headers, httpx_client_factory=cast(Any, factory)
        )
    forward = config.forward
    relays: dict[str, Any] = {}
    if forward.sampling:

        async def sampling(_messages: Any, params: Any, _context: Any) -> Any:
            return await server.relay_sampling(key, params)

        relays["sampling_handler"] = sampling
    if forward.elicitation:

        async def elicitation(_message: Any, _type: Any, params: Any, _context: Any) -> Any:
            return await server.relay_elicitation(key, params)

        relays["elicitation_handler"] = elicitation
    if forward.roots:

        async def roots(_context: Any) -> list[Any]:
            return await server.relay_roots(key)

        relays["roots"] = roots
    return Client(
        transport,
        name=f"nexus-mcp/{config.server_id}",
        message_handler=handler,
        **relays,
        mode="legacy",  # the handshake era: one session that lasts, as reuse needs
        timeout=config.timeouts.call_seconds,
        init_timeout=config.timeouts.connect_seconds,
    )


class UpstreamTool(Tool):
    """An upstream tool as FastMCP holds it; ``run`` is the connector of an upstream call."""

    _server: Any = None
    _view: Any = None

    @classmethod
    def for_view(cls, server: UpstreamServer, view: ToolView) -> UpstreamTool:
        definition = view.definition
        annotations = definition.get("annotations")
        tool = cls(
            name=view.exposed_name or view.upstream_name,
            title=definition.get("title"),
            description=definition.get("description"),
            parameters=definition.get("inputSchema") or {"type": "object"},
            output_schema=definition.get("outputSchema"),
            annotations=ToolAnnotations(**_annotations_for(view, annotations)),
            meta={
                "nexus": {
                    "server_id": server.server_id,
                    "upstream_tool": view.upstream_name,
                    "risk": view.tool_class,
                    "sha256": view.digest,
                }
            },
            tags={UPSTREAM_TOOLSET_PREFIX + server.server_id},
        )
        tool._server = server
        tool._view = view
        return tool

    @property
    def view(self) -> ToolView:
        return self._view  # type: ignore[no-any-return]

    @view.setter
    def view(self, value: ToolView) -> None:
        self._view = value

    async def run(self, arguments: dict[str, Any], context: Any = None) -> ToolResult:
        server: UpstreamServer = self._server
        view: ToolView = self._view
        state = current_call()
        current = server.visible_tools().get(self.name)
        if state is None or state.principal is None or current is not self:
            # Reached without the chain, or quarantined since it was looked up: the
            # answer a hidden or missing tool gets.
            raise FastMCPNotFoundError(f"Unknown tool: {self.name!r}")
        hooks = server.hooks
        assert hooks is not None, "the composition root binds the connector hooks"
        checks, build_effect, on_started, before_run = hooks
        contract = server.contract_for(view)
        try:
            for check in checks:
                check.before(contract, state, arguments)
            before_run(contract, state)
            state.executed = True
            on_started(contract, state)
            try:
                raw = await server.forward(
                    state,
                    view.upstream_name,
                    _upstream_arguments(arguments, view),
                    retryable=state.tool_class == "read",
                )
            except UpstreamFailure as failure:
                raise failure.to_error() from None
            result = _to_result(raw, server.max_result_bytes)
            if not result.is_error:
                for check in checks:
                    check.after(contract, state, result.document)
            effect = build_effect(contract, state)
        except NexusError as exc:
            raise ConnectorRefusal(exc) from exc
        state.effect = effect
        if result.is_error:
            return ToolResult(
                content=result.content, meta={META_TOOL_EFFECT: dict(effect)}, is_error=True
            )
        return ToolResult(
            content=result.content,
            structured_content=result.structured,
            meta={META_TOOL_EFFECT: dict(effect)},
        )


def _upstream_arguments(arguments: dict[str, Any], view: ToolView) -> dict[str, Any]:
    """The arguments the upstream gets: nexus's call plumbing (idempotency key, approval
    token) stays here, unless the upstream's own schema declares such an argument."""
    schema = view.definition.get("inputSchema")
    declared = schema.get("properties") if isinstance(schema, Mapping) else None
    own = set(declared) if isinstance(declared, Mapping) else set()
    if not (PLUMBING_ARGS & arguments.keys()):
        return arguments
    return {k: v for k, v in arguments.items() if k not in PLUMBING_ARGS or k in own}


def _annotations_for(view: ToolView, annotations: Any) -> dict[str, Any]:
    """The upstream's hints, except the ones nexus decides: read-only only when the
    registry says read; never idempotent or non-destructive on the upstream's word."""
    hints = dict(annotations) if isinstance(annotations, Mapping) else {}
    allowed = {k: v for k, v in hints.items() if k in ("title", "openWorldHint")}
    read = view.tool_class == "read"
    allowed["readOnlyHint"] = read
    allowed["destructiveHint"] = not read
    allowed["idempotentHint"] = read
    return allowed


@dataclass(frozen=True)
class _Result:
    content: list[Any]
    structured: dict[str, Any] | None
    is_error: bool

    @property
    def document(self) -> dict[str, Any]:
        """What the registry's read pointers resolve in for an upstream tool: the result
        object (``/structuredContent/...``, ``/content/0/text``)."""
        return {
            "content": [
                c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in self.content
            ],
            "structuredContent": self.structured,
        }


def _to_result(raw: Any, max_bytes: int) -> _Result:
    """The upstream's CallToolResult, checked for shape and size (never echoed).

    The size is that of the content blocks and ``structuredContent`` as JSON, whatever
    their kind (text, images, embedded resources); over ``limits.max_read_bytes`` the
    result is refused, never truncated.
    """
    try:
        content = list(raw.content or [])
        structured = raw.structured_content
        is_error = bool(raw.is_error)
        if structured is not None and not isinstance(structured, dict):
            raise TypeError("structuredContent is not an object")
        dumped = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in content]
        size = len(to_canonical_json([dumped, structured]))
    except Exception:  # noqa: BLE001 - an upstream's malformed answer, never echoed
        raise UpstreamFailure("error", "bad_result").to_error() from None
    if size > max_bytes:
        raise UpstreamFailure("error", "result_too_large").to_error()
    if is_error:
        # Its text is the tool's output, like a native tool's; an error result carries
        # no structuredContent (DESIGN.md, Error envelope).
        content = [c for c in content if isinstance(c, TextContent)] or [
            TextContent(type="text", text="")
        ]
        return _Result(content, None, True)
    return _Result(content, structured, False)


class UpstreamProvider(Provider):
    """FastMCP's ``Provider`` for every upstream's exposed tools (one enforcement path:
    the server's middleware chain runs for these tools exactly as for native ones)."""

    # Its names never collide with the local provider's (``server.py`` refuses a prefix
    # that could), so the ToolIndex may answer native lookups without asking it.
    disjoint_from_local = True

    def __init__(self, servers: Iterable[UpstreamServer]) -> None:
        super().__init__()
        self.servers = list(servers)
        self._started = time.monotonic()
        self._warm = False

    async def start(self) -> None:
        for server in self.servers:
            await server.start()

    async def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                await server.close()

    def warming(self) -> bool:
        """True while some upstream is on its first connection, within the start-up window
        (or this event loop has not started the upstreams yet)."""
        if self._warm:
            return False
        loop = asyncio.get_running_loop()
        if any(server._loop is not loop for server in self.servers):
            return True
        if time.monotonic() - self._started > WARM_UP_WINDOW_SECONDS or all(
            server.first_attempt_done for server in self.servers
        ):
            self._warm = True
            return False
        return True

    async def warm_up(self) -> None:
        """Right after start-up, let upstreams still on their first connection finish it,
        together, for at most ``FIRST_LIST_WAIT_SECONDS``: a client lists (or calls) once,
        right after it starts the server. A server known to be down is never waited for,
        and after the window nothing ever waits here."""
        if not self.warming():
            return
        await asyncio.gather(*(s.wait_first_attempt(FIRST_LIST_WAIT_SECONDS) for s in self.servers))

    async def _list_tools(self) -> list[Tool]:
        await self.warm_up()
        tools: list[Tool] = []
        for server in self.servers:
            server._bind_loop()
            tools.extend(server.visible_tools().values())
        return tools

    async def _get_tool(self, name: str, version: VersionSpec | None = None) -> Tool | None:
        for server in self.servers:
            server._bind_loop()
            tool = server.visible_tools().get(name)
            if tool is not None:
                return tool
        return None


__all__ = [
    "UPSTREAM_TOOLSET_PREFIX",
    "ToolView",
    "UpstreamFailure",
    "UpstreamProvider",
    "UpstreamServer",
    "UpstreamTool",
    "build_client",
]
