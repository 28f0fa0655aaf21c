"""Change notifications (issue 27): each connected caller is told when, and only when, the
tools, prompts or resources *it* may see change, and nothing else.

The upstream is the recording test server (``tests/support/upstream_server.py``) as a real
stdio subprocess behind a gateway built the normal way; callers are FastMCP clients on the
handshake era (a lasting session the server may speak on), each collecting what the
server sends it. Two callers with different grants are two principals over HTTP with
bearer tokens.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from fastmcp import Client

from .upstream_harness import Gateway, all_up_tools, make_gateway, stdio_upstream

GRANTS: dict[str, Any] = {"resources": ["up"], "prompts": ["up_greet", "up_review"]}
QUIET_SECONDS = 1.0  # how long a caller owed nothing is watched (debounce is 0.15 s)
TOOLS = "notifications/tools/list_changed"
PROMPTS = "notifications/prompts/list_changed"
RESOURCES = "notifications/resources/list_changed"


class Inbox:
    """What the server sent one client, in order (methods only: they carry nothing)."""

    def __init__(self) -> None:
        self.methods: list[str] = []
        self.params: list[Any] = []

    async def __call__(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if isinstance(method, str) and method.startswith("notifications/"):
            self.methods.append(method)
            self.params.append(getattr(message, "params", None))

    async def wait_for(self, method: str, count: int = 1, seconds: float = 15.0) -> None:
        deadline = time.monotonic() + seconds
        while self.methods.count(method) < count:
            assert time.monotonic() < deadline, f"{method} x{count} not received: {self.methods}"
            await asyncio.sleep(0.02)


def gateway(tmp_path: Path, **kwargs: Any) -> Gateway:
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream()],
        grant={"full": all_up_tools()},
        grant_items={"full": GRANTS},
        **kwargs,
    )
    assert gw.pin("up") == 0
    return gw


async def test_a_quarantined_tool_is_told_as_a_tool_list_change_only(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    server = gw.build()
    inbox = Inbox()
    async with Client(server.mcp, mode="legacy", message_handler=inbox) as client:
        caps = client.initialize_result.capabilities
        assert caps.tools.list_changed and caps.prompts.list_changed
        assert caps.resources.list_changed
        assert "up_echo" in {t.name for t in await client.list_tools()}
        await client.call_tool("up_mutate", {})
        await inbox.wait_for(TOOLS)
        assert "up_echo" not in {t.name for t in await client.list_tools()}
        await asyncio.sleep(QUIET_SECONDS)
        assert inbox.methods == [TOOLS]
        assert inbox.params == [None]
