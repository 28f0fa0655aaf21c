"""Discovery tools answer only about the caller's visible tools (seed 004 phase 4), end to end.

A custom profile file gives callers exactly the tool sets these tests need; an admin on
the shipped profiles (every registered tool) provides the unfiltered ranking to compare
against. Hidden tools must look exactly like missing ones in every discovery answer.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer

from .access_helpers import (
    MISSING_TOOL,
    TTL_SECONDS,
    grants_db,
    http_client,
    http_nexus,
    poll,
    registered,
    registry_write_tools,
    run_cli,
    token,
    tool_names,
)
from .conftest import ServerFactory, wire

MODES = ["auto", "legacy"]
DISCOVERY = [
    "nexus_discovery_search_tools",
    "nexus_discovery_list_servers",
    "nexus_discovery_get_tool_details",
    "nexus_discovery_load_tools",
]
READER = ["nexus_read_file", "nexus_file_info", "nexus_list_files", "nexus_glob", *DISCOVERY]
PROFILES_YAML = f"""
default_profile: reader
roles: {{viewer: reader, editor: reader, evaluator: reader, admin: writer}}
profiles:
  reader:
    tools: [{", ".join(READER)}]
  writer:
    extends: reader
    tools: [nexus_write_file, nexus_delete_file, nexus_rename_file]
  finder:
    tools: [nexus_discovery_search_tools]
  lister:
    tools: [nexus_discovery_list_servers]
"""


@pytest.fixture
def profiles_file(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(PROFILES_YAML)
    return path


@pytest.fixture
def as_profile(make_server: ServerFactory, profiles_file: Path) -> Any:
    def build(profile: str, *, subject: str = "dora", **overrides: Any) -> NexusServer:
        settings: dict[str, Any] = {"file": profiles_file, "cache_ttl_seconds": TTL_SECONDS}
        return make_server(
            mode="prod", subject=subject, profile=profile, profiles=settings, **overrides
        )

    return build


async def call(
    server: NexusServer, tool: str, args: dict[str, Any], mode: str = "auto"
) -> dict[str, Any]:
    async with Client(server.mcp, mode=mode) as client:
        return wire(await client.call_tool_mcp(tool, args))


def answer(result: dict[str, Any]) -> Any:
    assert result["isError"] is False, result
    return result["structuredContent"]


async def load(client: Client[Any], *names: str) -> list[str]:
    """Load tools in this client's session; returns everything loaded there so far."""
    result = wire(await client.call_tool_mcp("nexus_discovery_load_tools", {"names": list(names)}))
    loaded: list[str] = answer(result)["loaded"]
    return loaded


async def full_ranking(make_server: ServerFactory, query: str) -> list[dict[str, Any]]:
    """The unfiltered ranking: an admin on the shipped profiles sees every registered tool."""
    admin = make_server(mode="prod", subject="root", role="admin")
    async with Client(admin.mcp) as client:
        assert await tool_names(client) == registered(admin)
        result = wire(
            await client.call_tool_mcp(
                "nexus_discovery_search_tools", {"query": query, "top_k": 50}
            )
        )
    ranking: list[dict[str, Any]] = answer(result)["results"]
    return ranking


# --- search ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_search_returns_only_visible_tools_in_the_unfiltered_order(
    make_server: ServerFactory, as_profile: Any, mode: str
) -> None:
    ranking = await full_ranking(make_server, "file")
    reader = as_profile("reader")
    result = answer(
        await call(reader, "nexus_discovery_search_tools", {"query": "file", "top_k": 50}, mode)
    )
    expected = [m for m in ranking if m["name"] in READER]
    assert len(expected) < len(ranking)  # the query does match hidden tools
    assert result == {"query_terms": 1, "results": expected}


async def test_search_still_returns_top_k_visible_tools_when_better_matches_are_hidden(
    make_server: ServerFactory, as_profile: Any
) -> None:
    ranking = await full_ranking(make_server, "file")
    top_k = 2
    assert not {m["name"] for m in ranking[:top_k]} & set(READER)  # the best matches are hidden
    reader = as_profile("reader")
    result = answer(
        await call(reader, "nexus_discovery_search_tools", {"query": "file", "top_k": top_k})
    )
    assert result["results"] == [m for m in ranking if m["name"] in READER][:top_k]
    assert len(result["results"]) == top_k


async def test_search_returns_nothing_when_every_match_is_hidden(
    make_server: ServerFactory, as_profile: Any
) -> None:
    query = "rename delete write"
    assert await full_ranking(make_server, query)  # something does match
    finder = as_profile("finder")
    assert answer(await call(finder, "nexus_discovery_search_tools", {"query": query})) == {
        "query_terms": 3,
        "results": [],
    }


# --- list servers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "read_only", "count", "toolsets"),
    [
        pytest.param("lister", False, 1, ["discovery"], id="only-list-servers"),
        pytest.param("reader", False, len(READER), ["discovery", "files"], id="reader"),
        pytest.param("writer", False, len(READER) + 3, ["discovery", "files"], id="writer"),
        pytest.param("writer", True, len(READER), ["discovery", "files"], id="writer-read-only"),
    ],
)
async def test_list_servers_counts_only_visible_tools_and_names_only_their_toolsets(
    as_profile: Any, profile: str, read_only: bool, count: int, toolsets: list[str]
) -> None:
    server = as_profile(profile, read_only=read_only)
    assert {"notes", "files", "discovery"} <= {
        c.toolset for c in server.runtime.book.contracts.values()
    }
    result = answer(await call(server, "nexus_discovery_list_servers", {}))
    assert result == {
        "servers": [{"server_id": "nexus", "tool_count": count, "toolsets": toolsets}]
    }


# --- tool details ------------------------------------------------------------------------------


@pytest.mark.parametrize("hidden", ["nexus_write_file", "get_note_outline"])
@pytest.mark.parametrize("mode", MODES)
async def test_details_of_a_hidden_tool_answer_exactly_as_a_missing_tool(
    as_profile: Any, mode: str, hidden: str
) -> None:
    reader = as_profile("reader")
    async with Client(reader.mcp, mode=mode) as client:
        assert hidden not in await tool_names(client)
        of_hidden = wire(
            await client.call_tool_mcp("nexus_discovery_get_tool_details", {"name": hidden})
        )
        of_missing = wire(
            await client.call_tool_mcp("nexus_discovery_get_tool_details", {"name": MISSING_TOOL})
        )
        of_visible = wire(
            await client.call_tool_mcp("nexus_discovery_get_tool_details", {"name": "nexus_glob"})
        )
    assert of_hidden == of_missing
    assert of_hidden["isError"] is True and "structuredContent" not in of_hidden
    assert json.loads(of_hidden["content"][0]["text"]) == {
        "error": "tool not found",
        "code": "NOT_FOUND",
    }
    assert hidden not in str(of_hidden)
    details = answer(of_visible)
    assert (details["name"], details["toolset"], details["risk"]) == ("nexus_glob", "files", "read")
    assert "pattern" in details["input_schema"]["properties"]


# --- load tools -----------------------------------------------------------------------------


async def test_load_tools_loads_only_visible_names_and_counts_hidden_as_not_found(
    as_profile: Any,
) -> None:
    reader = as_profile("reader")
    names = [
        "nexus_read_file",
        "nexus_write_file",
        MISSING_TOOL,
        "nexus_read_file",
        "get_note_outline",
    ]
    async with Client(reader.mcp) as client:
        mixed = answer(
            wire(await client.call_tool_mcp("nexus_discovery_load_tools", {"names": names}))
        )
        hidden = wire(
            await client.call_tool_mcp(
                "nexus_discovery_load_tools", {"names": ["nexus_write_file"]}
            )
        )
        missing = wire(
            await client.call_tool_mcp("nexus_discovery_load_tools", {"names": [MISSING_TOOL]})
        )
    assert mixed["loaded"] == ["nexus_read_file"]
    assert [t["name"] for t in mixed["tools"]] == ["nexus_read_file"]
    assert mixed["not_found"] == 3
    # Same session, same state: hidden and missing give the same answer.
    assert (hidden["content"], hidden["structuredContent"]) == (
        missing["content"],
        missing["structuredContent"],
    )
    assert answer(hidden) == {"loaded": ["nexus_read_file"], "tools": [], "not_found": 1}


async def test_loaded_tools_are_per_session_for_legacy_clients_of_one_subject(
    as_profile: Any,
) -> None:
    reader = as_profile("reader")
    async with (
        Client(reader.mcp, mode="legacy") as first,
        Client(reader.mcp, mode="legacy") as second,
    ):
        assert await load(first, "nexus_read_file") == ["nexus_read_file"]
        assert await load(second, "nexus_glob") == ["nexus_glob"]
        assert await load(first, "nexus_file_info") == ["nexus_file_info", "nexus_read_file"]
        assert await load(second, "nexus_glob") == ["nexus_glob"]


@pytest.mark.parametrize("mode", MODES)
async def test_two_subjects_never_share_loaded_tools(
    workspace: Path, tmp_path: Path, audit: MemoryAuditSink, profiles_file: Path, mode: str
) -> None:
    profiles = {"file": profiles_file, "cache_ttl_seconds": TTL_SECONDS}
    async with (
        http_nexus(workspace, tmp_path / "data", audit, profiles=profiles) as (_server, url),
        http_client(url, token("uma", profile="reader"), mode=mode) as uma,
        http_client(url, token("ugo", profile="reader"), mode=mode) as ugo,
    ):
        first = list(await asyncio.gather(load(uma, "nexus_read_file"), load(ugo, "nexus_glob")))
        again = list(
            await asyncio.gather(load(uma, "nexus_file_info"), load(ugo, "nexus_list_files"))
        )
    assert first == [["nexus_read_file"], ["nexus_glob"]]
    assert again == [["nexus_file_info", "nexus_read_file"], ["nexus_glob", "nexus_list_files"]]


async def test_a_loaded_tool_drops_out_of_the_session_once_it_is_revoked(as_profile: Any) -> None:
    reader = as_profile("reader", subject="rex")
    db = str(grants_db(reader))
    run_cli("profiles", "grant", "rex", "nexus_grep", "--db", db)
    async with Client(reader.mcp) as client:
        first = answer(
            wire(
                await client.call_tool_mcp("nexus_discovery_load_tools", {"names": ["nexus_grep"]})
            )
        )
        run_cli("profiles", "revoke", "rex", "--tool", "nexus_grep", "--db", db)
        names, _ = await poll(lambda: tool_names(client), lambda n: "nexus_grep" not in n)
        assert "nexus_grep" not in names
        after = answer(
            wire(
                await client.call_tool_mcp(
                    "nexus_discovery_load_tools", {"names": ["nexus_glob", "nexus_grep"]}
                )
            )
        )
    assert first["loaded"] == ["nexus_grep"]
    assert after == {"loaded": ["nexus_glob"], "tools": after["tools"], "not_found": 1}
    assert [t["name"] for t in after["tools"]] == ["nexus_glob"]


def test_the_reader_profile_has_no_write_tools() -> None:
    """Guards the expectations above (read-only counts equal the reader's)."""
    assert not set(READER) & registry_write_tools()
    assert {"nexus_write_file", "nexus_delete_file", "nexus_rename_file"} <= registry_write_tools()
