"""Upstream MCP servers behind the chain: classified, pinned, granted, audited, contained.

Every test mounts the recording test server (``tests/support/upstream_server.py``) as a
real stdio subprocess and talks to nexus through FastMCP's in-memory client, as a caller
would; what reached the upstream is read back from its own record.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fastmcp import Client

from nexus_mcp.errors import ConfigError
from nexus_mcp.server import NexusServer

from .conftest import wire
from .upstream_harness import (
    REPO,
    UP_TOOLS,
    Gateway,
    all_up_tools,
    approve,
    envelope,
    make_gateway,
    poll,
    read_record,
    stdio_upstream,
)

SECRET_TEXT = "SECRET-UPSTREAM-TEXT"
APPROVAL_SECRET = "approval-secret-for-upstream-tests-0123456789abcdef"
EFFECT = "nexus.mcp/tool_effect"
EFFECT_SCHEMA = json.loads((REPO / "schemas" / "mcp" / "tool_effect.schema.json").read_text())
WRITE_POLICY = {"allowed_tools": ["write_note", "remember"], "require_approval": False}


def calls_to(record: Path, tool: str) -> list[dict[str, Any]]:
    return [r for r in read_record(record) if r["method"] == "tools/call" and r["tool"] == tool]


def gateway(tmp_path: Path, *, pin: bool = True, **upstream: Any) -> tuple[Gateway, Path]:
    record = tmp_path / "record.jsonl"
    options = {"write_policy": WRITE_POLICY, **upstream}
    registries = options.pop("registries", None)
    documents = options.pop("documents", None)
    mode = options.pop("mode", "prod")
    extra = options.pop("extra", None)
    grant = options.pop("grant", {"full": all_up_tools()})
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(record=record, **options)],
        mode=mode,
        registries=registries,
        documents=documents,
        grant=grant,
        extra=extra,
    )
    if pin:
        assert gw.pin("up") == 0
    return gw, record


def build(gw: Gateway, **overrides: Any) -> NexusServer:
    return gw.build(env={"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET}, **overrides)


async def names(client: Client[Any]) -> set[str]:
    return {tool.name for tool in await client.list_tools()}


def unknown_like(result: Any, name: str, other: Any, other_name: str) -> None:
    """Both answers are byte for byte the same once the names are swapped."""
    left = json.dumps(wire(result), sort_keys=True).replace(name, "<tool>")
    right = json.dumps(wire(other), sort_keys=True).replace(other_name, "<tool>")
    assert left == right


# -- pinning and classification -------------------------------------------------------


async def test_unpinned_tools_are_quarantined_hidden_and_answer_as_unknown(
    tmp_path: Path,
) -> None:
    gw, record = gateway(tmp_path, pin=False)
    server = build(gw)
    async with Client(server.mcp) as client:
        listed = await names(client)
        assert not {n for n in listed if n.startswith("up_")}
        hidden = await client.call_tool_mcp("up_echo", {"text": "hi"})
        missing = await client.call_tool_mcp("up_nothing_here", {"text": "hi"})
        unknown_like(hidden, "up_echo", missing, "up_nothing_here")
    assert calls_to(record, "echo") == []
    unpinned = {e["tool"]: e for e in gw.events("tool_unpinned")}
    assert set(unpinned) == set(UP_TOOLS)
    assert len(unpinned["echo"]["seen_sha256"]) == 64
    assert "pinned_sha256" not in unpinned["echo"]
    summary = server.runtime.upstreams.summary()["up"] if server.runtime.upstreams else {}
    assert {q["tool"] for q in summary["quarantined"]} == set(UP_TOOLS)
    assert summary["tools"] == []
    assert gw.check("up") == 1
    assert gw.pin("up") == 0
    assert gw.check("up") == 0
    async with Client(build(gw).mcp) as client:
        assert set(all_up_tools()) <= await names(client)


async def test_a_pinned_read_goes_through_every_layer(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path)
    server = build(gw)
    async with Client(server.mcp) as client:
        result = await client.call_tool_mcp(
            "up_echo", {"text": "hello"}, meta={"nexus.mcp/correlation_id": "corr-123"}
        )
    payload = wire(result)
    assert payload.get("isError") is False
    assert payload["structuredContent"] == {"text": "hello"}
    effect = payload["_meta"][EFFECT]
    jsonschema.validate(effect, EFFECT_SCHEMA)
    assert (effect["server_id"], effect["tool_name"], effect["tool_class"]) == (
        "up",
        "echo",
        "read",
    )
    (finished,) = [e for e in gw.events("tool_call_finished") if e["tool"] == "up_echo"]
    assert finished["server_id"] == "up"
    assert finished["upstream_tool"] == "echo"
    assert finished["correlation_id"] == "corr-123"
    assert finished["outcome"] == "OK"
    assert finished["effect_id"] == effect["effect_id"]
    (call,) = calls_to(record, "echo")
    assert call["arguments"] == {"text": "hello"}
    # Nothing of the caller's _meta travels upstream.
    assert "corr-123" not in json.dumps(call)


async def test_a_changed_definition_at_connect_is_quarantined(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path)
    # The same server, now describing echo differently: a rug pull between two runs.
    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["args"] += ["--variant", "evil"]
    gw.config_file.write_text(yaml.safe_dump(config))
    server = build(gw)
    async with Client(server.mcp) as client:
        listed = await names(client)
        assert "up_echo" not in listed
        assert "up_add" in listed
        result = await client.call_tool_mcp("up_echo", {"text": "x"})
        assert wire(result)["content"][0]["text"] == "Unknown tool: 'up_echo'"
    (changed,) = gw.events("tool_definition_changed")
    assert changed["tool"] == "echo"
    assert changed["server_id"] == "up"
    assert changed["pinned_sha256"] != changed["seen_sha256"]
    assert gw.check("up") == 1


async def test_a_definition_changed_at_run_time_is_quarantined_for_everyone(
    tmp_path: Path,
) -> None:
    gw, record = gateway(tmp_path)
    server = build(gw)
    upstreams = server.runtime.upstreams
    assert upstreams is not None
    async with Client(server.mcp) as client:
        assert not (await client.call_tool_mcp("up_echo", {"text": "a"})).is_error
        assert not (await client.call_tool_mcp("up_mutate", {})).is_error
        await poll(
            lambda: any(q["tool"] == "echo" for q in upstreams.summary()["up"]["quarantined"])
        )
        assert "up_echo" not in await names(client)
        after = await client.call_tool_mcp("up_echo", {"text": "b"})
        assert wire(after)["content"][0]["text"] == "Unknown tool: 'up_echo'"
    assert [c["arguments"] for c in calls_to(record, "echo")] == [{"text": "a"}]
    assert gw.events("tool_definition_changed")


async def test_unclassified_tools_are_hidden_in_prod_and_writes_in_dev(tmp_path: Path) -> None:
    registry = {k: v for k, v in UP_TOOLS.items() if k != "add"}
    gw, record = gateway(tmp_path, registries={"up": registry})
    async with Client(build(gw).mcp) as client:
        assert "up_add" not in await names(client)
        result = await client.call_tool_mcp("up_add", {"a": 1, "b": 2})
        assert wire(result)["content"][0]["text"] == "Unknown tool: 'up_add'"
    assert calls_to(record, "add") == []

    dev, dev_record = gateway(
        tmp_path / "dev", registries={"up": registry}, mode="dev", write_policy=None
    )
    async with Client(build(dev).mcp) as client:
        assert "up_add" in await names(client)
        # Its annotations say read-only; only a registry can say so: it is a write here.
        refused = await client.call_tool_mcp("up_add", {"a": 1, "b": 2})
        assert envelope(refused)["code"] == "IDEMPOTENCY_KEY_REQUIRED"
        ran = await client.call_tool_mcp("up_add", {"a": 1, "b": 2, "idempotency_key": "k"})
        assert wire(ran).get("structuredContent") == {"sum": 3}, wire(ran)
    (call,) = calls_to(dev_record, "add")
    assert call["arguments"] == {"a": 1, "b": 2}  # the key stays in nexus


async def test_the_allowlist_never_exposes_another_tool(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path, tools=["echo"])
    async with Client(build(gw).mcp) as client:
        listed = {n for n in await names(client) if n.startswith("up_")}
        assert listed == {"up_echo"}
        result = await client.call_tool_mcp("up_add", {"a": 1, "b": 2})
        assert wire(result)["content"][0]["text"] == "Unknown tool: 'up_add'"
    assert calls_to(record, "add") == []


async def test_grants_decide_who_sees_an_upstream_tool(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path, grant={"full": ["up_echo", "up_write_note"]})
    async with Client(build(gw).mcp) as client:
        assert {n for n in await names(client) if n.startswith("up_")} == {
            "up_echo",
            "up_write_note",
        }
        hidden = await client.call_tool_mcp("up_add", {"a": 1, "b": 2})
        missing = await client.call_tool_mcp("up_subtract", {"a": 1, "b": 2})
        unknown_like(hidden, "up_add", missing, "up_subtract")
    async with Client(build(gw, read_only=True).mcp) as client:
        visible = {n for n in await names(client) if n.startswith("up_")}
        assert visible == {"up_echo"}  # a read-only caller never sees a write tool
        refused = await client.call_tool_mcp(
            "up_write_note", {"title": "t", "body": "b", "idempotency_key": "k"}
        )
        assert wire(refused)["content"][0]["text"] == "Unknown tool: 'up_write_note'"
    assert calls_to(record, "add") == [] and calls_to(record, "write_note") == []


# -- writes: policy, approval, idempotency, documents ---------------------------------


async def test_writes_are_denied_without_a_policy_in_prod(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path, write_policy=None)
    async with Client(build(gw).mcp) as client:
        result = await client.call_tool_mcp(
            "up_write_note", {"title": "t", "body": "b", "idempotency_key": "k1"}
        )
        assert envelope(result)["code"] == "WRITE_POLICY_DENIED"
    assert calls_to(record, "write_note") == []
    (blocked,) = [e for e in gw.events("tool_call_blocked") if e["tool"] == "up_write_note"]
    assert blocked["policy_rule"] == "upstream_no_policy"


async def test_an_approved_write_runs_once_and_replays_without_the_upstream(
    tmp_path: Path,
) -> None:
    policy = {"allowed_tools": ["write_note"], "require_approval": True}
    gw, record = gateway(tmp_path, write_policy=policy)
    server = build(gw)
    arguments = {"title": "t", "body": "b", "idempotency_key": "k1"}
    async with Client(server.mcp) as client:
        refused = await client.call_tool_mcp("up_write_note", arguments)
        assert envelope(refused)["code"] == "APPROVAL_REQUIRED"
        assert calls_to(record, "write_note") == []
        token = approve(server, "up_write_note", arguments)
        approved = {**arguments, "approval_token": token}
        first = await client.call_tool_mcp("up_write_note", approved)
        assert wire(first)["structuredContent"] == {"count": 1}
        again = await client.call_tool_mcp("up_write_note", approved)
        assert wire(again)["structuredContent"] == {"count": 1}
        assert wire(again)["_meta"]["nexus.mcp/idempotent_replay"] is True
        conflict = await client.call_tool_mcp("up_write_note", {**approved, "body": "other"})
        assert envelope(conflict)["code"] == "IDEMPOTENCY_KEY_CONFLICT"
        count = await client.call_tool_mcp("up_count_writes", {})
        assert wire(count)["structuredContent"] == {"count": 1}
    (call,) = calls_to(record, "write_note")
    assert call["arguments"] == {"title": "t", "body": "b"}  # no key, no token upstream
    (finished,) = [
        e
        for e in gw.events("tool_call_finished")
        if e["tool"] == "up_write_note" and e.get("idempotency") == "executed"
    ]
    assert finished["approver"] == "bob"
    assert finished["side_effects"] is True


async def test_documents_are_checked_before_the_upstream_is_called(tmp_path: Path) -> None:
    documents = {
        "up": {
            "write_note": {
                "content_encoding": "utf8",
                "write_content_pointers": ["/body"],
                "max_write_bytes": 16,
            },
            "echo": {
                "content_encoding": "utf8",
                "read_content_pointers": ["/structuredContent/text"],
            },
        }
    }
    gw, record = gateway(tmp_path, documents=documents)
    async with Client(build(gw).mcp) as client:
        big = await client.call_tool_mcp(
            "up_write_note", {"title": "t", "body": "x" * 17, "idempotency_key": "k1"}
        )
        assert envelope(big)["code"] == "DOC_SIZE_EXCEEDED"
        wrong = await client.call_tool_mcp(
            "up_write_note",
            {"title": "t", "body": "short", "idempotency_key": "k2"},
            meta={"nexus.mcp/expected_document_hashes": [{"pointer": "/body", "hash": "0" * 64}]},
        )
        assert envelope(wrong)["code"] == "DOC_HASH_MISMATCH"
        assert calls_to(record, "write_note") == []
        read = await client.call_tool_mcp("up_echo", {"text": "hashed text"})
    (document,) = wire(read)["_meta"][EFFECT]["document_hashes"]
    assert document["pointer"] == "/structuredContent/text"
    assert document["hash"] == hashlib.sha256(b"hashed text").hexdigest()


# -- results and failures -------------------------------------------------------------


async def test_an_upstream_error_result_is_the_tools_result(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        result = await client.call_tool_mcp("up_fail_tool", {})
    payload = wire(result)
    assert payload["isError"] is True
    assert "structuredContent" not in payload
    assert payload["content"][0]["text"] == f"upstream says no {SECRET_TEXT}"
    (finished,) = [e for e in gw.events("tool_call_finished") if e["tool"] == "up_fail_tool"]
    assert finished["outcome"] == "TOOL_ERROR"


async def test_jsonrpc_errors_and_oversized_results_are_upstream_errors_that_echo_nothing(
    tmp_path: Path,
) -> None:
    gw, _record = gateway(tmp_path)
    async with Client(build(gw, limits={"max_read_bytes": 100_000}).mcp) as client:
        rpc = await client.call_tool_mcp("up_rpc_error", {})
        huge = await client.call_tool_mcp("up_huge", {"n": 200_000})
        fine = await client.call_tool_mcp("up_huge", {"n": 10})
    assert envelope(rpc) == {"error": "Upstream error", "code": "UPSTREAM_ERROR"}
    assert envelope(huge) == {"error": "Upstream error", "code": "UPSTREAM_ERROR"}
    assert wire(fine)["structuredContent"] == {"data": "x" * 10}
    everything = json.dumps([wire(rpc), wire(huge), gw.events()])
    assert SECRET_TEXT not in everything
    assert "x" * 1000 not in everything


async def test_a_crash_mid_call_is_unavailable_and_the_next_call_gets_a_new_process(
    tmp_path: Path,
) -> None:
    gw, record = gateway(tmp_path, retry={"attempts": 1})
    async with Client(build(gw).mcp) as client:
        first = await client.call_tool_mcp("up_echo", {"text": "before"})
        crashed = await client.call_tool_mcp("up_crash", {})
        assert envelope(crashed) == {"error": "Upstream unavailable", "code": "UPSTREAM_ERROR"}
        after = await client.call_tool_mcp("up_echo", {"text": "after"})
    assert wire(first)["structuredContent"] == {"text": "before"}
    assert wire(after)["structuredContent"] == {"text": "after"}
    pids = [c["pid"] for c in calls_to(record, "echo")]
    assert len(set(pids)) == 2


async def test_the_tool_timeout_cancels_the_call_upstream(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path)
    server = build(gw, budgets={"tool_timeouts": {"up_slow": 1.0}})
    async with Client(server.mcp) as client:
        # The caller's upstream session is up first: the deadline is for the call itself.
        assert not (await client.call_tool_mcp("up_echo", {"text": "warm"})).is_error
        result = await client.call_tool_mcp("up_slow", {"seconds": 10})
        assert envelope(result)["code"] == "TOOL_TIMEOUT"
        # Still connected: the upstream got notifications/cancelled and stopped the call
        # (not a shutdown that would stop it anyway).
        await poll(lambda: any(r["method"] == "cancelled" for r in read_record(record)))
    methods = [r["method"] for r in read_record(record)]
    assert "notifications/cancelled" in methods


async def test_the_upstream_call_timeout_is_an_upstream_timeout(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path, timeouts={"call_seconds": 0.5})
    async with Client(build(gw).mcp) as client:
        result = await client.call_tool_mcp("up_slow", {"seconds": 5})
    assert envelope(result) == {"error": "Upstream timeout", "code": "UPSTREAM_ERROR"}


async def test_a_dead_upstream_blocks_neither_native_tools_nor_the_list(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path, pin=False, command="/nonexistent/bin/upstream", mode="dev")
    server = build(gw)
    async with Client(server.mcp) as client:
        started = time.monotonic()
        listed = await names(client)
        native = await client.call_tool_mcp("nexus_list_files", {"path": "."})
        assert time.monotonic() - started < 5
    assert "nexus_list_files" in listed
    assert not native.is_error
    upstreams = server.runtime.upstreams
    assert upstreams is not None
    assert upstreams.summary()["up"]["state"] == "degraded"
    assert gw.events("upstream_down")


async def test_discovery_names_an_upstream_only_to_callers_who_see_its_tools(
    tmp_path: Path,
) -> None:
    gw, _record = gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        servers = await client.call_tool_mcp("nexus_discovery_list_servers", {})
        by_id = {s["server_id"]: s for s in wire(servers)["structuredContent"]["servers"]}
        assert by_id["up"]["tool_count"] == len(UP_TOOLS)
        found = await client.call_tool_mcp("nexus_discovery_search_tools", {"query": "echo"})
        assert "up_echo" in json.dumps(wire(found)["structuredContent"])
    hidden, _ = gateway(tmp_path / "hidden", grant={"full": []})
    async with Client(build(hidden).mcp) as client:
        servers = await client.call_tool_mcp("nexus_discovery_list_servers", {})
        ids = {s["server_id"] for s in wire(servers)["structuredContent"]["servers"]}
        assert "up" not in ids


# -- start-up -------------------------------------------------------------------------


def test_prod_refuses_an_upstream_without_a_registry(tmp_path: Path) -> None:
    gw, _ = gateway(tmp_path, pin=False)
    (gw.registry_dir / "up.json").unlink()
    with pytest.raises(ConfigError, match="no registry file"):
        build(gw)


def test_a_prefix_that_could_shadow_a_native_tool_stops_start_up(tmp_path: Path) -> None:
    gw, _ = gateway(tmp_path, pin=False, prefix="nexus_")
    with pytest.raises(ConfigError, match="shadow native tools"):
        build(gw)


def test_an_inline_credential_stops_a_prod_start_up_without_showing_it(tmp_path: Path) -> None:
    token = "sk-inline-CANARY-41"
    gw = make_gateway(
        tmp_path,
        [
            {
                "server_id": "web",
                "transport": "http",
                "url": "http://127.0.0.1:9/mcp",
                "credentials": {"type": "bearer", "token": token},
            }
        ],
    )
    with pytest.raises(ConfigError) as caught:
        build(gw)
    assert "inline secrets are refused in prod" in str(caught.value)
    assert token not in str(caught.value)


async def test_arguments_the_pinned_schema_refuses_never_reach_the_upstream(
    tmp_path: Path,
) -> None:
    gw, record = gateway(tmp_path)
    async with Client(build(gw).mcp) as client:
        wrong_type = await client.call_tool_mcp("up_add", {"a": "VALUE-CANARY", "b": 2})
        missing = await client.call_tool_mcp("up_add", {"a": 1})
        extra = await client.call_tool_mcp("up_echo", {"text": "x", "other-CANARY": 1})
        fine = await client.call_tool_mcp("up_add", {"a": 1, "b": 2})
    assert envelope(wrong_type) == {
        "error": "argument 'a' should be a whole number",
        "code": "INVALID_INPUT",
    }
    assert envelope(missing)["code"] == "INVALID_INPUT"
    assert "CANARY" not in json.dumps([wire(wrong_type), wire(extra), gw.events()])
    assert wire(fine)["structuredContent"] == {"sum": 3}
    assert [c["arguments"] for c in calls_to(record, "add")] == [{"a": 1, "b": 2}]


async def test_concurrent_first_calls_of_one_caller_open_one_upstream_session(
    tmp_path: Path,
) -> None:
    gw, record = gateway(tmp_path)
    server = build(gw)
    upstreams = server.runtime.upstreams
    assert upstreams is not None
    async with Client(server.mcp) as client:
        results = await asyncio.gather(
            *(client.call_tool_mcp("up_echo", {"text": f"t{i}"}) for i in range(30))
        )
        # Still connected: the session lives on (the server's lifespan closes it at exit).
        assert upstreams.servers["up"].session_count() == 1
    assert [wire(r)["structuredContent"] for r in results] == [{"text": f"t{i}"} for i in range(30)]
    pids = {c["pid"] for c in calls_to(record, "echo")}
    assert len(pids) == 1
