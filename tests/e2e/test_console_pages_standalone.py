"""The Access, Audit and Health pages of ``nexus-mcp console`` beside a stdio server.

The same grants file and audit file as the stdio server (an in-process server on the data
dir, as a desktop client would launch it): a profile assigned in the console is the one
the server's store holds, the agent's calls are in the audit page, and the health page
says what it cannot know there (upstreams, registry) instead of guessing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml
from fastmcp import Client

from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .test_console_standalone import console_process, read_link

pytestmark = pytest.mark.slow

SUBJECT = "agent-9"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "nexus.yaml"
    path.write_text(yaml.safe_dump({"server_name": "nexus-mcp"}), encoding="utf-8")
    return path


@pytest.fixture
def stdio_server(workspace: Path, tmp_path: Path, config: Path) -> Iterator[NexusServer]:
    built = build_server(
        Settings(
            mode="prod", subject=SUBJECT, role="editor", workspace=workspace,
            data_dir=tmp_path / "data",
        ),
        config_file=config,
    )  # fmt: skip
    yield built
    built.close()


async def test_the_pages_beside_a_stdio_server(
    stdio_server: NexusServer, tmp_path: Path, config: Path
) -> None:
    async with Client(stdio_server.mcp) as agent:
        await agent.call_tool_mcp("nexus_list_files", {"path": "."})
    process = console_process(tmp_path, config)
    try:
        link = read_link(process)
        base = link.split("/console/")[0]
        token = parse_qs(urlsplit(link).query)["t"][0]
        async with httpx.AsyncClient(base_url=base, timeout=30) as browser:
            signed = await browser.post(
                "/console/login", data={"t": token}, headers={"Origin": base}
            )
            assert signed.status_code == 303
            access = (await browser.get("/console/access")).text
            assert "<code>full</code>" in access and 'id="assign"' in access
            csrf = re.search(r'name="csrf" value="([^"]+)"', access)
            assert csrf is not None
            done = await browser.post(
                "/console/access/assign",
                data={"csrf": csrf.group(1), "subject": SUBJECT, "profile": "full"},
                headers={"Origin": base},
            )
            assert done.status_code == 303, done.text
            audit = (await browser.get("/console/audit", params={"subject": SUBJECT})).text
            health = (await browser.get("/console/health")).text
    finally:
        process.terminate()
        process.communicate(timeout=30)
    zone = stdio_server.runtime.settings.profiles.zone
    assert stdio_server.runtime.grants.get_assignment(SUBJECT, zone) == "full"
    assert "nexus_list_files" in audit and "tool_call_finished" in audit
    assert re.search(r'id="store">ready · backend <code>embedded</code>', health)
    assert "does not see its upstreams" in health
    assert "has not loaded the registry" in health
