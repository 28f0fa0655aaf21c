"""Every JSON-RPC error leaves without the values the client sent, on both transports.

The MCP SDK and FastMCP build several protocol-level errors from request content: an
unknown method comes back as ``-32601`` with the method name in ``data``, a
``resources/read`` of a missing or malformed URI with the URI in the message and in
``data``, a ``prompts/get`` of an unknown prompt with its name in the message, the
handshake-era HTTP transport's ``400``s with pydantic's or the JSON parser's text (which
quote the input), and an exception raised outside our middleware with its own text under
code ``0``. nexus-mcp promises not to echo input, so every JSON-RPC error passes one
outbound filter on its way to the wire: ``scrub_error`` keeps the code, replaces the
message with a fixed text for that code (``FIXED_MESSAGES``) unless the message is one of
the SDK's own constant texts, which carry no request content (``_CONSTANT_MESSAGES``),
and drops ``data`` except the fields a client needs and the server chose (the
``supported`` versions of ``-32022``, the capabilities a ``-32021`` requires, the SDK's
empty ``""``). A refusal of a ``resources/read`` or ``prompts/get`` (code
``REFUSAL_JSONRPC_CODE``) keeps its envelope, as a tool's refusal does: the message is
kept when it is the envelope's JSON, with a known code, and the data is that envelope.

There is no FastMCP or SDK hook that sees every error (the 2026-07-28 HTTP entry writes
its own, the stdio reader and the session transport theirs), so the filter sits at the
wire: ``TransportErrorsMiddleware`` for HTTP (JSON bodies of any status and each event of
an SSE stream) and ``ScrubbingSendStream`` around the stdio write stream (``transport/serve.py``).
A tool's refusal is a ``CallToolResult`` (our envelope), not a JSON-RPC error: untouched.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mcp.shared.message import SessionMessage
from mcp_types import ErrorData, JSONRPCError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nexus_mcp.envelope import (
    PROMPT_NOT_FOUND_MESSAGE,
    REFUSAL_JSONRPC_CODE,
    RESOURCE_NOT_FOUND_MESSAGE,
)
from nexus_mcp.errors import Code
from nexus_mcp.observability.logs import get_logger

log = get_logger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002  # 2025-11-25 spec; retired by 2026-07-28, still sent by the SDK
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022
REQUEST_CANCELLED = -32800

# The fixed message of each code; any other code gets ``FALLBACK_MESSAGE``.
FIXED_MESSAGES: dict[int, str] = {
    PARSE_ERROR: "Parse error",
    INVALID_REQUEST: "Invalid request",
    METHOD_NOT_FOUND: "Method not found",
    INVALID_PARAMS: "Invalid request parameters",
    INTERNAL_ERROR: "Internal server error",
    0: "Internal server error",  # the handshake era's code for an unhandled exception
    RESOURCE_NOT_FOUND: "Resource not found",
    HEADER_MISMATCH: "Request headers do not match the request body",
    MISSING_REQUIRED_CLIENT_CAPABILITY: "Missing required client capability",
    UNSUPPORTED_PROTOCOL_VERSION: "Unsupported protocol version",
    -32000: "Connection closed",
    -32001: "Request failed",
    REFUSAL_JSONRPC_CODE: "Request refused",
    REQUEST_CANCELLED: "Request cancelled",
}
FALLBACK_MESSAGE = "Request failed"

# Texts the SDK writes from constants alone: kept, since they tell a client what to fix.
_CONSTANT_MESSAGES = frozenset(
    {
        "Bad Request: Missing session ID",
        "Bad Request: No valid session ID provided",
        "Body must be a single JSON-RPC request or notification object",
        "Conflict: Only one SSE stream is allowed per session",
        "Method Not Allowed",
        "Method Not Allowed: Session termination not supported",
        "Not Acceptable: Client must accept application/json",
        "Not Acceptable: Client must accept both application/json and text/event-stream",
        "Not Acceptable: Client must accept text/event-stream",
        "Not Found: Invalid or expired session ID",
        "Not Found: Session has been terminated",
        "Session not found",
        "Session terminated before the request completed",
        "Too many open sessions",
        # The envelope's answer to a hidden or missing resource or prompt (fixed texts).
        RESOURCE_NOT_FOUND_MESSAGE,
        PROMPT_NOT_FOUND_MESSAGE,
        "Unsupported Media Type: Content-Type must be application/json",
        "the protocol-version envelope value must be a string",
        "this connection serves the handshake protocol era; "
        "requests carrying the 2026-07-28 envelope are not accepted on it",
        "connection is serving the 2026-07-28 protocol; the initialize handshake is not accepted",
    }
)
_ENVELOPE_KEY = r"io\.modelcontextprotocol/(?:protocolVersion|clientCapabilities)"
_CONSTANT_PATTERNS = (
    re.compile(
        rf"params\._meta is missing the required envelope key\(s\)"
        rf"(?:: {_ENVELOPE_KEY}(?:, {_ENVELOPE_KEY})?)?"
    ),
    re.compile(
        r"params\._meta must be an object carrying the required "
        r"'io\.modelcontextprotocol/protocolVersion' and "
        r"'io\.modelcontextprotocol/clientCapabilities' envelope keys"
    ),
    re.compile(
        r"(?:mcp-protocol-version|mcp-method|mcp-name) header (?:appears more than once|does "
        r"not match the request (?:envelope's protocol version|body's method|body's "
        r"'(?:name|uri)' parameter))"
    ),
)
# Larger non-2xx error bodies are not parsed: they are replaced whole (none is this large).
MAX_ERROR_BODY_BYTES = 1 << 20
_SUCCESS_MAX = 299


def _is_constant(message: str) -> bool:
    return message in _CONSTANT_MESSAGES or any(p.fullmatch(message) for p in _CONSTANT_PATTERNS)


def _kept_data(code: int, data: Any) -> tuple[bool, Any]:
    """(keep, value): the part of ``data`` the server chose and a client needs, if any."""
    if data == "":
        return True, ""  # the SDK's "no details" marker (-32602)
    if code == UNSUPPORTED_PROTOCOL_VERSION and isinstance(data, dict):
        supported = data.get("supported")
        if isinstance(supported, list) and all(isinstance(v, str) for v in supported):
            # ``requested`` is the client's own value: blanked, not echoed; the SDK client
            # negotiates on ``supported`` alone (mcp/client/_probe.py).
            return True, {"supported": supported, "requested": ""}
        return False, None
    if code == MISSING_REQUIRED_CLIENT_CAPABILITY and isinstance(data, dict):
        required = {k: v for k, v in data.items() if k in ("requiredCapabilities",)}
        return bool(required), required or None
    return False, None


def _refusal(error: dict[str, Any]) -> dict[str, Any] | None:
    """A read's or get's refusal as the envelope built it (``envelope.to_request_error``):
    its data is exactly ``{"error": text, "code": a stable code}`` and its message that
    data's JSON. Anything else under its code is scrubbed as any error."""
    data = error.get("data")
    if not (isinstance(data, dict) and data.keys() == {"error", "code"}):
        return None
    text, code = data["error"], data["code"]
    if not (isinstance(text, str) and isinstance(code, str) and code in Code.__members__):
        return None
    if error.get("message") != json.dumps(data, separators=(",", ":")):
        return None
    return {"code": REFUSAL_JSONRPC_CODE, "message": error["message"], "data": data}


def scrub_error(error: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC ``error`` object with the code kept and nothing of the request left."""
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        return {"code": INTERNAL_ERROR, "message": FIXED_MESSAGES[INTERNAL_ERROR]}
    if code == REFUSAL_JSONRPC_CODE and (refusal := _refusal(error)) is not None:
        return refusal
    message = error.get("message")
    if not (isinstance(message, str) and _is_constant(message)):
        message = FIXED_MESSAGES.get(code, FALLBACK_MESSAGE)
    scrubbed: dict[str, Any] = {"code": code, "message": message}
    if "data" in error:
        keep, data = _kept_data(code, error["data"])
        if keep:
            scrubbed["data"] = data
    return scrubbed


def scrub_document(document: Any) -> Any:
    """A decoded JSON-RPC message (or batch) with every error scrubbed; the same object
    when it holds no error (so a large result is never copied or compared)."""
    if isinstance(document, list):
        items = [scrub_document(item) for item in document]
        return document if all(a is b for a, b in zip(items, document, strict=True)) else items
    if isinstance(document, dict) and isinstance(error := document.get("error"), dict):
        scrubbed = scrub_error(error)
        return document if scrubbed == error else {**document, "error": scrubbed}
    return document


def scrub_json(body: bytes) -> bytes:
    """A JSON body with every JSON-RPC error scrubbed; returned as it is when it has none."""
    if b'"error"' not in body:  # cheap: most answers are results
        return body
    try:
        document: Any = json.loads(body)
    except (ValueError, RecursionError):
        return body
    scrubbed = scrub_document(document)
    return body if scrubbed is document else _encode(scrubbed)


def scrub_error_body(body: bytes) -> bytes:
    """A non-2xx JSON body, scrubbed; one too large to parse is replaced whole."""
    if len(body) > MAX_ERROR_BODY_BYTES:
        generic = {"code": INVALID_PARAMS, "message": FIXED_MESSAGES[INVALID_PARAMS]}
        return _encode({"jsonrpc": "2.0", "id": None, "error": generic})
    return scrub_json(body)


def _encode(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


class _SseScrubber:
    """Scrubs the ``data:`` of each complete event of a ``text/event-stream`` body."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes, *, final: bool) -> bytes:
        text = self.pending + chunk
        out: list[bytes] = []
        while True:
            end, size = _event_end(text)
            if end < 0:
                break
            out.append(_scrub_event(text[:end]) + text[end : end + size])
            text = text[end + size :]
        if final:
            out.append(_scrub_event(text) if text else b"")
            text = b""
        self.pending = text
        return b"".join(out)


def _event_end(text: bytes) -> tuple[int, int]:
    found = [(i, len(sep)) for sep in (b"\r\n\r\n", b"\n\n", b"\r\r") if (i := text.find(sep)) >= 0]
    return min(found) if found else (-1, 0)


def _scrub_event(event: bytes) -> bytes:
    lines = event.splitlines(keepends=True)
    data_at = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
    if not data_at:
        return event
    payload = b"\n".join(lines[i][5:].strip(b"\r\n").removeprefix(b" ") for i in data_at)
    scrubbed = scrub_json(payload)
    if scrubbed == payload:
        return event
    ending = lines[data_at[0]][len(lines[data_at[0]].rstrip(b"\r\n")) :]
    out = [line for i, line in enumerate(lines) if i not in data_at]
    out.insert(data_at[0], b"data: " + scrubbed + ending)
    return b"".join(out)


class TransportErrorsMiddleware:
    """Scrubs every JSON-RPC error an HTTP response carries, JSON or SSE, any status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        chunks: list[bytes] = []
        sse: _SseScrubber | None = None
        started = False

        async def scrubbing_send(message: Message) -> None:
            nonlocal held, sse, started
            if message["type"] == "http.response.start":
                started = True
                kind = _content_type(message)
                if kind == b"application/json":
                    held = message
                    return
                if kind == b"text/event-stream":
                    sse = _SseScrubber()
                await send(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            more = bool(message.get("more_body", False))
            if sse is not None:
                body = sse.feed(message.get("body", b""), final=not more)
                await send({**message, "body": body})
                return
            if held is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if more:
                return
            raw = b"".join(chunks)
            status = int(held.get("status", 200))
            body = scrub_json(raw) if status <= _SUCCESS_MAX else scrub_error_body(raw)
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode("ascii")))
            start, held = {**held, "headers": headers}, None
            await send(start)
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, scrubbing_send)
        if not started:
            # The SDK returns without answering in a few corners (a GET carrying
            # Last-Event-ID while no event store is configured); the server would send a
            # bare 500 and log it as an error. The client gets a JSON-RPC error instead.
            log.warning("response_missing", method=str(scope.get("method", "")))
            await _send_internal_error(send)


async def _send_internal_error(send: Send) -> None:
    error = {"code": INTERNAL_ERROR, "message": FIXED_MESSAGES[INTERNAL_ERROR]}
    body = _encode({"jsonrpc": "2.0", "id": None, "error": error})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
    ]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _content_type(message: Message) -> bytes | None:
    for name, value in message.get("headers", []):
        if name.lower() == b"content-type":
            return bytes(value.split(b";")[0].strip().lower())
    return None


class ScrubbingSendStream:
    """The stdio write stream, with every JSON-RPC error scrubbed before it is written.

    Wraps the SDK's send stream (``mcp.server.stdio.stdio_server``); everything but
    ``send`` is the wrapped stream's own.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, JSONRPCError):
            raw = message.error.model_dump(mode="json", exclude_unset=True)
            error = ErrorData.model_validate(scrub_error(raw))
            item = SessionMessage(
                message=JSONRPCError(jsonrpc="2.0", id=message.id, error=error),
                metadata=item.metadata,
            )
        await self._inner.send(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> ScrubbingSendStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> Any:
        return await self._inner.__aexit__(*exc)


__all__ = [
    "FIXED_MESSAGES",
    "MAX_ERROR_BODY_BYTES",
    "ScrubbingSendStream",
    "TransportErrorsMiddleware",
    "scrub_document",
    "scrub_error",
    "scrub_error_body",
    "scrub_json",
]
