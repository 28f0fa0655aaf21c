"""Server-side tools/list with 1,000 registered tools and a 30-tool profile: cold and cached.

The nexus server (namespace middleware, profiles, SQLite grants, visible-tools cache) and a
bare FastMCP server with the same 1,000 tools answer ``list_tools`` in the same run. Issue
29's target: the caller's listing at most 0.5x bare FastMCP listing all (FastMCP's per-tool
checks run over the caller's 30 tools only: ``ToolIndex.list_tools``). "cold" forgets the
caller's cached visible set before each call (grants are read from SQLite again); "cached"
is the steady state.

    python benchmarks/bench_list_tools.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from fastmcp import FastMCP
from pydantic import BaseModel

from nexus_mcp.contracts import nexus_tool
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.observability.logs import configure_logging
from nexus_mcp.principal import Principal
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings
from results import Row, progress, report

NAME = "bench_list_tools"
TOOLS = 1_000
PROFILE_TOOLS = 30
ROUNDS = 300
CACHED_TARGET_US = 100.0
COLD_TARGET_US = 2_000.0
LIST_TARGET_RATIO = 0.5  # issue 29: the caller's 30 tools at most half of bare listing all


class Out(BaseModel):
    ok: bool


def make_tool(index: int) -> Callable[..., Awaitable[Out]]:
    async def tool(value: str = "") -> Out:
        return Out(ok=True)

    tool.__name__ = f"bench_tool_{index:04d}"
    tool.__qualname__ = tool.__name__
    tool.__doc__ = f"Benchmark tool number {index}."
    return nexus_tool(risk="read", toolset="bench")(tool)


async def median_us(
    call: Callable[[], Awaitable[Any]], before: Callable[[], None] | None = None
) -> float:
    samples = []
    for _ in range(ROUNDS):
        if before is not None:
            before()
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


async def run() -> None:
    progress(NAME, f"{TOOLS} tools, {ROUNDS} lists per measure")
    tools = [make_tool(i) for i in range(TOOLS)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        profiles = root / "profiles.yaml"
        granted = [f"bench_tool_{i:04d}" for i in range(0, TOOLS, TOOLS // PROFILE_TOOLS)][
            :PROFILE_TOOLS
        ]
        profiles.write_text(
            yaml.safe_dump({"default_profile": "bench", "roles": {"viewer": "bench", "editor": "bench",
                            "evaluator": "bench", "admin": "bench"},
                            "profiles": {"bench": {"description": "30 tools", "tools": granted}}})
        )  # fmt: skip
        server = build_server(
            Settings(mode="dev", workspace=root / "ws", data_dir=root / "data", subject="bench",
                     profiles={"file": profiles}),
            audit_sinks=[MemoryAuditSink()],
            extra_tools=tools,
        )  # fmt: skip
        bare: FastMCP[Any] = FastMCP("bare")
        for tool in tools:
            bare.tool(tool)
        listed = await server.mcp.list_tools()
        assert len(listed) == PROFILE_TOOLS, len(listed)
        assert len(await bare.list_tools()) == TOOLS
        for _ in range(50):  # warm-up
            await server.mcp.list_tools()
            await bare.list_tools()
        bare_us = await median_us(bare.list_tools)
        cached_us = await median_us(server.mcp.list_tools)
        cold_us = await median_us(server.mcp.list_tools, before=server.runtime.access.forget)
        # The namespace step alone on the real 1,000+ listed tool objects.
        all_tools = await server.mcp.list_tools(run_middleware=False)
        principal = Principal(subject="bench", role="admin")
        access = server.runtime.access

        async def filter_step() -> None:
            # What ToolNamespaceMiddleware.on_list_tools does with the tools FastMCP listed.
            visible = access.visible_tools(principal)
            kept = [t for t in all_tools if t.name in visible]
            assert len(kept) == PROFILE_TOOLS

        step_cached_us = await median_us(filter_step)
        step_cold_us = await median_us(filter_step, before=access.forget)
        server.close()
    listing = f"tools/list, {TOOLS:,} tools, {PROFILE_TOOLS}-tool profile"
    bare = f"bare FastMCP listing all {TOOLS:,}"
    report(
        NAME,
        [
            Row(
                f"{listing}, cached visible set",
                bare,
                bare_us,
                cached_us,
                "µs",
                target_kind="ratio_max",
                target=LIST_TARGET_RATIO,
            ),
            Row(
                f"{listing}, cold (grants from SQLite)",
                bare,
                bare_us,
                cold_us,
                "µs",
                target_kind="ratio_max",
                target=LIST_TARGET_RATIO,
            ),
            Row(
                "namespace step over the real tool objects, cached",
                "-",
                None,
                step_cached_us,
                "µs",
                target_kind="value_max",
                target=CACHED_TARGET_US,
            ),
            Row(
                "namespace step over the real tool objects, cold",
                "-",
                None,
                step_cold_us,
                "µs",
                target_kind="value_max",
                target=COLD_TARGET_US,
            ),
        ],
    )


if __name__ == "__main__":
    configure_logging("ERROR")  # the server's JSON logs are not the result
    asyncio.run(run())
    sys.exit(0)
