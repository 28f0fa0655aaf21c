"""``Mcp-Method`` / ``Mcp-Name`` that disagree with the body are refused in every era.

A proxy or firewall in front of the server may route and filter on these headers (the
2026-07-28 transport mirrors them for that). The SDK compares them with the body only
when it handles a request as 2026-07-28; here each request's headers name a read (or
nothing that writes) while its body calls ``nexus_write_file``, sent as the handshake era
would handle it (in a session, without or with an older ``MCP-Protocol-Version``), as a
batch, a notification, with case-varied, duplicated, Base64-wrapped or non-ASCII header
values. Each must be ``400`` / ``-32020`` and the file must not be written (issue 22,
item 7). Headers that agree run the call, in both eras.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .servers import free_port, http_server
from .test_protocol_edges import HTTP_HEADERS, INITIALIZE, INITIALIZED, LEGACY, MODERN, MODERN_META

pytestmark = pytest.mark.slow

HEADER_MISMATCH = -32020
READ, WRITE = "nexus_read_file", "nexus_write_file"
Headers = list[tuple[str, str | bytes]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    base = tmp_path_factory.mktemp("routing-headers")
    workspace = base / "ws"
    workspace.mkdir()
    (workspace / "todo.txt").write_text("todo")
    port = free_port()
    env = {"NEXUS_MCP_MODE": "dev", "NEXUS_MCP_DATA_DIR": str(base / "data")}
    with (
        (base / "nexus.stderr").open("wb") as err,
        http_server(["--workspace", str(workspace)], env, port=port, stderr=err),
    ):
        yield f"http://127.0.0.1:{port}/mcp", workspace


def session_id(client: httpx.Client, url: str) -> str:
    response = client.post(url, json=INITIALIZE, headers=HTTP_HEADERS)
    assert response.status_code == 200
    session = response.headers["mcp-session-id"]
    client.post(url, json=INITIALIZED, headers={**HTTP_HEADERS, "mcp-session-id": session})
    return session


def write_call(path: str, request_id: int = 1, meta: dict[str, Any] | None = None) -> Any:
    params: dict[str, Any] = {
        "name": WRITE,
        "arguments": {"path": path, "content": "written", "idempotency_key": f"key-{path}"},
    }
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def read_call(request_id: int = 2) -> dict[str, Any]:
    params = {"name": READ, "arguments": {"path": "todo.txt"}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def b64(value: str) -> str:
    return f"=?base64?{base64.b64encode(value.encode()).decode()}?="


def post(client: httpx.Client, url: str, body: Any, headers: Headers) -> httpx.Response:
    base: Headers = [(k, v) for k, v in HTTP_HEADERS.items()]
    return client.post(url, content=json.dumps(body), headers=[*base, *headers])


NAMES_READ: Headers = [("mcp-method", "tools/call"), ("mcp-name", READ)]

# (label, body for the written path, headers beyond accept/content-type; "{session}" is
# replaced by a live handshake session's id)
MISMATCHES: list[tuple[str, Any, Headers]] = [
    ("session, 2025-11-25 version", "one", [("mcp-protocol-version", LEGACY), *NAMES_READ]),
    ("session, no version header", "one", NAMES_READ),
    ("session, older version", "one", [("mcp-protocol-version", "2025-06-18"), *NAMES_READ]),
    ("no session, no version", None, NAMES_READ),
    ("method header names a listing", "one", [("mcp-method", "tools/list")]),
    ("name header alone", "one", [("mcp-name", READ)]),
    ("method header alone, name missing", "one", [("mcp-method", "tools/call")]),
    ("header names upper case", "one", [("MCP-METHOD", "tools/call"), ("MCP-NAME", READ)]),
    ("header names mixed case", "one", [("mCp-MeThOd", "tools/call"), ("Mcp-Name", READ)]),
    ("name duplicated, body's first", "one",
     [("mcp-method", "tools/call"), ("mcp-name", WRITE), ("mcp-name", READ)]),
    ("name duplicated, body's last", "one",
     [("mcp-method", "tools/call"), ("mcp-name", READ), ("mcp-name", WRITE)]),
    ("method duplicated", "one",
     [("mcp-method", "tools/call"), ("mcp-method", "tools/list"), ("mcp-name", WRITE)]),
    ("name Base64-wrapped", "one", [("mcp-method", "tools/call"), ("mcp-name", b64(READ))]),
    ("name Base64 malformed", "one", [("mcp-method", "tools/call"), ("mcp-name", "=?base64?%%?=")]),
    ("name percent-encoded", "one",
     [("mcp-method", "tools/call"), ("mcp-name", "nexus%5Fwrite%5Ffile")]),
    ("name with raw non-ASCII", "one",
     [("mcp-method", "tools/call"), ("mcp-name", WRITE.encode() + b"\xc3\xa9")]),
    ("method with raw non-ASCII", "one",
     [("mcp-method", b"tools/call\xa0"), ("mcp-name", WRITE)]),
    ("batch of the write", "batch", NAMES_READ),
    ("batch of a read and the write", "mixed", NAMES_READ),
    ("2026-07-28 era (the SDK's own check)", "modern",
     [("mcp-protocol-version", MODERN), *NAMES_READ]),
]  # fmt: skip


@pytest.mark.parametrize(("label", "shape", "headers"), MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_headers_that_disagree_with_the_body_are_refused_and_nothing_runs(
    server: tuple[str, Path], label: str, shape: Any, headers: Headers
) -> None:
    url, workspace = server
    path = f"w-{abs(hash(label))}.txt"
    with httpx.Client(timeout=20) as client:
        extra: Headers = []
        if shape != "modern" and shape is not None:
            extra = [("mcp-session-id", session_id(client, url))]
        body: Any = write_call(path)
        if shape == "batch":
            body = [body]
        elif shape == "mixed":
            body = [read_call(), write_call(path, 3)]
        elif shape == "modern":
            body = write_call(path, meta=MODERN_META)
        response = post(client, url, body, [*extra, *headers])
    assert response.status_code == 400, (label, response.text)
    answer = response.json()
    assert answer["error"] == {
        "code": HEADER_MISMATCH,
        "message": "Request headers do not match the request body",
    }
    assert answer["id"] == (None if isinstance(body, list) else body["id"])
    assert not (workspace / path).exists(), label


@pytest.mark.parametrize(
    ("label", "body", "headers"),
    [
        ("notification", INITIALIZED, [("mcp-method", "tools/call"), ("mcp-name", WRITE)]),
        ("notification, name only", INITIALIZED, [("mcp-name", READ)]),
        ("resources/read uri", {"jsonrpc": "2.0", "id": 4, "method": "resources/read",
            "params": {"uri": "nexus://b"}},
         [("mcp-method", "resources/read"), ("mcp-name", "nexus://a")]),
        ("resources/read, name missing", {"jsonrpc": "2.0", "id": 5, "method": "resources/read",
            "params": {"uri": "nexus://b"}}, [("mcp-method", "resources/read")]),
        ("prompts/get name", {"jsonrpc": "2.0", "id": 6, "method": "prompts/get",
            "params": {"name": "b"}}, [("mcp-method", "prompts/get"), ("mcp-name", "a")]),
        ("prompts/get name as another method", {"jsonrpc": "2.0", "id": 7,
            "method": "prompts/get", "params": {"name": "b"}},
         [("mcp-method", "resources/read"), ("mcp-name", "b")]),
        ("uri with raw non-ASCII that matches byte-for-byte", {"jsonrpc": "2.0", "id": 8,
            "method": "resources/read", "params": {"uri": "nexus://caf\u00c3\u00a9"}},
         [("mcp-method", "resources/read"), ("mcp-name", b"nexus://caf\xc3\xa9")]),
    ],
)  # fmt: skip
def test_every_method_that_carries_a_name_and_notifications_are_checked(
    server: tuple[str, Path], label: str, body: Any, headers: Headers
) -> None:
    url, _ = server
    with httpx.Client(timeout=20) as client:
        session = [("mcp-session-id", session_id(client, url))]
        response = post(client, url, body, [*session, *headers])
    assert response.status_code == 400, (label, response.text)
    assert response.json()["error"]["code"] == HEADER_MISMATCH, label


def test_headers_that_agree_run_the_call_in_both_eras(server: tuple[str, Path]) -> None:
    url, workspace = server
    agree: Headers = [("mcp-method", "tools/call"), ("mcp-name", WRITE)]
    with httpx.Client(timeout=20) as client:
        session = [("mcp-session-id", session_id(client, url))]
        legacy = post(client, url, write_call("agreed.txt"), [*session, *agree])
        wrapped = post(
            client,
            url,
            write_call("wrapped.txt"),
            [*session, ("mcp-method", "tools/call"), ("mcp-name", b64(WRITE))],
        )
        plain = post(client, url, write_call("plain.txt"), session)  # no routing headers
        modern = post(
            client,
            url,
            write_call("modern.txt", meta=MODERN_META),
            [("mcp-protocol-version", MODERN), *agree],
        )
    for response in (legacy, wrapped, plain, modern):
        assert response.status_code == 200, response.text
        assert '"isError":false' in response.text.replace(" ", ""), response.text
    for name in ("agreed.txt", "wrapped.txt", "plain.txt", "modern.txt"):
        assert (workspace / name).read_text() == "written"


@pytest.fixture(scope="module")
def stateless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A ``--stateless-http`` server: a 2025-11-25 request needs no session there."""
    base = tmp_path_factory.mktemp("routing-headers-stateless")
    workspace = base / "ws"
    workspace.mkdir()
    port = free_port()
    env = {"NEXUS_MCP_MODE": "dev", "NEXUS_MCP_DATA_DIR": str(base / "data")}
    args = ["--workspace", str(workspace), "--stateless-http"]
    with (
        (base / "nexus.stderr").open("wb") as err,
        http_server(args, env, port=port, stderr=err),
    ):
        yield f"http://127.0.0.1:{port}/mcp", workspace


@pytest.mark.parametrize(
    "version", [None, LEGACY, "2025-06-18", "2025-03-26"], ids=["none", LEGACY, "06-18", "03-26"]
)
def test_a_stateless_server_refuses_disagreeing_headers_in_every_older_version(
    stateless: tuple[str, Path], version: str | None
) -> None:
    url, workspace = stateless
    extra: Headers = [("mcp-protocol-version", version)] if version else []
    path = f"stateless-{version}.txt"
    with httpx.Client(timeout=20) as client:
        refused = post(client, url, write_call(path), [*extra, *NAMES_READ])
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == HEADER_MISMATCH
        assert not (workspace / path).exists()
        agreeing = [("mcp-method", "tools/call"), ("mcp-name", WRITE)]
        ran = post(client, url, write_call(path), [*extra, *agreeing])
    assert ran.status_code == 200, ran.text
    assert (workspace / path).read_text() == "written"
