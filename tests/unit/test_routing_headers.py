"""Which routing headers agree with a body (``routing_headers.mismatch``), as a table."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from nexus_mcp.transport.routing_headers import mismatch

READ, WRITE = "nexus_read_file", "nexus_write_file"


def call(name: Any, method: str = "tools/call", key: str = "name") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {key: name}}


def b64(value: str) -> bytes:
    return f"=?base64?{base64.b64encode(value.encode()).decode()}?=".encode()


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        ({b"mcp-method": b"tools/call", b"mcp-name": WRITE.encode()}, call(WRITE), None),
        ({b"mcp-method": b"tools/call", b"mcp-name": b64(WRITE)}, call(WRITE), None),
        ({b"mcp-method": b"tools/call", b"mcp-name": b64("caf\u00e9")}, call("caf\u00e9"), None),
        ({b"mcp-method": b"tools/list"}, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, None),
        ({b"mcp-name": b"nexus://a"}, call("nexus://a", "resources/read", "uri"), None),
        ({b"mcp-method": b"tools/call", b"mcp-name": READ.encode()}, call(WRITE), "name"),
        ({b"mcp-method": b"tools/call", b"mcp-name": b64(READ)}, call(WRITE), "name"),
        ({b"mcp-method": b"tools/call", b"mcp-name": b"=?base64?%%?="}, call(WRITE),
         "name_encoding"),
        ({b"mcp-method": b"tools/list"}, call(WRITE), "method"),
        ({b"mcp-method": b"tools/call"}, call(WRITE), "name_missing"),
        ({b"mcp-name": READ.encode()}, call(WRITE), "name"),
        ({b"mcp-name": READ.encode()}, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
         "name_without_named_method"),
        ({b"mcp-method": b"tools/call", b"mcp-name": WRITE.encode()}, call([WRITE]), "name"),
        ({b"mcp-method": b"prompts/get", b"mcp-name": b"a"}, call("b", "prompts/get"), "name"),
        ({b"mcp-method": b"resources/read", b"mcp-name": b"a"},
         call("b", "resources/read", "uri"), "name"),
        ({b"mcp-method": b"tools/call", b"mcp-name": WRITE.encode()}, [], "empty_batch"),
        ({b"mcp-method": b"tools/call", b"mcp-name": READ.encode()}, [call(READ), call(WRITE)],
         "name"),
        ({b"mcp-method": b"tools/call", b"mcp-name": READ.encode()}, [call(READ), call(READ)],
         None),
        ({b"mcp-method": b"tools/call"}, {"jsonrpc": "2.0", "method": "notifications/cancelled"},
         "method"),
        ({b"mcp-method": b"tools/call"}, {"jsonrpc": "2.0", "id": 1, "result": {}}, "method"),
        ({b"mcp-method": b"tools/call"}, "not an object", "method"),
    ],
)  # fmt: skip
def test_headers_agree_only_with_the_body_they_name(
    headers: dict[bytes, bytes], body: Any, reason: str | None
) -> None:
    assert mismatch(headers, body) == reason
