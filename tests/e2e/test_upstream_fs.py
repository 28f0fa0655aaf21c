"""A server nobody on the team wrote, mounted through the gateway end to end: the reference
filesystem MCP server (``@modelcontextprotocol/server-filesystem``, pinned in
``tests/clients``), classified by ``config/upstreams/fs.json`` as the README's worked
example has it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client

from .conftest import wire
from .node_clients import is_ci
from .upstream_harness import FS_SERVER, REPO, approve, envelope, make_gateway

EXAMPLE = REPO / "config" / "upstreams" / "example.yaml"
FS_REGISTRY = REPO / "config" / "upstreams" / "fs.json"
APPROVAL_SECRET = "approval-secret-for-fs-tests-0123456789abcdefgh"
TEXT = "Quarterly notes\nline two: ünïcode\n"


def node_and_server() -> str:
    node = shutil.which("node")
    if node is None or not FS_SERVER.is_file():
        if is_ci():
            pytest.fail("node and the pinned server-filesystem are required in CI (make clients)")
        pytest.skip("node or @modelcontextprotocol/server-filesystem missing: run make clients")
    return node


def example_upstream() -> dict[str, Any]:
    """The README's example entry, as written in ``config/upstreams/example.yaml``."""
    document = yaml.safe_load(EXAMPLE.read_text())
    (entry,) = document["upstreams"]
    return dict(entry)


def fs_gateway(tmp_path: Path, **changes: Any) -> Any:
    node = node_and_server()
    served = tmp_path / "served"
    served.mkdir()
    (served / "notes.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "outside.txt").write_text("OUTSIDE-CANARY")
    upstream = example_upstream()
    # The example runs npx; the test runs the very same package from tests/clients.
    upstream.update(command=node, args=[str(FS_SERVER), str(served)], **changes)
    gw = make_gateway(
        tmp_path / "gw",
        [upstream],
        grant={"full": [f"fs_{name}" for name in upstream["tools"]] + ["fs_move_file"]},
    )
    shutil.copy(FS_REGISTRY, gw.registry_dir / "fs.json")
    return gw, served


async def test_the_reference_filesystem_server_behind_the_gateway(tmp_path: Path) -> None:
    gw, served = fs_gateway(tmp_path)
    assert gw.check("fs") == 1  # nothing pinned yet
    assert gw.pin("fs") == 0
    assert (gw.registry_dir / "fs.lock.json").is_file()
    assert gw.check("fs") == 0
    server = gw.build(env={"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET})
    async with Client(server.mcp) as client:
        listed = {t.name for t in await client.list_tools() if t.name.startswith("fs_")}
        # Exactly the allowlisted tools: move_file is granted but not on the allowlist.
        assert listed == {f"fs_{name}" for name in example_upstream()["tools"]}

        read = await client.call_tool_mcp("fs_read_text_file", {"path": str(served / "notes.txt")})
        payload = wire(read)
        assert payload["content"][0]["text"] == TEXT
        effect = payload["_meta"]["nexus.mcp/tool_effect"]
        assert effect["server_id"] == "fs" and effect["tool_name"] == "read_text_file"
        (document,) = effect["document_hashes"]
        assert document["hash"] == hashlib.sha256(TEXT.encode("utf-8")).hexdigest()

        # The upstream's own refusal is its result, passed through as that tool's output.
        outside = await client.call_tool_mcp(
            "fs_read_text_file", {"path": str(tmp_path / "outside.txt")}
        )
        assert wire(outside)["isError"] is True
        assert "OUTSIDE-CANARY" not in json.dumps(wire(outside))

        moved = await client.call_tool_mcp(
            "fs_move_file", {"source": "a", "destination": "b", "idempotency_key": "k0"}
        )
        assert wire(moved)["content"][0]["text"] == "Unknown tool: 'fs_move_file'"

        target = served / "new.txt"
        arguments = {"path": str(target), "content": "new text", "idempotency_key": "k1"}
        unapproved = await client.call_tool_mcp("fs_write_file", arguments)
        assert envelope(unapproved)["code"] == "APPROVAL_REQUIRED"
        assert not target.exists()
        token = approve(server, "fs_write_file", arguments)
        written = await client.call_tool_mcp(
            "fs_write_file", {**arguments, "approval_token": token}
        )
        assert wire(written).get("isError") is False, wire(written)
        assert target.read_text() == "new text"
        (hashed,) = wire(written)["_meta"]["nexus.mcp/tool_effect"]["document_hashes"]
        assert hashed["hash"] == hashlib.sha256(b"new text").hexdigest()
    events = [e for e in gw.events("tool_call_finished") if e.get("server_id") == "fs"]
    assert {e["upstream_tool"] for e in events} >= {"read_text_file", "write_file"}


async def test_a_write_the_policy_does_not_list_is_denied_and_writes_nothing(
    tmp_path: Path,
) -> None:
    gw, served = fs_gateway(tmp_path, write_policy={"allowed_tools": ["edit_file"]})
    assert gw.pin("fs") == 0
    async with Client(gw.build().mcp) as client:
        target = served / "denied.txt"
        result = await client.call_tool_mcp(
            "fs_write_file", {"path": str(target), "content": "x", "idempotency_key": "k1"}
        )
        assert envelope(result)["code"] == "WRITE_POLICY_DENIED"
    assert not target.exists()
