"""JSON-RPC errors the HTTP transport writes itself, without the values the client sent.

Before a POST reaches the server's dispatch (and so the envelope), the MCP SDK's
handshake-era streamable HTTP transport checks the body's JSON-RPC shape and answers a
failure with ``400`` and ``"Validation error: <pydantic's text>"`` (``-32602``) or
``"Parse error: <parser's text>"`` (``-32700``). pydantic's text quotes the input
(``input_value=[...]``): a ``tools/call`` whose ``params`` is an array comes back with
the array in the error. ``TransportErrorsMiddleware`` rewrites those two messages to the
fixed texts the SDK uses everywhere else (``Invalid request parameters``, ``Parse
error``), keeping the code and the status; every other response passes untouched.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

INVALID_PARAMS = -32602
PARSE_ERROR = -32700
# The message prefix the transport writes, and the fixed message that replaces it.
_FIXED_MESSAGES = {
    INVALID_PARAMS: ("Validation error", "Invalid request parameters"),
    PARSE_ERROR: ("Parse error", "Parse error"),
}
# Larger error bodies are not parsed: they are replaced whole (none is this large).
MAX_ERROR_BODY_BYTES = 1 << 20
_BAD_REQUEST = 400


def scrub_error_body(body: bytes) -> bytes:
    """The body with a transport error message replaced; any other body unchanged."""
    if len(body) > MAX_ERROR_BODY_BYTES:
        generic = {"code": INVALID_PARAMS, "message": _FIXED_MESSAGES[INVALID_PARAMS][1]}
        return _encode({"jsonrpc": "2.0", "id": None, "error": generic})
    try:
        document: Any = json.loads(body)
    except ValueError:
        return body
    error: Any = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):
        return body
    message, code = error.get("message"), error.get("code")
    fixed = _FIXED_MESSAGES.get(code) if isinstance(code, int) else None
    if fixed is None or not isinstance(message, str) or not message.startswith(fixed[0]):
        return body
    error["message"] = fixed[1]
    error.pop("data", None)
    return _encode(document)


def _encode(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


class TransportErrorsMiddleware:
    """Holds a ``400`` JSON response until its body is complete, then scrubs it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        chunks: list[bytes] = []

        async def scrubbing_send(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                if message.get("status") == _BAD_REQUEST and _is_json(message):
                    held = message
                    return
                await send(message)
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = scrub_error_body(b"".join(chunks))
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode("ascii")))
            start, held = {**held, "headers": headers}, None
            await send(start)
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, scrubbing_send)


def _is_json(message: Message) -> bool:
    for name, value in message.get("headers", []):
        if name.lower() == b"content-type":
            return bool(value.split(b";")[0].strip().lower() == b"application/json")
    return False


__all__ = ["MAX_ERROR_BODY_BYTES", "TransportErrorsMiddleware", "scrub_error_body"]
