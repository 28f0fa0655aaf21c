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

from nexus_mcp.envelope import not_found_error, to_request_error
from nexus_mcp.errors import UpstreamError
from nexus_mcp.transport.wire_errors import (
    MAX_ERROR_BODY_BYTES,
    ScrubbingSendStream,
    TransportErrorsMiddleware,
    _SseScrubber,
    scrub_error,
    scrub_error_body,
    scrub_json,
)

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


async def test_the_middleware_rewrites_json_errors_of_any_status_and_fixes_their_length() -> None:
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
    # A 200 carrying a JSON-RPC error is scrubbed as well (issue 22: the SDK's dispatch
    # errors are 200s); GET answers pass through the same filter.
    assert CANARY not in passed.text
    assert passed.json()["error"]["message"] == "Invalid request parameters"
    assert fetched.status_code == 400  # GET passes through untouched


@pytest.mark.parametrize(
    ("error_in", "error_out"),
    [
        ({"code": -32601, "message": "Method not found", "data": f"{CANARY}/x"},
         {"code": -32601, "message": "Method not found"}),
        ({"code": -32002, "message": f"Unknown resource: nexus://{CANARY}",
          "data": {"uri": f"nexus://{CANARY}"}},
         {"code": -32002, "message": "Resource not found"}),
        ({"code": -32602, "message": f"Unknown prompt: '{CANARY}'"},
         {"code": -32602, "message": "Invalid request parameters"}),
        ({"code": 0, "message": f"KeyError: {CANARY}"},
         {"code": 0, "message": "Internal server error"}),
        ({"code": -32099, "message": CANARY, "data": [CANARY]},
         {"code": -32099, "message": "Request failed"}),
        ({"code": -32022, "message": f"Unsupported protocol version {CANARY}",
          "data": {"supported": ["2026-07-28"], "requested": CANARY}},
         {"code": -32022, "message": "Unsupported protocol version",
          "data": {"supported": ["2026-07-28"], "requested": ""}}),
        ({"code": -32022, "message": "x", "data": {"supported": CANARY}},
         {"code": -32022, "message": "Unsupported protocol version"}),
        ({"code": "-32602", "message": CANARY},
         {"code": -32603, "message": "Internal server error"}),
    ],
    ids=["method", "resource", "prompt", "code-0", "unknown-code", "version", "version-bad",
         "code-not-int"],
)  # fmt: skip
def test_every_error_gets_the_fixed_text_of_its_code(
    error_in: dict[str, Any], error_out: dict[str, Any]
) -> None:
    assert scrub_error(error_in) == error_out


def test_a_batch_and_an_error_with_a_result_sibling_are_scrubbed_element_by_element() -> None:
    body = json.dumps(
        [
            {"jsonrpc": "2.0", "id": 1, "result": {"text": CANARY}},
            {"jsonrpc": "2.0", "id": 2, "error": {"code": -32601, "message": "x", "data": CANARY}},
        ]
    ).encode()
    scrubbed = json.loads(scrub_json(body))
    assert scrubbed[0]["result"] == {"text": CANARY}  # a result is the server's answer
    assert scrubbed[1]["error"] == {"code": -32601, "message": "Method not found"}


async def sse(request: Request) -> Response:
    event = error(-32601, "Method not found", data=CANARY).decode()
    done = json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"ok": CANARY}})
    text = f"event: message\r\nid: 7\r\ndata: {event}\r\n\r\n: ping\r\n\r\ndata: {done}\n\n"
    return Response(text.encode(), media_type="text/event-stream")


async def test_the_events_of_a_stream_are_scrubbed_however_it_is_chunked() -> None:
    app = TransportErrorsMiddleware(Starlette(routes=[Route("/mcp", sse, methods=["POST"])]))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as http:
        answer = await http.post("/mcp")
    events = [line for line in answer.text.splitlines() if line.startswith("data:")]
    assert json.loads(events[0][5:])["error"] == {"code": -32601, "message": "Method not found"}
    assert json.loads(events[1][5:])["result"] == {"ok": CANARY}
    assert "id: 7" in answer.text and ": ping" in answer.text
    # Fed a byte at a time, the stream comes out the same.
    raw = (await sse(None)).body  # type: ignore[arg-type]
    whole = _SseScrubber().feed(raw, final=True)
    split = _SseScrubber()
    pieces = [split.feed(raw[i : i + 1], final=i == len(raw) - 1) for i in range(len(raw))]
    assert b"".join(pieces) == whole
    assert CANARY.encode() not in whole.split(b"result")[0]


async def test_the_stdio_stream_writes_errors_scrubbed_and_results_as_they_are() -> None:
    import anyio
    from mcp.shared.message import SessionMessage
    from mcp_types import ErrorData, JSONRPCError, JSONRPCResponse

    send, receive = anyio.create_memory_object_stream[SessionMessage](4)
    stream = ScrubbingSendStream(send)
    async with stream:
        failed = ErrorData(code=-32601, message="Method not found", data=CANARY)
        await stream.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=1, error=failed)))
        ok = JSONRPCResponse(jsonrpc="2.0", id=2, result={"text": CANARY})
        await stream.send(SessionMessage(ok))
    async with receive:
        written = [item.message async for item in receive]
    assert isinstance(written[0], JSONRPCError)
    assert written[0].error.data is None and written[0].error.message == "Method not found"
    assert written[1] == ok


# --- issue 27: resources/read and prompts/get ---------------------------------------------


def test_a_read_or_get_refusal_keeps_its_envelope_through_the_wire_filter() -> None:
    refusal = to_request_error(UpstreamError(reason="error"))
    error = {"code": refusal.error.code, "message": refusal.error.message,
             "data": refusal.error.data}  # fmt: skip
    assert scrub_error(error) == error
    assert error["data"]["code"] == "UPSTREAM_ERROR"
    # The fixed not-found texts quote nothing and are kept.
    for prompt in (False, True):
        found = not_found_error(prompt=prompt).error
        assert scrub_error({"code": found.code, "message": found.message}) == {
            "code": -32602,
            "message": found.message,
        }


@pytest.mark.parametrize(
    "forged",
    [
        {"code": -32050, "message": CANARY, "data": {"error": CANARY, "code": "NOT_FOUND"}},
        {"code": -32050, "message": json.dumps({"error": CANARY, "code": "NOPE"}),
         "data": {"error": CANARY, "code": "NOPE"}},
        {"code": -32050, "message": '{"error":"x","code":"NOT_FOUND"}',
         "data": {"error": "x", "code": "NOT_FOUND", "uri": CANARY}},
        {"code": -32050, "message": '{"error":"x","code":"NOT_FOUND"}', "data": [CANARY]},
        {"code": -32050, "message": '{"error":"x","code":"NOT_FOUND"}'},
        {"code": -32050, "message": f'{{"error":"{CANARY}","code":"NOT_FOUND"}}',
         "data": {"error": "other", "code": "NOT_FOUND"}},
    ],
    ids=["message-not-the-data", "unknown-code", "extra-data", "data-not-object", "no-data",
         "message-differs"],
)  # fmt: skip
def test_anything_else_under_the_refusal_code_is_scrubbed(forged: dict[str, Any]) -> None:
    assert scrub_error(forged) == {"code": -32050, "message": "Request refused"}
