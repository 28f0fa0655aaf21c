"""Issue 28, hostile, end to end: secrets an upstream puts where output scanning did not
look (a resource link's URI, name, title and description; a content block's ``_meta``; an
embedded resource's URI and ``_meta``), or in a native note read as a resource, never reach
the client."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

from nexus_mcp.policy.secret_scan import marker
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


@pytest.mark.parametrize("mode", ["redact", "refuse"])
async def test_a_note_read_as_a_resource_is_scanned_like_the_notes_tools(
    tmp_path: Path, mode: str
) -> None:
    # get_section_source of this note was redacted or refused; resources/read of the same
    # note handed the token over as it was.
    gw = make_gateway(
        tmp_path / "gw",
        [],
        grant_items={"full": {"resources": ["notes"]}},
        extra={"output_scanning": {"mode": mode}},
    )
    note = gw.workspace / "notes" / "ops.md"
    note.parent.mkdir(parents=True)
    note.write_text(f"---\ntitle: Ops\n---\n# Ops\ntoken {GITHUB_TOKEN}\n", encoding="utf-8")
    server = gw.build()
    async with Client(server.mcp) as client:
        if mode == "refuse":
            with pytest.raises(MCPError) as caught:
                await client.read_resource("nexus://notes/notes/ops.md")
            payload = json.loads(str(caught.value))
            assert payload == {
                "error": "result withheld: it holds a secret (github_token)",
                "code": "OUTPUT_DENIED",
            }
            text = str(caught.value)
        else:
            (content,) = await client.read_resource("nexus://notes/notes/ops.md")
            delivered = getattr(content, "text", "")
            assert marker("github_token") in delivered
            meta = content.meta or {}
            assert meta["nexus/sha256"] == hashlib.sha256(delivered.encode()).hexdigest()
            text = json.dumps(content.model_dump(mode="json"))
    server.close()
    assert GITHUB_TOKEN not in text
    assert GITHUB_TOKEN not in json.dumps(gw.events())
