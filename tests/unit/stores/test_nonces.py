"""The in-memory nonce store: single use, expiry, fail-closed bound, and atomicity."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from nexus_mcp.errors import Code, ConfigError, NexusError
from nexus_mcp.stores.nonces import MemoryNonceStore, NonceStore


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
