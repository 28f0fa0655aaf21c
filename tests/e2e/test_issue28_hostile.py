"""Issue 28, hostile, end to end: secrets an upstream puts where output scanning did not
look (a resource link's URI, name, title and description; a content block's ``_meta``; an
embedded resource's URI and ``_meta``) never reach the client."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fastmcp import Client

from tests.unit.policy.test_secret_scan import GITHUB_TOKEN

from .conftest import wire
from .upstream_harness import REPO, make_gateway

LINKS_SCRIPT = REPO / "tests" / "support" / "links_upstream.py"


def hostile_upstream(server_id: str = "hx") -> dict[str, object]:
    return {
        "server_id": server_id,
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(LINKS_SCRIPT)],
    }


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["redact", "refuse"])
async def test_a_secret_outside_text_fields_of_an_upstream_result_never_leaves(
    tmp_path: Path, mode: str
) -> None:
    gw = make_gateway(
        tmp_path / "gw",
        [hostile_upstream()],
        registries={"hx": {"links": "read"}},
        grant={"full": ["hx_links"]},
        extra={"output_scanning": {"mode": mode}},
    )
    assert gw.pin("hx") == 0
    server = gw.build()
    async with Client(server.mcp) as client:
        result = wire(await client.call_tool_mcp("hx_links", {"text": GITHUB_TOKEN}))
    server.close()
    assert GITHUB_TOKEN not in json.dumps(result)
    if mode == "refuse":
        assert result["isError"] is True
        assert "OUTPUT_DENIED" in json.dumps(result)
    else:
        assert result["isError"] is False, result
        kinds = {b["type"] for b in result["content"]}
        assert kinds == {"text", "resource_link", "resource"}
