"""List-changed notifications to the connected callers whose visible lists changed.

Which callers are connected: every request of a handshake-era connection (2025-11-25 and
before: one MCP session that lasts, with a channel the server may speak on) is seen by
the identity layer, which calls ``track`` with the connection and its principal. The
connection is held weakly (a closed one drops out, and its teardown forgets it at once),
at most ``MAX_SESSIONS`` of them (the oldest is forgotten first; a listen stream forgotten
so ends, and its client listens again).

When something changes (an upstream's tools, prompts or resources are listed anew, are
quarantined, go down or come back; a grant changes through this server, another replica,
or the grants store's revision moves), ``changed`` starts one round after
``DEBOUNCE_SECONDS``, so a burst of changes is one round. A round lists what the server
has (once), then for every connection computes the fingerprints of what its principal may
see (``policy/notifications.py``: the namespace's own rules) and compares them with those
it was last told; then every connection owed something is sent, each in a task of its
own and all at once: ``notifications/tools/list_changed``, ``.../prompts/...``,
``.../resources/...``, each without params. A caller with nothing changed is sent
nothing; the time of a send never depends on another caller's grants.

The 2026-07-28 era has no lasting session: change notifications reach such a client only
through a ``subscriptions/listen`` stream (``server/listen.py``), which registers itself
here for its principal as a connection does; its requests are not tracked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nexus_mcp.identity.access import GrantedTools
from nexus_mcp.identity.resolver import MODERN_PROTOCOL
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.notifications import (
    LIST_CHANGED_METHODS,
    Existing,
    Fingerprints,
    Granted,
    changed_kinds,
    visible_fingerprints,
)
from nexus_mcp.principal import Principal

log = get_logger(__name__)

DEBOUNCE_SECONDS = 0.15
MAX_SESSIONS = 10_000
REVISION_POLL_SECONDS = 1.0
SEND_TIMEOUT_SECONDS = 5.0


def _visibility_key(principal: Principal) -> tuple[Any, ...]:
    return (
        principal.subject,
        principal.profile,
        principal.effective_role,
        principal.read_only,
        principal.scopes,
    )


@dataclass
class _Session:
    connection: weakref.ReferenceType[Any]
    principal: Principal
    key: tuple[Any, ...]
    told: Fingerprints | None = None


def connection_of(ctx: Any) -> Any:
    """The lasting connection behind a FastMCP context (handshake era only), or None.

    The MCP SDK builds a ``ServerSession`` per request; the connection it speaks through
    is the one object a session keeps for its whole life."""
    request = getattr(ctx, "request_context", None) if ctx is not None else None
    session = getattr(request, "session", None)
    connection = getattr(session, "_connection", None)
    if connection is None or getattr(connection, "protocol_version", MODERN_PROTOCOL) == (
        MODERN_PROTOCOL
    ):
        return None
    if not getattr(connection, "has_standalone_channel", False):
        return None
    return connection


def _forgotten(connection: Any) -> None:
    """A connection forgotten to make room is told so when it can be (a listen stream then
    ends, and its client listens again), rather than left acknowledged but never told."""
    hook = getattr(connection, "forgotten", None)
    if hook is not None:
        with contextlib.suppress(Exception):
            hook()


class ChangeNotifier:
    """The registry of live caller connections and the rounds that notify them."""

    def __init__(
        self,
        access: GrantedTools,
        *,
        zone: str,
        poll_revision: bool,
        debounce_seconds: float = DEBOUNCE_SECONDS,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self._mcp: Callable[[], Any] = lambda: None
        self.access = access
        self.zone = zone
        self.poll_revision = poll_revision
        self.debounce_seconds = debounce_seconds
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, _Session] = OrderedDict()
        self._existing: Existing | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._round: asyncio.Task[None] | None = None
        self._again = False
        self._watch: asyncio.Task[None] | None = None
        self._revision: int | None = None
        self.rounds = 0  # how many rounds ran (tests, metrics)
        self.sent = 0  # how many notifications were sent

    def bind(self, mcp: Any) -> None:
        """The FastMCP server whose listings say what exists (built after the chain)."""
        self._mcp = weakref.ref(mcp)

    # -- who is connected -------------------------------------------------------------

    async def track(self, ctx: Any, principal: Principal | None) -> None:
        """A request on ``ctx``'s connection, for ``principal`` (None: nothing visible)."""
        if principal is None:
            return
        connection = connection_of(ctx)
        if connection is not None:
            await self.register(connection, principal)

    async def register(self, connection: Any, principal: Principal) -> None:
        """Watch ``connection`` for ``principal``: a handshake-era connection, or a
        2026-07-28 ``subscriptions/listen`` stream (``server/listen.py``). It needs
        ``notify(method, params)``, an ``exit_stack`` closed with it, and a weak reference."""
        ident = id(connection)
        entry = self._sessions.get(ident)
        key = _visibility_key(principal)
        if entry is not None and entry.connection() is connection:
            if entry.key != key:  # another principal on the same connection: start over
                entry.principal, entry.key = principal, key
                entry.told = self._fingerprints(principal, self._existing)
            return
        self._bind_loop()
        if self._existing is None:
            try:
                self._existing = await self._list()
            except Exception as exc:  # noqa: BLE001 - never the request's failure
                log.warning("notify_list_failed", error=type(exc).__name__)
                return
        if len(self._sessions) >= self.max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            _forgotten(oldest.connection())
        ref = weakref.ref(connection, functools.partial(self._forget, ident))
        self._sessions[ident] = _Session(
            ref, principal, key, self._fingerprints(principal, self._existing)
        )
        with contextlib.suppress(Exception):  # the connection's teardown forgets it at once
            connection.exit_stack.callback(self._forget, ident, ref)

    def _forget(self, ident: int, ref: weakref.ReferenceType[Any]) -> None:
        entry = self._sessions.get(ident)
        if entry is not None and entry.connection is ref:
            del self._sessions[ident]

    def live(self) -> int:
        return sum(1 for entry in self._sessions.values() if entry.connection() is not None)

    # -- what changed -----------------------------------------------------------------

    def changed(self) -> None:
        """Something a caller may see changed: one round after the debounce (any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._schedule()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._schedule)

    def _schedule(self) -> None:
        if not self._sessions:
            self._existing = None  # listed afresh when the next caller connects
            return
        if self._round is not None and not self._round.done():
            self._again = True
            return
        self._round = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            await asyncio.sleep(self.debounce_seconds)
            try:
                await self.notify_now()
            except Exception as exc:  # noqa: BLE001 - one failed round; the next one retries
                log.warning("notify_round_failed", error=type(exc).__name__)
            if not self._again:
                return

    async def notify_now(self) -> None:
        """One round: list, compare every connection, then send to all owed at once."""
        self.rounds += 1
        existing = await self._list()
        self._existing = existing
        owed: list[tuple[Any, tuple[str, ...]]] = []
        for entry in list(self._sessions.values()):
            connection = entry.connection()
            if connection is None:
                continue
            now = self._fingerprints(entry.principal, existing)
            if now is None:
                continue  # the grants store did not answer: told nothing, compared later
            kinds = changed_kinds(entry.told, now)
            entry.told = now
            if kinds:
                owed.append((connection, kinds))
        if owed:
            await asyncio.gather(
                *(self._send(connection, kinds) for connection, kinds in owed),
                return_exceptions=True,
            )

    async def _send(self, connection: Any, kinds: tuple[str, ...]) -> None:
        for kind in kinds:
            try:
                async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
                    await connection.notify(LIST_CHANGED_METHODS[kind], None)
            except Exception:  # noqa: BLE001 - a gone or stuck client: best effort
                return
            self.sent += 1

    def _fingerprints(self, principal: Principal, existing: Existing | None) -> Fingerprints | None:
        if existing is None:
            return None
        try:
            granted = Granted(
                tools=self.access.visible_tools(principal),
                prompts=self.access.visible_prompts(principal),
                sources=self.access.visible_resource_sources(principal),
            )
        except Exception:  # noqa: BLE001 - as the namespace: a failed lookup decides nothing
            log.warning("notify_lookup_failed", subject=principal.log_subject)
            return None
        return visible_fingerprints(existing, granted)

    async def _list(self) -> Existing:
        mcp = self._mcp()
        if mcp is None:
            return Existing()
        tools = await mcp.list_tools(run_middleware=False)
        prompts = await mcp.list_prompts(run_middleware=False)
        resources = await mcp.list_resources(run_middleware=False)
        templates = await mcp.list_resource_templates(run_middleware=False)
        return Existing(
            tools=frozenset(t.name for t in tools),
            prompts=frozenset(p.name for p in prompts),
            resources=frozenset(str(r.uri) for r in resources),
            templates=frozenset(str(t.uri_template) for t in templates),
        )

    # -- the grants store's revision (writes by another process) ----------------------

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        self._sessions.clear()
        self._existing = None
        self._round = None
        if self.poll_revision:
            self._watch = asyncio.ensure_future(self._watch_revision())

    async def _watch_revision(self) -> None:
        """On the embedded backend no replica announces a grant change (``profiles grant``
        from another process): its revision is read every ``REVISION_POLL_SECONDS`` while
        a caller is connected, and a move is a grant change."""
        store = self.access.store
        first = True
        while True:
            if not first:
                await asyncio.sleep(REVISION_POLL_SECONDS)
            first = False
            if not self._sessions and self._revision is not None:
                continue
            try:
                revision = await asyncio.to_thread(store.revision, self.zone)
            except Exception as exc:  # noqa: BLE001 - the store is down: nothing to compare
                log.debug("notify_revision_unread", error=type(exc).__name__)
                continue
            if self._revision is not None and revision != self._revision:
                self.access.forget()
                self.changed()
            self._revision = revision


__all__ = ["DEBOUNCE_SECONDS", "MAX_SESSIONS", "ChangeNotifier", "connection_of"]
