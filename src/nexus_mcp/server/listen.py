"""``subscriptions/listen``: change notifications and resource updates for 2026-07-28-era
clients (issue 27).

That era has no lasting session: a client opts in to server events with a
``subscriptions/listen`` request whose response is the stream (SEP-2575). FastMCP 4.1.2
serves no such method; the MCP SDK's server takes a handler for it
(``add_request_handler``) and then announces ``listChanged`` (and ``resources.subscribe``)
on that era. The SDK's own ``ListenHandler`` fans one bus out to every stream alike; here
each stream is one caller's, so it is built on the same vocabulary (``mcp.shared.
subscriptions``: the events, ``event_matches``, ``event_to_notification``) but fed per
caller:

- **change notifications**: the stream registers with the ``ChangeNotifier`` for the
  principal the listen request was made as, exactly like a handshake-era connection, so
  it is told a tools, prompts or resources list change when, and only when, what *that*
  principal may see changed; a caller with no principal is acknowledged nothing and its
  stream ends at once (nothing could ever reach it, and it would hold a slot);
- **resource updates**: each requested ``resourceSubscriptions`` URI is taken through
  ``Subscriptions.take`` (the caller's grants, exposed now, the upstream announces
  subscriptions; audited by digest), and only those taken are honored in the ack; a
  hidden, unknown or unsupported one is left out alike;
- **bounded**: at most ``MAX_STREAMS`` open streams, ``MAX_STREAMS_PER_SUBJECT`` per
  subject, ``MAX_BUFFERED_EVENTS`` events waiting per stream (a client that stopped
  reading has its stream ended at once, even in the middle of a write it never reads; it
  re-listens and refetches, as the spec has it); a stream opened with a bearer token ends
  gracefully when the token expires;
- **cleaned up**: the stream's end drops its subscriptions and its registration.

The chain's request hooks run around the handler (envelope, identity), so the caller's
principal is bound as for any request.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ServerEvent,
    event_from_wire,
    event_matches,
    event_to_notification,
)
from mcp_types import (
    INVALID_REQUEST,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)

from nexus_mcp.calls import current_principal, current_subject_token
from nexus_mcp.envelope import to_request_error
from nexus_mcp.errors import RateLimitedError
from nexus_mcp.observability.audit import AuditLog, caller_event
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.principal import Principal
from nexus_mcp.server.notify import ChangeNotifier

if TYPE_CHECKING:
    from nexus_mcp.server.subscribe import Subscriptions  # with an upstream only

log = get_logger(__name__)

LISTEN_METHOD = "subscriptions/listen"
LISTEN_OPENED = "listen_opened"
LISTEN_REFUSED = "listen_refused"
LISTEN = "(listen)"
MAX_STREAMS = 1024
MAX_STREAMS_PER_SUBJECT = 16
MAX_BUFFERED_EVENTS = 256
LIMIT_MESSAGE = "too many open listen streams; retry later"
# Resource subscriptions one stream takes at most (each may be an upstream round trip and
# an audit record before the ack); the rest are left out of it, as hidden ones are.
MAX_RESOURCES_PER_STREAM = 256


class ListenStream:
    """One open listen stream, as the notifier and the subscription relay see a
    connection: ``notify`` queues an event the stream honors, ``exit_stack`` closes with
    the stream (the relay and the notifier hang their cleanup on it)."""

    def __init__(self, honored: SubscriptionFilter, max_buffered: int) -> None:
        self.honored = honored
        self.uris: frozenset[str] = frozenset()
        self.exit_stack = contextlib.ExitStack()
        self._send, self.events = anyio.create_memory_object_stream[ServerEvent](max_buffered)
        self.overflowed = False
        # Around the stream's writes: cancelled when the backlog overflows, so a write the
        # client never reads does not keep the stream (and what it holds) open.
        self.scope = anyio.CancelScope()

    def honor(self, uris: list[str]) -> SubscriptionFilter:
        self.uris = frozenset(uris)
        self.honored = self.honored.model_copy(update={"resource_subscriptions": uris or None})
        return self.honored

    async def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        event = event_from_wire(method, params)
        if event is None or not event_matches(self.honored, self.uris, event):
            return
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            # A client that stopped reading: end its stream now, even in the middle of a
            # write it does not read (no replay; it re-listens and refetches).
            self.overflowed = True
            self._send.close()
            self.scope.cancel()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def forgotten(self) -> None:
        """The notifier forgot it to make room (``MAX_SESSIONS``): it would never be told
        again, so it ends gracefully and its client listens again."""
        self._send.close()

    def close(self) -> None:
        self._send.close()
        with contextlib.suppress(Exception):
            self.exit_stack.close()
        self.events.close()


def _flags(requested: SubscriptionFilter, principal: Principal | None) -> SubscriptionFilter:
    """The list-change kinds honored: those asked for, and none for a caller who may see
    nothing (no principal)."""
    allowed = principal is not None
    return SubscriptionFilter(
        tools_list_changed=True if allowed and requested.tools_list_changed else None,
        prompts_list_changed=True if allowed and requested.prompts_list_changed else None,
        resources_list_changed=True if allowed and requested.resources_list_changed else None,
    )


class ListenService:
    """The ``subscriptions/listen`` handler: one call is one caller's stream."""

    def __init__(
        self,
        notifier: ChangeNotifier | None,
        subscriptions: Subscriptions | None,
        audit: AuditLog,
        *,
        max_streams: int = MAX_STREAMS,
        max_per_subject: int = MAX_STREAMS_PER_SUBJECT,
        max_buffered: int = MAX_BUFFERED_EVENTS,
    ) -> None:
        self.notifier = notifier
        self.subscriptions = subscriptions
        self.audit = audit
        self.max_streams = max_streams
        self.max_per_subject = max_per_subject
        self.max_buffered = max_buffered
        self._open: set[ListenStream] = set()
        self._per_subject: Counter[str | None] = Counter()

    def open_streams(self) -> int:
        return len(self._open)

    def _audit(self, event: str, principal: Principal | None, **fields: Any) -> None:
        self.audit.emit(caller_event(event, LISTEN, principal, **fields))

    async def __call__(
        self, ctx: Any, params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        request_id = ctx.request_id
        if request_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        principal = current_principal()
        subject = principal.subject if principal is not None else None
        if len(self._open) >= self.max_streams or (
            self._per_subject[subject] >= self.max_per_subject
        ):
            self._audit(LISTEN_REFUSED, principal, outcome="RATE_LIMITED", reason="stream_cap")
            # The documented envelope, as a refused read or get answers (-32050).
            raise to_request_error(RateLimitedError(LIMIT_MESSAGE, reason="stream_cap"))
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: request_id}
        stream = ListenStream(_flags(params.notifications, principal), self.max_buffered)
        self._open.add(stream)
        self._per_subject[subject] += 1
        try:
            honored = await self._take(stream, principal, params.notifications)
            self._audit(
                LISTEN_OPENED,
                principal,
                outcome="OK",
                facts={
                    "kinds": sorted(k for k, v in honored.model_dump().items() if v is True),
                    "resource_subscriptions": len(stream.uris),
                },
            )
            with stream.scope:
                await ctx.session.send_notification(
                    SubscriptionsAcknowledgedNotification(
                        params=SubscriptionsAcknowledgedNotificationParams(
                            notifications=honored, _meta=meta
                        )
                    ),
                    related_request_id=request_id,
                )
                with anyio.move_on_after(_lifetime(principal)):
                    async for event in stream.events:
                        await ctx.session.send_notification(
                            event_to_notification(event, meta), related_request_id=request_id
                        )
            if stream.overflowed:
                log.warning("listen_backlog_full", subject=_log_subject(principal))
        finally:
            stream.close()
            self._open.discard(stream)
            self._per_subject[subject] -= 1
            if self._per_subject[subject] <= 0:
                del self._per_subject[subject]
        return SubscriptionsListenResult(_meta=meta)

    async def _take(
        self, stream: ListenStream, principal: Principal | None, requested: SubscriptionFilter
    ) -> SubscriptionFilter:
        """Register for change notifications and take the resource subscriptions, before
        the ack (an event meanwhile waits in the stream's buffer, after the ack)."""
        honored = stream.honored
        kinds = (honored.tools_list_changed, honored.prompts_list_changed)
        wants_changes = any((*kinds, honored.resources_list_changed))
        if principal is not None and self.notifier is not None and wants_changes:
            await self.notifier.register(stream, principal)
        taken: list[str] = []
        asked = list(dict.fromkeys(requested.resource_subscriptions or ()))
        if self.subscriptions is not None and principal is not None:
            for uri in asked[:MAX_RESOURCES_PER_STREAM]:
                try:
                    await self.subscriptions.take(principal, stream, uri)
                except MCPError:
                    continue  # hidden, unknown or unsupported alike: not honored
                taken.append(uri)
        return stream.honor(taken)


def _lifetime(principal: Principal | None) -> float:
    """How long the stream may stay open: not at all for a caller with no principal
    (nothing can ever reach it; its token is not even kept), until the bearer token it
    was opened with expires (HTTP), else without end."""
    if principal is None:
        return 0.0
    token = current_subject_token()
    if token is None or token.expires_at is None:
        return float("inf")
    return max(0.0, float(token.expires_at) - time.time())


def _log_subject(principal: Principal | None) -> str | None:
    return principal.log_subject if principal is not None else None


def add_listen_handler(
    mcp: Any,
    notifier: ChangeNotifier | None,
    subscriptions: Subscriptions | None,
    audit: AuditLog,
) -> ListenService:
    """Serve ``subscriptions/listen`` on ``mcp`` (its 2026-07-28 capabilities then say
    ``listChanged: true``, and ``resources.subscribe`` only where ``subscriptions`` can
    take one)."""
    service = ListenService(notifier, subscriptions, audit)
    server = mcp._mcp_server
    server.add_request_handler(LISTEN_METHOD, SubscriptionsListenRequestParams, service)
    if subscriptions is None:
        _announce_no_resource_subscriptions(server)
    return service


def _announce_no_resource_subscriptions(server: Any) -> None:
    """The SDK derives the 2026-07-28 era's ``resources.subscribe`` from listen being
    served; without an upstream nothing can be subscribed, so that era announces none, as
    the handshake era (no ``resources/subscribe`` handler) does."""
    derive = server.get_capabilities

    def get_capabilities(*args: Any, **kwargs: Any) -> Any:
        capabilities = derive(*args, **kwargs)
        resources = capabilities.resources
        if resources is None or not resources.subscribe:
            return capabilities
        honest = resources.model_copy(update={"subscribe": False})
        return capabilities.model_copy(update={"resources": honest})

    server.get_capabilities = get_capabilities


__all__ = [
    "LISTEN_OPENED",
    "LISTEN_REFUSED",
    "MAX_STREAMS",
    "MAX_STREAMS_PER_SUBJECT",
    "ListenService",
    "ListenStream",
    "add_listen_handler",
]
