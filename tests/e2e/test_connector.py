"""The connector as FastMCP holds it: every nexus tool is a ``NexusTool`` whose ``run`` is
ours, and it behaves like FastMCP's own ``FunctionTool`` wherever a client can tell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastmcp import Client
from fastmcp.tools import FunctionTool
from pydantic import BaseModel

from nexus_mcp.contracts import nexus_tool
from nexus_mcp.middleware.chain import PolicyChain
from nexus_mcp.middleware.classification import ClassificationMiddleware
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.policy.grants import grant_tool
from nexus_mcp.providers.native import NexusTool
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings

from .conftest import ServerFactory, wire


class Strict(BaseModel):
    count: int


def envelope(result: dict[str, Any]) -> dict[str, str]:
    """The error envelope: text content only, no structuredContent (DESIGN.md)."""
    assert result["isError"] is True and "structuredContent" not in result
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert set(payload) == {"error", "code"}
    return payload


@nexus_tool(risk="read", toolset="test", description="Fails inside its body with a pydantic error.")
async def body_fails(count: int) -> dict[str, Any]:
    Strict.model_validate({"count": "SECRET-BODY-VALUE"})  # raises inside the body
    return {"count": count}


async def test_every_registered_tool_is_a_nexus_tool(make_server: ServerFactory) -> None:
    server = make_server()
    tools = await server.mcp.list_tools(run_middleware=False)
    assert tools and all(isinstance(t, NexusTool) for t in tools)
    assert {t.name for t in tools} == set(server.runtime.book.contracts)


async def test_the_schema_is_the_one_fastmcp_derives_from_the_declared_function(
    make_server: ServerFactory,
) -> None:
    server = make_server()
    for tool in await server.mcp.list_tools(run_middleware=False):
        assert isinstance(tool, NexusTool)
        plain = FunctionTool.from_function(tool.fn, name=tool.name)
        assert tool.parameters == plain.parameters, tool.name
        assert tool.output_schema == plain.output_schema, tool.name


async def test_bad_arguments_are_invalid_input_naming_the_field_only(
    make_server: ServerFactory, audit: MemoryAuditSink
) -> None:
    server = make_server()
    async with Client(server.mcp) as client:
        result = wire(await client.call_tool_mcp("nexus_read_file", {"path": 12345678}))
    payload = envelope(result)
    assert payload["code"] == "INVALID_INPUT"
    assert "path" in payload["error"]
    assert "12345678" not in json.dumps(result) + json.dumps(audit.records())


async def test_a_pydantic_error_inside_a_tool_body_is_an_internal_error_not_bad_input(
    workspace: Path, tmp_path: Path
) -> None:
    audit = MemoryAuditSink()
    settings = Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "d")
    server = build_server(settings, audit_sinks=[audit], extra_tools=[body_fails])
    grant_tool(server.runtime.grants, settings.dev_principal.subject, "body_fails", "default")
    try:
        async with Client(server.mcp) as client:
            result = wire(await client.call_tool_mcp("body_fails", {"count": 3}))
    finally:
        server.close()
    assert envelope(result)["code"] == "INTERNAL_ERROR"
    assert "SECRET-BODY-VALUE" not in json.dumps(result) + json.dumps(audit.records())


async def test_without_the_gateway_the_tool_still_validates_its_own_arguments(
    make_server: ServerFactory, workspace: Path
) -> None:
    server = make_server()
    (chain,) = server.mcp.middleware
    assert isinstance(chain, PolicyChain)
    chain.replace_layers([m for m in chain.layers if not isinstance(m, ClassificationMiddleware)])
    async with Client(server.mcp) as client:
        bad = wire(await client.call_tool_mcp("nexus_read_file", {"path": ["todo.txt"]}))
        extra = wire(
            await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt", "x": "EXTRA-VAL"})
        )
        good = wire(await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"}))
    assert envelope(bad)["code"] == "INVALID_INPUT"
    assert "path" in envelope(bad)["error"]
    assert envelope(extra)["code"] == "INVALID_INPUT"
    assert "EXTRA-VAL" not in json.dumps(extra)
    assert good["structuredContent"]["content"] == (workspace / "todo.txt").read_text()
