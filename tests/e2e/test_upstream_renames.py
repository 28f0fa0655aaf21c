"""Renamed and new upstream tools are not trusted by name (issue 27).

A pin is of a tool's whole definition, its name included: a renamed copy of a pinned tool
(the same description and schemas under another name) and a tool that appears on a
pinned server at run time are unpinned, so quarantined until an approver pins them,
even when the registry already classifies the new name. The upstream is the recording
test server as a real stdio subprocess.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from fastmcp import Client

from .upstream_harness import UP_TOOLS, all_up_tools, make_gateway, run_cli, stdio_upstream

CLASSES = {**UP_TOOLS, "echo_v2": "read", "fresh": "read"}


def gateway(tmp_path: Path, **extra: object):  # type: ignore[no-untyped-def]
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(**extra)],
        registries={"up": CLASSES},
        grant={"full": [*all_up_tools(), "up_echo_v2", "up_fresh"]},
    )
    assert gw.pin("up") == 0
    return gw


async def test_a_renamed_copy_of_a_pinned_tool_is_quarantined(tmp_path: Path) -> None:
    gw = gateway(tmp_path)
    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["args"] += ["--rename-echo", "echo_v2"]
    gw.config_file.write_text(yaml.safe_dump(config))
    server = gw.build()
    async with Client(server.mcp) as client:
        names = {t.name for t in await client.list_tools()}
        assert "up_echo_v2" not in names and "up_echo" not in names
        refused = await client.call_tool("up_echo_v2", {"text": "hi"}, raise_on_error=False)
        assert refused.is_error
    unpinned = [e for e in gw.events("tool_unpinned") if e.get("tool") == "echo_v2"]
    assert unpinned, gw.events("tool_unpinned")
    # check names the drift: the new name not pinned, the old one no longer listed.
    args = ["upstream", "check", "up", "--config", str(gw.config_file)]
    assert run_cli([*args, "--data-dir", str(gw.data_dir)]) == 1
    # Pinned by an approver, it is served.
    assert gw.pin("up", "echo_v2") == 0
    server = gw.build()
    async with Client(server.mcp) as client:
        assert "up_echo_v2" in {t.name for t in await client.list_tools()}


async def test_a_tool_that_appears_at_run_time_is_quarantined(tmp_path: Path) -> None:
    # One upstream process for every caller: the tool appears on the gateway's own
    # session, which decides what exists (on a caller's own session a tool the gateway
    # never listed is simply never exposed).
    gw = gateway(tmp_path, shared=True)
    server = gw.build()
    async with Client(server.mcp) as client:
        await client.call_tool("up_spawn_tool", {})
        for _ in range(100):
            if any(e.get("tool") == "fresh" for e in gw.events("tool_unpinned")):
                break
            await asyncio.sleep(0.05)
        assert any(e.get("tool") == "fresh" for e in gw.events("tool_unpinned"))
        assert "up_fresh" not in {t.name for t in await client.list_tools()}
        refused = await client.call_tool("up_fresh", {"text": "x"}, raise_on_error=False)
        assert refused.is_error
