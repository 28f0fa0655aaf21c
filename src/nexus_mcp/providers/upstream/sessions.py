"""Connections to an upstream MCP server: one FastMCP ``Client`` per session.

``build_client`` makes the client for one session with only the gateway's own
credentials, or on a caller's session of a per-caller credential type only the one
obtained for that caller (``session_headers``, ``credentials.py``); FastMCP's ``Client``
and transports are used as they are (see ``server.py`` for why not its ``ProxyTool``).
``UpstreamSession`` runs it on a task of its own, since anyio scopes are entered and left
by one task while calls come from the callers' tasks.
``UpstreamFailure`` is how anything going wrong on the way is classified, never echoed.
An upstream's own requests (sampling, elicitation, roots) are relayed only where the
configuration allows it (``relay.py``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import httpx2
from fastmcp import Client
from fastmcp.client.messages import MessageHandler
from fastmcp.client.transports import StreamableHttpTransport
from pydantic import SecretStr

from nexus_mcp.errors import UpstreamError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.sandbox import SandboxLaunch
from nexus_mcp.policy.upstreams import ResolvedSecrets, UpstreamConfig
from nexus_mcp.providers.upstream.progress import ignore_progress, upstream_log
from nexus_mcp.providers.upstream.stdio import BoundedStdioTransport

log = get_logger(__name__)

GATEWAY_SESSION = ("__gateway__",)
SessionKey = tuple[str, ...]


class SessionHost(Protocol):
    """What ``build_client`` needs of the upstream a session belongs to
    (``UpstreamServer`` satisfies it): its configuration and credentials, its result cap,
    and where an upstream's notifications and requests go."""

    @property
    def config(self) -> UpstreamConfig: ...

    @property
    def secrets(self) -> ResolvedSecrets: ...

    @property
    def max_result_bytes(self) -> int: ...

    @property
    def sandbox(self) -> SandboxLaunch | None: ...

    def schedule_refresh(self, key: SessionKey) -> None: ...

    def resource_updated(self, key: SessionKey, uri: str) -> None: ...

    async def relay_sampling(self, key: SessionKey, params: Any) -> Any: ...

    async def relay_elicitation(self, key: SessionKey, params: Any) -> Any: ...

    async def relay_roots(self, key: SessionKey) -> list[Any]: ...


class UpstreamFailure(Exception):
    """A failure of the upstream or the way to it; ``kind`` picks the fixed message.
    ``credential``: no credential could be obtained for this caller (``credentials.py``);
    ``facts``: fixed labels for the audit record, never an upstream's or a provider's text."""

    def __init__(
        self,
        kind: Literal["unavailable", "timeout", "error", "credential"],
        reason: str,
        **facts: str,
    ) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.facts = facts

    @property
    def transport(self) -> bool:
        return self.kind == "unavailable"

    def to_error(self) -> UpstreamError:
        message = {
            "unavailable": "Upstream unavailable",
            "timeout": "Upstream timeout",
            "error": "Upstream error",
            "credential": "Upstream credential unavailable",
        }[self.kind]
        return UpstreamError(
            message, outcome=f"upstream_{self.kind}", reason=self.reason, **self.facts
        )


class _ListChanged(MessageHandler):
    def __init__(
        self, on_change: Callable[[], None], on_updated: Callable[[str], None] | None = None
    ) -> None:
        self._on_change = on_change
        self._on_updated = on_updated

    async def on_tool_list_changed(self, message: Any) -> None:
        self._on_change()

    # Prompts and resources are listed and decided with the tools (``catalog.py``).
    async def on_prompt_list_changed(self, message: Any) -> None:
        self._on_change()

    async def on_resource_list_changed(self, message: Any) -> None:
        self._on_change()

    # A resource this session subscribed to changed (relayed to its subscribers only).
    async def on_resource_updated(self, message: Any) -> None:
        uri = getattr(getattr(message, "params", None), "uri", None)
        if self._on_updated is not None and uri is not None:
            self._on_updated(str(uri))


@dataclass
class UpstreamSession:
    """One live MCP session to the upstream, run by its own task (anyio scopes are
    entered and left by the same task); calls are made from the callers' tasks."""

    key: SessionKey
    client: Client[Any]
    # The caller's own credential it was opened with (per-caller credential types only,
    # ``credentials.py``); ``retired``: that credential was renewed, no call may start on it.
    credential: SecretStr | None = None
    retired: bool = False
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
    # Resources callers subscribed to on this session: it is not reaped while any are.
    subscribed: int = 0

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


def is_transport_failure(exc: BaseException) -> bool:
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


class RedirectRefused(httpx2.TransportError):
    """A request to another URL than the upstream's configured one (never sent)."""


class ResponseTooLarge(httpx2.StreamError):
    """An HTTP response longer than the upstream's response cap (read no further)."""


class ResponseEncoded(httpx2.StreamError):
    """An HTTP response with a ``Content-Encoding`` (its size on the wire bounds nothing)."""


class _BoundedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                log.warning("upstream_message_too_large", transport="http")
                raise ResponseTooLarge("response over the upstream's cap")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """Every response body is read up to ``limit`` bytes, then refused: one page of a
    listing, or one result, cannot fill the gateway's memory (the SDK reads a JSON
    response whole). Server-sent events are bounded per event by the SDK as well.

    The bound is on the bytes received, so the body must be what is decoded: httpx asks
    for ``gzip, deflate`` by default and inflates whatever ``Content-Encoding`` a response
    names, a few KB on the wire becoming gigabytes. Every request asks for ``identity``,
    and a response with any other encoding is refused unread."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        encodings = response.headers.get_list("content-encoding", split_commas=True)
        if any(e.strip().lower() not in ("", "identity") for e in encodings):
            log.warning("upstream_message_encoded", transport="http")
            await response.aclose()
            raise ResponseEncoded("response with a content encoding")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._limit:
            log.warning("upstream_message_too_large", transport="http")
            await response.aclose()
            raise ResponseTooLarge("response over the upstream's cap")
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        response.stream = _BoundedStream(stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def http_client_factory(
    url: str, verify: ssl.SSLContext | bool, max_response_bytes: int
) -> Callable[..., Any]:
    """The ``httpx_client_factory`` of an HTTP upstream's transport: no redirect, ever.

    Exactly the headers given (the caller's are never merged in: forward_incoming_headers
    stays off). Redirects: FastMCP asks its factory for ``follow_redirects=True``, and the
    MCP SDK follows a same-origin 307/308 by itself whatever that flag says
    (``stream_within_origin``, up to the client's ``max_redirects``), carrying the
    gateway's credential. So the client gets ``follow_redirects=False`` *and*
    ``max_redirects=0`` (the SDK then hands the 3xx back, and the request fails as an
    upstream error), and a request hook refuses, before it is sent, any request to
    another URL than the configured endpoint, whatever follows a redirect in the future.
    """
    endpoint = httpx2.URL(url)

    async def only_the_endpoint(request: httpx2.Request) -> None:
        target = request.url
        if (target.scheme, target.host, target.port, target.raw_path) != (
            endpoint.scheme,
            endpoint.host,
            endpoint.port,
            endpoint.raw_path,
        ):
            raise RedirectRefused("request to another URL than the upstream's endpoint")

    def factory(**kwargs: Any) -> httpx2.AsyncClient:
        kwargs["follow_redirects"] = False
        kwargs["max_redirects"] = 0
        kwargs.pop("verify", None)
        kwargs["transport"] = BoundedTransport(
            httpx2.AsyncHTTPTransport(verify=verify), max_response_bytes
        )
        kwargs["event_hooks"] = {"request": [only_the_endpoint]}
        return httpx2.AsyncClient(**kwargs)

    return factory


def max_response_bytes(server: SessionHost) -> int:
    """One HTTP response of an upstream: a result (``limits.max_read_bytes``) or a page
    of a listing (``MAX_LISTING_BYTES``), whichever is more, and room for the envelope."""
    from nexus_mcp.providers.upstream.listing import MAX_LISTING_BYTES

    return max(server.max_result_bytes, MAX_LISTING_BYTES) + 1024 * 1024


def session_headers(
    server: SessionHost, key: SessionKey, credential: SecretStr | None
) -> dict[str, str]:
    """What one session sends: the gateway's own credential, or (per-caller credential
    types) on a caller's session only the credential obtained for that caller. A caller
    session of such an upstream without one is never opened (fail closed)."""
    own = {k: v.get_secret_value() for k, v in server.secrets.headers.items()}
    if not server.config.credentials.per_caller or key == GATEWAY_SESSION:
        return own
    if credential is None:
        raise UpstreamFailure("credential", "no_credential")
    return {"Authorization": f"Bearer {credential.get_secret_value()}"}


def build_client(
    server: SessionHost, key: SessionKey, credential: SecretStr | None = None
) -> Client[Any]:
    """A FastMCP client for one session, with only the gateway's own credentials, or the
    one obtained for its caller (``session_headers``).

    Sampling, elicitation and roots handlers are installed only where the upstream's
    ``forward`` section allows them; otherwise the client does not advertise them and the
    SDK refuses an upstream's request for them. An allowed request is relayed only to the
    caller whose call is in flight on this very session (``_caller_for``).
    """
    config = server.config
    handler = _ListChanged(
        lambda: server.schedule_refresh(key), lambda uri: server.resource_updated(key, uri)
    )
    transport: BoundedStdioTransport | StreamableHttpTransport
    if config.transport == "stdio":
        env = dict(config.env)
        env.update({k: v.get_secret_value() for k, v in server.secrets.env.items()})
        # The SDK starts the subprocess with a small default environment (PATH, HOME,
        # ...) plus ``env``: nothing of nexus's own environment (its secrets) is inherited.
        # FastMCP's StdioTransport, but for a bound on each message (stdio.py).
        sandbox = server.sandbox
        if sandbox is not None:
            # bwrap does the isolation (policy/sandbox.py); the environment given is the
            # whole of it: nothing of the SDK's default one.
            argv = sandbox.argv(list(config.args))
            transport = BoundedStdioTransport(
                command=argv[0],
                args=argv[1:],
                env=sandbox.env(env),
                cwd=None,
                max_line_chars=max_response_bytes(server),
                whole_env=True,
            )
        else:
            transport = BoundedStdioTransport(
                command=str(config.command),
                args=list(config.args),
                env=env,
                cwd=str(config.cwd) if config.cwd is not None else None,
                max_line_chars=max_response_bytes(server),
            )
    else:
        headers = session_headers(server, key, credential)
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

        transport = StreamableHttpTransport(
            str(config.url),
            headers=headers,
            httpx_client_factory=cast(
                Any, http_client_factory(str(config.url), verify, max_response_bytes(server))
            ),
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
        # Its log messages: the gateway's log at debug, escaped and cut; its progress:
        # only through a call's own relay (``progress.py``).
        log_handler=upstream_log(config.server_id),
        progress_handler=ignore_progress,
        **relays,
        mode="legacy",  # the handshake era: one session that lasts, as reuse needs
        init_timeout=config.timeouts.connect_seconds,
    )


__all__ = [
    "GATEWAY_SESSION",
    "SessionHost",
    "SessionKey",
    "UpstreamFailure",
    "UpstreamSession",
    "build_client",
    "is_transport_failure",
    "session_headers",
]
