"""An upstream's own requests to the client (sampling, elicitation, roots): refused unless
the operator allows them per upstream, and then relayed only to the caller whose call is in
flight on that upstream session, never with anything of the caller's other context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult

from .upstream_harness import all_up_tools, make_gateway, read_record, stdio_upstream

FORWARD_ALL = {"sampling": True, "elicitation": True, "roots": True}
CALLER_ROOT = "file:///home/caller/project"


async def sampling(messages: Any, params: Any, context: Any) -> str:
    return "hello from the caller's model"


async def elicitation(message: str, response_type: Any, params: Any, context: Any) -> Any:
    return ElicitResult(action="accept", content={"name": "Ada"})


def gateway(tmp_path: Path, forward: dict[str, bool] | None) -> Any:
    extra = {"forward": forward} if forward is not None else {}
    gw = make_gateway(
        tmp_path,
        [stdio_upstream(record=tmp_path / "rec.jsonl", **extra)],
        grant={"full": all_up_tools()},
    )
    assert gw.pin("up") == 0
    return gw


def client(server: Any, *, handlers: bool) -> Client[Any]:
    if not handlers:
        return Client(server.mcp, mode="legacy")
    return Client(
        server.mcp,
        mode="legacy",
        sampling_handler=sampling,
        elicitation_handler=elicitation,
        roots=[CALLER_ROOT],
    )


@pytest.mark.parametrize("handlers", [True, False])
async def test_relays_are_off_by_default(tmp_path: Path, handlers: bool) -> None:
    server = gateway(tmp_path, None).build()
    async with client(server, handlers=handlers) as c:
        for tool in ("up_ask_sampling", "up_ask_elicit", "up_ask_roots"):
            result = await c.call_tool_mcp(tool, {})
            # The upstream's request was refused: its tool answers with its own error,
            # and nothing of the caller (its model's answer, its roots) reached it.
            assert result.is_error, tool
            text = result.content[0].text
            assert "hello from the caller" not in text
            assert "Ada" not in text
            assert CALLER_ROOT not in text


async def test_allowed_relays_reach_the_calling_client(tmp_path: Path) -> None:
    server = gateway(tmp_path, FORWARD_ALL).build()
    async with client(server, handlers=True) as c:
        sampled = await c.call_tool_mcp("up_ask_sampling", {})
        assert not sampled.is_error
        assert sampled.structured_content == {"text": "hello from the caller's model"}
        elicited = await c.call_tool_mcp("up_ask_elicit", {})
        assert elicited.structured_content == {"action": "accept", "content": {"name": "Ada"}}
        rooted = await c.call_tool_mcp("up_ask_roots", {})
        assert rooted.structured_content == {"roots": [CALLER_ROOT]}


async def test_an_allowed_relay_fails_closed_without_the_callers_capability(
    tmp_path: Path,
) -> None:
    server = gateway(tmp_path, FORWARD_ALL).build()
    async with client(server, handlers=False) as c:
        for tool in ("up_ask_sampling", "up_ask_elicit", "up_ask_roots"):
            result = await c.call_tool_mcp(tool, {})
            assert result.is_error, tool
            # The upstream learns that the request is not available, not why.
            assert "is not available" in result.content[0].text


async def test_only_one_kind_is_relayed_when_only_it_is_allowed(tmp_path: Path) -> None:
    server = gateway(tmp_path, {"roots": True}).build()
    async with client(server, handlers=True) as c:
        rooted = await c.call_tool_mcp("up_ask_roots", {})
        assert rooted.structured_content == {"roots": [CALLER_ROOT]}
        sampled = await c.call_tool_mcp("up_ask_sampling", {})
        assert sampled.is_error
        assert "hello from the caller" not in sampled.content[0].text
    calls = [r for r in read_record(tmp_path / "rec.jsonl") if r["method"] == "tools/call"]
    assert [r["tool"] for r in calls] == ["ask_roots", "ask_sampling"]
