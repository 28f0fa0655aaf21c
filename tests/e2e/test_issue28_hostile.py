"""Issue 28, hostile, end to end: secrets an upstream puts where output scanning did not
look (a resource link's URI, name, title and description; a content block's ``_meta``; an
embedded resource's URI and ``_meta``), in a native note read as a resource, or in an
upstream's progress message, never reach the client."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml
from fastmcp import Client
from mcp.shared.exceptions import MCPError

from nexus_mcp.policy.secret_scan import marker
from tests.unit.policy.test_secret_scan import GITHUB_TOKEN

from .conftest import wire
from .test_upstream_progress import Seen
from .test_upstream_progress import call as progress_call
from .test_upstream_progress import caller as progress_caller
from .test_upstream_progress import gateway as progress_gateway
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


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["redact", "refuse"])
async def test_a_progress_message_is_scanned_before_it_is_relayed(
    tmp_path: Path, mode: str
) -> None:
    # With forward.progress: messages, an upstream's progress text reached the caller
    # unscanned while the same text in its result was redacted or withheld.
    gw = progress_gateway(tmp_path, forward={"progress": "messages"})
    raw = yaml.safe_load(gw.config_file.read_text())
    raw["output_scanning"] = {"mode": mode}
    gw.config_file.write_text(yaml.safe_dump(raw))
    server = gw.build()
    seen = Seen()
    async with progress_caller(server, seen) as client:
        await progress_call(client, seen, steps=2, delay=0.15, message=f"got {GITHUB_TOKEN}")
    server.close()
    assert [p["progress"] for p in seen.progress] == [1.0, 2.0]
    assert GITHUB_TOKEN not in json.dumps(seen.progress, default=str)
    messages = [p.get("message") for p in seen.progress]
    if mode == "redact":
        assert messages == [f"got {marker('github_token')}"] * 2
    else:
        assert messages == [None, None]  # withheld: the numbers still go
