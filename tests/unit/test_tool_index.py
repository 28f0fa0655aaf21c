"""``ToolIndex``: tools/call finds a tool by name, and answers only what FastMCP would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client, FastMCP

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.providers.tool_index import ToolIndex
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

UNKNOWN = "Unknown tool: 'nexus_read_file'"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NexusServer]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("alpha")
    built = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "data"),
        audit_sinks=[MemoryAuditSink()],
    )
    yield built
    built.close()


async def read(server: NexusServer) -> dict[str, Any]:
    async with Client(server.mcp) as client:
        result = await client.call_tool_mcp("nexus_read_file", {"path": "a.txt"})
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def text_of(result: dict[str, Any]) -> str:
    text: str = result["content"][0]["text"]
    return text


async def test_the_server_looks_every_registered_tool_up_by_name_through_its_first_transform(
    server: NexusServer,
) -> None:
    (index,) = [t for t in server.mcp.transforms if isinstance(t, ToolIndex)]
    assert server.mcp.transforms[0] is index
    registered = await server.mcp.list_tools(run_middleware=False)
    assert registered
    for tool in registered:
        assert await server.mcp.get_tool(tool.name) is tool
    assert json.loads(text_of(await read(server)))["content"] == "alpha"


async def test_a_tool_removed_after_start_up_is_unknown_not_served_from_the_index(
    server: NexusServer,
) -> None:
    server.mcp.local_provider.remove_tool("nexus_read_file")
    result = await read(server)
    assert result["isError"] is True and text_of(result) == UNKNOWN
    assert await server.mcp.get_tool("nexus_read_file") is None


@pytest.mark.parametrize("where", ["server", "local provider"])
async def test_a_tool_disabled_after_start_up_stays_disabled(
    server: NexusServer, where: str
) -> None:
    # Visibility is a transform: on the server it wraps the index, on the local provider
    # the index steps aside, so FastMCP's own lookup applies it.
    target = server.mcp if where == "server" else server.mcp.local_provider
    target.disable(names={"nexus_read_file"})
    result = await read(server)
    assert result["isError"] is True and text_of(result) == UNKNOWN


async def test_names_it_was_not_given_take_fastmcps_own_path(server: NexusServer) -> None:
    @server.mcp.tool
    def plain_extra() -> str:
        return "x"

    assert (await server.mcp.get_tool("plain_extra")) is not None
    assert await server.mcp.get_tool("no_such_tool") is None


def test_it_must_be_the_first_transform_so_later_ones_still_apply() -> None:
    mcp: FastMCP[Any] = FastMCP("x")
    mcp.disable(names={"anything"})
    with pytest.raises(ValueError):
        ToolIndex(mcp)
