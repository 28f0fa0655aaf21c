"""Issue 29: a caller's ``tools/list`` makes FastMCP do its per-tool work over the caller's
tools only (``ToolIndex.list_tools`` under the namespace's ``ListingFilter``), and shows
exactly what the full listing filtered by the namespace showed before.

Attacker's view: the narrowing must never show more than the grants allow, never leak into
another listing (a task started meanwhile, a caller listing at the same time, an internal
full listing), and never hide a tool that became visible while the listing ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from fastmcp import Client
from pydantic import BaseModel

from nexus_mcp.calls import ListingFilter, bind_listing, current_listing
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import build_server
from nexus_mcp.server.runtime import NexusServer
from nexus_mcp.settings import Settings

TOOLS = 200
GRANTED = [f"wide_tool_{i:03d}" for i in range(0, TOOLS, 10)]


class Out(BaseModel):
    ok: bool


def make_tool(index: int) -> Callable[..., Awaitable[Out]]:
    async def tool(value: str = "") -> Out:
        return Out(ok=True)

    tool.__name__ = f"wide_tool_{index:03d}"
    tool.__qualname__ = tool.__name__
    tool.__doc__ = f"Tool number {index}."
    return nexus_tool(risk="read", toolset="wide")(tool)


def build(tmp_path: Path, granted: list[str]) -> NexusServer:
    profiles = tmp_path / "profiles.yaml"
    roles = dict.fromkeys(("viewer", "editor", "evaluator", "admin"), "few")
    profiles.write_text(
        yaml.safe_dump(
            {
                "default_profile": "few",
                "roles": roles,
                "profiles": {"few": {"description": "a few tools", "tools": granted}},
            }
        )
    )
    (tmp_path / "ws").mkdir(exist_ok=True)
    return build_server(
        Settings(
            mode="dev",
            workspace=tmp_path / "ws",
            data_dir=tmp_path / "data",
            subject="alice",
            profiles={"file": profiles},
        ),
        audit_sinks=[MemoryAuditSink()],
        extra_tools=[make_tool(i) for i in range(TOOLS)],
    )


async def test_the_narrowed_listing_is_exactly_the_full_listing_filtered(tmp_path: Path) -> None:
    server = build(tmp_path, GRANTED)
    try:
        everything = await server.mcp.list_tools(run_middleware=False)
        assert len(everything) >= TOOLS  # no narrowing without the namespace's filter
        async with Client(server.mcp) as client:
            listed = sorted(t.name for t in await client.list_tools())
        # The profile names only these (computed here from the file, not from the server).
        assert listed == sorted(GRANTED)
    finally:
        server.close()


async def test_the_hidden_count_still_counts_every_tool_left_out(tmp_path: Path) -> None:
    server = build(tmp_path, GRANTED)
    try:
        everything = await server.mcp.list_tools(run_middleware=False)
        cache = server.runtime.access.cache
        before = cache.metrics()["filtered"]
        async with Client(server.mcp) as client:
            listed = await client.list_tools()
        assert len(listed) == len(GRANTED)
        assert cache.metrics()["filtered"] - before == len(everything) - len(listed)
    finally:
        server.close()


async def test_a_task_started_during_a_listing_lists_everything(tmp_path: Path) -> None:
    """A task inherits the context variable; its listings (the change notifier's) must
    not be narrowed to the caller's names."""
    server = build(tmp_path, GRANTED)
    seen: list[int] = []
    try:
        full = len(await server.mcp.list_tools(run_middleware=False))
        with bind_listing(ListingFilter(frozenset(GRANTED[:1]), asyncio.current_task())):
            narrowed = await server.mcp.list_tools(run_middleware=False)

            async def other() -> None:
                assert current_listing() is not None  # inherited ...
                seen.append(len(await server.mcp.list_tools(run_middleware=False)))

            await asyncio.create_task(other())
        assert [t.name for t in narrowed] == GRANTED[:1]
        assert seen == [full]  # ... and ignored: another task's listing is whole
    finally:
        server.close()


async def test_callers_listing_at_once_each_see_their_own(tmp_path: Path) -> None:
    server = build(tmp_path, GRANTED)
    try:
        async with Client(server.mcp) as first, Client(server.mcp) as second:
            results: list[Any] = await asyncio.gather(
                *(c.list_tools() for c in [first, second] * 10)
            )
        names = {tuple(sorted(t.name for t in r)) for r in results}
        assert len(names) == 1
    finally:
        server.close()


async def test_a_tool_made_visible_while_listing_is_not_missed(tmp_path: Path) -> None:
    """The visible set is read before and after FastMCP lists; when it grew in between,
    the namespace lists again in full instead of showing a stale narrowing."""
    server = build(tmp_path, GRANTED[:2])
    access = server.runtime.access
    original = access.visible_tools
    calls = 0

    def growing(principal: Any) -> frozenset[str]:
        nonlocal calls
        calls += 1
        names = original(principal)
        return names if calls % 2 else names | {GRANTED[5]}

    access.visible_tools = growing  # type: ignore[method-assign]
    try:
        async with Client(server.mcp) as client:
            listed = {t.name for t in await client.list_tools()}
        assert GRANTED[5] in listed
        assert set(GRANTED[:2]) <= listed
    finally:
        access.visible_tools = original  # type: ignore[method-assign]
        server.close()
