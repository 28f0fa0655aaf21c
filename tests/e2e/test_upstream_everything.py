"""The MCP reference test server (``@modelcontextprotocol/server-everything``, pinned in
``tests/clients``) through the gateway as a real upstream process, classified by
``config/upstreams/everything.json``. It registers tools after the handshake and says so
with ``notifications/tools/list_changed``; it dumps its whole environment on request; it
has tools that change what it sends every session and one that fetches any URL: each is
a thing a gateway must handle as it says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from .conftest import wire
from .upstream_harness import (
    Gateway,
    approve,
    copy_registry,
    envelope,
    everything_upstream,
    make_gateway,
)

APPROVAL_SECRET = "approval-secret-for-everything-tests-0123456789"
CANARY = "EVERYTHING-GATEWAY-CANARY-0123456789"
READS = ["echo", "get-sum", "get-env", "trigger-long-running-operation", "simulate-research-query"]
WRITES = ["toggle-simulated-logging", "gzip-file-as-resource"]


def everything_gateway(tmp_path: Path, **changes: Any) -> Gateway:
    upstream = everything_upstream(
        tools=READS + WRITES,
        write_policy={"allowed_tools": ["toggle-simulated-logging"], "require_approval": True},
        **changes,
    )
    grant = [f"everything_{name}" for name in READS + WRITES] + ["everything_get-tiny-image"]
    gw = make_gateway(tmp_path / "gw", [upstream], grant={"full": grant})
    copy_registry(gw, "everything")
    return gw


def text(result: Any) -> str:
    payload = wire(result)
    assert payload.get("isError") is False, payload
    value: str = payload["content"][0]["text"]
    return value


async def test_the_reference_test_server_behind_the_gateway(tmp_path: Path) -> None:
    gw = everything_gateway(tmp_path)
    assert gw.check("everything") == 1  # nothing pinned yet
    assert gw.pin("everything") == 0
    # Every allowed tool, the one registered after the handshake included, is pinned.
    pins = json.loads((gw.registry_dir / "everything.lock.json").read_text())["tools"]
    assert set(pins) == set(READS + WRITES)
    assert gw.check("everything") == 0
    server = gw.build()
    async with Client(server.mcp) as client:
        wanted = {f"everything_{name}" for name in READS + WRITES}
        names = {t.name for t in await client.list_tools() if t.name.startswith("everything_")}
        # Granted but not on the allowlist: get-tiny-image is not exposed.
        assert names == wanted, names ^ wanted

        echo = await client.call_tool_mcp("everything_echo", {"message": "hi ünïcode"})
        assert text(echo) == "Echo: hi ünïcode"
        effect = wire(echo)["_meta"]["nexus.mcp/tool_effect"]
        assert (effect["server_id"], effect["tool_name"], effect["tool_class"]) == (
            "everything",
            "echo",
            "read",
        )
        added = await client.call_tool_mcp("everything_get-sum", {"a": 2, "b": 3.5})
        assert text(added) == "The sum of 2 and 3.5 is 5.5."
        # Arguments its schema refuses: the upstream's own validation error, as its result.
        bad = await client.call_tool_mcp("everything_get-sum", {"a": "2", "b": 3})
        assert wire(bad)["isError"] is True

        # A long operation sends progress when the caller asks, in steps: each step
        # reaches the caller through the gateway (issue 27), and the call completes.
        steps: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            steps.append((progress, total, message))

        slow = await client.call_tool_mcp(
            "everything_trigger-long-running-operation",
            {"duration": 0.75, "steps": 3},
            progress_handler=on_progress,
        )
        assert text(slow) == "Long running operation completed. Duration: 0.75 seconds, Steps: 3."
        assert steps == [(1.0, 3.0, None), (2.0, 3.0, None), (3.0, 3.0, None)]

        hidden = await client.call_tool_mcp("everything_get-tiny-image", {})
        assert wire(hidden)["content"][0]["text"] == "Unknown tool: 'everything_get-tiny-image'"
    finished = [e for e in gw.events("tool_call_finished") if e.get("server_id") == "everything"]
    assert {e["upstream_tool"] for e in finished} >= {"echo", "get-sum"}
    # Its list_changed after the handshake changed nothing pinned: nothing quarantined.
    events = {e.get("event") for e in gw.events()}
    assert not events & {"tool_definition_changed", "tool_unpinned", "upstream_tool_invalid"}


async def test_its_environment_holds_nothing_of_the_gateways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get-env prints the upstream's whole environment: only what its configuration
    gives (and the SDK's small default set), none of the gateway's secrets."""
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_SECRET", CANARY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    gw = everything_gateway(tmp_path, env={"GIVEN": "given-value"})
    assert gw.pin("everything") == 0
    async with Client(gw.build().mcp) as client:
        env = json.loads(text(await client.call_tool_mcp("everything_get-env", {})))
    assert env["GIVEN"] == "given-value"
    assert CANARY not in json.dumps(env)
    assert not {"NEXUS_MCP_APPROVAL_SECRET", "AWS_SECRET_ACCESS_KEY"} & set(env)


async def test_its_writes_take_the_write_path(tmp_path: Path) -> None:
    gw = everything_gateway(tmp_path)
    assert gw.pin("everything") == 0
    server = gw.build(env={"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET})
    async with Client(server.mcp) as client:
        # A fetch of any URL the caller names: a write the policy does not list, denied.
        fetch = {"data": "http://169.254.169.254/latest/meta-data/", "idempotency_key": "g-1"}
        denied = await client.call_tool_mcp("everything_gzip-file-as-resource", fetch)
        assert envelope(denied)["code"] == "WRITE_POLICY_DENIED"

        toggle = {"idempotency_key": "t-1"}
        unapproved = await client.call_tool_mcp("everything_toggle-simulated-logging", toggle)
        assert envelope(unapproved)["code"] == "APPROVAL_REQUIRED"
        token = approve(server, "everything_toggle-simulated-logging", toggle)
        started = await client.call_tool_mcp(
            "everything_toggle-simulated-logging", {**toggle, "approval_token": token}
        )
        assert text(started).startswith("Started simulated, random-leveled logging")
        assert wire(started)["_meta"]["nexus.mcp/tool_effect"]["tool_class"] == "write"
        again = {"idempotency_key": "t-2"}
        token = approve(server, "everything_toggle-simulated-logging", again)
        stopped = await client.call_tool_mcp(
            "everything_toggle-simulated-logging", {**again, "approval_token": token}
        )
        assert text(stopped).startswith("Stopped simulated logging")
    calls = [e for e in gw.events("tool_call_finished") if e.get("server_id") == "everything"]
    assert [e["upstream_tool"] for e in calls] == ["toggle-simulated-logging"] * 2


async def test_its_prompts_resources_and_templates_through_the_chain(tmp_path: Path) -> None:
    """Issue 27: the reference server's prompts, static resources and templates, pinned
    by ``upstream pin`` beside its tools, granted by a profile, read and rendered through
    the gateway under their exposed names, each content hashed."""
    import hashlib

    upstream = everything_upstream(tools=READS)
    grant = [f"everything_{name}" for name in READS]
    prompts = ["everything_simple-prompt", "everything_args-prompt"]
    gw = make_gateway(
        tmp_path / "gw",
        [upstream],
        grant={"full": grant},
        grant_items={"full": {"resources": ["everything"], "prompts": prompts}},
    )
    copy_registry(gw, "everything")
    assert gw.pin("everything") == 0
    lock = json.loads((gw.registry_dir / "everything.lock.json").read_text())
    assert lock["schema_version"] == "v2"
    assert {"simple-prompt", "args-prompt"} <= set(lock["prompts"])
    assert "demo://resource/dynamic/text/{resourceId}" in lock["resource_templates"]
    server = gw.build()
    async with Client(server.mcp) as client:
        listed = {p.name for p in await client.list_prompts()}
        # Pinned but not granted: completable-prompt is not shown.
        assert listed == set(prompts), listed
        args = await client.get_prompt("everything_args-prompt", {"city": "Oslo"})
        assert "Oslo" in json.dumps([m.content.model_dump() for m in args.messages])
        uris = {str(r.uri) for r in await client.list_resources()}
        doc = "upstream://everything/demo://resource/static/document/architecture.md"
        assert doc in uris
        contents = await client.read_resource(doc)
        body = contents[0].text.encode()  # type: ignore[union-attr]
        assert (contents[0].meta or {})["nexus/sha256"] == hashlib.sha256(body).hexdigest()
        templates = {t.uri_template for t in await client.list_resource_templates()}
        assert "upstream://everything/demo://resource/dynamic/text/{resourceId}" in templates
        dynamic = await client.read_resource("upstream://everything/demo://resource/dynamic/text/7")
        assert dynamic and (dynamic[0].meta or {}).get("nexus/sha256")
        blob = await client.read_resource("upstream://everything/demo://resource/dynamic/blob/7")
        assert blob and (blob[0].meta or {}).get("nexus/sha256")
    reads = gw.events("resource_read_finished")
    assert reads and all(e.get("resource_source") == "everything" for e in reads)
    assert all("architecture" not in json.dumps(e) for e in reads)
