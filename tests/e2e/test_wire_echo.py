"""No JSON-RPC error quotes the request back, on stdio and HTTP, in both protocol eras.

The SDK and FastMCP build several protocol-level errors from request content (an unknown
method's name in ``data``, a resource URI or prompt name in the message, a cursor, a log
level). Each request here carries a canary in the place the error would quote; the answer
must be an error with a fixed message and no canary anywhere in it (issue 22, item 5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.shared.inbound import encode_header_value

from .servers import free_port, http_server
from .test_protocol_edges import (
    HTTP_HEADERS,
    INITIALIZE,
    INITIALIZED,
    LEGACY,
    MODERN,
    MODERN_META,
    PRINCIPAL_ENV,
    handshake,
    nexus_stdio_args,
    parse_body,
    stdio_process,
)

pytestmark = pytest.mark.slow

CANARY = "CANARY-ECHO-91c4"
NAME_KEYS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def echo_cases(meta: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, request without id): each would be answered with the canary quoted back."""
    env = {"_meta": meta} if meta else {}
    return [
        ("unknown method", {"method": f"{CANARY}/list", "params": {**env}}),
        ("unknown method, no params", {"method": f"tools/{CANARY}"}),
        ("resource not found", {"method": "resources/read",
            "params": {"uri": f"nexus://{CANARY}/x", **env}}),
        ("resource uri malformed", {"method": "resources/read",
            "params": {"uri": f"::{CANARY} not a uri", **env}}),
        ("resource uri not a string", {"method": "resources/read",
            "params": {"uri": {"x": CANARY}, **env}}),
        ("resource template unknown", {"method": "resources/read",
            "params": {"uri": f"file:///{CANARY}", **env}}),
        ("prompt not found", {"method": "prompts/get", "params": {"name": CANARY, **env}}),
        ("prompt arguments wrong type", {"method": "prompts/get",
            "params": {"name": CANARY, "arguments": [CANARY], **env}}),
        ("completion of unknown prompt", {"method": "completion/complete", "params": {
            "ref": {"type": "ref/prompt", "name": CANARY},
            "argument": {"name": CANARY, "value": CANARY}, **env}}),
        ("completion of unknown resource", {"method": "completion/complete", "params": {
            "ref": {"type": "ref/resource", "uri": f"nexus://{CANARY}"},
            "argument": {"name": "a", "value": CANARY}, **env}}),
        ("completion ref type unknown", {"method": "completion/complete", "params": {
            "ref": {"type": CANARY}, "argument": {"name": "a", "value": "b"}, **env}}),
        ("log level unknown", {"method": "logging/setLevel",
            "params": {"level": CANARY, **env}}),
        ("cursor unknown", {"method": "tools/list", "params": {"cursor": CANARY, **env}}),
        ("tool name wrong type", {"method": "tools/call",
            "params": {"name": [CANARY], "arguments": {}, **env}}),
        ("params wrong type", {"method": "prompts/list", "params": {"cursor": [CANARY], **env}}),
    ]  # fmt: skip


def leak(answer: Any) -> str | None:
    """The answer's text when it quotes the canary or is not a plain fixed-shape error."""
    text = json.dumps(answer)
    if CANARY in text:
        return text
    if "result" in answer:  # answered without an error (an unknown cursor lists from the start)
        return None
    error = answer["error"]
    fixed = isinstance(error["code"], int) and set(error) <= {"code", "message", "data"}
    return None if fixed and error.get("data", "") == "" else text


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_protocol_errors_over_stdio_quote_nothing(
    workspace: Path, tmp_path: Path, era: str
) -> None:
    with (
        (tmp_path / "nexus.stderr").open("wb") as err,
        stdio_process(nexus_stdio_args(workspace, tmp_path / "data"), err, PRINCIPAL_ENV) as ours,
    ):
        if era == LEGACY:
            handshake(ours)
        leaks: dict[str, str] = {}
        for label, body in echo_cases({} if era == LEGACY else MODERN_META):
            answer = ours.request(body)
            assert answer["id"] == ours.next_id, label
            if (text := leak(answer)) is not None:
                leaks[label] = text
        assert leaks == {}
        # Still serving: a well-formed listing answers after all of them.
        listing = {
            "method": "tools/list",
            "params": {"_meta": MODERN_META} if era == MODERN else {},
        }
        assert "result" in ours.request(listing)


@pytest.fixture(scope="module")
def nexus_url(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("echo-http")
    workspace = base / "ws"
    workspace.mkdir()
    (workspace / "todo.txt").write_text("todo")
    port = free_port()
    env = {"NEXUS_MCP_MODE": "dev", "NEXUS_MCP_DATA_DIR": str(base / "data")}
    with (
        (base / "nexus.stderr").open("wb") as err,
        http_server(["--workspace", str(workspace)], env, port=port, stderr=err),
    ):
        yield f"http://127.0.0.1:{port}/mcp"


def modern_headers(body: dict[str, Any]) -> dict[str, str]:
    """The headers a 2026-07-28 client mirrors from the body (names Base64-wrapped)."""
    headers = {**HTTP_HEADERS, "mcp-protocol-version": MODERN, "mcp-method": body["method"]}
    key = NAME_KEYS.get(body["method"])
    value = (body.get("params") or {}).get(key) if key else None
    if isinstance(value, str):
        headers["mcp-name"] = encode_header_value(value)
    return headers


def legacy_session(client: httpx.Client, url: str) -> dict[str, str]:
    response = client.post(url, json=INITIALIZE, headers=HTTP_HEADERS)
    assert response.status_code == 200
    headers = {**HTTP_HEADERS, "mcp-protocol-version": LEGACY}
    headers["mcp-session-id"] = response.headers["mcp-session-id"]
    client.post(url, json=INITIALIZED, headers=headers)
    return headers


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_protocol_errors_over_http_quote_nothing(nexus_url: str, era: str) -> None:
    with httpx.Client(timeout=20) as client:
        session = legacy_session(client, nexus_url) if era == LEGACY else {}
        leaks: dict[str, str] = {}
        for number, (label, body) in enumerate(echo_cases({} if era == LEGACY else MODERN_META)):
            request = {"jsonrpc": "2.0", "id": number + 1, **body}
            headers = session if era == LEGACY else modern_headers(request)
            response = client.post(nexus_url, content=json.dumps(request), headers=headers)
            answer = parse_body(response.text)
            assert answer["id"] == number + 1, label
            if (text := leak(answer)) is not None:
                leaks[label] = text
    assert leaks == {}


@pytest.mark.parametrize(
    ("label", "headers", "raw"),
    [
        ("version header unknown", {"mcp-protocol-version": CANARY}, None),
        ("modern version with a canary in the envelope", {"mcp-protocol-version": MODERN},
         {"_meta": {"io.modelcontextprotocol/protocolVersion": CANARY,
                    "io.modelcontextprotocol/clientCapabilities": {}}}),
        ("body not JSON", {}, f"{CANARY}{{"),
        ("params an array", {}, [CANARY]),
        ("session id unknown", {"mcp-session-id": CANARY}, None),
    ],
)  # fmt: skip
def test_transport_refusals_quote_nothing(
    nexus_url: str, label: str, headers: dict[str, str], raw: Any
) -> None:
    if isinstance(raw, str):
        content = raw
    else:
        params = raw if raw is not None else {}
        content = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params})
    with httpx.Client(timeout=20) as client:
        extra = {"mcp-method": "tools/list"} if headers.get("mcp-protocol-version") else {}
        response = client.post(
            nexus_url, content=content, headers={**HTTP_HEADERS, **headers, **extra}
        )
    assert CANARY not in response.text, (label, response.text)
    assert "error" in parse_body(response.text), label


@pytest.mark.parametrize("last_event_id", [CANARY, f"{CANARY}_0", CANARY * 200])
def test_a_get_stream_resumed_without_an_event_store_gets_a_json_rpc_error(
    nexus_url: str, last_event_id: str
) -> None:
    """The SDK returns without answering a GET carrying ``Last-Event-ID`` when no event
    store is configured (no resumability): the server sent a bare text 500 and logged an
    error for whoever had a session. The answer is a fixed JSON-RPC error, no echo."""
    with httpx.Client(timeout=20) as client:
        session = legacy_session(client, nexus_url)
        headers = {**session, "accept": "text/event-stream", "last-event-id": last_event_id}
        response = client.get(nexus_url, headers=headers)
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert answer["error"] == {"code": -32603, "message": "Internal server error"}
    assert last_event_id not in response.text and CANARY not in response.text
