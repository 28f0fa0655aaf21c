"""Resource subscriptions relayed per caller: ``resources/subscribe`` of an exposed upstream
resource subscribes on the caller's own upstream session, and that session's
``notifications/resources/updated`` reaches the callers who subscribed on it, and only them.

- **only what the caller may read**: the server layer checks the caller's grants first
  (hidden answers as unknown); here the URI must be one the upstream exposes now (a pinned
  resource, or one matching a pinned template), and the upstream must announce
  ``resources.subscribe`` on the caller's session;
- **on the caller's own session**: ``UpstreamServer.session_key`` (a ``shared`` upstream:
  the gateway's one session; its updates still reach only the callers who subscribed);
  the upstream is asked once per (session, URI), however many connections subscribed;
- **relayed with the exposed URI**, to each subscribed caller's connection in a task of
  its own, after its grants and the resource's exposure are checked again (a revoked or
  quarantined resource is relayed to no one);
- **cleaned up**: ``unsubscribe`` and a closing connection drop its subscriptions, and the
  upstream is unsubscribed when the last one on a session goes; a subscribed session is
  not reaped as idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mcp_types import (
    EmptyResult,
    SubscribeRequest,
    SubscribeRequestParams,
    UnsubscribeRequest,
    UnsubscribeRequestParams,
)

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.catalog import backend_uri
from nexus_mcp.policy.resources import resource_source
from nexus_mcp.principal import Principal
from nexus_mcp.providers.upstream.sessions import SessionKey, UpstreamFailure

if TYPE_CHECKING:
    from nexus_mcp.providers.upstream.server import UpstreamServer

log = get_logger(__name__)

UPDATED_METHOD = "notifications/resources/updated"
MAX_SUBSCRIPTIONS_PER_CONNECTION = 1000
SEND_TIMEOUT_SECONDS = 5.0

Target = tuple[str, SessionKey, str]  # (server_id, upstream session key, upstream URI)


class NotExposed(Exception):
    """Not a resource any upstream exposes now: answered as an unknown resource."""


class NotSupported(Exception):
    """The upstream does not announce ``resources.subscribe``."""


@dataclass
class _Subscriber:
    connection: weakref.ReferenceType[Any]
    principal: Principal
    exposed: str


@dataclass
class _Target:
    subscribers: dict[int, _Subscriber] = field(default_factory=dict)
    session: Any = None


class SubscriptionRelay:
    """Every caller's resource subscriptions to the upstreams, in this process."""

    def __init__(
        self,
        servers: Mapping[str, UpstreamServer],
        *,
        may_read: Callable[[Principal, str], bool],
    ) -> None:
        """``may_read(principal, source)``: the caller's grants, asked again at relay."""
        self.servers = servers
        self.may_read = may_read
        self._targets: dict[Target, _Target] = {}
        self._by_connection: dict[int, set[Target]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        for server in servers.values():
            server.on_resource_updated = self.updated

    def _resolve(self, uri: str) -> tuple[UpstreamServer, str]:
        source = resource_source(uri)
        server = self.servers.get(source or "")
        backend = backend_uri(server.server_id, uri) if server is not None else None
        if server is None or backend is None or not exposed(server, uri):
            raise NotExposed
        return server, backend

    async def subscribe(self, connection: Any, principal: Principal, uri: str) -> None:
        """Subscribe ``connection`` (its caller ``principal``, grants already checked)."""
        server, backend = self._resolve(uri)
        ident = id(connection)
        mine = self._by_connection.get(ident, set())
        if len(mine) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
            raise UpstreamFailure("unavailable", "subscription_cap").to_error()
        key = server.session_key(principal)
        target = (server.server_id, key, backend)
        entry = self._targets.get(target)
        if entry is None or entry.session is None or not entry.session.alive:
            session = await self._upstream_subscribe(server, key, backend)
            entry = self._targets.get(target)
            if entry is None:
                entry = self._targets[target] = _Target()
            if entry.session is not session:
                if entry.session is not None:
                    entry.session.subscribed -= 1
                entry.session = session
                session.subscribed += 1
        ref = weakref.ref(connection, functools.partial(self._gone, ident))
        entry.subscribers[ident] = _Subscriber(ref, principal, uri)
        if ident not in self._by_connection:
            self._by_connection[ident] = set()
            with contextlib.suppress(Exception):  # its teardown drops its subscriptions
                connection.exit_stack.callback(self._closed, ident)
        self._by_connection[ident].add(target)

    async def _upstream_subscribe(self, server: UpstreamServer, key: SessionKey, uri: str) -> Any:
        try:
            session = await server._session_for(key)
        except UpstreamFailure as failure:
            raise failure.to_error() from None
        capabilities = getattr(
            getattr(session.client, "initialize_result", None), "capabilities", None
        )
        resources = getattr(capabilities, "resources", None)
        if not getattr(resources, "subscribe", False):
            raise NotSupported
        try:
            async with asyncio.timeout(server.config.timeouts.call_seconds):
                await _request(session.client, "subscribe", uri)
        except TimeoutError:
            raise UpstreamFailure("timeout", "call_timeout").to_error() from None
        except Exception:  # noqa: BLE001 - classified, never echoed
            raise UpstreamFailure("error", "jsonrpc_error").to_error() from None
        return session

    async def unsubscribe(self, connection: Any, principal: Principal, uri: str) -> None:
        """Drop ``connection``'s subscription to ``uri`` (nothing to drop: no answer differs)."""
        source = resource_source(uri)
        server = self.servers.get(source or "")
        backend = backend_uri(server.server_id, uri) if server is not None else None
        if server is None or backend is None:
            return
        self._drop(id(connection), (server.server_id, server.session_key(principal), backend))

    def _gone(self, ident: int, _ref: Any) -> None:
        self._closed(ident)

    def _closed(self, ident: int) -> None:
        for target in list(self._by_connection.pop(ident, ())):
            self._drop(ident, target)

    def _drop(self, ident: int, target: Target) -> None:
        mine = self._by_connection.get(ident)
        if mine is not None:
            mine.discard(target)
        entry = self._targets.get(target)
        if entry is None or entry.subscribers.pop(ident, None) is None or entry.subscribers:
            return
        del self._targets[target]
        session = entry.session
        if session is not None:
            session.subscribed -= 1
            if session.alive:
                self._spawn(_quietly(_request(session.client, "unsubscribe", target[2])))

    def updated(self, server: UpstreamServer, key: SessionKey, uri: str) -> None:
        """``notifications/resources/updated`` of ``uri`` from the session ``key``."""
        entry = self._targets.get((server.server_id, key, uri))
        if entry is None:
            return  # no caller subscribed to it on this session: nothing leaves
        for subscriber in list(entry.subscribers.values()):
            connection = subscriber.connection()
            if connection is None:
                continue
            source = resource_source(subscriber.exposed)
            try:
                allowed = source is not None and self.may_read(subscriber.principal, source)
            except Exception:  # noqa: BLE001 - as the namespace: a failed lookup shows nothing
                allowed = False
            if not allowed or not exposed(server, subscriber.exposed):
                continue
            self._spawn(_send(connection, subscriber.exposed))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def count(self) -> int:
        return sum(len(entry.subscribers) for entry in self._targets.values())


def exposed(server: UpstreamServer, uri: str) -> bool:
    """``uri`` is a resource the upstream exposes now, or matches a template it does and
    that template may reach it (``template_may_read``, as a read through it: never a
    resource that is not exposed itself, never a query the template does not declare,
    never a URI longer than a read takes)."""
    catalog = server.catalog
    if uri in catalog.visible_resources():
        return True
    backend = backend_uri(server.server_id, uri)
    if backend is None:
        return False
    for template in catalog.visible_templates().values():
        if template.matches(uri) is not None:
            return bool(catalog.template_may_read(backend, template._view.key))
    return False


async def _send(connection: Any, uri: str) -> None:
    with contextlib.suppress(Exception):  # a gone or stuck client: best effort
        async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
            await connection.notify(UPDATED_METHOD, {"uri": uri})


async def _request(client: Any, which: str, uri: str) -> Any:
    """``resources/subscribe`` or ``/unsubscribe`` on a handshake-era upstream session (the
    SDK's own helpers for them warn that 2026-07-28 removed them; these sessions are not
    of that era)."""
    if which == "subscribe":
        request: Any = SubscribeRequest(params=SubscribeRequestParams(uri=uri))
    else:
        request = UnsubscribeRequest(params=UnsubscribeRequestParams(uri=uri))
    return await client.session.send_request(request, EmptyResult)


async def _quietly(coro: Any) -> None:
    with contextlib.suppress(Exception):
        await coro


__all__ = ["NotExposed", "NotSupported", "SubscriptionRelay", "exposed"]
