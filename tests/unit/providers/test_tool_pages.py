"""A tools/list page validated a definition at a time: what the MCP SDK's own
``list_tools`` gives (and refuses), with the event loop given turns meanwhile."""

from __future__ import annotations

from typing import Any

import mcp_types
import pytest
from fastmcp import Client, FastMCP
from mcp_types import methods
from pydantic import ValidationError

from nexus_mcp.providers.upstream.listing import fetch_listing
from nexus_mcp.providers.upstream.tool_pages import list_page, validated

from .conftest import CountTurns

VERSION = "2025-11-25"


def server(tools: int) -> FastMCP[Any]:
    mcp: FastMCP[Any] = FastMCP("pages")
    for index in range(tools):

        async def tool(value: str = "") -> dict[str, Any]:
            return {"value": value}

        mcp.tool(tool, name=f"tool_{index:04d}", description=f"Tool {index}.")
    return mcp


def sdk(raw: dict[str, Any]) -> mcp_types.ListToolsResult:
    """What ``ClientSession.send_request`` does with a tools/list result."""
    methods.validate_server_result("tools/list", VERSION, raw)
    return mcp_types.ListToolsResult.model_validate(raw, by_name=False)


async def test_a_page_is_what_the_sdk_lists_and_the_session_takes_it_in() -> None:
    async with Client(server(40)) as client:
        ours = await list_page(client, None)
        theirs = await client.list_tools_mcp()
        assert ours == theirs
        listing = await fetch_listing(client)
        assert [t["name"] for t in listing.wire] == [t.name for t in theirs.tools]
        # Absorbed as list_tools absorbs: the session knows each tool's output schema.
        schemas = client.session._tool_output_schemas
        assert set(schemas) == {t.name for t in theirs.tools}


RAW: list[dict[str, Any]] = [
    {"tools": []},
    {"tools": [{"name": "a", "inputSchema": {"type": "object"}}], "nextCursor": "c"},
    {"tools": [{"name": "a", "inputSchema": {"type": "object"}, "title": "T"}], "_meta": {}},
]
REFUSED: list[dict[str, Any]] = [
    {},
    {"tools": "none"},
    {"tools": [{"name": "a"}]},  # no inputSchema
    {"tools": [{"name": 5, "inputSchema": {"type": "object"}}]},
    {"tools": [{"name": "a", "inputSchema": {"type": "object"}}, {"inputSchema": {}}]},
    {"tools": [], "nextCursor": 5},
]


@pytest.mark.parametrize("raw", RAW)
async def test_a_result_the_sdk_takes_is_taken_alike(raw: dict[str, Any]) -> None:
    assert await validated(raw, VERSION) == sdk(raw)


@pytest.mark.parametrize("raw", REFUSED)
async def test_a_result_the_sdk_refuses_is_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        sdk(raw)
    with pytest.raises(ValidationError):
        await validated(raw, VERSION)


async def test_the_loop_gets_turns_while_a_large_page_is_validated(
    count_turns: CountTurns,
) -> None:
    """Counted, not timed: with a zero slice, a turn between definitions."""
    raw = {"tools": [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(300)]}
    result, turns = await count_turns(validated(raw, VERSION))
    assert result == sdk(raw)
    assert turns >= 300


async def test_a_client_without_the_sdk_session_is_asked_as_before() -> None:
    class Pages:
        async def list_tools_mcp(self, cursor: str | None = None) -> mcp_types.ListToolsResult:
            return mcp_types.ListToolsResult(tools=[], next_cursor=cursor)

    assert (await list_page(Pages(), "x")).next_cursor == "x"
