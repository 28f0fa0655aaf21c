"""An upstream's progress on a call, relayed to that call's caller only (issue 27), and its
log messages kept out of the gateway's log levels and text.

The upstream is the recording test server (``tests/support/upstream_server.py``), a real
process, whose ``progress`` tool sends raw progress notifications, well-behaved or hostile
(backwards, a flood, tokens it was never given, after its answer). The callers are
in-memory FastMCP clients: each records every progress notification that reaches it
(``on_progress`` sees them all, whatever their token), and when.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.messages import MessageHandler

from nexus_mcp.providers.upstream.progress import MAX_MESSAGE_CHARS, MAX_PER_SECOND

from .upstream_harness import all_up_tools, make_gateway, read_record, stdio_upstream

HOSTILE_MESSAGE = "\x1b[2J\x1b]52;c;Y2FuYXJ5\x07step\u202eevil\r\nFAKE LOG LINE " + "A" * 50_000
LOG_CANARY = "UPSTREAM-LOG-CANARY"
CALLER_TOKEN = "caller-token"


class Seen(MessageHandler):
    """Every progress notification this caller received, with when."""

    def __init__(self) -> None:
        self.progress: list[dict[str, Any]] = []
        self.answered_at: float | None = None

    async def on_progress(self, message: Any) -> None:
        params = message.params.model_dump(by_alias=True, exclude_none=True)
        self.progress.append({**params, "at": time.monotonic()})


_LOCK: list[str] = []  # the test server's pins, taken once (``upstream pin``) and reused


def gateway(tmp_path: Path, **extra: Any) -> Any:
    gw = make_gateway(
        tmp_path,
        [stdio_upstream(record=tmp_path / "rec.jsonl", **extra)],
        grant={"full": all_up_tools()},
    )
    lock = gw.registry_dir / "up.lock.json"
    if not _LOCK:
        assert gw.pin("up") == 0
        _LOCK.append(lock.read_text())
    else:
        lock.write_text(_LOCK[0])
    return gw


async def call(client: Client[Any], seen: Seen, token: Any = CALLER_TOKEN, **args: Any) -> Any:
    meta = {"progressToken": token} if token is not None else None
    # The caller's own token, sent as the caller's request _meta.
    result = await client.session.call_tool("up_progress", args, meta=meta)
    seen.answered_at = time.monotonic()
    return result


def caller(server: Any, seen: Seen) -> Client[Any]:
    return Client(server.mcp, message_handler=seen)


async def test_progress_reaches_the_caller_under_its_own_token(tmp_path: Path) -> None:
    server = gateway(tmp_path).build()
    seen = Seen()
    async with caller(server, seen) as client:
        result = await call(client, seen, steps=3, delay=0.15, message="step text")
    assert not result.is_error
    assert [(p["progressToken"], p["progress"], p["total"]) for p in seen.progress] == [
        ("caller-token", 1.0, 3.0),
        ("caller-token", 2.0, 3.0),
        ("caller-token", 3.0, 3.0),
    ]
    # Numbers only by default: the upstream's text does not ride along.
    assert all("message" not in p for p in seen.progress)
    # The upstream got a token of the gateway's own, never the caller's value.
    (call_record,) = [r for r in read_record(tmp_path / "rec.jsonl") if r["tool"] == "progress"]
    upstream_token = (call_record["meta"] or {}).get("progressToken")
    assert upstream_token is not None and upstream_token != "caller-token"
    assert "caller-token" not in json.dumps(call_record)
    assert result.structured_content == {"token": upstream_token}


async def test_the_fastmcp_progress_handler_gets_it_too(tmp_path: Path) -> None:
    """The ordinary client API: ``call_tool(progress_handler=...)``."""
    server = gateway(tmp_path).build()
    got: list[tuple[float, float | None, str | None]] = []

    async def handler(progress: float, total: float | None, message: str | None) -> None:
        got.append((progress, total, message))

    async with Client(server.mcp, mode="legacy") as client:
        await client.call_tool("up_progress", {"steps": 2, "delay": 0.15}, progress_handler=handler)
    assert got == [(1.0, 2.0, None), (2.0, 2.0, None)]


async def test_a_caller_that_asked_for_no_progress_gets_none(tmp_path: Path) -> None:
    server = gateway(tmp_path).build()
    seen = Seen()
    async with caller(server, seen) as client:
        result = await call(client, seen, token=None, steps=3, delay=0.0)
        await asyncio.sleep(0.3)
    assert not result.is_error
    assert seen.progress == []


async def test_progress_can_be_turned_off(tmp_path: Path) -> None:
    server = gateway(tmp_path, forward={"progress": "off"}).build()
    seen = Seen()
    async with caller(server, seen) as client:
        await call(client, seen, steps=2, delay=0.15)
    assert seen.progress == []


async def test_messages_only_when_allowed_and_then_escaped_and_short(tmp_path: Path) -> None:
    server = gateway(tmp_path, forward={"progress": "messages"}).build()
    seen = Seen()
    async with caller(server, seen) as client:
        await call(client, seen, steps=2, delay=0.15, message=HOSTILE_MESSAGE)
    assert [p["progress"] for p in seen.progress] == [1.0, 2.0]
    for p in seen.progress:
        text = p["message"]
        assert len(text) <= MAX_MESSAGE_CHARS + 40
        assert text.isprintable() and text.isascii()
        assert "\x1b" not in text and "\u202e" not in text and "\n" not in text
        assert text.startswith("\\x1b[2J\\x1b]52;c;Y2FuYXJ5\\x07step\\u202eevil\\x0d\\x0a")
        assert text.endswith(f"({len(HOSTILE_MESSAGE)} characters)")


async def test_backwards_progress_is_dropped(tmp_path: Path) -> None:
    server = gateway(tmp_path).build()
    seen = Seen()
    async with caller(server, seen) as client:
        await call(client, seen, pattern="backwards", delay=0.15)
    # The upstream sent 2, 1, 2, 3: the caller sees only an increasing sequence.
    assert [p["progress"] for p in seen.progress] == [2.0, 3.0]


async def test_a_flood_is_rate_limited(tmp_path: Path, log_output: io.StringIO) -> None:
    server = gateway(tmp_path).build()
    seen = Seen()
    async with caller(server, seen) as client:
        started = time.monotonic()
        await call(client, seen, pattern="flood", steps=2000)
        took = time.monotonic() - started
    values = [p["progress"] for p in seen.progress]
    assert 1 <= len(values) <= int(took * MAX_PER_SECOND) + 2, (len(values), took)
    assert values == sorted(set(values))
    # The operator learns that progress was dropped, and how much: counts only.
    (dropped,) = [e for e in events(log_output) if e.get("event") == "upstream_progress_dropped"]
    assert dropped["server_id"] == "up" and dropped["relayed"] == len(values)
    assert dropped["dropped_rate"] >= 2000 - len(values) - 5


def events(log_output: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_output.getvalue().splitlines() if line.strip()]


async def test_progress_on_tokens_it_was_never_given_is_dropped(tmp_path: Path) -> None:
    server = gateway(tmp_path).build()
    seen = Seen()
    async with caller(server, seen) as client:
        await call(client, seen, pattern="foreign", delay=0.15)
    # Only the one on its own token arrives, under the caller's token.
    assert [(p["progressToken"], p["progress"]) for p in seen.progress] == [("caller-token", 1.0)]


async def test_nothing_arrives_after_the_call_answered(tmp_path: Path) -> None:
    server = gateway(tmp_path).build()
    seen = Seen()
    async with caller(server, seen) as client:
        await call(client, seen, pattern="late", steps=5, delay=0.05)
        await asyncio.sleep(0.6)  # the upstream sends its five after its answer
        # The session is still good for the next call, which gets its own progress only.
        await call(client, seen, token="second", steps=1)
    assert [p["progressToken"] for p in seen.progress] == ["second"]


async def two_callers_at_once(server: Any) -> tuple[Seen, Seen]:
    first, second = Seen(), Seen()
    async with caller(server, first) as a, caller(server, second) as b:
        await asyncio.gather(
            call(a, first, token="A", steps=4, delay=0.15),
            call(b, second, token="B", steps=6, delay=0.12),
        )
    return first, second


@pytest.mark.parametrize("shared", [True, False])
async def test_two_callers_on_one_upstream_session_get_their_own_only(
    tmp_path: Path, shared: bool
) -> None:
    """Two callers' calls in flight on one upstream session (``shared: true``, or one
    principal's session): each gets its own call's progress, under its own token."""
    server = gateway(tmp_path, shared=shared).build()
    first, second = await two_callers_at_once(server)
    assert [(p["progressToken"], p["progress"], p["total"]) for p in first.progress] == [
        ("A", float(n), 4.0) for n in range(1, 5)
    ]
    assert [(p["progressToken"], p["progress"], p["total"]) for p in second.progress] == [
        ("B", float(n), 6.0) for n in range(1, 7)
    ]
    calls = [r for r in read_record(tmp_path / "rec.jsonl") if r["tool"] == "progress"]
    assert len({r["pid"] for r in calls}) == 1
    tokens = [(r["meta"] or {}).get("progressToken") for r in calls]
    assert len(set(tokens)) == 2 and not {"A", "B"} & set(tokens)


async def test_an_upstream_log_does_not_choose_the_gateways_level_or_text(
    tmp_path: Path, log_output: io.StringIO, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    server = gateway(tmp_path).build()
    hostile = f"\x1b[31m{LOG_CANARY}\u202e\nERROR forged line " + "B" * 10_000
    seen = Seen()
    async with caller(server, seen) as client:
        result = await client.call_tool_mcp("up_log_error", {"text": hostile})
        assert not result.is_error
        await asyncio.sleep(0.3)
    lines = events(log_output)
    logged = [e for e in lines if e.get("event") == "upstream_log"]
    assert [(e["level"], e["upstream_level"]) for e in logged] == [
        ("debug", "error"),
        ("debug", "emergency"),
    ]
    assert {e["server_id"] for e in logged} == {"up"}
    assert [e.get("upstream_logger") for e in logged] == ["upstream.test", None]
    assert all(e["chars"] >= len(hostile) for e in logged)  # FastMCP wraps it in JSON
    # Nothing of its text, anywhere in the gateway's log, and nothing at error level.
    everything = log_output.getvalue() + caplog.text + repr([r.__dict__ for r in caplog.records])
    assert LOG_CANARY not in everything and "forged line" not in everything
    assert not [e for e in lines if e.get("level") in ("error", "critical")]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
