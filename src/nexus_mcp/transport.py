"""Running the server on stdio or streamable HTTP, with the defaults FastMCP leaves open.

HTTP: Host/Origin validation on (DNS rebinding), bound to 127.0.0.1 unless configured,
request bodies bounded here as well as by the app, optional stateless mode for replicas
behind a load balancer. stdio: nothing but MCP messages on stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from starlette.middleware import Middleware as ASGIMiddlewareSpec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nexus_mcp.logs import enforce_one_handler
from nexus_mcp.server import NexusServer
from nexus_mcp.settings import Settings

LOOPBACK_HOSTS = ("127.0.0.1:*", "localhost:*", "[::1]:*")


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


def http_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for FastMCP's ``run_http_async``/``http_app`` (shared with tests)."""
    allowed_hosts = list(settings.allowed_hosts) or list(LOOPBACK_HOSTS)
    return {
        "path": settings.http_path,
        "stateless_http": settings.stateless_http,
        "host_origin_protection": True,
        "allowed_hosts": allowed_hosts,
        "allowed_origins": list(settings.allowed_origins) or None,
        "middleware": [
            ASGIMiddlewareSpec(BodyLimitMiddleware, max_bytes=settings.limits.max_request_bytes)
        ],
    }


def client_config(settings: Settings, *, url: str | None) -> dict[str, Any]:
    if url is not None:
        return {"mcpServers": {"nexus": {"url": url}}}
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


def announce(settings: Settings) -> None:
    """Tell the operator where the server is, on stderr (stdout may be the stdio channel)."""
    if settings.transport != "http":
        return
    host = settings.host if ":" not in settings.host else f"[{settings.host}]"
    url = f"http://{host}:{settings.port}{settings.http_path}"
    lines = [
        f"nexus-mcp {settings.mode} server on {url}",
        f"workspace: {settings.workspace}",
        "client config (paste into your MCP client):",
        json.dumps(client_config(settings, url=url), indent=2),
    ]
    if settings.is_dev and not settings.auth.enabled:
        lines.append("dev mode: callers act as the dev principal; never expose this port.")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


async def serve(server: NexusServer) -> None:
    settings = server.runtime.settings
    # Building the server imported FastMCP and the MCP SDK, which may install handlers of
    # their own; every line must still leave through the one JSON handler (logs.py).
    enforce_one_handler()
    try:
        if settings.transport == "stdio":
            await server.mcp.run_stdio_async(show_banner=False)
        else:
            announce(settings)
            await server.mcp.run_http_async(
                show_banner=False,
                transport="http",
                host=settings.host,
                port=settings.port,
                # No log_level here: FastMCP would re-install its rich handler for the run.
                # Levels come from logs.configure_logging; uvicorn keeps our JSON logging.
                uvicorn_config={"log_config": None},
                **http_options(settings),
            )
    finally:
        server.close()


__all__ = ["BodyLimitMiddleware", "announce", "client_config", "http_options", "serve"]
