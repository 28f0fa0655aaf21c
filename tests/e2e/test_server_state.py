"""The server's own state is out of reach of the file tools even inside the workspace.

``nexus-mcp serve --workspace .`` with the default data directory puts the audit log, the
grants and the idempotency records inside the served folder. A caller must not read the
audit trail, delete it, or rewrite its own grants through the file tools.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import JsonlAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .conftest import DEMO_WORKSPACE, wire

IDEMPOTENCY = {"idempotency_key": "k-1"}


def serve(workspace: Path, **overrides: Any) -> NexusServer:
    values: dict[str, Any] = {"mode": "dev", "workspace": workspace}
    values.update(overrides)
    settings = Settings(**values)
    # The real JSONL sink: the audit file must exist where a caller might look for it.
    return build_server(settings, audit_sinks=[JsonlAuditSink(settings.audit_path)])


async def call(client: Client[Any], tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return wire(await client.call_tool_mcp(tool, args))


def code(result: dict[str, Any]) -> str | None:
    if not result["isError"]:
        return None
    assert "structuredContent" not in result  # the envelope is text content only
    return str(json.loads(result["content"][0]["text"])["code"])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(DEMO_WORKSPACE, root)
    return root


async def test_state_inside_the_workspace_cannot_be_read_listed_or_searched(
    workspace: Path,
) -> None:
    server = serve(workspace, data_dir=workspace / ".nexus-data")
    try:
        async with Client(server.mcp) as client:
            await call(client, "nexus_read_file", {"path": "todo.txt"})  # audit has a line
            audit = ".nexus-data/audit.jsonl"
            assert (workspace / audit).stat().st_size > 0
            for path in (audit, ".nexus-data/grants.sqlite3", ".nexus-data", "./.nexus-data/x"):
                assert code(await call(client, "nexus_read_file", {"path": path})) == (
                    "INVALID_PATH"
                ), path
                assert code(await call(client, "nexus_file_info", {"path": path})) == (
                    "INVALID_PATH"
                ), path
            listed = await call(client, "nexus_list_files", {"path": ".", "recursive": True})
            paths = [e["path"] for e in listed["structuredContent"]["entries"]]
            assert paths and not any(p.startswith(".nexus-data") for p in paths)
            found = await call(client, "nexus_glob", {"pattern": "**/*"})
            assert not any(".nexus-data" in p for p in found["structuredContent"]["matches"])
            grep = await call(client, "nexus_grep", {"pattern": "tool_call_finished"})
            assert grep["structuredContent"]["files"] == []
    finally:
        server.close()


async def test_state_inside_the_workspace_cannot_be_changed_or_removed(workspace: Path) -> None:
    data = workspace / "state" / ".nexus-data"
    server = serve(workspace, data_dir=data)
    try:
        async with Client(server.mcp) as client:
            await call(client, "nexus_read_file", {"path": "todo.txt"})
            before = (data / "audit.jsonl").read_bytes()
            grants = (data / "grants.sqlite3").read_bytes()
            attempts = [
                ("nexus_write_file", {"path": "state/.nexus-data/audit.jsonl", "content": "x"}),
                ("nexus_write_file", {"path": "state/.nexus-data/new.txt", "content": "x"}),
                ("nexus_delete_file", {"path": "state/.nexus-data/grants.sqlite3"}),
                ("nexus_mkdir", {"path": "state/.nexus-data/sub"}),
                ("nexus_rmdir", {"path": "state/.nexus-data", "recursive": True}),
                ("nexus_rmdir", {"path": "state", "recursive": True}),  # holds the state
                ("nexus_rename_file", {"source": "state", "destination": "moved"}),
                ("nexus_rename_file", {"source": "todo.txt", "destination": "state/.nexus-data/t"}),
            ]
            for tool, args in attempts:
                result = await call(
                    client,
                    tool,
                    {**args, **IDEMPOTENCY, "idempotency_key": tool + json.dumps(args)},
                )
                assert code(result) == "INVALID_PATH", (tool, args, result)
            assert (data / "grants.sqlite3").read_bytes() == grants
            assert (data / "audit.jsonl").read_bytes().startswith(before)
            assert (workspace / "todo.txt").exists()
            # The rest of the folder stays usable.
            ok = await call(
                client,
                "nexus_write_file",
                {"path": "state/notes.txt", "content": "fine", "idempotency_key": "k-ok"},
            )
            assert code(ok) is None
    finally:
        server.close()


async def test_a_workspace_inside_the_data_directory_hides_only_the_state_files(
    tmp_path: Path,
) -> None:
    """The `make run` layout: .nexus-data/demo-workspace is served, state lies beside it."""
    data = tmp_path / ".nexus-data"
    workspace = data / "demo-workspace"
    shutil.copytree(DEMO_WORKSPACE, workspace)
    server = serve(workspace, data_dir=data)
    try:
        async with Client(server.mcp) as client:
            listed = await call(client, "nexus_list_files", {"path": ".", "recursive": True})
            assert len(listed["structuredContent"]["entries"]) == len(list(workspace.rglob("*")))
            read = await call(client, "nexus_read_file", {"path": "todo.txt"})
            assert code(read) is None
    finally:
        server.close()


async def test_a_grants_database_configured_inside_the_workspace_is_hidden(
    workspace: Path, tmp_path: Path
) -> None:
    grants_db = workspace / "config" / "grants.db"
    grants_db.parent.mkdir()
    server = serve(workspace, data_dir=tmp_path / "data", profiles={"grants_db": grants_db})
    try:
        async with Client(server.mcp) as client:
            for path in ("config/grants.db", "config/grants.db-wal"):
                result = await call(client, "nexus_read_file", {"path": path})
                assert code(result) == "INVALID_PATH", path
            deleted = await call(
                client,
                "nexus_delete_file",
                {"path": "config/grants.db", "idempotency_key": "k-del"},
            )
            assert code(deleted) == "INVALID_PATH"
            assert grants_db.exists()
            listed = await call(client, "nexus_list_files", {"path": "config"})
            assert listed["structuredContent"]["entries"] == []
    finally:
        server.close()


async def test_the_notes_tools_do_not_read_server_state_as_a_note(workspace: Path) -> None:
    server = serve(workspace, data_dir=workspace / ".nexus-data")
    try:
        async with Client(server.mcp) as client:
            await call(client, "nexus_read_file", {"path": "todo.txt"})
            for tool in ("get_section_source", "get_note_outline", "get_metadata_facets"):
                result = await call(client, tool, {"path": ".nexus-data/audit.jsonl"})
                assert result["isError"] is True, tool
                assert "tool_call" not in json.dumps(result), tool
            readable = await call(
                client, "get_note_outline", {"path": "notes/projects/atlas/plan.md"}
            )
            assert readable["isError"] is False, readable
    finally:
        server.close()


NONCE_FILES = ("nonces.sqlite3", "nonces.sqlite3-wal", "nonces.sqlite3-shm")


@pytest.mark.parametrize("layout", ["data-dir-inside", "data-dir-is-workspace"])
async def test_the_used_approval_nonces_cannot_be_read_changed_or_removed(
    workspace: Path, layout: str
) -> None:
    """Deleting the nonce database would make every spent approval token usable again."""
    prefix = ".nexus-data/" if layout == "data-dir-inside" else ""
    data = workspace / prefix.rstrip("/")
    server = serve(workspace, data_dir=data)
    try:
        assert all((data / name).exists() for name in NONCE_FILES)
        stored = (data / "nonces.sqlite3").read_bytes()
        async with Client(server.mcp) as client:
            for name in NONCE_FILES:
                path = prefix + name
                attempts = [
                    ("nexus_read_file", {"path": path}),
                    ("nexus_file_info", {"path": path}),
                    ("nexus_delete_file", {"path": path, "idempotency_key": "d-" + name}),
                    (
                        "nexus_write_file",
                        {"path": path, "content": "", "idempotency_key": "w-" + name},
                    ),
                    (
                        "nexus_rename_file",
                        {"source": path, "destination": "gone.db", "idempotency_key": "r-" + name},
                    ),
                ]
                for tool, args in attempts:
                    assert code(await call(client, tool, args)) == "INVALID_PATH", (tool, path)
            listed = await call(client, "nexus_list_files", {"path": ".", "recursive": True})
            paths = [e["path"] for e in listed["structuredContent"]["entries"]]
            assert not any("nonces" in p for p in paths)
        assert all((data / name).exists() for name in NONCE_FILES)
        assert (data / "nonces.sqlite3").read_bytes() == stored
        assert not (workspace / "gone.db").exists()
    finally:
        server.close()
