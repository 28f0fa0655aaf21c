"""The operator console's routes, for the HTTP server and for ``nexus-mcp console``.

One page per job (inbox, upstream pins, access, audit, health), server-rendered; the only
script is ``static/console.js`` (the inbox's live update and a confirmation or two), from
the console's own origin as the Content-Security-Policy requires: no inline code, no
front-end build.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nexus_mcp.console import access, audit, health, inbox, oidc, pins, signin
from nexus_mcp.console.pages import PREFIX, Console
from nexus_mcp.console.security import SECURITY_HEADERS
from nexus_mcp.console.services import ConsoleServices
from nexus_mcp.observability.logs import get_logger

log = get_logger(__name__)

ANY_METHOD = ("DELETE", "GET", "OPTIONS", "PATCH", "POST", "PUT")
STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}


def console_routes(services: ConsoleServices) -> list[Route]:
    """Every route of the console, under ``/console``."""
    console = Console(services)
    files = {
        name: (resources.files("nexus_mcp.console").joinpath("static", name).read_bytes(), kind)
        for name, kind in STATIC.items()
    }

    async def static(request: Request) -> Response:
        found = files.get(request.path_params.get("name", ""))
        if found is None:
            return Response("not found", status_code=404, headers=dict(SECURITY_HEADERS))
        body, kind = found
        headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache"}
        return Response(body, media_type=kind, headers=headers)

    async def not_found(request: Request) -> Response:
        return Response("not found", status_code=404, headers=dict(SECURITY_HEADERS))

    pages: list[Route] = [
        *signin.routes(console),
        *oidc.routes(console),
        *inbox.routes(console),
        *access.routes(console),
        *audit.routes(console),
        *health.routes(console),
        *pins.routes(console),
        Route(f"{PREFIX}/static/{{name}}", static, methods=["GET"]),
        # Last: any other /console path or method is the console's own not-found (with its
        # headers: no framing, no sniffing), never the bare answer of the HTTP framework.
        Route(f"{PREFIX}/{{rest:path}}", not_found, methods=list(ANY_METHOD)),
    ]
    return [
        Route(route.path, _secured(route.endpoint), methods=sorted(route.methods or ()))
        for route in pages
    ]


def _secured(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[..., Any]:
    """Every console answer (pages, redirects, refusals, JSON) with the strict headers."""

    async def answer(request: Request) -> Response:
        try:
            response = await endpoint(request)
        except Exception as exc:  # noqa: BLE001 - any fault is the same plain page
            # Not the framework's bare 500 (no anti-framing headers); never the exception's
            # text to the browser, its type to the server's log.
            log.error("console_page_failed", error_type=type(exc).__name__)
            return Response("server error", status_code=500, headers=dict(SECURITY_HEADERS))
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    return answer


def add_console_routes(mcp: Any, services: ConsoleServices) -> None:
    """Serve the console on a FastMCP server's HTTP app (``custom_route``)."""
    for route in console_routes(services):
        methods = sorted(route.methods or ())
        mcp.custom_route(route.path, methods=[m for m in methods if m != "HEAD"])(route.endpoint)


__all__ = ["add_console_routes", "console_routes"]
