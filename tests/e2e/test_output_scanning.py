"""Issue 28, output secret scanning, end to end: planted secrets in workspace files, notes,
repository blobs and upstream results never reach the client when policy redacts or
refuses; audit mode lets them pass and records them; the audit file never holds one; a
refusal echoes nothing; ordinary content is not touched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from mcp.shared.exceptions import MCPError

from nexus_mcp.observability.audit import TOOL_CALL_FINISHED, JsonlAuditSink, MemoryAuditSink
from nexus_mcp.policy.secret_scan import marker
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from tests.support.git_repos import make_repo
from tests.unit.policy.test_secret_scan import (
    AWS_KEY,
    GITHUB_TOKEN,
    HIGH_ENTROPY,
    PEM,
    SHA256,
    SLACK_TOKEN,
)

from .conftest import wire
from .upstream_harness import envelope, make_gateway, stdio_upstream

EFFECT = "nexus.mcp/tool_effect"
PLANTED = (AWS_KEY, GITHUB_TOKEN, SLACK_TOKEN, HIGH_ENTROPY, "MIIEpAIBAAKCAQEA", "q8ZkT2vL9xR4")
KINDS = {
    "aws_access_key": 1,
    "base64_high_entropy_string": 1,
    "github_token": 1,
    "private_key": 1,
    "slack_token": 1,
}
LEAKY = (
    "# deploy notes\n"
    f"aws_access_key_id = {AWS_KEY}\n"
    f"export GITHUB_TOKEN={GITHUB_TOKEN}\n"
    f'slack = "{SLACK_TOKEN}"\n'
    f'signing_secret = "{HIGH_ENTROPY}"\n'
    f"{PEM}\n"
    "the end\n"
)
ORDINARY = (
    "# Release checklist\n\n"
    f"- commit 3f786850e387550fdab836ed7e6dc881de23001b, archive sha256 `{SHA256}`\n"
    '- run id "0192f3a4-5b6c-7d8e-9f01-23456789abcd", see https://example.com/docs/a-b\n\n'
    "```python\n"
    'def connect(password: str) -> None:\n    url = f"https://{host}/api"\n'
    '    headers = {"Authorization": token}\n'
    "```\n"
)


def leaked(payload: Any) -> list[str]:
    text = json.dumps(payload)
    return [secret for secret in PLANTED if secret in text]


def build(tmp_path: Path, audit: MemoryAuditSink, **values: Any) -> NexusServer:
    settings: dict[str, Any] = {
        "mode": "dev",
        "workspace": tmp_path / "ws",
        "data_dir": tmp_path / "data",
        **values,
    }
    sinks = [audit, JsonlAuditSink(tmp_path / "audit.jsonl")]
    return build_server(Settings(**settings), audit_sinks=sinks)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "notes").mkdir(parents=True)
    (root / "deploy.env").write_text(LEAKY, encoding="utf-8")
    # A note whose title (returned by every notes tool) holds a token, its body the rest.
    ops = f"---\ntitle: Ops {GITHUB_TOKEN}\n---\n" + LEAKY
    (root / "notes" / "ops.md").write_text(ops, encoding="utf-8")
    (root / "notes" / "plain.md").write_text("---\ntitle: Plain\n---\n" + ORDINARY)
    (root / "checklist.md").write_text(ORDINARY, encoding="utf-8")
    return root


def finished(audit: MemoryAuditSink, tool: str) -> dict[str, Any]:
    (record,) = [
        r for r in audit.records() if r["event"] == TOOL_CALL_FINISHED and r["tool"] == tool
    ]
    return record


def audit_file_leaks(tmp_path: Path) -> list[str]:
    text = (tmp_path / "audit.jsonl").read_text(encoding="utf-8")
    return [secret for secret in PLANTED if secret in text]


async def test_a_workspace_file_leaves_redacted_and_its_hash_is_what_the_client_got(
    tmp_path: Path, files: Path
) -> None:
    audit = MemoryAuditSink()
    server = build(tmp_path, audit)
    async with Client(server.mcp) as client:
        result = wire(await client.call_tool_mcp("nexus_read_file", {"path": "deploy.env"}))
    server.close()
    assert result["isError"] is False
    assert leaked(result) == []
    content = result["structuredContent"]["content"]
    assert marker("aws_access_key") in content and marker("private_key") in content
    assert content.startswith("# deploy notes\n") and content.endswith("the end\n")
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    # The tool effect's hash is that of what was delivered, not of the file on disk.
    (document,) = result["_meta"][EFFECT]["document_hashes"]
    assert document["hash"] == hashlib.sha256(content.encode()).hexdigest()
    record = finished(audit, "nexus_read_file")
    assert record["outcome"] == "OK"
    assert record["output_scan"]["action"] == "redacted"
    assert record["output_scan"]["kinds"] == KINDS
    assert hashlib.sha256(AWS_KEY.encode()).hexdigest() in record["output_scan"]["sha256"]
    assert record["document_hashes"] == [document]
    assert audit_file_leaks(tmp_path) == []


async def test_grep_and_notes_leave_redacted_too(tmp_path: Path, files: Path) -> None:
    server = build(tmp_path, MemoryAuditSink())
    async with Client(server.mcp) as client:
        grep = wire(
            await client.call_tool_mcp("nexus_grep", {"pattern": "key|TOKEN|slack", "regex": True})
        )
        notes = {
            tool: wire(await client.call_tool_mcp(tool, {"path": "notes/ops.md"}))
            for tool in ("get_section_source", "get_note_outline", "get_document_tree")
        }
    server.close()
    assert grep["isError"] is False and leaked(grep) == []
    assert marker("github_token") in json.dumps(grep)
    for result in notes.values():
        assert result["isError"] is False
        assert leaked(result) == []
        assert marker("github_token") in json.dumps(result)


async def test_refuse_withholds_the_whole_result_and_echoes_nothing(
    tmp_path: Path, files: Path
) -> None:
    audit = MemoryAuditSink()
    server = build(
        tmp_path,
        audit,
        output_scanning={"mode": "audit", "tools": {"nexus_read_file": "refuse"}},
    )
    async with Client(server.mcp) as client:
        refused = await client.call_tool_mcp("nexus_read_file", {"path": "deploy.env"})
        clean = wire(await client.call_tool_mcp("nexus_read_file", {"path": "checklist.md"}))
    server.close()
    payload = envelope(refused)
    assert payload == {
        "error": "result withheld: it holds a secret "
        "(aws_access_key, base64_high_entropy_string, github_token, private_key, slack_token)",
        "code": "OUTPUT_DENIED",
    }
    answer = wire(refused)
    assert leaked(answer) == [] and "deploy" not in json.dumps(answer)
    assert EFFECT not in answer.get("_meta", {})
    records = [r for r in audit.records() if r["event"] == TOOL_CALL_FINISHED]
    record = records[0]
    assert record["outcome"] == "OUTPUT_DENIED"
    assert record["output_scan"]["action"] == "refused"
    assert record["output_scan"]["kinds"] == KINDS
    # A clean file under the same policy passes untouched.
    assert clean["structuredContent"]["content"] == ORDINARY
    assert "output_scan" not in records[1]
    assert audit_file_leaks(tmp_path) == []


async def test_audit_mode_passes_the_secret_and_records_it_without_the_value(
    tmp_path: Path, files: Path
) -> None:
    audit = MemoryAuditSink()
    server = build(tmp_path, audit, output_scanning={"mode": "audit"})
    async with Client(server.mcp) as client:
        result = wire(await client.call_tool_mcp("nexus_read_file", {"path": "deploy.env"}))
    server.close()
    assert result["structuredContent"]["content"] == LEAKY
    record = finished(audit, "nexus_read_file")
    assert record["output_scan"]["action"] == "audited"
    assert record["output_scan"]["count"] == 5
    assert audit_file_leaks(tmp_path) == []


async def test_off_for_the_native_server_leaves_results_alone(tmp_path: Path, files: Path) -> None:
    server = build(tmp_path, MemoryAuditSink(), output_scanning={"servers": {"nexus": "off"}})
    async with Client(server.mcp) as client:
        result = wire(await client.call_tool_mcp("nexus_read_file", {"path": "deploy.env"}))
    server.close()
    assert result["structuredContent"]["content"] == LEAKY


async def test_ordinary_notes_and_code_are_not_mangled(tmp_path: Path, files: Path) -> None:
    audit = MemoryAuditSink()
    server = build(tmp_path, audit)
    async with Client(server.mcp) as client:
        read = wire(await client.call_tool_mcp("nexus_read_file", {"path": "checklist.md"}))
        info = wire(await client.call_tool_mcp("nexus_file_info", {"path": "checklist.md"}))
        note = wire(await client.call_tool_mcp("get_section_source", {"path": "notes/plain.md"}))
        source = wire(
            await client.call_tool_mcp("nexus_read_file", {"path": "../../" + "x"})
        )  # refused as a path, not scanned
    server.close()
    assert read["structuredContent"]["content"] == ORDINARY
    assert "REDACTED" not in json.dumps([read, info, note])
    assert source["isError"] is True
    assert all("output_scan" not in r for r in audit.records())


async def test_a_repository_blob_leaves_redacted_and_keeps_its_git_hashes(
    tmp_path: Path, files: Path
) -> None:
    project = make_repo(
        tmp_path / "roots" / "project", {"config/prod.env": LEAKY, "README.md": ORDINARY}
    )
    config = tmp_path / "nexus.yaml"
    config.write_text(
        json.dumps(
            {
                "repos": {
                    "allowed_roots": [str(tmp_path / "roots")],
                    "repositories": {"proj": {"path": str(project)}},
                }
            }
        )
    )
    audit = MemoryAuditSink()
    server = build_server(
        Settings(
            mode="prod",
            subject="alice",
            role="editor",
            profile="repo",
            workspace=files,
            data_dir=tmp_path / "data",
        ),
        config_file=config,
        audit_sinks=[audit, JsonlAuditSink(tmp_path / "audit.jsonl")],
    )
    async with Client(server.mcp) as client:
        blob = wire(
            await client.call_tool_mcp(
                "read_repo_file", {"repo": "proj", "path": "config/prod.env"}
            )
        )
        readme = wire(
            await client.call_tool_mcp("read_repo_file", {"repo": "proj", "path": "README.md"})
        )
    server.close()
    assert blob["isError"] is False, blob
    assert leaked(blob) == []
    structured = blob["structuredContent"]
    assert marker("slack_token") in structured["content"]
    # The blob's own identity (its commit, the sha256 of its bytes) is git's, untouched.
    assert structured["sha256"] == hashlib.sha256(LEAKY.encode()).hexdigest()
    assert len(structured["commit_sha"]) == 40
    assert readme["structuredContent"]["content"] == ORDINARY
    assert finished_kinds(audit, "read_repo_file") == [KINDS]
    assert audit_file_leaks(tmp_path) == []


def finished_kinds(audit: MemoryAuditSink, tool: str) -> list[dict[str, int]]:
    return [
        r["output_scan"]["kinds"]
        for r in audit.records()
        if r["event"] == TOOL_CALL_FINISHED and r["tool"] == tool and "output_scan" in r
    ]


@pytest.mark.slow
async def test_an_upstream_result_leaves_redacted_or_refused_by_server(tmp_path: Path) -> None:
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream()],
        grant={"full": ["up_echo"]},
        extra={"output_scanning": {"servers": {"up": "redact"}, "tools": {"up_add": "refuse"}}},
    )
    assert gw.pin("up") == 0
    server = gw.build()
    async with Client(server.mcp) as client:
        result = wire(await client.call_tool_mcp("up_echo", {"text": LEAKY}))
    server.close()
    assert result["isError"] is False, result
    assert leaked(result) == []
    assert result["structuredContent"]["text"] == json.loads(result["content"][0]["text"])["text"]
    assert marker("private_key") in result["structuredContent"]["text"]
    events = gw.events(TOOL_CALL_FINISHED)
    # Found twice each: in the text block and in structuredContent (the key block's bytes
    # differ there: JSON escapes its newlines, so six distinct values, not five).
    assert events[-1]["output_scan"]["kinds"] == {kind: 2 for kind in KINDS}
    assert len(events[-1]["output_scan"]["sha256"]) == 6
    assert hashlib.sha256(AWS_KEY.encode()).hexdigest() in events[-1]["output_scan"]["sha256"]
    assert events[-1]["server_id"] == "up"


@pytest.mark.slow
async def test_an_upstream_result_is_refused_where_its_server_refuses(tmp_path: Path) -> None:
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream()],
        grant={"full": ["up_echo"]},
        extra={"output_scanning": {"mode": "audit", "servers": {"up": "refuse"}}},
    )
    assert gw.pin("up") == 0
    server = gw.build()
    async with Client(server.mcp) as client:
        refused = await client.call_tool_mcp("up_echo", {"text": f"x {GITHUB_TOKEN} y"})
        clean = wire(await client.call_tool_mcp("up_echo", {"text": ORDINARY}))
    server.close()
    assert envelope(refused) == {
        "error": "result withheld: it holds a secret (github_token)",
        "code": "OUTPUT_DENIED",
    }
    assert GITHUB_TOKEN not in json.dumps(wire(refused))
    assert clean["structuredContent"] == {"text": ORDINARY}


@pytest.mark.slow
async def test_upstream_resource_reads_and_prompts_are_scanned_and_hashed_as_delivered(
    tmp_path: Path,
) -> None:
    grants = {"full": {"resources": ["up"], "prompts": ["up_greet", "up_review"]}}
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream()],
        grant_items=grants,
        extra={"output_scanning": {"tools": {"up_review": "refuse"}}},
    )
    assert gw.pin("up") == 0
    server = gw.build()
    async with Client(server.mcp) as client:
        # The template answers "item <id>": the id is the planted token.
        item = await client.read_resource(f"upstream://up/test://items/{GITHUB_TOKEN}")
        greeting = await client.get_prompt("up_greet", {"name": AWS_KEY})
        with pytest.raises(MCPError) as refused:
            await client.get_prompt("up_review", {"code": PEM})
        readme = await client.read_resource("upstream://up/test://static/readme")
    server.close()
    text = item[0].text  # type: ignore[union-attr]
    assert text == f"item {marker('github_token')}"
    assert (item[0].meta or {})["nexus/sha256"] == hashlib.sha256(text.encode()).hexdigest()
    said = greeting.messages[0].content.text  # type: ignore[union-attr]
    assert said == f"Hello, {marker('aws_access_key')} (plain)."
    assert refused.value.error.data == {
        "error": "result withheld: it holds a secret (private_key)",
        "code": "OUTPUT_DENIED",
    }
    assert "MIIEpAIBAAKCAQEA" not in str(refused.value)
    assert "REDACTED" not in readme[0].text  # type: ignore[union-attr]
    scanned = [e for e in gw.events() if "output_scan" in e]
    assert [(e["event"], e["output_scan"]["action"]) for e in scanned] == [
        ("resource_read_finished", "redacted"),
        ("prompt_get_finished", "redacted"),
        ("prompt_get_finished", "refused"),
    ]
    assert GITHUB_TOKEN not in json.dumps(gw.events()) and AWS_KEY not in json.dumps(gw.events())


async def test_a_large_result_is_scanned_off_the_event_loop(tmp_path: Path, files: Path) -> None:
    """About 0.1 s per MiB of text: a large result is scanned in a worker thread, so the
    loop keeps serving others (its thread's CPU between two 10 ms ticks stays small), and
    what leaves is still redacted."""
    import asyncio
    import time

    body = (ORDINARY + f'token = "{HIGH_ENTROPY}"\n' + "plain prose line\n" * 40) * 4000
    (files / "big.md").write_text(body + LEAKY, encoding="utf-8")
    audit = MemoryAuditSink()
    server = build(tmp_path, audit, limits={"max_read_bytes": 16 * 1024 * 1024})
    worst = 0.0

    async def tick() -> None:
        nonlocal worst
        while True:
            before = time.thread_time()
            await asyncio.sleep(0.01)
            worst = max(worst, time.thread_time() - before)

    async with Client(server.mcp) as client:
        await client.call_tool_mcp("nexus_read_file", {"path": "checklist.md"})  # warm
        ticker = asyncio.ensure_future(tick())
        try:
            result = wire(await client.call_tool_mcp("nexus_read_file", {"path": "big.md"}))
        finally:
            ticker.cancel()
    assert result["isError"] is False
    assert leaked(result) == []
    big = [
        r
        for r in audit.records()
        if r["event"] == TOOL_CALL_FINISHED and r["tool"] == "nexus_read_file"
    ][-1]
    assert big["output_scan"]["action"] == "redacted"
    assert worst < 0.15, worst  # the scan (several tenths of a second) ran off the loop
