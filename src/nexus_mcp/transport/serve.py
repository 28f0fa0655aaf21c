"""Running the server on stdio or streamable HTTP, with the defaults FastMCP leaves open.

HTTP: Host/Origin validation on (DNS rebinding), bound to 127.0.0.1 unless configured,
request bodies bounded here as well as by the app, optional stateless mode for replicas
behind a load balancer. The socket is bound here, before anything is announced, so the
banner names the port really listened on (``--port 0``) and a port that cannot be had is
one line, not a banner followed by a traceback. stdio: nothing but MCP messages on stdout.

Every run logs ``server_started`` (its address, ``stdio`` or the URL, mode and transport)
and ``server_stopped`` (why: ``SIGINT``, ``SIGTERM``, ``stdin_closed`` or ``exit``). On
HTTP, uvicorn shuts down gracefully on SIGINT or SIGTERM and then raises the signal again;
the handler installed here turns that into a clean stop (exit 0). On stdio the SDK reads
stdin on a thread that cancellation cannot interrupt, so a signal cancels the session and,
if stdin still holds it after ``STDIO_STOP_GRACE_SECONDS``, the process closes its stores,
logs the stop and exits.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, cast
from urllib.parse import urlsplit

from starlette.middleware import Middleware as ASGIMiddlewareSpec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nexus_mcp._version import __version__
from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.logs import enforce_one_handler, get_logger
from nexus_mcp.server.build import NexusServer
from nexus_mcp.server.scope_challenge import ScopeChallengeMiddleware
from nexus_mcp.settings import Settings
from nexus_mcp.transport.routing_headers import RoutingHeadersMiddleware
from nexus_mcp.transport.wire_errors import ScrubbingSendStream, TransportErrorsMiddleware

LOOPBACK_HOSTS = ("127.0.0.1:*", "localhost:*", "[::1]:*")
LISTEN_BACKLOG = 2048  # uvicorn's default, which it would have used binding the socket itself
LISTEN_SETTINGS = "set 'host' (NEXUS_MCP_HOST / --host) or 'port' (NEXUS_MCP_PORT / --port)"
PORT_IN_USE_HINT = (
    "another process listens there: pick another port with --port N (NEXUS_MCP_PORT; "
    "with make: make run PORT=N), or --port 0 for any free one"
)
# What the banner's client config puts where a token goes: never a real one.
TOKEN_PLACEHOLDER = "Bearer <your token>"  # noqa: S105 - a placeholder, no secret
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STDIO_STOP_GRACE_SECONDS = 1.0
STARTED_EVENT = "server_started"
STOPPED_EVENT = "server_stopped"

log = get_logger(__name__)


class BodyLimitMiddleware:
    """Refuses HTTP request bodies over ``max_bytes`` with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _reject(send)
                return
        seen = 0
        rejected = False

        async def limited() -> Message:
            nonlocal seen, rejected
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    rejected = True
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            if rejected:
                await _reject(send)


class _TooLarge(Exception):
    pass


SESSION_HEADER = b"mcp-session-id"


class SessionAffinityMiddleware:
    """Makes the 2025-11-25 era's ``Mcp-Session-Id`` routable by a load balancer.

    The MCP SDK names sessions with a random id and keeps them in this process's memory,
    so every request of a session must reach the replica that opened it. This layer puts
    ``<instance_id>.`` in front of the id the SDK hands out and takes it off again on the
    way in; a balancer maps that prefix to its replica (docs/replicas.md:
    an nginx ``map`` on the header). An id carrying another replica's prefix is
    passed on unchanged, so the SDK answers it as the unknown session it is here (404)
    and the client starts a new one. Nothing else of the request is touched.
    """

    def __init__(self, app: ASGIApp, instance_id: str) -> None:
        self.app = app
        self.prefix = instance_id.encode("ascii") + b"."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        if any(name == SESSION_HEADER for name, _ in headers):
            scope = dict(scope)
            scope["headers"] = [
                (name, self._inbound(value) if name == SESSION_HEADER else value)
                for name, value in headers
            ]

        async def outbound(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [
                    (name, self.prefix + value if name.lower() == SESSION_HEADER else value)
                    for name, value in message.get("headers", [])
                ]
            await send(message)

        await self.app(scope, receive, outbound)

    def _inbound(self, value: bytes) -> bytes:
        return value[len(self.prefix) :] if value.startswith(self.prefix) else value


async def _reject(send: Send) -> None:
    body = b'{"error":"request body too large"}'
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def public_hosts(base_url: str | None) -> list[str]:
    """The Host header values ``auth.base_url`` names (with and without its port)."""
    if base_url is None:
        return []
    parts = urlsplit(base_url)
    if parts.hostname is None or parts.hostname in ("127.0.0.1", "localhost", "::1"):
        return []
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return [host, f"{host}:*"]


def front_door_paths(settings: Settings) -> tuple[str, ...]:
    """The routes of FastMCP's OAuthProxy (its authorization server) and its callback."""
    proxy = settings.auth.oidc_proxy
    callback = (proxy.redirect_path,) if proxy is not None else ()
    return ("/authorize", "/token", "/register", "/revoke", "/consent", *callback)


def http_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for FastMCP's ``run_http_async``/``http_app`` (shared with tests)."""
    # Here, not at the top: it loads FastMCP's OAuth proxy, which stdio never needs.
    from nexus_mcp.server.oauth_errors import OAuthErrorsMiddleware

    allowed_hosts = list(settings.allowed_hosts) or [
        *LOOPBACK_HOSTS,
        # The public address clients and the identity provider's redirects reach.
        *public_hosts(settings.auth.base_url),
    ]
    return {
        "path": settings.http_path,
        "stateless_http": settings.stateless_http,
        "host_origin_protection": True,
        "allowed_hosts": allowed_hosts,
        # The sign-in pages' own origin (behind a TLS proxy the request looks like http).
        "allowed_origins": list(settings.allowed_origins)
        or ([settings.auth.base_url] if settings.auth.base_url else None),
        "middleware": [
            ASGIMiddlewareSpec(BodyLimitMiddleware, max_bytes=settings.limits.max_request_bytes),
            # JSON-RPC errors the SDK and FastMCP build from request content quote it back
            # (transport/wire_errors.py): every error leaves with a fixed message.
            ASGIMiddlewareSpec(TransportErrorsMiddleware),
            # Mcp-Method / Mcp-Name agree with the body in every era (transport/routing_headers.py).
            ASGIMiddlewareSpec(RoutingHeadersMiddleware),
            *(
                [
                    ASGIMiddlewareSpec(
                        SessionAffinityMiddleware, instance_id=settings.state.instance_id
                    )
                ]
                if settings.state.instance_id and not settings.stateless_http
                else []
            ),
            # The front door's OAuth errors keep their code, never the request's words.
            *(
                [ASGIMiddlewareSpec(OAuthErrorsMiddleware, paths=front_door_paths(settings))]
                if settings.auth.oidc_proxy is not None
                else []
            ),
            # Inside FastMCP's authentication: a granted tool the token's scopes do not
            # cover answers 403 insufficient_scope (server/scope_challenge.py).
            *([ASGIMiddlewareSpec(ScopeChallengeMiddleware)] if settings.auth.enabled else []),
        ],
    }


def signs_in(settings: Settings) -> str | None:
    """The public MCP URL when clients sign in by OAuth (no token to paste), else None."""
    auth = settings.auth
    if auth.base_url is None or not (auth.authorization_servers or auth.oidc_proxy):
        return None
    return auth.resource_url(settings.http_path)


def client_config(settings: Settings, *, url: str | None) -> dict[str, Any]:
    if url is not None:
        resource = signs_in(settings)
        entry: dict[str, Any] = {"url": resource or url}
        if settings.auth.enabled and resource is None:
            # Tokens decide who calls (prod HTTP always): show where the caller's goes.
            entry["headers"] = {"Authorization": TOKEN_PLACEHOLDER}
        return {"mcpServers": {"nexus": entry}}
    workspace = str(settings.workspace.resolve()) if settings.workspace else "."
    return {
        "mcpServers": {
            "nexus": {
                "command": "nexus-mcp",
                "args": [
                    "serve",
                    "--transport",
                    "stdio",
                    "--mode",
                    settings.mode,
                    "--workspace",
                    workspace,
                ],
            }
        }
    }


def bind_listener(settings: Settings) -> socket.socket:
    """Bind and listen on the configured host and port, as uvicorn would have.

    Raises ``ConfigError`` naming the address when it cannot be had (in use, not local,
    not resolvable, privileged), before anything is announced.
    """
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    address = f"{_url_host(settings.host)}:{settings.port}"
    sock: socket.socket | None = None
    try:
        # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on sockets whose
        # proto says TCP, and without it every response waits for Nagle and delayed ACK
        # (~40 ms a call over loopback; benchmarks/bench_chain.py over HTTP).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        # uvicorn sets it too: a restart may rebind while old connections sit in TIME_WAIT.
        # On Linux and macOS it never lets a second server listen on a port in use.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        if sock is not None:
            sock.close()
        hint = PORT_IN_USE_HINT if exc.errno == errno.EADDRINUSE else LISTEN_SETTINGS
        raise ConfigError(f"cannot listen on {address}: {_reason(exc)}; {hint}") from None
    return sock


def _reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


def _url_host(host: str) -> str:
    return host if ":" not in host else f"[{host}]"


def http_url(settings: Settings, port: int) -> str:
    return f"http://{_url_host(settings.host)}:{port}{settings.http_path}"


def log_started(settings: Settings, *, address: str, **extra: Any) -> None:
    """The start line: where (``stdio`` or the URL), how, which build. No path, no secret."""
    log.info(
        STARTED_EVENT,
        address=address,
        mode=settings.mode,
        transport=settings.transport,
        version=__version__,
        **extra,
    )


def log_stopped(settings: Settings, *, reason: str) -> None:
    log.info(STOPPED_EVENT, transport=settings.transport, reason=reason)


class LifespanHooks:
    """Passes everything to ``app`` and calls ``started`` once its lifespan has started
    (uvicorn is serving) and ``stopped`` once it has ended, cleanly or not. The start line
    uses the first; a ``--workers`` child closes its server's stores with the second."""

    def __init__(
        self,
        app: ASGIApp,
        started: Callable[[], None] | None = None,
        stopped: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.started = started
        self.stopped = stopped

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def watch(message: Message) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete" and self.started is not None:
                self.started()
            if (
                message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed")
                and self.stopped is not None
            ):
                self.stopped()

        await self.app(scope, receive, watch)


class _StopSignal(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised by ``_on_stop_signal`` (a KeyboardInterrupt, so that
    asyncio carries it out of whatever task it lands in, as it does Ctrl-C)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _on_stop_signal(signum: int, _frame: FrameType | None) -> None:
    raise _StopSignal(signal.Signals(signum).name)


def _install_stop_handlers() -> dict[int, Any] | None:
    """SIGINT and SIGTERM raise ``_StopSignal`` (main thread only); the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {sig: signal.signal(sig, _on_stop_signal) for sig in STOP_SIGNALS}


def _restore_handlers(previous: dict[int, Any] | None) -> None:
    for sig, handler in (previous or {}).items():
        signal.signal(sig, handler)


def announce(settings: Settings, *, port: int) -> None:
    """Tell the operator where the server listens, on stderr (stdout may be stdio's channel).

    ``port`` is the bound port, which differs from the setting when that is 0.
    """
    if settings.transport != "http":
        return
    url = http_url(settings, port)
    lines = [
        f"nexus-mcp {settings.mode} server on {url}",
        f"workspace: {settings.workspace}",
        "client config (paste into your MCP client):",
        json.dumps(client_config(settings, url=url), indent=2),
    ]
    if signs_in(settings) is not None:
        lines.append(
            "clients sign in with your identity provider (OAuth): no token to paste; "
            f"metadata at {settings.auth.base_url}/.well-known/oauth-protected-resource"
            f"{settings.http_path}"
        )
    if settings.console.enabled:
        base = url.removesuffix(settings.http_path)
        lines.append(
            f"operator console: {base}/console (a one-time sign-in link: nexus-mcp console "
            f"--link --url {base} --data-dir {settings.data_dir})"
        )
    if settings.is_dev and not settings.auth.enabled:
        lines.append("dev mode: callers act as the dev principal; never expose this port.")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


async def run_stdio(server: NexusServer) -> None:
    """FastMCP's ``run_stdio_async`` (fastmcp/server/mixins/transport.py), with every
    JSON-RPC error scrubbed on its way to stdout (``wire_errors.ScrubbingSendStream``).

    FastMCP has no hook on the stdio write stream and the SDK writes several errors from
    request content (an unknown method's name, a resource URI), so this is the same
    sequence with the stream wrapped: transport marked ``stdio``, the server's lifespan,
    the SDK's ``stdio_server``, the low-level server's ``run``.
    """
    from fastmcp.server.context import reset_transport, set_transport
    from mcp.server.stdio import stdio_server

    mcp = server.mcp
    token = set_transport("stdio")
    try:
        async with mcp._lifespan_manager(), stdio_server() as (read_stream, write_stream):
            await mcp._mcp_server.run(
                read_stream,
                cast(Any, ScrubbingSendStream(write_stream)),
                mcp._mcp_server.create_initialization_options(),
            )
    finally:
        reset_transport(token)


async def serve(server: NexusServer) -> None:
    """Serve until stopped; ``server_started`` and ``server_stopped`` bracket the run."""
    settings = server.runtime.settings
    # Building the server imported FastMCP and the MCP SDK, which may install handlers of
    # their own; every line must still leave through the one handler (observability/logs.py).
    enforce_one_handler()
    if settings.transport == "stdio":
        await _serve_stdio(server)
    else:
        await _serve_http(server)


async def _serve_http(server: NexusServer) -> None:
    settings = server.runtime.settings
    reason = "exit"
    try:
        listener = bind_listener(settings)
        try:
            port = int(listener.getsockname()[1])
            announce(settings, port=port)
            previous = _install_stop_handlers()
            options = http_options(settings)
            # The start line once uvicorn serves: from then on its own handlers take a
            # signal and shut down gracefully before raising it again.
            started = ASGIMiddlewareSpec(
                LifespanHooks,
                started=lambda: log_started(settings, address=http_url(settings, port)),
            )
            options["middleware"] = [*options["middleware"], started]
            try:
                await server.mcp.run_http_async(
                    show_banner=False,
                    transport="http",
                    host=settings.host,
                    port=port,
                    # No log_level here: FastMCP would re-install its rich handler for the
                    # run. Levels come from logs.configure_logging; uvicorn keeps our handler.
                    uvicorn_config={"log_config": None},
                    sockets=[listener],
                    **options,
                )
            except _StopSignal as stop:
                # uvicorn has shut down gracefully and raised the signal again (module doc).
                reason = stop.name
            finally:
                _restore_handlers(previous)
            log_stopped(settings, reason=reason)
        finally:
            listener.close()
    finally:
        server.close()


async def _serve_stdio(server: NexusServer) -> None:
    settings = server.runtime.settings
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    received: list[str] = []

    def force_stop() -> None:
        # stdin's reader thread still holds the session (module docstring).
        server.close()
        log_stopped(settings, reason=received[0])
        sys.stderr.flush()
        os._exit(0)

    timers: list[asyncio.TimerHandle] = []

    def on_signal(sig: signal.Signals) -> None:
        if received:
            return
        received.append(sig.name)
        if task is not None:
            task.cancel()
        timers.append(loop.call_later(STDIO_STOP_GRACE_SECONDS, force_stop))

    installed: list[signal.Signals] = []
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    log_started(settings, address="stdio")
    try:
        await run_stdio(server)
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        for timer in timers:
            timer.cancel()
        server.close()
    log_stopped(settings, reason=received[0] if received else "stdin_closed")


__all__ = [
    "BodyLimitMiddleware",
    "LifespanHooks",
    "SessionAffinityMiddleware",
    "announce",
    "bind_listener",
    "client_config",
    "http_options",
    "http_url",
    "log_started",
    "log_stopped",
    "run_stdio",
    "serve",
]
