"""The nonce stores: single use, expiry, fail-closed bounds and atomicity; the SQLite one
also across restarts, connections and processes (real SQLite files in tmp_path)."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

from nexus_mcp.errors import Code, ConfigError, NexusError
from nexus_mcp.stores.nonces import (
    NONCE_STORE_UNAVAILABLE,
    MemoryNonceStore,
    NonceStore,
    SqliteNonceStore,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_memory_store_is_a_nonce_store() -> None:
    assert isinstance(MemoryNonceStore(), NonceStore)


def test_a_nonce_is_consumed_the_first_time_only() -> None:
    store = MemoryNonceStore(clock=FakeClock())
    assert [store.consume("a", 2000.0) for _ in range(3)] == [True, False, False]


def test_different_nonces_are_independent() -> None:
    store = MemoryNonceStore(clock=FakeClock())
    assert [store.consume(j, 2000.0) for j in ("a", "b", "c", "a")] == [True, True, True, False]


def test_a_nonce_is_remembered_until_it_expires_then_forgotten() -> None:
    clock = FakeClock(1000.0)
    store = MemoryNonceStore(clock=clock)
    store.consume("a", 1100.0)
    store.consume("b", 1200.0)
    clock.now = 1099.9
    assert store.consume("a", 1100.0) is False
    assert len(store) == 2
    clock.now = 1100.0
    assert len(store) == 1
    assert store.consume("b", 1200.0) is False
    clock.now = 1200.0
    assert len(store) == 0


def test_a_full_store_refuses_new_nonces_instead_of_evicting_live_ones() -> None:
    clock = FakeClock(1000.0)
    store = MemoryNonceStore(maxsize=2, clock=clock)
    assert store.consume("a", 1100.0)
    assert store.consume("b", 1300.0)
    with pytest.raises(NexusError) as caught:
        store.consume("c", 1300.0)
    assert caught.value.code == Code.RATE_LIMITED
    assert store.consume("a", 1100.0) is False  # still remembered: no replay window
    clock.now = 1100.0
    assert store.consume("c", 1300.0) is True


@pytest.mark.parametrize("maxsize", [0, -1, True, 1.5])
def test_a_store_size_that_is_not_a_positive_integer_is_a_config_error(maxsize: object) -> None:
    with pytest.raises(ConfigError):
        MemoryNonceStore(maxsize=maxsize)  # type: ignore[arg-type]


def test_fifty_threads_consuming_one_nonce_get_exactly_one_true() -> None:
    store = MemoryNonceStore(clock=FakeClock())
    barrier = threading.Barrier(50)

    def consume_once(_: int) -> bool:
        barrier.wait(timeout=10)
        return store.consume("shared", 2000.0)

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(consume_once, range(50)))
    assert results.count(True) == 1


async def test_fifty_tasks_consuming_one_nonce_get_exactly_one_true() -> None:
    store = MemoryNonceStore(clock=FakeClock())

    async def consume_once() -> bool:
        await asyncio.sleep(0)  # interleave the tasks before they reach the store
        return store.consume("shared", 2000.0)

    results = await asyncio.gather(*(consume_once() for _ in range(50)))
    assert results.count(True) == 1


def test_many_nonces_across_threads_are_each_consumed_once() -> None:
    store = MemoryNonceStore(clock=FakeClock())

    def consume_all(_: int) -> int:
        return sum(store.consume(f"n{i}", 2000.0) for i in range(500))

    with ThreadPoolExecutor(max_workers=8) as pool:
        totals = list(pool.map(consume_all, range(8)))
    assert sum(totals) == 500
    assert len(store) == 500


# --- the SQLite store: durable, shared by processes, fail-closed --------------------------

REPO = Path(__file__).resolve().parents[3]
EXPIRES = 2000.0


@pytest.fixture
def nonce_path(tmp_path: Path) -> Path:
    return tmp_path / "nonces.sqlite3"


@pytest.fixture
def sqlite_store(nonce_path: Path) -> Iterator[SqliteNonceStore]:
    store = SqliteNonceStore(nonce_path, clock=FakeClock())
    yield store
    store.close()


def rows(path: Path) -> list[tuple[str, float]]:
    with closing(sqlite3.connect(path)) as conn:
        return list(conn.execute("SELECT jti_sha256, expires_at FROM used_nonces"))


def test_the_sqlite_store_is_a_nonce_store(sqlite_store: SqliteNonceStore) -> None:
    assert isinstance(sqlite_store, NonceStore)


def test_a_nonce_in_the_sqlite_store_is_consumed_the_first_time_only(
    sqlite_store: SqliteNonceStore,
) -> None:
    assert [sqlite_store.consume(j, EXPIRES) for j in ("a", "b", "a", "b", "c")] == [
        True,
        True,
        False,
        False,
        True,
    ]


def test_a_used_nonce_stays_used_after_the_store_is_closed_and_reopened(nonce_path: Path) -> None:
    clock = FakeClock()
    first = SqliteNonceStore(nonce_path, clock=clock)
    assert first.consume("spent-before-restart", EXPIRES)
    first.close()
    reopened = SqliteNonceStore(nonce_path, clock=clock)
    try:
        assert reopened.consume("spent-before-restart", EXPIRES) is False
        assert reopened.consume("fresh-after-restart", EXPIRES) is True
    finally:
        reopened.close()


def test_two_stores_on_one_file_share_what_was_used(nonce_path: Path) -> None:
    clock = FakeClock()
    one, other = (
        SqliteNonceStore(nonce_path, clock=clock),
        SqliteNonceStore(nonce_path, clock=clock),
    )
    try:
        assert one.consume("shared", EXPIRES) is True
        assert other.consume("shared", EXPIRES) is False
        assert other.consume("second", EXPIRES) is True
        assert one.consume("second", EXPIRES) is False
    finally:
        one.close()
        other.close()


def test_a_sqlite_nonce_is_remembered_until_it_expires_then_purged(nonce_path: Path) -> None:
    clock = FakeClock(1000.0)
    store = SqliteNonceStore(nonce_path, clock=clock)
    try:
        store.consume("a", 1100.0)
        store.consume("b", 1200.0)
        clock.now = 1099.9
        assert store.consume("a", 1100.0) is False
        assert len(store) == 2
        clock.now = 1100.0
        assert len(store) == 1
        assert store.consume("b", 1200.0) is False
        # Consuming drops every expired id from the file, not only the one it looks at.
        assert len(rows(nonce_path)) == 1
        clock.now = 1200.0
        assert store.consume("c", 1300.0) is True
        assert [expires for _, expires in rows(nonce_path)] == [1300.0]
    finally:
        store.close()


def test_purging_removes_only_expired_nonces(sqlite_store: SqliteNonceStore) -> None:
    sqlite_store.consume("early", 1100.0)
    sqlite_store.consume("late", 1300.0)
    assert sqlite_store.purge_expired(now=1050.0) == 0
    assert sqlite_store.purge_expired(now=1200.0) == 1
    assert sqlite_store.consume("late", 1300.0) is False
    assert len(sqlite_store) == 1


def test_the_sqlite_store_keeps_only_the_sha256_of_each_nonce(
    nonce_path: Path, sqlite_store: SqliteNonceStore
) -> None:
    jti = "jti-CANARY-7c0f-0123456789abcdef"
    assert sqlite_store.consume(jti, EXPIRES)
    sqlite_store.close()
    stored = b"".join(p.read_bytes() for p in nonce_path.parent.iterdir())
    assert jti.encode() not in stored
    assert rows(nonce_path) == [(hashlib.sha256(jti.encode()).hexdigest(), EXPIRES)]


def test_fifty_threads_consuming_one_sqlite_nonce_get_exactly_one_true(
    sqlite_store: SqliteNonceStore,
) -> None:
    barrier = threading.Barrier(50)

    def consume_once(_: int) -> bool:
        barrier.wait(timeout=10)
        return sqlite_store.consume("shared", EXPIRES)

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(consume_once, range(50)))
    assert results.count(True) == 1


def test_threads_with_their_own_connections_consume_each_nonce_once(nonce_path: Path) -> None:
    stores = [SqliteNonceStore(nonce_path, clock=FakeClock()) for _ in range(8)]
    barrier = threading.Barrier(len(stores))

    def consume_all(store: SqliteNonceStore) -> list[str]:
        barrier.wait(timeout=10)
        return [f"n{i}" for i in range(200) if store.consume(f"n{i}", EXPIRES)]

    try:
        with ThreadPoolExecutor(max_workers=len(stores)) as pool:
            won = [jti for batch in pool.map(consume_all, stores) for jti in batch]
    finally:
        for store in stores:
            store.close()
    assert sorted(won) == sorted(f"n{i}" for i in range(200))


def test_processes_sharing_the_file_consume_each_nonce_exactly_once(nonce_path: Path) -> None:
    SqliteNonceStore(nonce_path).close()
    script = (
        "import sys\n"
        "from nexus_mcp.stores.nonces import SqliteNonceStore\n"
        "store = SqliteNonceStore(sys.argv[1], clock=lambda: 1000.0)\n"
        "print(' '.join(f'n{i}' for i in range(300) if store.consume(f'n{i}', 2000.0)))\n"
        "store.close()\n"
    )
    env = {"PYTHONPATH": str(REPO / "src")}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(nonce_path)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(4)
    ]
    won = [jti for p in processes for jti in p.communicate(timeout=60)[0].split()]
    assert all(p.returncode == 0 for p in processes)
    assert sorted(won) == sorted(f"n{i}" for i in range(300))


def test_a_store_locked_by_another_writer_refuses_instead_of_accepting(nonce_path: Path) -> None:
    store = SqliteNonceStore(nonce_path, clock=FakeClock(), busy_timeout_seconds=0.05)
    holder = sqlite3.connect(nonce_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
        with pytest.raises(NexusError) as caught:
            store.consume("blocked", EXPIRES)
        assert caught.value.code == Code.INTERNAL_ERROR
        assert caught.value.facts == {"reason": NONCE_STORE_UNAVAILABLE}
        holder.execute("ROLLBACK")
        # The refused attempt recorded nothing; the store works again once the lock is gone.
        assert store.consume("blocked", EXPIRES) is True
        assert store.consume("blocked", EXPIRES) is False
    finally:
        holder.close()
        store.close()


def test_a_tampered_store_refuses_every_nonce_instead_of_accepting(
    nonce_path: Path, sqlite_store: SqliteNonceStore
) -> None:
    assert sqlite_store.consume("spent", EXPIRES)
    with closing(sqlite3.connect(nonce_path, isolation_level=None)) as tamper:
        tamper.execute("DROP TABLE used_nonces")
    for jti in ("spent", "fresh"):
        with pytest.raises(NexusError) as caught:
            sqlite_store.consume(jti, EXPIRES)
        assert caught.value.code == Code.INTERNAL_ERROR


def test_a_closed_store_refuses_every_nonce_instead_of_accepting(nonce_path: Path) -> None:
    store = SqliteNonceStore(nonce_path, clock=FakeClock())
    store.close()
    with pytest.raises(NexusError) as caught:
        store.consume("after-close", EXPIRES)
    assert caught.value.code == Code.INTERNAL_ERROR
