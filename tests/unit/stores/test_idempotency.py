"""Idempotency records on real SQLite and PostgreSQL: replay, conflict, exactly-once, expiry,
crash, scope. Every test runs on both backends unless it names one."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import Code, IdempotencyKeyConflictError, InternalError
from nexus_mcp.stores.idempotency import (
    Claim,
    ClaimStatus,
    IdempotencyScope,
    IdempotencyStore,
    SqliteIdempotencyStore,
    to_refusal,
)
from nexus_mcp.stores.postgres import PostgresPool
from nexus_mcp.stores.postgres_idempotency import PostgresIdempotencyStore
from tests.unit.stores.conftest import BACKENDS, PoolFactory

REPO = Path(__file__).resolve().parents[3]
TARGET = "f" * 64
SCOPE = IdempotencyScope("alice", "nexus", "nexus_write_file", "key-1", target=TARGET)
ARGS = "a" * 64
OTHER_ARGS = "b" * 64
TTL = 1000.0
LEASE = 60.0


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingTool:
    """A write tool that counts how often it really runs."""

    def __init__(self) -> None:
        self.runs = 0
        self._lock = threading.Lock()

    async def __call__(self) -> str:
        with self._lock:
            self.runs += 1
            run = self.runs
        for _ in range(5):  # give the other callers a chance to arrive mid-run
            await asyncio.sleep(0)
        return json.dumps({"written": True, "run": run})


async def call_once(
    store: IdempotencyStore,
    scope: IdempotencyScope,
    args_digest: str,
    tool: Callable[[], Awaitable[str]],
    *,
    wait_timeout: float = 10.0,
) -> str:
    """What the lead's middleware does with a claim, reduced to its decisions."""
    claim = store.begin(scope, args_digest)
    if claim.status is ClaimStatus.IN_PROGRESS:
        claim = await store.wait(scope, args_digest, wait_timeout)
    refusal = to_refusal(claim)
    if refusal is not None:
        raise refusal
    if claim.status is ClaimStatus.REPLAY:
        assert claim.result_json is not None
        return claim.result_json
    result = await tool()
    assert store.complete(claim, result)
    return result


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class Backend:
    """Opens idempotency stores on one storage: a SQLite file, or a PostgreSQL database
    through a new pool each (another replica, or the same one after a restart)."""

    def __init__(self, name: str, tmp_path: Path, pools: PoolFactory | None, url: str) -> None:
        self.name = name
        self.path = tmp_path / "idem.sqlite3"
        self.url = url
        self._pools = pools
        self._opened: list[IdempotencyStore] = []

    def open(self, **options: Any) -> IdempotencyStore:
        store: IdempotencyStore
        if self.name == "sqlite":
            store = SqliteIdempotencyStore(self.path, **options)
        else:
            assert self._pools is not None
            store = PostgresIdempotencyStore(self._pools(self.url), **options)
        self._opened.append(store)
        return store

    def pool(self) -> PostgresPool:
        assert self._pools is not None
        return self._pools(self.url)

    def close(self) -> None:
        for store in self._opened:
            store.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        opened = Backend("sqlite", tmp_path, None, "")
    else:
        url: str = request.getfixturevalue("migrated_url")
        opened = Backend("postgres", tmp_path, request.getfixturevalue("pg_pools"), url)
    yield opened
    opened.close()


@pytest.fixture
def store(backend: Backend, clock: FakeClock) -> IdempotencyStore:
    return backend.open(ttl_seconds=TTL, lease_seconds=LEASE, clock=clock)


async def test_a_retry_with_the_same_key_and_arguments_replays_without_running(
    store: IdempotencyStore,
) -> None:
    tool = CountingTool()
    first = await call_once(store, SCOPE, ARGS, tool)
    second = await call_once(store, SCOPE, ARGS, tool)
    assert tool.runs == 1
    assert second == first == json.dumps({"written": True, "run": 1})


def test_the_same_key_with_different_arguments_is_a_conflict(
    store: IdempotencyStore,
) -> None:
    claim = store.begin(SCOPE, ARGS)
    assert store.complete(claim, "{}")
    conflict = store.begin(SCOPE, OTHER_ARGS)
    assert conflict.status is ClaimStatus.CONFLICT
    refusal = to_refusal(conflict)
    assert refusal is not None and refusal.code == Code.IDEMPOTENCY_KEY_CONFLICT
    # Also while the first call is still running.
    other = IdempotencyScope("alice", "nexus", "nexus_write_file", "key-2", target=TARGET)
    store.begin(other, ARGS)
    assert store.begin(other, OTHER_ARGS).status is ClaimStatus.CONFLICT


async def test_twenty_concurrent_calls_with_one_key_run_the_tool_once(
    store: IdempotencyStore,
) -> None:
    tool = CountingTool()
    results = await asyncio.gather(*(call_once(store, SCOPE, ARGS, tool) for _ in range(20)))
    assert tool.runs == 1
    assert set(results) == {json.dumps({"written": True, "run": 1})}


def test_concurrent_threads_with_one_key_run_the_tool_once(backend: Backend) -> None:
    store = backend.open()
    tool = CountingTool()
    results: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        try:
            results.append(asyncio.run(call_once(store, SCOPE, ARGS, tool)))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert tool.runs == 1
    assert len(results) == 8 and len(set(results)) == 1
    store.close()


def test_concurrent_processes_with_one_key_claim_it_once(tmp_path: Path) -> None:
    """SQLite: processes sharing one file (PostgreSQL: test_postgres.py, replicas)."""
    path = tmp_path / "idem.sqlite3"
    SqliteIdempotencyStore(path).close()
    script = (
        "import sys\n"
        "from nexus_mcp.stores.idempotency import IdempotencyScope, SqliteIdempotencyStore\n"
        "store = SqliteIdempotencyStore(sys.argv[1])\n"
        "claim = store.begin(IdempotencyScope('alice', 'nexus', 'w', 'k', target='t'), 'a' * 64)\n"
        "print(claim.status.value)\n"
    )
    env = {"PYTHONPATH": str(REPO / "src")}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(4)
    ]
    statuses = sorted(process.communicate(timeout=60)[0].strip() for process in processes)
    assert statuses == ["in_progress", "in_progress", "in_progress", "new"]


def test_records_expire_after_the_ttl(store: IdempotencyStore, clock: FakeClock) -> None:
    claim = store.begin(SCOPE, ARGS)
    assert store.complete(claim, '{"ok":1}')
    clock.now += TTL - 1
    assert store.begin(SCOPE, ARGS).status is ClaimStatus.REPLAY
    clock.now += 1
    fresh = store.begin(SCOPE, OTHER_ARGS)
    assert fresh.status is ClaimStatus.NEW


def test_purge_removes_only_expired_records(store: IdempotencyStore, clock: FakeClock) -> None:
    store.complete(store.begin(SCOPE, ARGS), "{}")
    clock.now += TTL / 2
    later = IdempotencyScope("alice", "nexus", "nexus_write_file", "key-2", target=TARGET)
    store.complete(store.begin(later, ARGS), "{}")
    assert store.purge_expired() == 0
    assert store.purge_expired(clock.now + TTL / 2) == 1
    assert store.begin(later, ARGS).status is ClaimStatus.REPLAY
    assert store.begin(SCOPE, ARGS).status is ClaimStatus.NEW


def test_a_crash_between_running_and_recording_refuses_the_retry(
    backend: Backend, clock: FakeClock
) -> None:
    crashed = backend.open(ttl_seconds=TTL, lease_seconds=LEASE, clock=clock)
    assert crashed.begin(SCOPE, ARGS).status is ClaimStatus.NEW
    crashed.close()  # the process died: no complete, no abandon
    del crashed

    reopened = backend.open(ttl_seconds=TTL, lease_seconds=LEASE, clock=clock)
    clock.now += 1
    assert reopened.begin(SCOPE, ARGS).status is ClaimStatus.IN_PROGRESS
    clock.now += LEASE
    unknown = reopened.begin(SCOPE, ARGS)
    assert unknown.status is ClaimStatus.OUTCOME_UNKNOWN
    refusal = to_refusal(unknown)
    assert refusal is not None
    assert (refusal.code, refusal.facts) == (
        Code.IDEMPOTENCY_KEY_CONFLICT,
        {"reason": "outcome_unknown"},
    )
    # Never run again under this key until the record expires.
    clock.now += TTL - LEASE - 2
    assert reopened.begin(SCOPE, ARGS).status is ClaimStatus.OUTCOME_UNKNOWN
    reopened.close()


async def test_a_retry_after_a_crash_does_not_run_the_tool(
    backend: Backend, clock: FakeClock
) -> None:
    crashed = backend.open(ttl_seconds=TTL, lease_seconds=LEASE, clock=clock)
    crashed.begin(SCOPE, ARGS)
    crashed.close()
    reopened = backend.open(ttl_seconds=TTL, lease_seconds=LEASE, clock=clock)
    clock.now += LEASE
    tool = CountingTool()
    with pytest.raises(IdempotencyKeyConflictError):
        await call_once(reopened, SCOPE, ARGS, tool)
    assert tool.runs == 0
    reopened.close()


def test_a_renewed_claim_stays_in_progress_past_its_first_lease_and_ttl(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.open(ttl_seconds=LEASE * 2, lease_seconds=LEASE, clock=clock)
    claim = store.begin(SCOPE, ARGS)
    for _ in range(4):  # waits for an approver longer than the lease, and than the TTL
        clock.now += LEASE - 1
        assert store.renew(claim)
        assert store.begin(SCOPE, ARGS).status is ClaimStatus.IN_PROGRESS
    assert store.complete(claim, json.dumps("done"))
    assert store.begin(SCOPE, ARGS).status is ClaimStatus.REPLAY
    assert not store.renew(claim)  # settled: nothing to renew


def test_only_the_owner_of_a_pending_claim_renews_it(store: IdempotencyStore) -> None:
    claim = store.begin(SCOPE, ARGS)
    waiter = store.begin(SCOPE, ARGS)
    assert waiter.status is ClaimStatus.IN_PROGRESS and not store.renew(waiter)
    forged = Claim(ClaimStatus.NEW, SCOPE, ARGS, token="0" * 32)
    assert not store.renew(forged)
    assert store.abandon(claim) and not store.renew(claim)


def test_keys_are_scoped_by_subject_server_tool_and_target(store: IdempotencyStore) -> None:
    scopes = [
        SCOPE,
        IdempotencyScope("bob", "nexus", "nexus_write_file", "key-1", target=TARGET),
        IdempotencyScope("alice", "other", "nexus_write_file", "key-1", target=TARGET),
        IdempotencyScope("alice", "nexus", "nexus_edit_file", "key-1", target=TARGET),
        IdempotencyScope("alice", "nexus", "nexus_write_file", "key-1", target="e" * 64),
        IdempotencyScope("alice", "nexus", "nexus_write_file", "key-1", target=""),
        # Field boundaries cannot be shifted to forge another scope.
        IdempotencyScope("alicenexus", "", "nexus_write_file", "key-1", target=TARGET),
        IdempotencyScope("alice", "nexus", "nexus_write_file", TARGET, target="key-1"),
    ]
    assert len({scope.digest() for scope in scopes}) == len(scopes)
    for index, scope in enumerate(scopes):
        claim = store.begin(scope, f"{index:064d}")
        assert claim.status is ClaimStatus.NEW
        assert store.complete(claim, json.dumps(index))
    for index, scope in enumerate(scopes):
        assert store.begin(scope, f"{index:064d}").result_json == json.dumps(index)


def test_the_database_holds_no_subject_key_or_target_in_clear(backend: Backend) -> None:
    store = backend.open()
    secret = IdempotencyScope(
        "subject-7f3a", "nexus", "nexus_write_file", "key-9c1d", target="target-4e2b"
    )
    store.complete(store.begin(secret, ARGS), "{}")
    store.close()
    if backend.name == "sqlite":
        stored = b"".join(p.read_bytes() for p in backend.path.parent.iterdir())
    else:
        with backend.pool().connection() as conn:
            rows = conn.execute("SELECT r::text FROM idempotency_records r").fetchall()
        assert len(rows) == 1
        stored = "".join(row[0] for row in rows).encode()
    for clear in (b"subject-7f3a", b"key-9c1d", b"target-4e2b"):
        assert clear not in stored


async def test_an_abandoned_claim_lets_the_retry_run(store: IdempotencyStore) -> None:
    claim = store.begin(SCOPE, ARGS)
    assert store.abandon(claim)
    tool = CountingTool()
    await call_once(store, SCOPE, ARGS, tool)
    assert tool.runs == 1


def test_only_the_owner_of_a_new_claim_can_settle_it(store: IdempotencyStore) -> None:
    owner = store.begin(SCOPE, ARGS)
    onlooker = store.begin(SCOPE, ARGS)
    forged = Claim(ClaimStatus.NEW, SCOPE, ARGS, token="0" * 32)
    assert onlooker.status is ClaimStatus.IN_PROGRESS
    assert not store.complete(onlooker, "{}")
    assert not store.abandon(onlooker)
    assert not store.mark_unknown(forged)
    assert store.complete(owner, '{"v":1}')
    assert not store.complete(owner, '{"v":2}')  # settled once
    assert not store.abandon(owner)
    assert store.begin(SCOPE, ARGS).result_json == '{"v":1}'


def test_a_claim_marked_unknown_refuses_retries(store: IdempotencyStore) -> None:
    claim = store.begin(SCOPE, ARGS)
    assert store.mark_unknown(claim)
    assert store.begin(SCOPE, ARGS).status is ClaimStatus.OUTCOME_UNKNOWN
    assert not store.complete(claim, "{}")


def test_a_late_completion_by_the_owner_still_records_the_result(
    store: IdempotencyStore, clock: FakeClock
) -> None:
    claim = store.begin(SCOPE, ARGS)
    clock.now += LEASE + 1
    assert store.begin(SCOPE, ARGS).status is ClaimStatus.OUTCOME_UNKNOWN
    assert store.complete(claim, '{"late":true}')
    assert store.begin(SCOPE, ARGS).status is ClaimStatus.REPLAY


def test_a_stale_owner_cannot_touch_a_key_reclaimed_after_expiry(
    store: IdempotencyStore, clock: FakeClock
) -> None:
    stale = store.begin(SCOPE, ARGS)
    clock.now += TTL
    fresh = store.begin(SCOPE, ARGS)
    assert fresh.status is ClaimStatus.NEW
    assert not store.complete(stale, '{"stale":true}')
    assert store.complete(fresh, '{"fresh":true}')
    assert store.begin(SCOPE, ARGS).result_json == '{"fresh":true}'


async def test_waiting_gives_up_after_the_timeout_with_in_progress(
    store: IdempotencyStore,
) -> None:
    store.begin(SCOPE, ARGS)
    claim = await store.wait(SCOPE, ARGS, 0.02)
    assert claim.status is ClaimStatus.IN_PROGRESS
    refusal = to_refusal(claim)
    assert refusal is not None and refusal.facts == {"reason": "in_progress"}


async def test_a_waiter_takes_over_when_the_owner_abandons(store: IdempotencyStore) -> None:
    owner = store.begin(SCOPE, ARGS)

    async def abandon_soon() -> None:
        await asyncio.sleep(0)
        store.abandon(owner)

    claim, _ = await asyncio.gather(store.wait(SCOPE, ARGS, 10.0), abandon_soon())
    assert claim.status is ClaimStatus.NEW and claim.token not in (None, owner.token)


def test_new_and_replay_claims_are_not_refusals(store: IdempotencyStore) -> None:
    claim = store.begin(SCOPE, ARGS)
    assert to_refusal(claim) is None
    store.complete(claim, "{}")
    assert to_refusal(store.begin(SCOPE, ARGS)) is None


@pytest.mark.parametrize(("ttl", "lease"), [(0, 1), (10, 0), (10, 11), (-1, -2)])
def test_a_lease_longer_than_the_ttl_is_refused(backend: Backend, ttl: float, lease: float) -> None:
    with pytest.raises(ValueError):
        backend.open(ttl_seconds=ttl, lease_seconds=lease)


def test_a_failed_recording_rolls_back_and_leaves_the_claim_pending(
    store: IdempotencyStore, backend: Backend
) -> None:
    claim = store.begin(SCOPE, ARGS)
    # A bad statement is a fault of the caller, not an outage: never UNAVAILABLE.
    expected = sqlite3.ProgrammingError if backend.name == "sqlite" else InternalError
    with pytest.raises(expected):
        store.complete(claim, object())  # type: ignore[arg-type]
    assert store.begin(SCOPE, ARGS).status is ClaimStatus.IN_PROGRESS
    assert store.complete(claim, "{}")


def test_purge_on_an_empty_store_removes_nothing(store: IdempotencyStore) -> None:
    assert store.purge_expired() == 0
