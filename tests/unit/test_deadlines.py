"""DeadlineWatch: asyncio.timeout's behaviour for many calls on one event-loop timer."""

from __future__ import annotations

import asyncio
import time

import pytest

from nexus_mcp.middleware.deadlines import DeadlineWatch


async def test_a_call_past_its_deadline_ends_in_timeout_error_on_time() -> None:
    watch = DeadlineWatch()
    start = time.monotonic()
    within = watch.within(0.05)
    with pytest.raises(TimeoutError):
        async with within:
            await asyncio.sleep(5)
    assert within.expired
    assert 0.04 <= time.monotonic() - start < 1.0
    assert len(watch) == 0
    await asyncio.sleep(0)  # no cancellation left pending on the task


async def test_a_call_in_time_is_untouched_and_leaves_nothing_pending() -> None:
    watch = DeadlineWatch()
    within = watch.within(5)
    async with within:
        await asyncio.sleep(0.01)
    assert not within.expired and len(watch) == 0
    await asyncio.sleep(0.01)


async def test_concurrent_calls_each_expire_at_their_own_deadline() -> None:
    watch = DeadlineWatch()
    ended: dict[str, float] = {}
    start = time.monotonic()

    async def call(name: str, seconds: float, runs: float) -> str:
        try:
            async with watch.within(seconds):
                await asyncio.sleep(runs)
            return "ok"
        except TimeoutError:
            return "timeout"
        finally:
            ended[name] = time.monotonic() - start

    # The long deadline arms the timer first; the shorter ones must re-arm it earlier.
    results = await asyncio.gather(
        call("long", 5.0, 0.3), call("short", 0.05, 5), call("mid", 0.15, 5), call("fast", 1, 0)
    )
    assert results == ["ok", "timeout", "timeout", "ok"]
    assert 0.04 <= ended["short"] < ended["mid"] < 1.0
    assert ended["mid"] >= 0.14
    assert len(watch) == 0


async def test_someone_elses_cancellation_stays_a_cancellation() -> None:
    watch = DeadlineWatch()

    async def call() -> None:
        async with watch.within(5):
            await asyncio.sleep(5)

    task = asyncio.create_task(call())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(watch) == 0


async def test_sequential_calls_share_one_timer() -> None:
    watch = DeadlineWatch()
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    for _ in range(500):
        async with watch.within(30):
            await asyncio.sleep(0)
    assert len(loop._scheduled) - before <= 1  # type: ignore[attr-defined]
