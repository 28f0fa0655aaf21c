"""Fixtures of the providers' unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from nexus_mcp.providers.upstream import pacing

CountTurns = Callable[[Awaitable[Any]], Awaitable[tuple[Any, int]]]


@pytest.fixture
def count_turns(monkeypatch: pytest.MonkeyPatch) -> CountTurns:
    """Paced work with a zero slice and pause; ``await count_turns(work)`` gives the
    work's result and how many turns the event loop gave another task meanwhile (counted,
    not timed)."""
    monkeypatch.setattr(pacing, "SLICE_SECONDS", 0.0)
    monkeypatch.setattr(pacing, "PAUSE_SECONDS", 0.0)

    async def run(work: Awaitable[Any]) -> tuple[Any, int]:
        turns = 0

        async def ticker() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = turns
        try:
            result = await work
        finally:
            task.cancel()
        return result, turns - before

    return run
