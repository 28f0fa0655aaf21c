"""The one ``tools/call`` of ``nexus-mcp call``: MCP's streamable HTTP, spoken directly.

A one-shot command pays for its imports on every run: FastMCP's ``Client`` over the MCP
SDK costs about 2 s of CPU to import (the SDK's types and its server), for a call that is
three JSON-RPC messages. This client sends them with ``httpx2`` alone (issue 29: ``call``
within 0.5 s of CPU): ``initialize`` in the handshake era, ``notifications/initialized``,
then ``tools/call``, and ends the session with ``DELETE``. An answer may be JSON or an
SSE stream (events bounded in size); a request the server sends meanwhile is answered
(``ping``) or refused as unsupported (the client declares no capabilities).

Redirects are followed as the SDK follows them: only 307/308 within the endpoint's origin
(same scheme, host and port), a few at most; any other is an HTTP failure (so a token is
never sent to another origin). The bearer
token goes in the ``Authorization`` header only. Failures are ``CallFailure``: an HTTP
status, a JSON-RPC error (code and message, the server's words for the client), or no
MCP answer; the caller words them without the exception's own text.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx2

from nexus_mcp._version import __version__

PROTOCOL_VERSION = "2025-11-25"  # the handshake era every nexus-mcp server speaks
MAX_EVENT_BYTES = 16 * 1024 * 1024  # one SSE event (a result); the SDK allows 1 MiB
MAX_REDIRECTS = 3
FOLLOWED_REDIRECTS = (307, 308)  # they keep the method and the body
SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
METHOD_NOT_FOUND = -32601


class CallFailure(Exception):
    """No result: an HTTP ``status``, a JSON-RPC ``error`` object, or neither (not MCP)."""

    def __init__(self, status: int | None = None, error: Mapping[str, Any] | None = None):
        super().__init__("the call got no result")
        self.status = status
        self.error = error


class McpHttpSession:
    """One MCP session over streamable HTTP on an open ``httpx2.AsyncClient``."""

    def __init__(self, client: httpx2.AsyncClient, url: str, token: str | None) -> None:
        self._client = client
        self._url = httpx2.URL(url)
        self._headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
        }
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._next_id = 0

    async def initialize(self) -> None:
        result = await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "nexus-mcp call", "version": __version__},
            },
        )
        version = result.get("protocolVersion")
        self._headers[VERSION_HEADER] = version if isinstance(version, str) else PROTOCOL_VERSION
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request; its result, or ``CallFailure``."""
        self._next_id += 1
        ident = self._next_id
        message = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
        answer = await self.send(message, wait_for=ident)
        if answer is None:
            raise CallFailure()
        if "error" in answer:
            error = answer["error"]
            raise CallFailure(error=error if isinstance(error, dict) else {})
        result = answer.get("result")
        if not isinstance(result, dict):
            raise CallFailure()
        return result

    async def send(
        self, message: dict[str, Any], wait_for: int | None = None
    ) -> dict[str, Any] | None:
        """POST one message; with ``wait_for``, the response carrying that id."""
        body = json.dumps(message, separators=(",", ":")).encode()
        for _ in range(MAX_REDIRECTS + 1):
            request = self._client.build_request(
                "POST", self._url, content=body, headers=self._headers
            )
            response = await self._client.send(request, stream=True)
            try:
                target = self._redirect_target(response)
                if target is not None:
                    self._url = target
                    continue
                if not 200 <= response.status_code < 300:  # an unfollowed redirect too
                    raise CallFailure(status=response.status_code)
                session = response.headers.get(SESSION_HEADER)
                if session and SESSION_HEADER not in self._headers:
                    self._headers[SESSION_HEADER] = session
                if wait_for is None:
                    return None
                return await self._answer(response, wait_for)
            finally:
                await response.aclose()
        raise CallFailure(status=response.status_code)

    async def close(self) -> None:
        """End the session (best effort: the server also expires it)."""
        if SESSION_HEADER not in self._headers:
            return
        with contextlib.suppress(httpx2.HTTPError):
            await self._client.delete(self._url, headers=self._headers)

    def _redirect_target(self, response: httpx2.Response) -> httpx2.URL | None:
        if response.status_code not in FOLLOWED_REDIRECTS:
            return None
        location = response.headers.get("location")
        if not location:
            return None
        target = self._url.join(location)
        same_origin = (target.scheme, target.host, target.port) == (
            self._url.scheme,
            self._url.host,
            self._url.port,
        )
        return target if same_origin else None

    async def _answer(self, response: httpx2.Response, ident: int) -> dict[str, Any] | None:
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind == "application/json":
            data = json.loads(await response.aread())
            for message in data if isinstance(data, list) else [data]:
                if isinstance(message, dict) and message.get("id") == ident:
                    return message
            return None
        if kind != "text/event-stream":
            return None
        async for event in httpx2.EventSource(response, max_event_size=MAX_EVENT_BYTES):
            if event.event != "message" or not event.data:
                continue
            message = json.loads(event.data)
            if not isinstance(message, dict):
                continue
            if message.get("id") == ident and "method" not in message:
                return message
            if "method" in message and "id" in message:  # the server asks something
                await self.send(_reply_to(message))
        return None


def _reply_to(request: dict[str, Any]) -> dict[str, Any]:
    if request.get("method") == "ping":
        return {"jsonrpc": "2.0", "id": request["id"], "result": {}}
    error = {"code": METHOD_NOT_FOUND, "message": "not supported by nexus-mcp call"}
    return {"jsonrpc": "2.0", "id": request["id"], "error": error}


async def call_tool_over_http(
    url: str,
    token: str | None,
    tool: str,
    arguments: dict[str, Any],
    meta: dict[str, Any] | None,
    timeout: float,
) -> dict[str, Any]:
    """The ``tools/call`` result as sent (``content`` and ``isError`` always present)."""
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    async with httpx2.AsyncClient(timeout=timeout, follow_redirects=False) as client:
        session = McpHttpSession(client, url, token)
        try:
            await session.initialize()
            result = await session.request("tools/call", params)
        except (ValueError, httpx2.SSEError):  # not JSON, or an event past its bound
            raise CallFailure() from None
        await session.close()  # after a success only: a failed session expires on its own
    result.setdefault("content", [])
    result.setdefault("isError", False)
    return result


__all__ = ["CallFailure", "McpHttpSession", "call_tool_over_http"]
