"""The front door's OAuth errors, with fixed descriptions: nothing of the request comes back.

FastMCP's ``OAuthProxy`` (and the MCP SDK handlers under it) answer OAuth errors as
RFC 6749 prescribes, ``{"error", "error_description"}``, but the descriptions quote the
request: a redirect URI an attacker chose (``javascript:...``), a client id, a pydantic
message naming fields and values. The envelope rule holds here too (DESIGN.md: no input
value is echoed), so this ASGI layer keeps each error's code, which clients act on, and
replaces its description with a fixed phrase for that code, in JSON bodies and in the
``error_description`` of a redirect back to a client; an HTML error page (the IdP
callback's quotes the ``error_description`` of any link) becomes one fixed page. Success
answers pass untouched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fastmcp.server.auth.oauth_proxy.ui import create_error_html
from starlette.types import ASGIApp, Message, Receive, Scope, Send

FIXED = {
    "invalid_request": "the request is missing a parameter or has a malformed one",
    "invalid_client": "the client is unknown or its authentication failed",
    "invalid_grant": (
        "the authorization code or refresh token is invalid, expired, already used, "
        "or was issued to another client"
    ),
    "unauthorized_client": "this client may not use this grant",
    "unsupported_grant_type": "this grant type is not supported",
    "unsupported_response_type": "this response type is not supported",
    "invalid_scope": "a requested scope is unknown or not allowed",
    "invalid_target": "the requested resource is not this server",
    "invalid_redirect_uri": "the redirect URI is not allowed",
    "invalid_client_metadata": "the client metadata is not allowed",
    "access_denied": "the request was denied",
    "unsupported_token_type": "this token type is not supported",
    "server_error": "the server could not complete the request",
    "temporarily_unavailable": "the server cannot handle the request now",
}
GENERIC_CODE = "invalid_request"
MAX_ERROR_BODY = 64 * 1024
# FastMCP's HTML error pages (the IdP callback's, the consent page's) quote the request
# too: the callback's ``error_description`` from a link anyone can send. One fixed page.
ERROR_PAGE = create_error_html(
    error_title="Sign-in failed",
    error_message="The sign-in could not be completed. Start it again from your client.",
).encode("utf-8")


def fixed_code(value: object) -> str:
    return value if isinstance(value, str) and value in FIXED else GENERIC_CODE


def scrub_json(body: bytes) -> bytes | None:
    """The error body with a fixed description, or None when ``body`` is no OAuth error."""
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(decoded, dict) or "error" not in decoded:
        return None
    code = fixed_code(decoded.get("error"))
    return json.dumps({"error": code, "error_description": FIXED[code]}).encode("utf-8")


def scrub_location(location: str) -> str:
    """A redirect carrying an OAuth error: the same code and state, a fixed description."""
    parts = urlsplit(location)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not any(k == "error" for k, _ in pairs):
        return location
    code = fixed_code(next(v for k, v in pairs if k == "error"))
    kept = [(k, v) for k, v in pairs if k not in ("error", "error_description", "error_uri")]
    query = urlencode([("error", code), ("error_description", FIXED[code]), *kept])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


class OAuthErrorsMiddleware:
    """Fixed error descriptions on the authorization server routes (``paths``)."""

    def __init__(self, app: ASGIApp, *, paths: Iterable[str]) -> None:
        self.app = app
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []
        answered = False

        async def outbound(message: Message) -> None:
            nonlocal start, answered
            if answered:
                return  # the rest of an error body already replaced
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers", []))
                if 300 <= status < 400:
                    headers = [
                        (k, scrub_location(v.decode("latin-1")).encode("latin-1"))
                        if k.lower() == b"location"
                        else (k, v)
                        for k, v in headers
                    ]
                    await send({**message, "headers": headers})
                    return
                if status < 400 or not (_is_json(headers) or _is_html(headers)):
                    await send(message)
                    return
                start = {**message, "headers": headers}  # hold it: the body decides
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False) and sum(map(len, chunks)) <= MAX_ERROR_BODY:
                return
            body = b"".join(chunks)
            if _is_html(start["headers"]):
                scrubbed: bytes | None = ERROR_PAGE
            else:
                scrubbed = scrub_json(body) if len(body) <= MAX_ERROR_BODY else None
            if scrubbed is None:
                scrubbed = json.dumps(
                    {"error": GENERIC_CODE, "error_description": FIXED[GENERIC_CODE]}
                ).encode("utf-8")
            headers = [
                (k, str(len(scrubbed)).encode("ascii") if k.lower() == b"content-length" else v)
                for k, v in start["headers"]
            ]
            answered = True
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": scrubbed})

        await self.app(scope, receive, outbound)


def _content_type(headers: list[tuple[bytes, bytes]]) -> bytes:
    return next(
        (v.split(b";")[0].strip().lower() for k, v in headers if k.lower() == b"content-type"),
        b"",
    )


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    return _content_type(headers) == b"application/json"


def _is_html(headers: list[tuple[bytes, bytes]]) -> bool:
    return _content_type(headers) == b"text/html"


__all__ = ["FIXED", "OAuthErrorsMiddleware", "scrub_json", "scrub_location"]
