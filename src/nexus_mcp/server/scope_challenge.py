"""The step-up challenge: a tool call the token's scopes do not cover answers HTTP 403.

MCP authorization (2025-11-25, "Scope challenge handling"; RFC 6750 section 3.1): when a
valid token lacks a scope an operation needs, the resource server answers ``403`` with
``WWW-Authenticate: Bearer error="insufficient_scope", scope="...",
resource_metadata="..."`` so the client can ask the user for more and retry. FastMCP 4.1
turns a component's scope shortfall into a tool error inside a ``200``, which no client
steps up from, so this ASGI layer makes the decision before the MCP handler runs.

It only answers for a ``tools/call`` whose tool the caller's profile grants
(``GrantedTools.missing_scopes``): a tool the namespace hides stays hidden, answered by
the chain as an unknown tool, so a challenge never reveals that a tool exists. The
scopes named are the tool's, from configuration (``auth.tool_scopes`` and contracts),
never anything the request carried. The layer sits inside FastMCP's authentication
middleware (it reads the verified token from the ASGI scope) and inside the body limit.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.server.asgi_body import read_body, replaying

log = get_logger(__name__)

# (verified access token, tool name) -> the scopes to ask for, or empty to let it through.
ScopeCheck = Callable[[Any, str], Iterable[str]]
_CHECKS: weakref.WeakKeyDictionary[Any, tuple[ScopeCheck, str | None]] = weakref.WeakKeyDictionary()
FORBIDDEN = 403


def bind_scope_check(server: Any, check: ScopeCheck, *, metadata_url: str | None) -> None:
    """Make ``check`` the step-up decision of every HTTP app built from ``server`` (FastMCP)."""
    _CHECKS[server] = (check, metadata_url)


def _bound(scope: Scope) -> tuple[ScopeCheck, str | None] | None:
    app = scope.get("app")
    state = getattr(app, "state", None)
    server = getattr(state, "fastmcp_server", None)
    if server is None or getattr(state, "path", None) != scope.get("path"):
        return None
    try:
        return _CHECKS.get(server)
    except TypeError:
        return None


def tool_call_name(body: bytes) -> str | None:
    """The tool a JSON-RPC ``tools/call`` body names (None for anything else)."""
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(decoded, dict) or decoded.get("method") != "tools/call":
        return None
    params = decoded.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else None


def challenge(scopes: Iterable[str], metadata_url: str | None) -> str:
    parts = ['error="insufficient_scope"', f'scope="{" ".join(sorted(scopes))}"']
    if metadata_url is not None:
        parts.append(f'resource_metadata="{metadata_url}"')
    return "Bearer " + ", ".join(parts)


class ScopeChallengeMiddleware:
    """Answers ``403 insufficient_scope`` for a granted tool the token's scopes do not cover."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        bound = _bound(scope)
        access = getattr(scope.get("user"), "access_token", None)
        if bound is None or access is None:
            await self.app(scope, receive, send)
            return
        messages, body = await read_body(receive)
        name = tool_call_name(body)
        check, metadata_url = bound
        missing = frozenset(check(access, name)) if name is not None else frozenset()
        if missing:
            log.info("scope_challenge", scopes=sorted(missing))
            await _forbid(send, challenge(missing, metadata_url))
            return
        await self.app(scope, replaying(messages, receive), send)


async def _forbid(send: Send, www_authenticate: str) -> None:
    body = json.dumps(
        {
            "error": "insufficient_scope",
            "error_description": "this tool needs a scope the token does not carry",
        }
    ).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": FORBIDDEN,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                (b"www-authenticate", www_authenticate.encode("ascii")),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "ScopeChallengeMiddleware",
    "bind_scope_check",
    "challenge",
    "tool_call_name",
]
