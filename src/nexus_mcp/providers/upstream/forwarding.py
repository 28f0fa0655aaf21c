"""How an ``UpstreamServer`` sends a caller's tool call upstream, and relays the upstream's
own requests back to that caller (``server.py``'s other half).

- A tools/call goes upstream on the caller's own session (``session_key``), with the
  caller's own upstream credential where the upstream takes one (``credentials.py``),
  never the caller's token; only read-class tools are retried, only on transport
  failures, bounded in count and total time.
- Nothing the caller sent travels upstream but the tool's arguments and the identity
  fields the configuration names in ``_meta`` (``identity_meta``).
- The upstream's own requests (sampling, elicitation, roots) are relayed only when the
  configuration forwards them, and only to the caller whose call is in flight on that
  very session (``relay.py``).
- Its progress on a call reaches that call's caller only, when the caller asked for it,
  under the caller's own token (the upstream gets a token of the gateway's), increasing,
  rate-limited, never after the call finished (``progress.py``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from nexus_mcp.calls import CallState
from nexus_mcp.connector import Connector
from nexus_mcp.errors import OutputDeniedError
from nexus_mcp.policy.upstreams import UpstreamConfig
from nexus_mcp.principal import Principal
from nexus_mcp.providers.upstream.progress import (
    MessageScan,
    ProgressRelay,
    ignore_progress,
    progress_relay,
)
from nexus_mcp.providers.upstream.relay import (
    Caller,
    caller_context,
    caller_on,
    elicit,
    roots_of,
    sample,
)
from nexus_mcp.providers.upstream.sessions import (
    SessionKey,
    UpstreamFailure,
    UpstreamSession,
    is_transport_failure,
)


class Forwarding:
    """The calls and relays of an ``UpstreamServer`` (which sets these)."""

    config: UpstreamConfig
    server_id: str
    state: str
    _reconnect: asyncio.Task[None] | None
    _sessions: dict[SessionKey, UpstreamSession]
    connector: Connector | None

    if TYPE_CHECKING:  # defined by ``UpstreamServer`` and ``CallerCredentials``

        def session_key(self, principal: Principal) -> SessionKey: ...

        async def caller_credential(
            self, key: SessionKey, principal: Principal
        ) -> SecretStr | None: ...

        async def _session_for(
            self, key: SessionKey, credential: SecretStr | None = None
        ) -> UpstreamSession: ...

        async def _drop(self, session: UpstreamSession) -> None: ...

        def _connection_failed(self, key: SessionKey) -> None: ...

        def release(self, session: UpstreamSession) -> None: ...

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
        self.refuse_while_down()
        retry = self.config.retry
        attempts = retry.attempts if retryable else 1
        deadline = time.monotonic() + retry.max_total_seconds
        key = self.session_key(principal)
        meta = self.identity_meta(principal)
        credential = await self.caller_credential(key, principal)  # never the caller's own
        caller = caller_context()
        # One relay across retries: a retry's progress must still increase for the caller.
        progress = progress_relay(
            caller, self.server_id, self.config.forward.progress, self._message_scan(state)
        )
        try:
            for attempt in range(1, attempts + 1):
                try:
                    return await self._call_once(
                        key, upstream_name, arguments, meta, credential, caller, progress
                    )
                except UpstreamFailure as failure:
                    last_try = attempt == attempts or time.monotonic() >= deadline
                    if not failure.transport or last_try:
                        raise
                    delay = retry.backoff_seconds * (2 ** (attempt - 1))
                    delay = min(delay, max(0.0, deadline - time.monotonic()))
                    await asyncio.sleep(random.uniform(0, delay))
            raise UpstreamFailure("unavailable", "retries_exhausted")  # pragma: no cover
        finally:
            if progress is not None:
                progress.close()  # the call has finished: nothing more reaches the caller

    def _message_scan(self, state: CallState) -> MessageScan | None:
        """Output scanning of this call's progress messages, as of its result (by the tool's
        name as the caller calls it): redacted, or withheld (None) where it refuses."""
        connector = self.connector
        scanner = connector.scanner if connector is not None else None
        if scanner is None:
            return None

        def scan(text: str) -> str | None:
            try:
                (out,) = scanner.texts(self.server_id, state.tool_name, [text])
            except OutputDeniedError:
                return None
            return out

        return scan

    def refuse_while_down(self) -> None:
        """Known down and waiting to reconnect: refuse at once, block nobody."""
        if self.state == "degraded" and (
            self._reconnect is not None and not self._reconnect.done()
        ):
            raise UpstreamFailure("unavailable", "upstream_down")

    async def _call_once(
        self,
        key: SessionKey,
        upstream_name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None,
        credential: SecretStr | None = None,
        caller: Caller | None = None,
        progress: ProgressRelay | None = None,
    ) -> Any:
        return await self.on_session(
            key,
            credential,
            lambda client: client.call_tool_mcp(
                upstream_name,
                arguments,
                meta=meta,
                progress_handler=progress if progress is not None else ignore_progress,
            ),
            caller=caller if self._relays else None,
        )

    async def on_session(
        self,
        key: SessionKey,
        credential: SecretStr | None,
        send: Callable[[Any], Awaitable[Any]],
        *,
        caller: Caller | None = None,
    ) -> Any:
        """One request on the caller's session (a tools/call, and ``catalog.py``'s reads
        and gets): within the call timeout, its failure classified and never echoed, the
        session released afterwards (closed now if its credential was renewed)."""
        session = await self._session_for(key, credential)
        session.busy += 1
        if caller is not None:
            session.callers.append(caller)
        try:
            async with asyncio.timeout(self.config.timeouts.call_seconds):
                return await send(session.client)
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
            self.release(session)

    # -- relays: an upstream's own requests to the caller (off unless configured) -----

    @property
    def _relays(self) -> bool:
        forward = self.config.forward
        return forward.sampling or forward.elicitation or forward.roots

    def _caller_for(self, key: SessionKey, kind: str) -> Caller:
        """The caller to relay to: one whose call is in flight on this very session."""
        return caller_on(self._sessions.get(key), kind, self.server_id)

    async def relay_sampling(self, key: SessionKey, params: Any) -> Any:
        return await sample(self._caller_for(key, "sampling"), params)

    async def relay_elicitation(self, key: SessionKey, params: Any) -> Any:
        return await elicit(self._caller_for(key, "elicitation"), params)

    async def relay_roots(self, key: SessionKey) -> list[Any]:
        return await roots_of(self._caller_for(key, "roots"))


__all__ = ["Forwarding"]
