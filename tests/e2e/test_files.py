"""The files toolset through the in-memory client, in both protocol eras."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import TOOL_CALL_BLOCKED, TOOL_CALL_FINISHED, MemoryAuditSink

from .conftest import ServerFactory, snapshot, wire

MODES = ["auto", "legacy"]
FILE_TOOLS = {
    "nexus_read_file", "nexus_list_files", "nexus_file_info", "nexus_glob", "nexus_grep",
    "nexus_write_file", "nexus_edit_file", "nexus_delete_file", "nexus_mkdir", "nexus_rmdir",
    "nexus_rename_file",
}  # fmt: skip


async def call(client: Client[Any], tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return wire(await client.call_tool_mcp(tool, args))


def error_code(result: dict[str, Any]) -> str:
    assert result["isError"] is True
    payload = json.loads(result["content"][0]["text"])
    assert "structuredContent" not in result
    assert set(payload) == {"error", "code"}
    return str(payload["code"])


@pytest.mark.parametrize("mode", MODES)
async def test_dev_principal_sees_every_file_tool(make_server: ServerFactory, mode: str) -> None:
    server = make_server()
    async with Client(server.mcp, mode=mode) as client:
        names = {t.name for t in await client.list_tools()}
    assert names >= FILE_TOOLS


@pytest.mark.parametrize("mode", MODES)
async def test_read_file_returns_structured_content_and_text(
    make_server: ServerFactory, workspace: Path, mode: str
) -> None:
    async with Client(make_server().mcp, mode=mode) as client:
        result = await call(client, "nexus_read_file", {"path": "src/hello.py"})
    assert result["isError"] is False
    expected = (workspace / "src/hello.py").read_text()
    assert result["structuredContent"] == {
        "path": "src/hello.py", "content": expected,
        "size_bytes": len(expected.encode()), "binary": False,
    }  # fmt: skip
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]


async def test_tool_annotations_follow_the_declared_risk(make_server: ServerFactory) -> None:
    async with Client(make_server().mcp) as client:
        tools = {t.name: t for t in await client.list_tools()}
    read, write = tools["nexus_read_file"].annotations, tools["nexus_delete_file"].annotations
    assert read is not None and write is not None
    assert (read.read_only_hint, read.destructive_hint) == (True, False)
    assert (write.read_only_hint, write.destructive_hint) == (False, True)


async def test_binary_files_are_reported_as_binary(
    make_server: ServerFactory, workspace: Path
) -> None:
    (workspace / "blob.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    async with Client(make_server().mcp) as client:
        result = await call(client, "nexus_read_file", {"path": "blob.bin"})
    assert result["structuredContent"]["binary"] is True
    assert result["structuredContent"]["content"] == ""


async def test_reads_over_the_limit_are_refused_not_truncated(
    make_server: ServerFactory, workspace: Path
) -> None:
    (workspace / "big.txt").write_text("x" * 5000)
    server = make_server(limits={"max_read_bytes": 4096})
    async with Client(server.mcp) as client:
        result = await call(client, "nexus_read_file", {"path": "big.txt"})
    assert error_code(result) == "DOC_SIZE_EXCEEDED"


async def test_write_edit_rename_delete_round_trip(
    make_server: ServerFactory, workspace: Path
) -> None:
    async with Client(make_server().mcp) as client:
        written = await call(
            client,
            "nexus_write_file",
            {"path": "scratch/a.md", "content": "one two two", "idempotency_key": "k-1"},
        )
        assert written["structuredContent"]["created"] is True
        edited = await call(
            client,
            "nexus_edit_file",
            {
                "path": "scratch/a.md",
                "old_text": "two",
                "new_text": "2",
                "expected_occurrences": 2,
                "idempotency_key": "k-2",
            },
        )
        assert edited["structuredContent"]["replacements"] == 2
        assert (workspace / "scratch/a.md").read_text() == "one 2 2"
        await call(
            client,
            "nexus_mkdir",
            {"path": "scratch/deep/er", "parents": True, "idempotency_key": "k-3"},
        )
        moved = await call(
            client,
            "nexus_rename_file",
            {
                "source": "scratch/a.md",
                "destination": "scratch/deep/er/b.md",
                "idempotency_key": "k-4",
            },
        )
        assert moved["isError"] is False
        assert (workspace / "scratch/deep/er/b.md").read_text() == "one 2 2"
        deleted = await call(
            client, "nexus_delete_file", {"path": "scratch/deep/er/b.md", "idempotency_key": "k-5"}
        )
        assert deleted["structuredContent"] == {"path": "scratch/deep/er/b.md", "deleted": True}
        removed = await call(
            client,
            "nexus_rmdir",
            {"path": "scratch/deep", "recursive": True, "idempotency_key": "k-6"},
        )
        assert removed["structuredContent"]["removed_entries"] == 2
    assert not (workspace / "scratch/deep").exists()


async def test_edit_refuses_when_occurrences_differ(
    make_server: ServerFactory, workspace: Path
) -> None:
    before = snapshot(workspace)
    async with Client(make_server().mcp) as client:
        result = await call(
            client,
            "nexus_edit_file",
            {"path": "todo.txt", "old_text": "- ", "new_text": "x", "idempotency_key": "k"},
        )
    assert error_code(result) == "CONFLICT"
    assert snapshot(workspace) == before


async def test_rmdir_refuses_a_non_empty_folder_unless_recursive(
    make_server: ServerFactory, workspace: Path
) -> None:
    async with Client(make_server().mcp) as client:
        result = await call(client, "nexus_rmdir", {"path": "notes", "idempotency_key": "k"})
    assert error_code(result) == "CONFLICT"
    assert (workspace / "notes/inbox/reading-list.md").exists()


async def test_write_without_overwrite_keeps_the_existing_file(
    make_server: ServerFactory, workspace: Path
) -> None:
    async with Client(make_server().mcp) as client:
        result = await call(
            client,
            "nexus_write_file",
            {"path": "todo.txt", "content": "new", "overwrite": False, "idempotency_key": "k"},
        )
    assert error_code(result) == "CONFLICT"
    assert "nexus_grep" in (workspace / "todo.txt").read_text()


async def test_list_files_does_not_follow_symlinks_out(make_server: ServerFactory) -> None:
    async with Client(make_server().mcp) as client:
        result = await call(client, "nexus_list_files", {"path": ".", "recursive": True})
    entries = result["structuredContent"]["entries"]
    paths = {e["path"] for e in entries}
    assert "notes/projects/atlas/plan.md" in paths
    assert {"path": "escape-link", "type": "symlink", "size_bytes": None} in entries
    assert not any(p.startswith("escape-link/") for p in paths)
    assert "CANARY" not in json.dumps(result)


async def test_glob_and_grep_find_files_within_the_workspace(make_server: ServerFactory) -> None:
    async with Client(make_server().mcp) as client:
        globbed = await call(client, "nexus_glob", {"pattern": "**/*.md", "path": "notes"})
        grepped = await call(client, "nexus_grep", {"pattern": "launch", "case_sensitive": False})
    assert "notes/projects/atlas/plan.md" in globbed["structuredContent"]["matches"]
    files = {f["path"] for f in grepped["structuredContent"]["files"]}
    assert {"notes/projects/atlas/plan.md", "todo.txt"} <= files
    assert grepped["structuredContent"]["truncated"] is False


async def test_grep_reports_the_cap_that_cut_results(
    make_server: ServerFactory, workspace: Path
) -> None:
    for i in range(5):
        (workspace / f"many-{i}.txt").write_text("needle\n" * 3)
    server = make_server(search={"max_results": 2, "max_matches_per_file": 1})
    async with Client(server.mcp) as client:
        result = await call(client, "nexus_grep", {"pattern": "needle"})
    content = result["structuredContent"]
    assert len(content["files"]) == 2
    assert content["truncated"] is True
    assert set(content["caps_hit"]) == {"max_results", "max_matches_per_file"}


async def test_grep_skips_binary_files_and_disallowed_extensions(
    make_server: ServerFactory, workspace: Path
) -> None:
    (workspace / "data.txt").write_bytes(b"needle\x00\x00")
    (workspace / "notes.exe").write_text("needle")
    (workspace / "ok.md").write_text("needle")
    async with Client(make_server().mcp) as client:
        result = await call(client, "nexus_grep", {"pattern": "needle"})
    assert [f["path"] for f in result["structuredContent"]["files"]] == ["ok.md"]


async def test_every_call_is_audited_with_digests_not_content(
    make_server: ServerFactory, audit: MemoryAuditSink
) -> None:
    async with Client(make_server().mcp) as client:
        await call(
            client,
            "nexus_write_file",
            {"path": "scratch/x.txt", "content": "CANARY-BODY-123", "idempotency_key": "k"},
        )
        await call(client, "nexus_read_file", {"path": "../escape"})
    events = audit.records()
    assert [e["event"] for e in events] == [
        "tool_call_started",
        TOOL_CALL_FINISHED,
        "tool_call_started",
        TOOL_CALL_FINISHED,
    ]
    assert "CANARY-BODY-123" not in json.dumps(events)
    finished = events[1]
    assert finished["outcome"] == "OK" and finished["subject"] == "dev"
    assert finished["args"] == {"path": "scratch/x.txt"}
    assert len(finished["args_digest"]) == 64
    assert events[3]["outcome"] == "INVALID_PATH" and "args" not in events[3]


async def test_validation_failures_are_audited_as_blocked(
    make_server: ServerFactory, audit: MemoryAuditSink
) -> None:
    async with Client(make_server().mcp) as client:
        await call(client, "nexus_read_file", {"path": 7})
    (event,) = audit.records()
    assert event["event"] == TOOL_CALL_BLOCKED and event["outcome"] == "INVALID_INPUT"
