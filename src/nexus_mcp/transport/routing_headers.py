"""``Mcp-Method`` / ``Mcp-Name`` must agree with the body in every protocol era.

The 2026-07-28 streamable HTTP transport mirrors a request's method and, for
``tools/call``, ``prompts/get`` and ``resources/read``, its ``name``/``uri`` into headers,
so that a proxy or firewall can route and filter without reading the body. The MCP SDK
checks them (``mcp.shared.inbound.classify_inbound_request``: ``400``, ``-32020``) only
when it handles the request as 2026-07-28. The same request without an
``MCP-Protocol-Version`` header, with an older one, or inside a handshake session is
handled as 2025-11-25 and its headers are not looked at: headers naming a read tool in
front of a body that calls a write tool pass a proxy that allows reads, and run the write.

``RoutingHeadersMiddleware`` makes the check wherever the headers appear, before the SDK
sees the request: when a POST carries ``Mcp-Method`` or ``Mcp-Name``, every message of
its body (one, or each of a batch) must have that method and name, a name-bearing method
named by ``Mcp-Method`` needs ``Mcp-Name``, a routing header may appear only once, and
its value must be visible ASCII (raw non-ASCII bytes are invalid; a name that is not
ASCII travels Base64-encoded as ``=?base64?...?=``). The comparison reuses the SDK's own
rules: ``NAME_BEARING_METHODS``, ``decode_header_value`` and
``find_duplicated_routing_header``. A request without these headers passes untouched
(the 2026-07-28 entry still requires them itself). A refusal is the SDK's: ``400``,
``-32020``, a fixed message; nothing of the request is echoed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    NAME_BEARING_METHODS,
    decode_header_value,
    find_duplicated_routing_header,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.server.asgi_body import read_body, replaying
from nexus_mcp.transport.wire_errors import FIXED_MESSAGES, HEADER_MISMATCH

log = get_logger(__name__)

_METHOD = MCP_METHOD_HEADER.encode("ascii")
_NAME = MCP_NAME_HEADER.encode("ascii")
_ROUTING = frozenset({_METHOD, _NAME, b"mcp-protocol-version"})
_VISIBLE_ASCII = re.compile(rb"[\x20-\x7e]*")
_BAD_REQUEST = 400


def mismatch(headers: Mapping[bytes, bytes], body: Any) -> str | None:
    """Why the routing headers disagree with the decoded body, or ``None`` when they agree.

    ``headers`` holds the routing headers present (lowercase name to raw value). The
    reason is a fixed phrase for the log, never a value.
    """
    method_header = headers.get(_METHOD)
    name_header = headers.get(_NAME)
    messages = body if isinstance(body, list) else [body]
    if not messages:
        return "empty_batch"
    name = decode_header_value(name_header.decode("ascii")) if name_header is not None else None
    if name_header is not None and name is None:
        return "name_encoding"
    for message in messages:
        method = message.get("method") if isinstance(message, dict) else None
        if method_header is not None and method != method_header.decode("ascii"):
            return "method"
        key = NAME_BEARING_METHODS.get(method) if isinstance(method, str) else None
        if key is None:
            if name_header is not None:
                return "name_without_named_method"
            continue
        params = message.get("params") if isinstance(message, dict) else None
        value = params.get(key) if isinstance(params, dict) else None
        if name_header is None:
            # A client that mirrors the method mirrors the name too (the SDK's own rule).
            if method_header is not None and value is not None:
                return "name_missing"
            continue
        if not isinstance(value, str) or value != name:
            return "name"
    return None


def _routing_headers(scope: Scope) -> tuple[dict[bytes, bytes], str | None]:
    raw = [(bytes(k).lower(), bytes(v)) for k, v in scope.get("headers", [])]
    present = {k: v for k, v in raw if k in _ROUTING}
    if _METHOD not in present and _NAME not in present:
        return {}, None
    duplicated = find_duplicated_routing_header((k.decode("latin-1"), "") for k, _ in raw)
    if duplicated is not None:
        return present, "duplicated"
    if any(not _VISIBLE_ASCII.fullmatch(v) for v in present.values()):
        return present, "not_ascii"
    return present, None


class RoutingHeadersMiddleware:
    """Refuses a POST whose ``Mcp-Method``/``Mcp-Name`` headers disagree with its body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        headers, reason = _routing_headers(scope)
        if not headers:
            await self.app(scope, receive, send)
            return
        # Read the whole body (bounded by BodyLimitMiddleware outside this layer), then
        # hand the same bytes to the app.
        messages, body = await read_body(receive)
        try:
            decoded: Any = json.loads(body)
        except (ValueError, RecursionError):
            decoded = None  # not JSON: nothing to route on, the SDK answers its parse error
        else:
            reason = reason or mismatch(headers, decoded)
        if reason is not None:
            log.warning("request_header_mismatch", problem=reason)
            await _refuse(send, _request_id(decoded))
            return
        await self.app(scope, replaying(messages, receive), send)


def _request_id(body: Any) -> Any:
    if isinstance(body, dict):
        request_id = body.get("id")
        if isinstance(request_id, str | int) and not isinstance(request_id, bool):
            return request_id
    return None


async def _refuse(send: Send, request_id: Any) -> None:
    error = {"code": HEADER_MISMATCH, "message": FIXED_MESSAGES[HEADER_MISMATCH]}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": _BAD_REQUEST,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = ["RoutingHeadersMiddleware", "mismatch"]
