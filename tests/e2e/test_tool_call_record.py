"""The seed's ``tool_call`` record (seed 000, 9.2.2 rule 1) is built and validated per call.

The connector builds the record for every call it is about to run, native, upstream and
replayed alike, with the call's own ``tool_call_id``, and validates it against
``schemas/mcp/tool_call.schema.json``. A record the schema refuses stops the call before
the tool runs: ``TOOL_CALL_RECORD_INVALID`` naming the field, nothing echoed, audited.
The values here reach the record without any other layer judging them: a read tool's
``_meta`` idempotency key is not used by the idempotency layer, but it is the record's
``idempotency_key`` (1 to 256 characters).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastmcp import Client

from nexus_mcp.calls import CallState
from nexus_mcp.enforcement import ToolCallRecordCheck
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .conftest import DEMO_WORKSPACE, ServerFactory, wire
from .upstream_harness import REPO, envelope, make_gateway, read_record, stdio_upstream

CANARY = "CANARY-RECORD-3b7"
META_KEY = "nexus.mcp/idempotency_key"
EFFECT = "nexus.mcp/tool_effect"
CODE = "TOOL_CALL_RECORD_INVALID"
MESSAGE = "the tool call record is invalid at 'idempotency_key'"
RECORD_SCHEMA = json.loads((REPO / "schemas" / "mcp" / "tool_call.schema.json").read_text())
BAD_KEYS = {
    "too long": CANARY + "k" * 257,
    "empty": "",
    "far too long": CANARY * 2000,
}


def assert_refused(result: Any, records: list[dict[str, Any]], tool: str) -> None:
    assert envelope(result) == {"error": MESSAGE, "code": CODE}
    blocked = [r for r in records if r.get("outcome") == CODE]
    assert len(blocked) == 1 and blocked[0]["tool"] == tool
    assert blocked[0]["event"] == "tool_call_blocked"
    assert blocked[0]["facts"] == {"field": "idempotency_key", "rule": "maxLength"} or blocked[0][
        "facts"
    ] == {"field": "idempotency_key", "rule": "minLength"}
    # Refused before the tool: no started event for that call.
    started = [r for r in records if r["event"] == "tool_call_started"]
    assert blocked[0]["tool_call_id"] not in {r["tool_call_id"] for r in started}
    assert CANARY not in json.dumps(wire(result)) + json.dumps(records)


@pytest.mark.parametrize("key", BAD_KEYS.values(), ids=BAD_KEYS.keys())
async def test_a_native_call_whose_record_breaks_the_schema_never_runs(
    make_server: ServerFactory, audit: MemoryAuditSink, key: str
) -> None:
    server = make_server()
    async with Client(server.mcp) as client:
        result = await client.call_tool_mcp(
            "nexus_read_file", {"path": "todo.txt"}, meta={META_KEY: key}
        )
    assert_refused(result, audit.records(), "nexus_read_file")


async def test_a_valid_record_carries_the_calls_id_like_its_audit_and_effect(
    make_server: ServerFactory, audit: MemoryAuditSink
) -> None:
    server = make_server()
    async with Client(server.mcp) as client:
        result = wire(
            await client.call_tool_mcp(
                "nexus_read_file", {"path": "todo.txt"}, meta={META_KEY: "k" * 256}
            )
        )
    assert result["isError"] is False
    finished = [r for r in audit.records() if r["event"] == "tool_call_finished"]
    assert finished[-1]["tool_call_id"] == result["_meta"][EFFECT]["tool_call_id"]

    # The record the connector builds for a call: schema-valid, the call's own id, the
    # audit's argument digest, the caller's key and expected hashes.
    (check,) = [c for c in server.runtime.connector.checks if isinstance(c, ToolCallRecordCheck)]
    state = CallState(
        tool_name="nexus_write_file",
        arguments={"path": "a.txt", "content": "x", "idempotency_key": "key-1"},
        meta={"nexus.mcp/expected_document_hashes": [{"pointer": "/content", "hash": "a" * 64}]},
        transport=None,
    )
    record = check.record(state)
    jsonschema.validate(record, RECORD_SCHEMA)
    assert record["tool_call_id"] == state.tool_call_id
    assert record["args_digest"] == state.args_digest
    assert (record["server_id"], record["tool_name"]) == ("nexus", "nexus_write_file")
    assert record["idempotency_key"] == "key-1"
    assert record["expected_document_hashes"] == [{"pointer": "/content", "hash": "a" * 64}]
    check.before(None, state, state.arguments)  # type: ignore[arg-type]
    assert state.tool_call_record == record


async def test_an_upstream_call_whose_record_breaks_the_schema_never_reaches_the_upstream(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record.jsonl"
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(record=record)],
        mode="prod",
        grant={"full": ["up_echo"]},
    )
    assert gw.pin("up") == 0
    server = gw.build()
    try:
        async with Client(server.mcp) as client:
            refused = await client.call_tool_mcp(
                "up_echo", {"text": "hi"}, meta={META_KEY: BAD_KEYS["too long"]}
            )
            passed = wire(await client.call_tool_mcp("up_echo", {"text": "hi"}))
    finally:
        server.close()
    assert_refused(refused, gw.events(), "up_echo")
    assert passed["isError"] is False
    calls = [r for r in read_record(record) if r["method"] == "tools/call"]
    assert len(calls) == 1  # only the valid call reached the upstream


async def test_a_replayed_call_whose_record_breaks_the_schema_is_refused_as_a_live_one(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    shutil.copytree(DEMO_WORKSPACE, workspace)
    fixtures = tmp_path / "fixtures"
    live = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "d1", record=fixtures),
        audit_sinks=[MemoryAuditSink()],
    )
    try:
        async with Client(live.mcp) as client:
            await client.call_tool_mcp("nexus_list_files", {"path": "."})
    finally:
        live.close()
    audit = MemoryAuditSink()
    replay: NexusServer = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "d2", replay=fixtures),
        audit_sinks=[audit],
    )
    try:
        async with Client(replay.mcp) as client:
            refused = await client.call_tool_mcp(
                "nexus_list_files", {"path": "."}, meta={META_KEY: BAD_KEYS["empty"]}
            )
            answered = wire(await client.call_tool_mcp("nexus_list_files", {"path": "."}))
    finally:
        replay.close()
    assert_refused(refused, audit.records(), "nexus_list_files")
    assert answered["isError"] is False
