"""The HTTP transport's own 400 errors leave without the body they refuse."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nexus_mcp.wire_errors import MAX_ERROR_BODY_BYTES, TransportErrorsMiddleware, scrub_error_body

CANARY = "CANARY-WIRE-5d2"


def error(code: int, message: str, **extra: Any) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message, **extra}}
    ).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            error(-32602, f"Validation error: input_value=['{CANARY}']"),
            error(-32602, "Invalid request parameters"),
        ),
        (
            error(-32602, f"Validation error: {CANARY}", data=CANARY),
            error(-32602, "Invalid request parameters"),
        ),
        (error(-32700, f"Parse error: {CANARY} at line 1"), error(-32700, "Parse error")),
    ],
    ids=["validation", "validation-with-data", "parse"],
)
def test_the_transports_quoting_messages_are_replaced(body: bytes, expected: bytes) -> None:
    scrubbed = scrub_error_body(body)
    assert json.loads(scrubbed) == json.loads(expected)
    assert CANARY.encode() not in scrubbed


@pytest.mark.parametrize(
    "body",
    [
        error(-32600, "Bad Request: No valid session ID provided"),
        error(-32602, "params._meta is missing the required envelope key(s)"),
        error(-32001, "Session not found"),
        b'{"error": "request body too large"}',
        b"not json at all",
        b"[1, 2]",
    ],
)
def test_every_other_body_passes_unchanged(body: bytes) -> None:
    assert scrub_error_body(body) == body


def test_an_oversized_error_body_is_replaced_whole() -> None:
    body = error(-32602, "Validation error: " + CANARY * (MAX_ERROR_BODY_BYTES // len(CANARY)))
    scrubbed = scrub_error_body(body)
    assert json.loads(scrubbed)["error"] == {
        "code": -32602,
        "message": "Invalid request parameters",
    }


async def echo(request: Request) -> Response:
    body = await request.body()
    status = int(request.query_params.get("status", "400"))
    message = "Validation error: " + body.decode()
    return Response(error(-32602, message), status_code=status, media_type="application/json")


async def test_the_middleware_rewrites_only_400_json_errors_and_fixes_their_length() -> None:
    app = TransportErrorsMiddleware(
        Starlette(routes=[Route("/mcp", echo, methods=["POST", "GET"])])
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as http:
        refused = await http.post("/mcp", content=CANARY)
        passed = await http.post("/mcp?status=200", content=CANARY)
        fetched = await http.get("/mcp")
    assert refused.status_code == 400
    assert CANARY not in refused.text
    assert int(refused.headers["content-length"]) == len(refused.content)
    assert refused.json()["error"]["message"] == "Invalid request parameters"
    assert CANARY in passed.text  # a 200 is the server's answer, not the transport's
    assert fetched.status_code == 400  # GET passes through untouched
