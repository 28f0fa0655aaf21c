"""Audit durability follows consequence (issue 11), on the real JSONL file.

Two invariants: no side effect starts before its intent (``tool_call_started``) is on
record, and no result leaves the server before its record is. A write's started event is
written before the tool runs; a read's started and finished events are written together
after the tool returns (or fails, times out or is cancelled) and before the result goes
back. Each test observes the file itself, at the moment that matters.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from pydantic import BaseModel

from nexus_mcp.calls import META_TOOL_EFFECT
from nexus_mcp.cli import main
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.observability.audit import TOOL_CALL_FINISHED, TOOL_CALL_STARTED
from nexus_mcp.policy.grants import grant_tool
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .conftest import wire
from .servers import server_env

ZONE = "default"
BOUNDED_WAIT_S = 10.0


class Seen(BaseModel):
    lines: int


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def of_call(path: Path, tool_call_id: str) -> list[str]:
    return [r["event"] for r in records(path) if r["tool_call_id"] == tool_call_id]


def call_id(result: dict[str, Any]) -> str:
    value: str = result["_meta"][META_TOOL_EFFECT]["tool_call_id"]
    return value


def code_of(result: dict[str, Any]) -> str:
    assert result["isError"] is True, result
    code: str = json.loads(result["content"][0]["text"])["code"]
    return code


ServerBuilder = Callable[..., NexusServer]


@pytest.fixture
def build(workspace: Path, tmp_path: Path) -> Iterator[ServerBuilder]:
    """A dev server writing the real JSONL audit file; its extra tools are granted."""
    built: list[NexusServer] = []

    def factory(*, extra_tools: tuple[Any, ...] = (), **overrides: Any) -> NexusServer:
        settings = Settings(
            mode="dev", workspace=workspace, data_dir=tmp_path / "data", **overrides
        )
        server = build_server(settings, extra_tools=extra_tools)
        built.append(server)
        for tool in extra_tools:
            grant_tool(server.runtime.grants, settings.dev_principal.subject, tool.__name__, ZONE)
        return server

    yield factory
    for server in built:
        server.close()


def audit_path(server: NexusServer) -> Path:
    return server.runtime.settings.audit_path


class FsyncObserver:
    """``os.fsync`` as it is, noting the audit file's records each time a tool forces a
    file it is writing to disk (the workspace's atomic write: the side effect under way)."""

    def __init__(self, audit_file: Path) -> None:
        self.real = os.fsync
        self.audit_file = audit_file
        self.seen: list[list[dict[str, Any]]] = []

    def __call__(self, fd: int) -> None:
        self.seen.append(records(self.audit_file))
        self.real(fd)


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        (
            "nexus_write_file",
            {"path": "scratch/new.txt", "content": "BODY", "idempotency_key": "k1"},
        ),
        (
            "nexus_edit_file",
            {
                "path": "todo.txt",
                "old_text": "(its first line)",
                "new_text": "x",
                "idempotency_key": "k2",
            },
        ),
    ],
    ids=["write", "edit"],
)
async def test_a_write_is_on_record_before_it_touches_the_workspace(
    build: ServerBuilder, monkeypatch: pytest.MonkeyPatch, tool: str, args: dict[str, Any]
) -> None:
    server = build()
    path = audit_path(server)
    if tool == "nexus_edit_file":
        first_line = (server.runtime.workspace.root / "todo.txt").read_text().splitlines()[0]
        args = {**args, "old_text": first_line}
    observer = FsyncObserver(path)
    monkeypatch.setattr(os, "fsync", observer)
    async with Client(server.mcp) as client:
        result = wire(await client.call_tool_mcp(tool, args))
    monkeypatch.undo()
    assert result["isError"] is False, result
    assert observer.seen, "the write never forced its file to disk"
    during = observer.seen[0]
    # While the tool was writing: its intent on record, its outcome not yet.
    assert [(r["event"], r["tool"]) for r in during] == [(TOOL_CALL_STARTED, tool)]
    assert during[0]["tool_call_id"] == call_id(result)
    assert of_call(path, call_id(result)) == [TOOL_CALL_STARTED, TOOL_CALL_FINISHED]


def peek_audit(path: Path) -> Any:
    @nexus_tool(risk="read", toolset="test")
    async def peek_audit() -> Seen:
        """Read-only: counts the audit file's lines while it runs."""
        return Seen(lines=len(records(path)))

    return peek_audit


async def test_a_read_runs_before_its_start_is_written_and_returns_after_both_are(
    build: ServerBuilder, workspace: Path, tmp_path: Path
) -> None:
    path = tmp_path / "data" / "audit.jsonl"
    server = build(extra_tools=(peek_audit(path),))
    assert audit_path(server) == path
    async with Client(server.mcp) as client:
        first = wire(await client.call_tool_mcp("peek_audit", {}))
        # Whatever the client sees, the file held at that moment.
        on_file = records(path)
        second = wire(await client.call_tool_mcp("peek_audit", {}))
    assert first["structuredContent"] == {"lines": 0}  # nothing of the read before it ran
    assert second["structuredContent"] == {"lines": 2}  # only the first read's two events
    started, finished = on_file
    assert (started["event"], finished["event"]) == (TOOL_CALL_STARTED, TOOL_CALL_FINISHED)
    assert started["tool_call_id"] == finished["tool_call_id"] == call_id(first)
    # Both keep their fields; the started event keeps its own time.
    assert started["args_digest"] == finished["args_digest"]
    assert {"outcome", "duration_ms", "effect_id"}.isdisjoint(started)
    assert finished["outcome"] == "OK" and finished["effect_id"]
    assert started["ts"] <= finished["ts"]
    assert started["side_effects"] is False and started["tool_class"] == "read"


async def test_reads_and_writes_leave_a_file_that_verifies_with_each_read_in_one_piece(
    build: ServerBuilder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = build()
    path = audit_path(server)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("nexus_read_file", {"path": "todo.txt"}),
        ("nexus_write_file", {"path": "scratch/a.txt", "content": "A", "idempotency_key": "a"}),
        ("nexus_read_file", {"path": "scratch/a.txt"}),
        ("nexus_read_file", {"path": "../ws-evil/secret.txt"}),  # the tool refuses the path
        ("nexus_read_file", {"path": 7}),  # refused before it runs: blocked
        ("nexus_read_file", {"path": "no-such-file.txt"}),  # ran and failed: NOT_FOUND
        ("nexus_list_files", {"path": "."}),
    ]
    async with Client(server.mcp) as client:
        for tool, args in calls:
            await client.call_tool_mcp(tool, args)
    lines = records(path)
    assert [(r["event"], r["tool"], r.get("outcome")) for r in lines] == [
        (TOOL_CALL_STARTED, "nexus_read_file", None),
        (TOOL_CALL_FINISHED, "nexus_read_file", "OK"),
        (TOOL_CALL_STARTED, "nexus_write_file", None),
        (TOOL_CALL_FINISHED, "nexus_write_file", "OK"),
        (TOOL_CALL_STARTED, "nexus_read_file", None),
        (TOOL_CALL_FINISHED, "nexus_read_file", "OK"),
        (TOOL_CALL_STARTED, "nexus_read_file", None),
        (TOOL_CALL_FINISHED, "nexus_read_file", "INVALID_PATH"),
        ("tool_call_blocked", "nexus_read_file", "INVALID_INPUT"),
        (TOOL_CALL_STARTED, "nexus_read_file", None),
        (TOOL_CALL_FINISHED, "nexus_read_file", "NOT_FOUND"),
        (TOOL_CALL_STARTED, "nexus_list_files", None),
        (TOOL_CALL_FINISHED, "nexus_list_files", "OK"),
    ]
    capsys.readouterr()
    assert main(["audit", "verify", "--file", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "13 events, 0 problems",
        "chain intact: 13 records in 1 segments",
    ]
    # The server's log is hash-chained: one edited byte is caught at its line.
    lines = path.read_bytes().splitlines(keepends=True)
    lines[4] = lines[4].replace(b'"nexus_read_file"', b'"nexus_read_filE"', 1)
    path.write_bytes(b"".join(lines))
    assert main(["audit", "verify", "--file", str(path)]) == 1
    assert "audit.jsonl:5: record does not match its hash" in capsys.readouterr().out
    assert main(["audit", "tail", "--file", str(path), "-n", "2"]) == 0
    assert "nexus_list_files" in capsys.readouterr().out


@nexus_tool(risk="read", toolset="test")
async def peek_then_fail() -> Seen:
    """Read-only, and fails while it runs."""
    raise RuntimeError("CANARY-FAILURE-TEXT")


@nexus_tool(risk="read", toolset="test")
async def peek_forever() -> Seen:
    """Read-only, and never returns unless cancelled."""
    await asyncio.Event().wait()
    return Seen(lines=0)  # pragma: no cover - cancelled before


async def wait_for_events(path: Path, count: int) -> list[dict[str, Any]]:
    """Bounded wait for the server side of a call the client gave up on."""
    deadline = time.monotonic() + BOUNDED_WAIT_S
    while len(lines := records(path)) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return lines


@pytest.mark.parametrize("ending", ["raises", "times out", "is cancelled"])
async def test_a_read_that_fails_times_out_or_is_cancelled_still_records_both_events(
    build: ServerBuilder, ending: str
) -> None:
    tool = {"raises": peek_then_fail, "times out": peek_forever, "is cancelled": peek_forever}
    timeouts = {"peek_forever": 0.05} if ending == "times out" else {}
    server = build(extra_tools=(tool[ending],), budgets={"tool_timeouts": timeouts})
    path = audit_path(server)
    name = tool[ending].__name__
    async with Client(server.mcp) as client:
        if ending == "is cancelled":
            # The client gives up: the MCP SDK sends notifications/cancelled, and the
            # server cancels the running call.
            with pytest.raises(Exception):  # noqa: B017 - the client's own timeout error
                await client.call_tool_mcp(name, {}, timeout=0.2)
            result = None
        else:
            result = wire(await client.call_tool_mcp(name, {}))
    lines = await wait_for_events(path, 2)
    assert [(r["event"], r["tool"]) for r in lines] == [
        (TOOL_CALL_STARTED, name),
        (TOOL_CALL_FINISHED, name),
    ]
    assert lines[0]["tool_call_id"] == lines[1]["tool_call_id"]
    expected = {"raises": "INTERNAL_ERROR", "times out": "TOOL_TIMEOUT"}
    if result is not None:
        assert code_of(result) == lines[1]["outcome"] == expected[ending]
    assert "CANARY-FAILURE-TEXT" not in path.read_text()


@pytest.mark.slow
async def test_over_stdio_each_read_is_on_record_before_its_result_arrives(
    workspace: Path, tmp_path: Path
) -> None:
    """A real subprocess: the file is read the moment each result arrives."""
    data = tmp_path / "data"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nexus_mcp", "serve", "--transport", "stdio", "--mode", "dev",
              "--workspace", str(workspace), "--data-dir", str(data), "--log-level", "ERROR"],
        env=server_env(),
    )  # fmt: skip
    seen: list[list[str]] = []
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for _ in range(10):
                    result = await session.call_tool("nexus_read_file", {"path": "todo.txt"})
                    assert result.is_error is False
                    assert result.meta is not None
                    tool_call_id = result.meta[META_TOOL_EFFECT]["tool_call_id"]
                    seen.append(of_call(data / "audit.jsonl", tool_call_id))
    assert seen == [[TOOL_CALL_STARTED, TOOL_CALL_FINISHED]] * 10


async def test_a_server_rotating_its_audit_file_leaves_one_verifiable_chain(
    build: ServerBuilder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = build(audit_max_bytes=65536)
    path = audit_path(server)
    async with Client(server.mcp) as client:
        for n in range(70):
            await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt" if n % 2 else "x"})
    segments = sorted(path.parent.glob("audit.jsonl.[0-9]*"))
    assert segments, "70 calls pass 64 KiB: the file rotated"
    assert all(p.stat().st_size <= 65536 for p in segments)
    capsys.readouterr()
    assert main(["audit", "verify", "--data-dir", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert f"chain intact: 140 records in {len(segments) + 1} segments" in out
    segments[0].unlink()
    assert main(["audit", "verify", "--data-dir", str(tmp_path / "data")]) == 1
    assert "audit.jsonl.1: segment is missing" in capsys.readouterr().out
