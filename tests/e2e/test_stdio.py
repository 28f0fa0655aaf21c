"""A real ``nexus-mcp serve --transport stdio`` subprocess driven by the mcp SDK client."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from .servers import server_env

pytestmark = pytest.mark.slow


def params(
    workspace: Path, data: Path, *flags: str, env: dict[str, str] | None = None
) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "nexus_mcp", "serve", "--transport", "stdio", "--workspace", str(workspace),
              "--data-dir", str(data), *flags],
        env=server_env(env),
    )  # fmt: skip


async def test_stdio_launch_principal_from_environment_reads_and_audits(
    workspace: Path, tmp_path: Path
) -> None:
    env = {"NEXUS_MCP_SUBJECT": "alice", "NEXUS_MCP_ROLE": "editor", "NEXUS_MCP_MODE": "prod"}
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with stdio_client(params(workspace, tmp_path / "data", env=env), errlog=errlog) as (
            read,
            write,
        ):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.protocol_version == "2025-11-25"
                names = {t.name for t in (await session.list_tools()).tools}
                assert "nexus_read_file" in names
                result = await session.call_tool("nexus_read_file", {"path": "todo.txt"})
                assert result.is_error is False
                assert result.structured_content is not None
                assert result.structured_content["path"] == "todo.txt"
                bad = await session.call_tool("nexus_read_file", {"path": "../ws-evil/secret.txt"})
                assert bad.is_error is True
                assert bad.structured_content is None
                assert json.loads(bad.content[0].text) == {
                    "error": "path is not allowed",
                    "code": "INVALID_PATH",
                }
    events = [json.loads(line) for line in (tmp_path / "data/audit.jsonl").read_text().splitlines()]
    assert {e["subject"] for e in events} == {"alice"}
    assert [e["outcome"] for e in events if e["event"] != "tool_call_started"] == [
        "OK",
        "INVALID_PATH",
    ]
    # Operational logs went to stderr as JSON, so stdout carried only MCP messages.
    lines = [ln for ln in (tmp_path / "stderr.log").read_text().splitlines() if ln.strip()]
    assert lines and all(json.loads(ln) for ln in lines)


async def test_stdio_prod_without_a_principal_lists_nothing_and_refuses_calls(
    workspace: Path, tmp_path: Path
) -> None:
    async with (
        stdio_client(params(workspace, tmp_path / "data", "--mode", "prod")) as (
            read,
            write,
        ),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        assert (await session.list_tools()).tools == []
        result = await session.call_tool("nexus_read_file", {"path": "todo.txt"})
    assert result.is_error is True
    assert [c.text for c in result.content if c.type == "text"] == [
        "Unknown tool: 'nexus_read_file'"
    ]


async def test_stdio_cli_flags_set_the_principal(workspace: Path, tmp_path: Path) -> None:
    flags = ("--mode", "prod", "--subject", "bob", "--read-only")
    async with stdio_client(params(workspace, tmp_path / "data", *flags)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
    assert "nexus_read_file" in names
    assert "nexus_write_file" not in names
