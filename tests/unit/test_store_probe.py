"""``StoreProbe``: what ``/readyz`` says about the state store, and how often it asks.

A real blocking probe on a real thread: a store that raises (whatever its text), one that
hangs past the bound, one that answers; answers are cached for the interval and concurrent
askers share one probe.
"""

from __future__ import annotations

import asyncio
import threading
import time

from nexus_mcp.server.health import StoreProbe, public_readiness, readiness_status_code

SECRET_TEXT = "redis://:hunter2-CANARY@10.0.0.5:6379 refused"


async def test_a_failing_store_is_unreachable_and_its_text_goes_nowhere() -> None:
    def probe() -> None:
        raise ConnectionError(SECRET_TEXT)

    reason = await StoreProbe(probe, timeout=1.0, interval=0.0).reason()
    assert reason == "unreachable"
    body = public_readiness(None, reason)
    assert body == {
        "status": "not_ready",
        "components": {"server": "ready", "state_store": "unavailable"},
        "reasons": {"state_store": "unreachable"},
    }
    assert readiness_status_code(body) == 503
    assert "CANARY" not in repr(body)


async def test_a_store_slower_than_the_bound_is_a_timeout_and_the_route_does_not_wait() -> None:
    release = threading.Event()
    store = StoreProbe(lambda: release.wait(5), timeout=0.1, interval=0.0)
    began = time.monotonic()
    try:
        assert await store.reason() == "timeout"
        assert time.monotonic() - began < 2
    finally:
        release.set()


async def test_concurrent_askers_share_one_probe_per_interval() -> None:
    calls: list[float] = []

    def probe() -> None:
        calls.append(time.monotonic())
        time.sleep(0.05)

    store = StoreProbe(probe, timeout=1.0, interval=60.0)
    answers = await asyncio.gather(*(store.reason() for _ in range(100)))
    assert answers == [None] * 100
    assert len(calls) == 1
    assert readiness_status_code(public_readiness(None, None)) == 200
