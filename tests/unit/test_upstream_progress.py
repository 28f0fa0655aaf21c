"""``ProgressRelay`` on its own, for what a FastMCP upstream cannot send (numbers that are
not finite: Python's JSON reads ``NaN`` and ``Infinity``) and for races the process tests
cannot time (a call that finishes while a notification waits its turn). The caller's MCP
session is a stand-in that records what it was asked to send, or fails."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from nexus_mcp.providers.upstream.progress import MAX_PER_SECOND, ProgressRelay, progress_relay
from nexus_mcp.providers.upstream.relay import Caller


class CallerSession:
    def __init__(self, *, fail: bool = False, gate: asyncio.Event | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail = fail
        self.gate = gate

    async def send_progress_notification(self, **params: Any) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("the caller went away")
        self.sent.append(params)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def relay(session: CallerSession, *, messages: bool = False) -> tuple[ProgressRelay, Clock]:
    clock = Clock()
    caller = Caller(session, request_id=7, progress_token="tok")
    return ProgressRelay(caller, "up", messages=messages, clock=clock), clock


async def test_numbers_that_are_not_finite_are_dropped() -> None:
    session = CallerSession()
    progress, clock = relay(session)
    for value, total in ((math.nan, None), (math.inf, None), (1.0, math.inf), (1.0, math.nan)):
        await progress(value, total, None)
        clock.now += 1
    await progress(1.0, 2.0, None)
    assert [(s["progress"], s["total"]) for s in session.sent] == [(1.0, 2.0)]
    assert progress.dropped["not_a_number"] == 4


async def test_the_rate_is_per_call_and_by_the_clock() -> None:
    session = CallerSession()
    progress, clock = relay(session)
    for step in range(1, 50):
        await progress(float(step), None, None)
        clock.now += 0.01
    assert len(session.sent) == 1 + int(49 * 0.01 * MAX_PER_SECOND)  # one per interval
    assert progress.dropped["rate"] == 49 - len(session.sent)


async def test_sent_under_the_callers_token_and_request() -> None:
    session = CallerSession()
    progress, _clock = relay(session)
    await progress(1.0, 4.0, "upstream text")
    assert session.sent == [
        {
            "progress_token": "tok",
            "progress": 1.0,
            "total": 4.0,
            "message": None,  # numbers only
            "related_request_id": 7,
        }
    ]


async def test_a_message_is_escaped_and_cut() -> None:
    session = CallerSession()
    progress, _clock = relay(session, messages=True)
    await progress(1.0, None, "\x1b[1mok\u2028" + "m" * 1000)
    (sent,) = session.sent
    assert sent["message"].startswith("\\x1b[1mok\\u2028mmm")
    assert sent["message"].endswith("... (1007 characters)")
    assert len(sent["message"]) < 260


async def test_nothing_leaves_once_the_call_finished_even_if_it_was_waiting() -> None:
    gate = asyncio.Event()
    session = CallerSession(gate=gate)
    progress, clock = relay(session)
    first = asyncio.create_task(progress(1.0, None, None))  # holds the lock, sending
    await asyncio.sleep(0)
    clock.now += 1
    second = asyncio.create_task(progress(2.0, None, None))  # accepted, waits its turn
    await asyncio.sleep(0)
    progress.close()
    gate.set()
    await asyncio.gather(first, second)
    await progress(3.0, None, None)  # after the call: dropped at once
    assert [s["progress"] for s in session.sent] == [1.0]
    assert progress.dropped["finished"] == 2


async def test_a_caller_that_went_away_costs_nothing_but_the_notification() -> None:
    session = CallerSession(fail=True)
    progress, _clock = relay(session)
    await progress(1.0, None, None)
    assert progress.relayed == 0 and progress.dropped["undeliverable"] == 1


def test_no_relay_without_the_callers_token_or_when_off() -> None:
    session = CallerSession()
    asked = Caller(session, request_id=1, progress_token=0)  # 0 is a token
    assert progress_relay(asked, "up", "numbers") is not None
    assert progress_relay(asked, "up", "off") is None
    assert progress_relay(Caller(session, request_id=1), "up", "messages") is None
    assert progress_relay(None, "up", "messages") is None
