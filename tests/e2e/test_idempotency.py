"""Issue 3 end to end: idempotent writes through the server (replay, conflict, concurrency, crash).

What ``stores/idempotency.py`` and ``middleware/classification.py`` document, checked through
FastMCP's in-memory client: a key is scoped by (subject, server, tool, key) and the target
the tool acts on (the served workspace: another folder on the same data directory runs the
call, the same folder after a restart or through a symlinked alias replays it); a success
is recorded and replayed; other arguments under the same key conflict; concurrent calls run
the tool once; typed refusals free the key; a claim whose outcome is unknown (crash,
failure after the tool started) is never run again; records expire after the TTL.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from fastmcp import Client

from nexus_mcp.calls import PLUMBING_ARGS
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.audit import (
    TOOL_CALL_BLOCKED,
    TOOL_CALL_FINISHED,
    TOOL_CALL_STARTED,
    MemoryAuditSink,
)
from nexus_mcp.policy.grants import grant_tool
from nexus_mcp.policy.hashing import digest_arguments
from nexus_mcp.policy.targets import RULE_UNKNOWN_TARGET, identify_folder
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from nexus_mcp.stores.idempotency import ClaimStatus, IdempotencyScope, SqliteIdempotencyStore

from .conftest import ServerFactory, snapshot, wire

WRITE = "nexus_write_file"
META_KEY = "nexus.mcp/idempotency_key"
META_EFFECT = "nexus.mcp/tool_effect"
META_REPLAYED = "nexus.mcp/idempotent_replay"
STORE_FILE = "idempotency.sqlite3"
DAY = 86_400.0
HOLD_SECONDS = 5.0
TIMEOUT_SECONDS = 0.3
STALL_SECONDS = 0.6


def envelope(result: dict[str, Any]) -> dict[str, str]:
    assert result["isError"] is True
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert "structuredContent" not in result
    assert set(payload) == {"error", "code"}
    return payload


def code_of(result: dict[str, Any]) -> str:
    return envelope(result)["code"]


def events(audit: MemoryAuditSink, kind: str) -> list[dict[str, Any]]:
    return [r for r in audit.records() if r["event"] == kind]


def outcomes(audit: MemoryAuditSink) -> list[str | None]:
    return [r.get("idempotency") for r in audit.records() if r["event"] != TOOL_CALL_STARTED]


async def call(
    server: NexusServer, tool: str, args: dict[str, Any], meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    async with Client(server.mcp) as client:
        return wire(await client.call_tool_mcp(tool, args, meta=meta))


class WriteSpy:
    """Counts (and optionally slows or breaks) the workspace's atomic writes of one server."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def install(
        self,
        monkeypatch: pytest.MonkeyPatch,
        server: NexusServer,
        *,
        before: Callable[[int], None] = lambda n: None,
        after: Callable[[int], None] = lambda n: None,
    ) -> None:
        workspace = server.runtime.workspace
        original = workspace.write_atomic

        def spied(*args: Any, **kwargs: Any) -> bool:
            with self._lock:
                self.calls += 1
                number = self.calls
            before(number)
            outcome = original(*args, **kwargs)
            after(number)
            return outcome

        monkeypatch.setattr(workspace, "write_atomic", spied)


@pytest.fixture
def spy() -> WriteSpy:
    return WriteSpy()


@pytest.fixture
def shared_servers(
    workspace: Path, tmp_path: Path
) -> Iterator[Callable[..., tuple[NexusServer, MemoryAuditSink]]]:
    """Servers on one workspace and one data_dir (replicas), each with its own audit sink."""
    built: list[NexusServer] = []

    def factory(**overrides: Any) -> tuple[NexusServer, MemoryAuditSink]:
        values: dict[str, Any] = {
            "mode": "dev",
            "workspace": workspace,
            "data_dir": tmp_path / "shared-data",
        }
        values.update(overrides)
        sink = MemoryAuditSink()
        server = build_server(Settings(**values), audit_sinks=[sink])
        built.append(server)
        return server, sink

    yield factory
    for server in built:
        server.close()


def store_path(server: NexusServer) -> Path:
    return server.runtime.settings.data_dir / STORE_FILE


def scope_of(
    key: str, *, workspace: Path, subject: str = "dev", tool: str = WRITE
) -> IdempotencyScope:
    return IdempotencyScope(subject, "nexus", tool, key, target=identify_folder(workspace))


def digest_of(args: dict[str, Any]) -> str:
    return digest_arguments(args, exclude=PLUMBING_ARGS)


# --- replay and conflict -----------------------------------------------------------------


async def test_a_retry_with_the_same_key_and_arguments_returns_the_recorded_result_without_running(
    make_server: ServerFactory, audit: MemoryAuditSink, workspace: Path
) -> None:
    server = make_server()
    args = {"path": "once.txt", "content": "written once", "idempotency_key": "k-once"}
    target = workspace / "once.txt"
    async with Client(server.mcp) as client:
        first = wire(await client.call_tool_mcp(WRITE, args))
        written = (target.read_bytes(), target.stat().st_mtime_ns)
        retry = wire(await client.call_tool_mcp(WRITE, args))
        assert (target.read_bytes(), target.stat().st_mtime_ns) == written
        target.write_bytes(b"changed by someone else")
        again = wire(await client.call_tool_mcp(WRITE, args))
    # The tool ran once: a rerun would have put "written once" back.
    assert target.read_bytes() == b"changed by someone else"
    assert len(events(audit, TOOL_CALL_STARTED)) == 1
    assert first["isError"] is False and META_REPLAYED not in first["_meta"]
    for replay in (retry, again):
        assert replay["isError"] is False
        assert replay["structuredContent"] == first["structuredContent"]
        assert replay["content"] == first["content"]
        assert replay["_meta"][META_REPLAYED] is True
        assert replay["_meta"][META_EFFECT] == first["_meta"][META_EFFECT]
    assert outcomes(audit) == ["executed", "replayed", "replayed"]


async def test_the_key_and_approval_token_are_not_part_of_the_arguments_a_retry_is_compared_on(
    make_server: ServerFactory, audit: MemoryAuditSink, workspace: Path
) -> None:
    server = make_server()
    args = {"path": "p.txt", "content": "plumbing"}
    first = await call(server, WRITE, {**args, "idempotency_key": "k-p"})
    via_meta = await call(server, WRITE, args, meta={META_KEY: "k-p"})
    with_token = await call(
        server, WRITE, {**args, "idempotency_key": "k-p", "approval_token": "t"}
    )
    assert first["isError"] is False
    assert via_meta["_meta"][META_REPLAYED] is True
    assert with_token["_meta"][META_REPLAYED] is True
    assert len(events(audit, TOOL_CALL_STARTED)) == 1


async def test_the_same_key_with_different_arguments_is_a_conflict(
    make_server: ServerFactory, audit: MemoryAuditSink, workspace: Path
) -> None:
    server = make_server()
    args = {"path": "c.txt", "content": "v1", "idempotency_key": "k-c"}
    assert (await call(server, WRITE, args))["isError"] is False
    before = snapshot(workspace)
    audit.clear()
    changes = [
        {"content": "other"},
        {"path": "elsewhere.txt"},
        {"overwrite": False},
        {"content": "v1\r\n"},
    ]
    async with Client(server.mcp) as client:
        for changed in changes:
            result = wire(await client.call_tool_mcp(WRITE, {**args, **changed}))
            assert code_of(result) == "IDEMPOTENCY_KEY_CONFLICT", changed
    assert snapshot(workspace) == before
    assert events(audit, TOOL_CALL_STARTED) == []
    assert [e["outcome"] for e in events(audit, TOOL_CALL_BLOCKED)] == [
        "IDEMPOTENCY_KEY_CONFLICT"
    ] * len(changes)


async def test_a_key_is_scoped_by_tool(make_server: ServerFactory, workspace: Path) -> None:
    server = make_server()
    write = await call(
        server, WRITE, {"path": "t.txt", "content": "t", "idempotency_key": "k-shared"}
    )
    mkdir = await call(server, "nexus_mkdir", {"path": "t-dir", "idempotency_key": "k-shared"})
    assert write["isError"] is False and mkdir["isError"] is False
    assert META_REPLAYED not in mkdir["_meta"]
    assert (workspace / "t-dir").is_dir()


async def test_a_key_is_scoped_by_subject(
    shared_servers: Callable[..., tuple[NexusServer, MemoryAuditSink]], workspace: Path
) -> None:
    alice, alice_audit = shared_servers(subject="alice", role="admin")
    bob, bob_audit = shared_servers(subject="bob", role="admin")
    assert store_path(alice) == store_path(bob)
    key = "k-everyone-uses-this"
    from_alice = {"path": "shared.txt", "content": "from alice", "idempotency_key": key}
    from_bob = {"path": "shared.txt", "content": "from bob", "idempotency_key": key}
    assert (await call(alice, WRITE, from_alice))["isError"] is False
    # Bob's record is his own: neither a conflict with Alice's nor a replay of it.
    bob_first = await call(bob, WRITE, from_bob)
    assert bob_first["isError"] is False and META_REPLAYED not in bob_first["_meta"]
    assert (workspace / "shared.txt").read_bytes() == b"from bob"
    alice_retry = await call(alice, WRITE, from_alice)
    assert alice_retry["_meta"][META_REPLAYED] is True
    assert (workspace / "shared.txt").read_bytes() == b"from bob"
    assert code_of(await call(bob, WRITE, from_alice)) == "IDEMPOTENCY_KEY_CONFLICT"
    assert len(events(alice_audit, TOOL_CALL_STARTED)) == 1
    assert len(events(bob_audit, TOOL_CALL_STARTED)) == 1


# --- concurrency -------------------------------------------------------------------------


class ClaimLog:
    """Spies on the servers' stores: every claim status handed out and every caller that waits."""

    def __init__(self) -> None:
        self.statuses: list[ClaimStatus] = []
        self.waiters = 0
        self._lock = threading.Lock()

    def install(self, monkeypatch: pytest.MonkeyPatch, server: NexusServer) -> None:
        store = server.runtime.idempotency
        original_begin, original_wait = store.begin, store.wait

        def begin(*args: Any, **kwargs: Any) -> Any:
            claim = original_begin(*args, **kwargs)
            with self._lock:
                self.statuses.append(claim.status)
            return claim

        async def wait(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.waiters += 1  # this caller found the key IN_PROGRESS
            return await original_wait(*args, **kwargs)

        monkeypatch.setattr(store, "begin", begin)
        monkeypatch.setattr(store, "wait", wait)

    def hold_until_waiting(self, count: int) -> Callable[[int], None]:
        """A ``before`` hook: the first write waits (bounded) until ``count`` other callers
        are waiting on its key, so they demonstrably arrived while the tool was running."""

        def hold(_number: int) -> None:
            deadline = time.monotonic() + HOLD_SECONDS
            while self.waiters < count and time.monotonic() < deadline:
                time.sleep(0.005)

        return hold


async def test_twenty_concurrent_calls_with_one_key_run_the_tool_once_and_share_its_result(
    make_server: ServerFactory,
    audit: MemoryAuditSink,
    workspace: Path,
    spy: WriteSpy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = make_server()
    claims = ClaimLog()
    claims.install(monkeypatch, server)
    spy.install(monkeypatch, server, before=claims.hold_until_waiting(19))
    args = {"path": "race.txt", "content": "exactly once", "idempotency_key": "k-race"}
    async with Client(server.mcp) as client:
        calls = [client.call_tool_mcp(WRITE, args) for _ in range(20)]
        results = [wire(r) for r in await asyncio.gather(*calls)]
    assert spy.calls == 1
    assert len(events(audit, TOOL_CALL_STARTED)) == 1
    # All twenty arrived while the one write was running: one claimed it, nineteen waited.
    assert claims.statuses.count(ClaimStatus.NEW) == 1
    assert claims.waiters == 19
    assert all(r["isError"] is False for r in results)
    assert len({json.dumps(r["structuredContent"], sort_keys=True) for r in results}) == 1
    assert sorted(bool(r["_meta"].get(META_REPLAYED)) for r in results) == [False] + [True] * 19
    assert (workspace / "race.txt").read_bytes() == b"exactly once"


async def test_replicas_sharing_one_store_run_a_keyed_write_once(
    shared_servers: Callable[..., tuple[NexusServer, MemoryAuditSink]],
    workspace: Path,
    spy: WriteSpy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, first_audit = shared_servers()
    second, second_audit = shared_servers()
    claims = ClaimLog()
    for server in (first, second):
        claims.install(monkeypatch, server)
        spy.install(monkeypatch, server, before=claims.hold_until_waiting(9))
    args = {"path": "replicas.txt", "content": "once", "idempotency_key": "k-replicas"}
    async with Client(first.mcp) as one, Client(second.mcp) as two:
        calls = [client.call_tool_mcp(WRITE, args) for client in (one, two) for _ in range(5)]
        results = [wire(r) for r in await asyncio.gather(*calls)]
    assert spy.calls == 1
    started = events(first_audit, TOOL_CALL_STARTED) + events(second_audit, TOOL_CALL_STARTED)
    assert len(started) == 1
    assert claims.statuses.count(ClaimStatus.NEW) == 1
    assert claims.waiters == 9
    assert len({json.dumps(r["structuredContent"], sort_keys=True) for r in results}) == 1
    assert sum(not r["_meta"].get(META_REPLAYED) for r in results) == 1
    assert (workspace / "replicas.txt").read_bytes() == b"once"


# --- refusals free the key ---------------------------------------------------------------


async def test_a_write_the_tool_refuses_is_not_recorded_so_a_corrected_retry_with_its_key_runs(
    make_server: ServerFactory, audit: MemoryAuditSink, workspace: Path
) -> None:
    (workspace / "e.txt").write_text("one two two\n")
    server = make_server()
    wrong = {
        "path": "e.txt",
        "old_text": "two",
        "new_text": "2",
        "expected_occurrences": 1,
        "idempotency_key": "k-e",
    }
    fixed = {**wrong, "expected_occurrences": 2}
    assert code_of(await call(server, "nexus_edit_file", wrong)) == "CONFLICT"
    # Not recorded: the same wrong call runs (and is refused by the tool) again, not replayed.
    assert code_of(await call(server, "nexus_edit_file", wrong)) == "CONFLICT"
    corrected = await call(server, "nexus_edit_file", fixed)
    assert corrected["isError"] is False and META_REPLAYED not in corrected["_meta"]
    assert (workspace / "e.txt").read_text() == "one 2 2\n"
    replay = await call(server, "nexus_edit_file", fixed)
    assert replay["_meta"][META_REPLAYED] is True
    assert code_of(await call(server, "nexus_edit_file", wrong)) == "IDEMPOTENCY_KEY_CONFLICT"
    assert len(events(audit, TOOL_CALL_STARTED)) == 3
    assert outcomes(audit) == ["abandoned", "abandoned", "executed", "replayed", "conflict"]


async def test_a_write_refused_before_it_runs_frees_its_key(
    make_server: ServerFactory, audit: MemoryAuditSink, workspace: Path
) -> None:
    server = make_server()
    refused = await call(
        server, WRITE, {"path": ".git/hooks/pre-commit", "content": "x", "idempotency_key": "k-r"}
    )
    assert code_of(refused) == "WRITE_POLICY_DENIED"
    allowed = await call(
        server, WRITE, {"path": "fine.txt", "content": "x", "idempotency_key": "k-r"}
    )
    assert allowed["isError"] is False
    assert (workspace / "fine.txt").read_bytes() == b"x"


# --- unknown outcomes: never run twice ---------------------------------------------------


async def test_a_claim_left_by_a_crash_before_recording_refuses_every_retry_with_its_key(
    make_server: ServerFactory, audit: MemoryAuditSink, workspace: Path
) -> None:
    server = make_server()
    args = {"path": "crash.txt", "content": "maybe written"}
    # Another process claimed the key, ran the tool and died before recording: its lease
    # (1 s, taken 10 s ago) has run out, the record itself (24 h) has not.
    crashed = SqliteIdempotencyStore(
        store_path(server), ttl_seconds=DAY, lease_seconds=1, clock=lambda: time.time() - 10
    )
    try:
        assert (
            crashed.begin(scope_of("k-crash", workspace=workspace), digest_of(args)).status
            is ClaimStatus.NEW
        )
    finally:
        crashed.close()
    before = snapshot(workspace)
    for meta in (None, {META_KEY: "k-crash"}):
        key_args = args if meta else {**args, "idempotency_key": "k-crash"}
        assert code_of(await call(server, WRITE, key_args, meta=meta)) == "IDEMPOTENCY_KEY_CONFLICT"
    assert snapshot(workspace) == before
    assert events(audit, TOOL_CALL_STARTED) == []
    assert outcomes(audit) == ["outcome_unknown", "outcome_unknown"]
    fresh = await call(server, WRITE, {**args, "idempotency_key": "k-crash-2"})
    assert fresh["isError"] is False


async def test_a_call_still_running_elsewhere_makes_a_retry_wait_then_refuse_without_running(
    make_server: ServerFactory, audit: MemoryAuditSink, workspace: Path
) -> None:
    server = make_server(registry={"idempotency_wait_seconds": 0.2})
    args = {"path": "busy.txt", "content": "busy"}
    other = SqliteIdempotencyStore(store_path(server))
    try:
        claim = other.begin(scope_of("k-busy", workspace=workspace), digest_of(args))
        assert claim.status is ClaimStatus.NEW
        refused = await call(server, WRITE, {**args, "idempotency_key": "k-busy"})
        assert code_of(refused) == "IDEMPOTENCY_KEY_CONFLICT"
        assert not (workspace / "busy.txt").exists()
        assert events(audit, TOOL_CALL_STARTED) == []
        assert other.abandon(claim)  # the other call was refused before its tool ran
    finally:
        other.close()
    retried = await call(server, WRITE, {**args, "idempotency_key": "k-busy"})
    assert retried["isError"] is False
    assert (workspace / "busy.txt").read_bytes() == b"busy"


async def test_a_write_that_failed_after_it_started_is_never_run_again_under_its_key(
    make_server: ServerFactory,
    audit: MemoryAuditSink,
    workspace: Path,
    spy: WriteSpy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = make_server()

    def fail_after_writing(number: int) -> None:
        if number == 1:
            raise RuntimeError("lost the connection after the rename")

    spy.install(monkeypatch, server, after=fail_after_writing)
    args = {"path": "half.txt", "content": "landed", "idempotency_key": "k-half"}
    assert code_of(await call(server, WRITE, args)) == "INTERNAL_ERROR"
    assert (workspace / "half.txt").read_bytes() == b"landed"
    assert code_of(await call(server, WRITE, args)) == "IDEMPOTENCY_KEY_CONFLICT"
    assert spy.calls == 1
    assert outcomes(audit) == ["outcome_unknown", "outcome_unknown"]


async def test_a_write_that_timed_out_after_it_acted_is_never_run_again_under_its_key(
    make_server: ServerFactory, workspace: Path, spy: WriteSpy, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(budgets={"tool_timeouts": {WRITE: TIMEOUT_SECONDS}})

    def stall_after_writing(number: int) -> None:
        if number == 1:
            time.sleep(STALL_SECONDS)  # the data landed; fsync of the folder is slow

    spy.install(monkeypatch, server, after=stall_after_writing)
    args = {"path": "late.txt", "content": "landed late", "idempotency_key": "k-late"}
    assert code_of(await call(server, WRITE, args)) == "TOOL_TIMEOUT"
    assert (workspace / "late.txt").read_bytes() == b"landed late"
    retry = await call(server, WRITE, args)
    assert spy.calls == 1, "the retry ran the write a second time"
    assert code_of(retry) == "IDEMPOTENCY_KEY_CONFLICT"


# --- expiry ------------------------------------------------------------------------------


def shift_clock(monkeypatch: pytest.MonkeyPatch, server: NexusServer, seconds: float) -> None:
    """Move the server's store clock (the store's injectable clock) forward."""
    monkeypatch.setattr(server.runtime.idempotency, "_clock", lambda: time.time() + seconds)


@pytest.mark.parametrize(
    ("ttl_setting", "ttl"), [(None, DAY), (600.0, 600.0)], ids=["default-24h", "configured"]
)
async def test_records_expire_after_the_configured_ttl(
    make_server: ServerFactory,
    audit: MemoryAuditSink,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    ttl_setting: float | None,
    ttl: float,
) -> None:
    server = make_server(
        **({"registry": {"idempotency_ttl_seconds": ttl_setting}} if ttl_setting else {})
    )
    args = {"path": "ttl.txt", "content": "first", "idempotency_key": "k-ttl"}
    assert (await call(server, WRITE, args))["isError"] is False
    shift_clock(monkeypatch, server, ttl - 60)
    assert (
        code_of(await call(server, WRITE, {**args, "content": "second"}))
        == "IDEMPOTENCY_KEY_CONFLICT"
    )
    assert (await call(server, WRITE, args))["_meta"][META_REPLAYED] is True
    shift_clock(monkeypatch, server, ttl + 1)
    after = await call(server, WRITE, {**args, "content": "second"})
    assert after["isError"] is False and META_REPLAYED not in after["_meta"]
    assert (workspace / "ttl.txt").read_bytes() == b"second"
    assert len(events(audit, TOOL_CALL_STARTED)) == 2


async def test_a_short_configured_ttl_is_honoured_or_refused_by_name(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        mode="dev",
        workspace=workspace,
        data_dir=tmp_path / "d",
        registry={"idempotency_ttl_seconds": 120},
    )
    try:
        server = build_server(settings, audit_sinks=[MemoryAuditSink()])
    except ConfigError as exc:
        assert "idempotency_ttl_seconds" in str(exc)
        return
    try:
        args = {"path": "short.txt", "content": "first", "idempotency_key": "k-short"}
        assert (await call(server, WRITE, args))["isError"] is False
        shift_clock(monkeypatch, server, 121)
        assert (await call(server, WRITE, {**args, "content": "second"}))["isError"] is False
    finally:
        server.close()


# --- audit of a replay -------------------------------------------------------------------


async def test_a_replay_is_audited_as_a_finished_call_not_a_blocked_one(
    make_server: ServerFactory, audit: MemoryAuditSink
) -> None:
    server = make_server()
    args = {"path": "a.txt", "content": "a", "idempotency_key": "k-a"}
    await call(server, WRITE, args)
    await call(server, WRITE, args)
    last = audit.records()[-1]
    assert (last["idempotency"], last["outcome"]) == ("replayed", "OK")
    assert last["event"] == TOOL_CALL_FINISHED
    assert events(audit, TOOL_CALL_BLOCKED) == []


# --- the target is part of the scope ------------------------------------------------------
#
# Issue 10, item 2: a record made on one workspace must never answer for another one served
# from the same data directory, while a retry on the same workspace after a restart (or
# through another path to the same folder) still replays without running again.


@dataclass(frozen=True)
class Operation:
    """One write tool: how to make its call valid on a folder, and how to see that it ran."""

    tool: str
    args: dict[str, Any]
    prepare: Callable[[Path], None]  # the folder state the call expects
    ran: Callable[[Path], bool]  # the call's effect is there
    code_on_empty: str | None  # what the call answers on a folder it was never prepared for


def _write_text(relative: str, text: str) -> Callable[[Path], None]:
    def prepare(root: Path) -> None:
        (root / relative).write_text(text, encoding="utf-8")

    return prepare


def _nothing(root: Path) -> None:
    return None


def _full_folder(root: Path) -> None:
    (root / "doomed-dir").mkdir()
    (root / "doomed-dir" / "inside.txt").write_text("inside", encoding="utf-8")


def _renamed(root: Path) -> bool:
    return not (root / "from.txt").exists() and (root / "to.txt").read_text() == "moving"


OPERATIONS = [
    Operation(
        "nexus_write_file",
        {"path": "written.txt", "content": "WRITTEN"},
        _nothing,
        lambda root: (
            (root / "written.txt").exists() and (root / "written.txt").read_text() == "WRITTEN"
        ),
        None,
    ),
    Operation(
        "nexus_edit_file",
        {"path": "edit.txt", "old_text": "OLD", "new_text": "NEW"},
        _write_text("edit.txt", "alpha OLD omega"),
        lambda root: (root / "edit.txt").read_text() == "alpha NEW omega",
        "NOT_FOUND",
    ),
    Operation(
        "nexus_delete_file",
        {"path": "doomed.txt"},
        _write_text("doomed.txt", "bye"),
        lambda root: not (root / "doomed.txt").exists(),
        "NOT_FOUND",
    ),
    Operation(
        "nexus_mkdir",
        {"path": "made"},
        _nothing,
        lambda root: (root / "made").is_dir(),
        None,
    ),
    Operation(
        "nexus_rmdir",
        {"path": "doomed-dir", "recursive": True},
        _full_folder,
        lambda root: not (root / "doomed-dir").exists(),
        "NOT_FOUND",
    ),
    Operation(
        "nexus_rename_file",
        {"source": "from.txt", "destination": "to.txt"},
        _write_text("from.txt", "moving"),
        _renamed,
        "NOT_FOUND",
    ),
]
OPERATION_IDS = [op.tool.removeprefix("nexus_") for op in OPERATIONS]


def reset(root: Path, operation: Operation) -> None:
    """Put a folder back to the state the call expects: a rerun would show as its effect."""
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    operation.prepare(root)


def folders(tmp_path: Path, operation: Operation, *names: str) -> list[Path]:
    made = []
    for name in names:
        root = tmp_path / name
        root.mkdir()
        operation.prepare(root)
        made.append(root)
    return made


def keyed(operation: Operation, key: str) -> dict[str, Any]:
    return {**operation.args, "idempotency_key": key}


def assert_ran(result: dict[str, Any], audit: MemoryAuditSink) -> None:
    assert result["isError"] is False, result
    assert META_REPLAYED not in result["_meta"]
    assert len(events(audit, TOOL_CALL_STARTED)) == 1
    assert outcomes(audit) == ["executed"]


def assert_replayed(result: dict[str, Any], first: dict[str, Any], audit: MemoryAuditSink) -> None:
    assert result["isError"] is False, result
    assert result["_meta"][META_REPLAYED] is True
    assert result["structuredContent"] == first["structuredContent"]
    assert events(audit, TOOL_CALL_STARTED) == []
    assert outcomes(audit) == ["replayed"]


ServeOn = Callable[..., tuple[NexusServer, MemoryAuditSink]]


@pytest.mark.parametrize("operation", OPERATIONS, ids=OPERATION_IDS)
async def test_a_key_used_on_one_workspace_runs_again_on_another_served_from_the_same_data_dir(
    shared_servers: ServeOn, tmp_path: Path, operation: Operation
) -> None:
    one, two = folders(tmp_path, operation, "ws-one", "ws-two")
    first_server, first_audit = shared_servers(workspace=one)
    first = await call(first_server, operation.tool, keyed(operation, "k-moved"))
    assert_ran(first, first_audit)
    assert operation.ran(one)
    first_server.close()  # stop, then serve another folder with the same data directory

    second_server, second_audit = shared_servers(workspace=two)
    assert store_path(second_server) == store_path(first_server)
    assert not operation.ran(two)
    second = await call(second_server, operation.tool, keyed(operation, "k-moved"))
    assert_ran(second, second_audit)
    assert operation.ran(two)


@pytest.mark.parametrize(
    "operation",
    [op for op in OPERATIONS if op.code_on_empty],
    ids=lambda op: op.tool.removeprefix("nexus_"),
)
async def test_a_key_used_on_one_workspace_gets_the_tools_refusal_where_the_file_is_missing(
    shared_servers: ServeOn, tmp_path: Path, operation: Operation
) -> None:
    """The reproduction: B has no file, so B's answer is the tool's, never A's recorded one."""
    (one,) = folders(tmp_path, operation, "ws-one")
    empty = tmp_path / "ws-empty"
    empty.mkdir()
    first_server, _ = shared_servers(workspace=one)
    assert (await call(first_server, operation.tool, keyed(operation, "k-a")))["isError"] is False
    first_server.close()

    second_server, second_audit = shared_servers(workspace=empty)
    refused = await call(second_server, operation.tool, keyed(operation, "k-a"))
    assert code_of(refused) == operation.code_on_empty
    assert "_meta" not in refused or META_REPLAYED not in refused["_meta"]
    assert list(empty.iterdir()) == []
    # The refusal freed the key on this workspace: once the file is there, the call runs.
    operation.prepare(empty)
    second_audit.clear()
    assert_ran(await call(second_server, operation.tool, keyed(operation, "k-a")), second_audit)


async def test_replicas_serving_two_folders_from_one_data_dir_each_run_the_same_key(
    shared_servers: ServeOn, tmp_path: Path
) -> None:
    operation = OPERATIONS[0]
    one, two = folders(tmp_path, operation, "ws-one", "ws-two")
    (server_one, audit_one), (server_two, audit_two) = (
        shared_servers(workspace=one),
        shared_servers(workspace=two),
    )
    first = await call(server_one, operation.tool, keyed(operation, "k-both"))
    second = await call(server_two, operation.tool, keyed(operation, "k-both"))
    assert_ran(first, audit_one)
    assert_ran(second, audit_two)
    assert operation.ran(one) and operation.ran(two)
    # Each replica still replays its own record.
    audit_one.clear()
    reset(one, operation)
    assert_replayed(
        await call(server_one, operation.tool, keyed(operation, "k-both")), first, audit_one
    )
    assert not operation.ran(one)


@pytest.mark.parametrize("operation", OPERATIONS, ids=OPERATION_IDS)
async def test_a_retry_on_the_same_workspace_after_a_restart_replays_without_running(
    shared_servers: ServeOn, tmp_path: Path, operation: Operation
) -> None:
    (root,) = folders(tmp_path, operation, "served")
    before, _ = shared_servers(workspace=root)
    first = await call(before, operation.tool, keyed(operation, "k-restart"))
    assert first["isError"] is False, first
    before.close()
    # Someone puts the folder back as it was: a rerun would be visible.
    reset(root, operation)
    untouched = snapshot(root)

    after, audit = shared_servers(workspace=root)
    retry = await call(after, operation.tool, keyed(operation, "k-restart"))
    assert_replayed(retry, first, audit)
    assert not operation.ran(root)
    assert snapshot(root) == untouched


def _symlinked(tmp_path: Path, root: Path) -> Path:
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    return alias


def _symlinked_parent(tmp_path: Path, root: Path) -> Path:
    parent = tmp_path / "parent-alias"
    parent.symlink_to(root.parent, target_is_directory=True)
    return parent / root.name


def _dotted(tmp_path: Path, root: Path) -> Path:
    (tmp_path / "detour").mkdir()
    return tmp_path / "detour" / ".." / "." / root.name


def _relative(tmp_path: Path, root: Path) -> Path:
    return Path(os.path.relpath(root))


ALIASES = [_symlinked, _symlinked_parent, _dotted, _relative]


@pytest.mark.parametrize("alias_of", ALIASES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("operation", OPERATIONS, ids=OPERATION_IDS)
async def test_the_same_workspace_reached_by_another_path_is_the_same_target(
    shared_servers: ServeOn,
    tmp_path: Path,
    operation: Operation,
    alias_of: Callable[[Path, Path], Path],
) -> None:
    (root,) = folders(tmp_path, operation, "served")
    direct, _ = shared_servers(workspace=root)
    first = await call(direct, operation.tool, keyed(operation, "k-alias"))
    assert first["isError"] is False, first
    direct.close()
    reset(root, operation)

    aliased, audit = shared_servers(workspace=alias_of(tmp_path, root))
    retry = await call(aliased, operation.tool, keyed(operation, "k-alias"))
    assert_replayed(retry, first, audit)
    assert not operation.ran(root)


async def test_a_workspace_moved_to_another_path_is_a_new_target_and_runs_the_call(
    shared_servers: ServeOn, tmp_path: Path
) -> None:
    """The documented edge (targets.py): moving a folder fails towards running again."""
    operation = OPERATIONS[0]
    (root,) = folders(tmp_path, operation, "served")
    before, _ = shared_servers(workspace=root)
    assert (await call(before, operation.tool, keyed(operation, "k-move")))["isError"] is False
    before.close()
    moved = root.rename(tmp_path / "served-moved")
    reset(moved, operation)
    after, audit = shared_servers(workspace=moved)
    assert_ran(await call(after, operation.tool, keyed(operation, "k-move")), audit)
    assert operation.ran(moved)


@nexus_tool(risk="write", toolset="untargeted")
async def stamp_elsewhere(name: str, idempotency_key: str | None = None) -> dict[str, bool]:
    """A write tool from a toolset that names no target."""
    raise AssertionError("a write with no known target must never run")


async def test_a_write_whose_toolset_names_no_target_is_refused_before_any_record(
    workspace: Path, tmp_path: Path
) -> None:
    audit = MemoryAuditSink()
    settings = Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "data")
    with structlog.testing.capture_logs() as logs:
        server = build_server(settings, audit_sinks=[audit], extra_tools=[stamp_elsewhere])
    try:
        assert {
            "event": "write_tools_without_target",
            "tools": ["stamp_elsewhere"],
            "log_level": "warning",
        } in logs
        grant_tool(server.runtime.grants, "dev", "stamp_elsewhere", settings.profiles.zone)
        result = await call(server, "stamp_elsewhere", {"name": "x", "idempotency_key": "k"})
        assert code_of(result) == "WRITE_POLICY_DENIED"
        (blocked,) = events(audit, TOOL_CALL_BLOCKED)
        assert blocked["facts"] == {"rule": RULE_UNKNOWN_TARGET}
        assert events(audit, TOOL_CALL_STARTED) == []
        with closing(sqlite3.connect(store_path(server))) as conn:
            assert conn.execute("SELECT count(*) FROM idempotency_records").fetchone() == (0,)
    finally:
        server.close()
