"""Issue 6 limits end to end: per-session budget, per-subject rate, per-tool timeout."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import TOOL_CALL_BLOCKED, TOOL_CALL_FINISHED, MemoryAuditSink

from .conftest import ServerFactory, snapshot, wire

READ = ("nexus_read_file", {"path": "todo.txt"})


async def call(client: Client[Any], tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return wire(await client.call_tool_mcp(tool, args))


def envelope(result: dict[str, Any]) -> dict[str, str]:
    assert result["isError"] is True, result
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert "structuredContent" not in result
    assert set(payload) == {"error", "code"}
    return payload


def temp_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(".nexus-*.tmp"))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_call_after_the_session_budget_is_refused_and_writes_nothing(
    make_server: ServerFactory, workspace: Path, audit: MemoryAuditSink, mode: str
) -> None:
    server = make_server(budgets={"max_calls_per_session": 3})
    before = snapshot(workspace)
    async with Client(server.mcp, mode=mode) as client:
        ok = [await call(client, *READ) for _ in range(3)]
        over_read = await call(client, *READ)
        over_write = await call(
            client,
            "nexus_write_file",
            {"path": "scratch/x.txt", "content": "x", "idempotency_key": "k"},
        )
    assert [r["isError"] for r in ok] == [False] * 3
    expected = {"error": "call budget for this session is exhausted", "code": "BUDGET_EXCEEDED"}
    assert envelope(over_read) == envelope(over_write) == expected
    assert snapshot(workspace) == before
    blocked = [r for r in audit.records() if r["event"] == TOOL_CALL_BLOCKED]
    assert [(r["tool"], r["outcome"]) for r in blocked] == [
        ("nexus_read_file", "BUDGET_EXCEEDED"),
        ("nexus_write_file", "BUDGET_EXCEEDED"),
    ]

    # A new handshake-era session has a budget of its own; the 2026-07-28 era has no
    # session, so the budget is the principal's and stays exhausted.
    async with Client(server.mcp, mode=mode) as client:
        fresh = await call(client, *READ)
    if mode == "legacy":
        assert fresh["isError"] is False
    else:
        assert envelope(fresh)["code"] == "BUDGET_EXCEEDED"


async def test_calls_beyond_the_rate_limit_are_refused(
    make_server: ServerFactory, workspace: Path, audit: MemoryAuditSink
) -> None:
    server = make_server(budgets={"rate_limit_calls": 2, "rate_limit_window_seconds": 60})
    before = snapshot(workspace)
    async with Client(server.mcp, mode="legacy") as client:
        ok = [await call(client, *READ) for _ in range(2)]
        limited = await call(client, *READ)
    # Per subject, not per session: another session of the same subject is limited too.
    async with Client(server.mcp, mode="legacy") as client:
        limited_write = await call(
            client,
            "nexus_write_file",
            {"path": "scratch/x.txt", "content": "x", "idempotency_key": "k"},
        )
    assert [r["isError"] for r in ok] == [False, False]
    expected = {"error": "too many calls; retry later", "code": "RATE_LIMITED"}
    assert envelope(limited) == envelope(limited_write) == expected
    assert snapshot(workspace) == before
    assert [r["outcome"] for r in audit.records() if r["event"] == TOOL_CALL_BLOCKED] == [
        "RATE_LIMITED"
    ] * 2


class SlowFsync:
    """``os.fsync`` that takes 0.5 s: a slow disk, so the write outlives its timeout.

    It notes the temporary files present mid-write, proving a partial file existed.
    """

    def __init__(self, root: Path) -> None:
        self.real = os.fsync
        self.root = root
        self.temp_files_seen: list[str] = []
        self.returned = threading.Event()

    def __call__(self, fd: int) -> None:
        self.temp_files_seen.extend(temp_files(self.root))
        time.sleep(0.5)
        self.real(fd)
        self.returned.set()


async def timed_out_write(
    make_server: ServerFactory,
    monkeypatch: pytest.MonkeyPatch,
    workspace: Path,
    args: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    server = make_server(budgets={"tool_timeouts": {"nexus_write_file": 0.05}})
    slow = SlowFsync(workspace)
    monkeypatch.setattr(os, "fsync", slow)
    async with Client(server.mcp) as client:
        result = await call(client, "nexus_write_file", args)
    # Bounded waits for the worker thread: its fsync returned, then it decided whether to
    # commit and removed its temporary file (the last thing a cancelled write does).
    assert await asyncio.to_thread(slow.returned.wait, 5)
    deadline = time.monotonic() + 5
    while temp_files(workspace) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    monkeypatch.undo()
    assert len(slow.temp_files_seen) == 1
    assert slow.temp_files_seen[0].startswith("scratch/.nexus-")
    return server, result


@pytest.mark.parametrize(
    "path", ["scratch/README.txt", "scratch/new-slow.txt"], ids=["existing", "new"]
)
async def test_a_timed_out_write_never_lands_not_even_late(
    make_server: ServerFactory,
    workspace: Path,
    audit: MemoryAuditSink,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    before = snapshot(workspace)
    args = {"path": path, "content": "LATE CONTENT", "idempotency_key": "k-slow"}
    _, result = await timed_out_write(make_server, monkeypatch, workspace, args)
    assert envelope(result) == {"error": "tool call timed out", "code": "TOOL_TIMEOUT"}
    assert temp_files(workspace) == []
    assert snapshot(workspace) == before
    record = [r for r in audit.records() if r["event"] != "tool_call_started"][-1]
    assert (record["event"], record["outcome"]) == (TOOL_CALL_FINISHED, "TOOL_TIMEOUT")


async def test_a_retry_after_a_timeout_is_refused_as_outcome_unknown(
    make_server: ServerFactory,
    workspace: Path,
    audit: MemoryAuditSink,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """classification.py: a tool that started and timed out may have acted; never run it
    again under that key and never record success (IDEMPOTENCY_KEY_CONFLICT, outcome unknown)."""
    before = snapshot(workspace)
    args = {"path": "scratch/README.txt", "content": "LATE CONTENT", "idempotency_key": "k-slow"}
    server, result = await timed_out_write(make_server, monkeypatch, workspace, args)
    assert envelope(result)["code"] == "TOOL_TIMEOUT"
    timed_out = [r for r in audit.records() if r["event"] == TOOL_CALL_FINISHED][-1]
    async with Client(server.mcp) as client:
        retry = await call(client, "nexus_write_file", args)
    assert (
        retry.get("_meta", {}).get("nexus.mcp/idempotent_replay") is None
    )  # never a recorded success
    assert envelope(retry) == {
        "error": "the outcome of an earlier call with this idempotency_key is unknown: "
        "check the target, then retry with a new idempotency_key",
        "code": "IDEMPOTENCY_KEY_CONFLICT",
    }
    assert snapshot(workspace) == before
    assert timed_out["idempotency"] == "outcome_unknown"
