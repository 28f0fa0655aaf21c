"""The error envelope on the wire: codes, no echo, masked internals, FastMCP's unknown tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from pydantic import BaseModel

from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import Code
from nexus_mcp.policy.grants import grant_tool

from .conftest import ServerFactory, snapshot, wire

MODES = ["auto", "legacy"]
CANARY = "CANARY-7f3a-INPUT"


def envelope(result: dict[str, Any]) -> dict[str, str]:
    assert result["isError"] is True
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert "structuredContent" not in result
    assert set(payload) == {"error", "code"}
    return payload


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_tool_is_fastmcps_own_answer(make_server: ServerFactory, mode: str) -> None:
    """Captured on purpose: the namespace must answer hidden tools byte for byte like this."""
    bare: FastMCP[Any] = FastMCP("nexus", version="0.1.0")
    async with Client(bare, mode=mode) as client:
        expected = wire(await client.call_tool_mcp("no_such_tool", {"x": 1}))
    async with Client(make_server().mcp, mode=mode) as client:
        actual = wire(await client.call_tool_mcp("no_such_tool", {"x": 1}))
    assert actual == expected
    assert actual["content"] == [{"type": "text", "text": "Unknown tool: 'no_such_tool'"}]
    assert actual["isError"] is True and "structuredContent" not in actual


BAD_INPUTS: list[tuple[str, dict[str, Any], str]] = [
    ("nexus_read_file", {}, "INVALID_INPUT"),
    ("nexus_read_file", {"path": 5}, "INVALID_INPUT"),
    ("nexus_read_file", {"path": ["a"]}, "INVALID_INPUT"),
    ("nexus_read_file", {"path": "todo.txt", CANARY: 1}, "INVALID_INPUT"),
    ("nexus_list_files", {"recursive": "true"}, "INVALID_INPUT"),
    ("nexus_glob", {"pattern": 3}, "INVALID_INPUT"),
    ("nexus_grep", {"pattern": ""}, "INVALID_INPUT"),
    ("nexus_grep", {"pattern": "(" + CANARY, "regex": True}, "INVALID_INPUT"),
    ("nexus_write_file", {"path": "a.txt"}, "INVALID_INPUT"),
    ("nexus_write_file", {"path": "a.txt", "content": 12, "idempotency_key": "k"}, "INVALID_INPUT"),
    (
        "nexus_edit_file",
        {"path": "todo.txt", "old_text": "", "new_text": "x", "idempotency_key": "k"},
        "INVALID_INPUT",
    ),
    (
        "nexus_edit_file",
        {
            "path": "todo.txt",
            "old_text": "a",
            "new_text": "b",
            "expected_occurrences": "5",
            "idempotency_key": "k",
        },
        "INVALID_INPUT",
    ),
    (
        "nexus_edit_file",
        {
            "path": "todo.txt",
            "old_text": "a",
            "new_text": "b",
            "expected_occurrences": 0,
            "idempotency_key": "k",
        },
        "INVALID_INPUT",
    ),
    ("nexus_mkdir", {"path": "x", "parents": 1, "idempotency_key": "k"}, "INVALID_INPUT"),
    ("nexus_rename_file", {"source": "todo.txt", "idempotency_key": "k"}, "INVALID_INPUT"),
]

HOSTILE_PATHS = [
    f"../{CANARY}",
    f"notes/../../{CANARY}",
    f"/etc/{CANARY}",
    f"C:/Users/{CANARY}",
    f"c:{CANARY}",
    f"\\\\server\\share\\{CANARY}",
    f"//server/share/{CANARY}",
    f"notes\\..\\{CANARY}",
    f"{CANARY}\x00.txt",
    "escape-link/secret.txt",
    "escape-link",
    "../ws-evil/secret.txt",
    "../ws/todo.txt",
]


@pytest.mark.parametrize(("tool", "args", "code"), BAD_INPUTS)
async def test_bad_arguments_get_invalid_input_and_are_not_echoed(
    make_server: ServerFactory, workspace: Path, tool: str, args: dict[str, Any], code: str
) -> None:
    before = snapshot(workspace)
    async with Client(make_server().mcp) as client:
        result = wire(await client.call_tool_mcp(tool, args))
    assert envelope(result)["code"] == code
    assert CANARY not in json.dumps(result)
    assert "input_value" not in json.dumps(result)
    assert snapshot(workspace) == before


async def test_invalid_input_names_the_field_only(make_server: ServerFactory) -> None:
    async with Client(make_server().mcp) as client:
        result = wire(await client.call_tool_mcp("nexus_read_file", {"path": 12345}))
    assert envelope(result) == {"error": "argument 'path' should be text", "code": "INVALID_INPUT"}


WRITE_CALLS = [
    ("nexus_write_file", {"content": "CANARY-WRITE"}),
    ("nexus_delete_file", {}),
    ("nexus_mkdir", {"parents": True}),
    ("nexus_rmdir", {"recursive": True}),
    ("nexus_edit_file", {"old_text": "a", "new_text": "b"}),
]


@pytest.mark.parametrize("path", HOSTILE_PATHS)
@pytest.mark.parametrize(
    ("tool", "extra"),
    [("nexus_read_file", {}), ("nexus_file_info", {}), ("nexus_list_files", {}), *WRITE_CALLS],
)
async def test_hostile_paths_are_refused_without_echo_or_effect(
    make_server: ServerFactory, workspace: Path, tool: str, extra: dict[str, Any], path: str
) -> None:
    outside = workspace.parent / "ws-evil"
    before, before_outside = snapshot(workspace), snapshot(outside)
    args = {"path": path, **extra}
    if tool not in {"nexus_read_file", "nexus_file_info", "nexus_list_files"}:
        args["idempotency_key"] = "k-hostile"
    async with Client(make_server().mcp) as client:
        result = wire(await client.call_tool_mcp(tool, args))
    text = json.dumps(result)
    assert envelope(result)["code"] in {"INVALID_PATH", "INVALID_INPUT"}
    assert CANARY not in text and "CANARY-OUTSIDE-SECRET" not in text and "ws-evil" not in text
    assert snapshot(workspace) == before
    assert snapshot(outside) == before_outside


@pytest.mark.parametrize("field", ["source", "destination"])
async def test_rename_refuses_hostile_paths_on_either_side(
    make_server: ServerFactory, workspace: Path, field: str
) -> None:
    before = snapshot(workspace)
    args = {"source": "todo.txt", "destination": "moved.txt", "idempotency_key": "k"}
    args[field] = f"../{CANARY}"
    async with Client(make_server().mcp) as client:
        result = wire(await client.call_tool_mcp("nexus_rename_file", args))
    assert envelope(result)["code"] == "INVALID_PATH"
    assert snapshot(workspace) == before


class Echo(BaseModel):
    ok: bool


@nexus_tool(risk="read", toolset="test")
async def explode() -> Echo:
    """Fails with a secret in its exception text."""
    raise RuntimeError(f"db password={CANARY}")


@pytest.mark.parametrize("mode", MODES)
async def test_unexpected_exceptions_become_masked_internal_errors(
    workspace: Path, tmp_path: Path, mode: str
) -> None:
    from nexus_mcp.observability.audit import MemoryAuditSink
    from nexus_mcp.server import build_server
    from nexus_mcp.settings import Settings

    sink = MemoryAuditSink()
    server = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "d"),
        audit_sinks=[sink],
        extra_tools=[explode],
    )
    grant_tool(server.runtime.grants, "dev", "explode", "default")  # tools are granted, not ambient
    async with Client(server.mcp, mode=mode) as client:
        result = wire(await client.call_tool_mcp("explode", {}))
    payload = envelope(result)
    assert payload["code"] == Code.INTERNAL_ERROR
    assert payload["error"].startswith("internal error (ref ")
    assert CANARY not in json.dumps(result)
    finished = sink.records()[-1]
    assert finished["outcome"] == "INTERNAL_ERROR"
    assert CANARY not in json.dumps(sink.records())


async def test_too_many_arguments_text_is_never_echoed(make_server: ServerFactory) -> None:
    async with Client(make_server().mcp) as client:
        result = wire(
            await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt", "extra": CANARY})
        )
    assert envelope(result) == {
        "error": "unexpected argument; accepted: path",
        "code": "INVALID_INPUT",
    }


async def test_oversized_arguments_are_refused_in_the_app(
    make_server: ServerFactory, workspace: Path
) -> None:
    """stdio has no HTTP body limit, so the envelope bounds argument size itself."""
    before = snapshot(workspace)
    server = make_server(limits={"max_request_bytes": 4096})
    async with Client(server.mcp) as client:
        result = wire(
            await client.call_tool_mcp(
                "nexus_write_file",
                {"path": "big.txt", "content": "x" * 5000, "idempotency_key": "k"},
            )
        )
    assert envelope(result) == {"error": "request is too large", "code": "INVALID_INPUT"}
    assert snapshot(workspace) == before


async def test_client_id_in_meta_never_sets_identity(
    make_server: ServerFactory, audit: Any
) -> None:
    server = make_server(mode="prod", subject="alice", role="viewer")
    async with Client(server.mcp) as client:
        await client.call_tool_mcp(
            "nexus_read_file", {"path": "todo.txt"}, meta={"client_id": "admin", "subject": "admin"}
        )
    assert {e["subject"] for e in audit.records()} == {"alice"}


@pytest.mark.parametrize("mode", MODES)
async def test_a_refusal_of_any_tool_carries_no_structured_content(
    make_server: ServerFactory, mode: str
) -> None:
    """Clients validate ``structuredContent`` against the tool's ``outputSchema`` even when
    ``isError`` is set (TypeScript SDK 1.x, MCP Inspector; see test_clients.py): for every
    tool, the envelope is text content only."""
    async with Client(make_server().mcp, mode=mode) as client:
        tools = await client.list_tools()
        results = {t.name: wire(await client.call_tool_mcp(t.name, {CANARY: 1})) for t in tools}
    assert tools and all(t.output_schema is not None for t in tools)
    assert {name: envelope(result)["code"] for name, result in results.items()} == dict.fromkeys(
        results, "INVALID_INPUT"
    )
