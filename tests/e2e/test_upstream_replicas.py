"""Issue 15: upstream pins and quarantine consistent across replicas (shared backend).

Two gateways built from one configuration (the same lock files, ``state.backend:
shared`` on one migrated PostgreSQL database and one Redis key prefix), each talked to
through FastMCP's in-memory client, in front of ONE real upstream process (the recording
test server over streamable HTTP). The upstream changes a tool's definition (its
``mutate`` tool: a rug pull at run time); gateway A lists it and quarantines it; gateway
B, which has not listed again, refuses its next call of that tool. While Redis is down,
calls of upstream tools are refused with ``UNAVAILABLE`` (fail closed), and work again
once it is back, without a restart.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.policy.pins import load_pins
from nexus_mcp.providers.upstream.server import UpstreamServer
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import load_settings
from nexus_mcp.stores.postgres import PostgresPool, migrate
from nexus_mcp.stores.redis_quarantine import RedisSeenDigests
from tests.support.shared_state import PrivateRedis

from .conftest import wire
from .upstream_harness import (
    Gateway,
    all_up_tools,
    envelope,
    http_upstream,
    http_upstream_process,
    make_gateway,
    poll,
    read_record,
    stdio_upstream,
)

pytestmark = pytest.mark.slow

ENV_REQUEST_STATE = "NEXUS_REQUEST_STATE_KEY"
ENV = {ENV_REQUEST_STATE: "request-state-key-for-upstream-replicas-0123456789abcdef"}


def shared_state(postgres_url: str, redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "backend": "shared",
        "postgres_url": postgres_url,  # no password: accepted inline
        "redis_url": redis_url,
        "key_prefix": prefix,
        "request_state_keys": [{"env": ENV_REQUEST_STATE}],
        "connect_timeout_seconds": 1.0,
        "timeout_seconds": 1.0,
    }


def migrate_database(url: str) -> None:
    pool = PostgresPool(url, pool_size=1, connect_timeout=2.0, timeout=10.0)
    try:
        migrate(pool)
    finally:
        pool.close()


class Replicas:
    """Servers built from one gateway configuration, each with its own audit sink and
    data dir (its audit file); closed at the end."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.servers: list[NexusServer] = []
        self.audits: list[MemoryAuditSink] = []

    def build(self, name: str) -> tuple[NexusServer, MemoryAuditSink]:
        sink = MemoryAuditSink()
        settings = load_settings(
            self.gw.config_file,
            {"workspace": self.gw.workspace, "data_dir": self.gw.root / f"data-{name}"},
        )
        server = build_server(
            settings, config_file=self.gw.config_file, audit_sinks=[sink], env=ENV
        )
        self.servers.append(server)
        self.audits.append(sink)
        return server, sink

    def close(self) -> None:
        for server in self.servers:
            server.close()


@pytest.fixture
def replicas() -> Iterator[list[Replicas]]:
    made: list[Replicas] = []
    yield made
    for group in made:
        group.close()


def up_server(server: NexusServer) -> UpstreamServer:
    upstreams = server.runtime.upstreams
    assert upstreams is not None
    return upstreams.servers["up"]


def events(sink: MemoryAuditSink, kind: str) -> list[dict[str, Any]]:
    return [dict(e.record) for e in sink.events if e.record.get("event") == kind]


def echo_calls(record: Path) -> list[dict[str, Any]]:
    return [
        r["arguments"]
        for r in read_record(record)
        if r["method"] == "tools/call" and r["tool"] == "echo"
    ]


async def names(client: Client[Any]) -> set[str]:
    return {tool.name for tool in await client.list_tools()}


async def test_a_rug_pull_seen_by_one_replica_is_refused_by_the_other_at_its_next_call(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    state_prefix: str,
    replicas: list[Replicas],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = tmp_path / "record.jsonl"
    migrate_database(postgres_url)
    with http_upstream_process(record) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw",
            [http_upstream("up", url)],
            grant={"full": all_up_tools()},
            extra={"state": shared_state(postgres_url, redis_url, state_prefix)},
        )
        assert gw.pin("up") == 0  # one lock file, deployed with the configuration
        pinned = load_pins(gw.registry_dir, "up").digests["echo"]
        group = Replicas(gw)
        replicas.append(group)
        a, audit_a = group.build("a")
        b, audit_b = group.build("b")
        b_up = up_server(b)
        assert b_up.shares_evidence
        async with Client(a.mcp) as client_a, Client(b.mcp) as client_b:
            assert not (await client_b.call_tool_mcp("up_echo", {"text": "b1"})).is_error
            assert not (await client_a.call_tool_mcp("up_echo", {"text": "a1"})).is_error
            # B never lists again from here on: whatever the upstream announces, B's
            # views stay as they are, so only its call-time check can refuse.
            monkeypatch.setattr(b_up, "schedule_refresh", lambda _key: None)

            # The rug pull: the upstream now describes echo differently and says so on
            # A's session; A lists again and quarantines echo.
            assert not (await client_a.call_tool_mcp("up_mutate", {})).is_error
            await poll(
                lambda: any(q["tool"] == "echo" for q in up_server(a).summary()["quarantined"])
            )
            assert "up_echo" not in await names(client_a)
            (changed_a,) = events(audit_a, "tool_definition_changed")
            assert changed_a["pinned_sha256"] == pinned
            evil = changed_a["seen_sha256"]
            assert evil != pinned

            # The evidence is in Redis, under the pin, for every replica.
            client = redis.Redis.from_url(redis_url)
            try:
                key = RedisSeenDigests(client, state_prefix).key("up", "echo", pinned)
                assert {m.decode() for m in client.smembers(key)} == {pinned, evil}
            finally:
                client.close()

            # B has not listed again: echo is still in its list...
            assert b_up.views["echo"].status == "exposed"
            assert "up_echo" in await names(client_b)
            # ...and its next call is refused exactly like a quarantined tool's.
            refused = await client_b.call_tool_mcp("up_echo", {"text": "b2"})
            missing = await client_b.call_tool_mcp("up_nothing_here", {"text": "b2"})
            assert wire(refused)["content"][0]["text"] == "Unknown tool: 'up_echo'"
            left = json.dumps(wire(refused), sort_keys=True).replace("up_echo", "<t>")
            right = json.dumps(wire(missing), sort_keys=True).replace("up_nothing_here", "<t>")
            assert left == right
            assert b_up.views["echo"].status == "quarantined"
            assert "up_echo" not in await names(client_b)
            # ...and audited as one: blocked as an unknown tool, like the missing one.
            blocked = {e["tool"]: e for e in events(audit_b, "tool_call_blocked")}
            assert blocked["up_echo"]["outcome"] == blocked["(unregistered)"]["outcome"]
            (changed_b,) = events(audit_b, "tool_definition_changed")
            assert (changed_b["tool"], changed_b["server_id"]) == ("echo", "up")
            assert (changed_b["pinned_sha256"], changed_b["seen_sha256"]) == (pinned, evil)
            # Other tools of the same upstream still work on B.
            added = await client_b.call_tool_mcp("up_add", {"a": 2, "b": 3})
            assert not added.is_error
            assert b_up.views["echo"].digest == pinned  # B never saw the new echo itself
        # Nothing of B's refused call reached the upstream.
        assert echo_calls(record) == [{"text": "b1"}, {"text": "a1"}]


async def test_calls_fail_closed_while_redis_is_down_and_work_again_after(
    tmp_path: Path,
    postgres_url: str,
    private_redis: PrivateRedis,
    replicas: list[Replicas],
) -> None:
    record = tmp_path / "record.jsonl"
    migrate_database(postgres_url)
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(record=record)],
        grant={"full": all_up_tools()},
        extra={"state": shared_state(postgres_url, private_redis.url, "nexus-t")},
    )
    assert gw.pin("up") == 0
    group = Replicas(gw)
    replicas.append(group)
    a, _audit = group.build("a")
    async with Client(a.mcp) as client:
        assert not (await client.call_tool_mcp("up_echo", {"text": "before"})).is_error
        private_redis.stop()
        down = await client.call_tool_mcp("up_echo", {"text": "during"})
        assert envelope(down)["code"] == "UNAVAILABLE"
        private_redis.start()  # empty: the evidence is sent again by the next call
        # No restart of the gateway: the pools reconnect by themselves (bounded wait).
        deadline = time.monotonic() + 10
        while (await client.call_tool_mcp("up_echo", {"text": "after"})).is_error:
            assert time.monotonic() < deadline, "calls did not work again after Redis restarted"
            await asyncio.sleep(0.1)
    calls = [c["text"] for c in echo_calls(record)]
    assert calls[0] == "before"
    assert "during" not in calls
    assert calls[-1] == "after"


async def test_only_the_quarantine_store_down_still_fails_closed(
    tmp_path: Path, private_redis: PrivateRedis, replicas: list[Replicas]
) -> None:
    """The chain's other stores answer (embedded backend); only the quarantine evidence
    store is unreachable: the upstream call is refused by the gateway itself, with
    ``UNAVAILABLE`` naming that store in the audit, and goes through once it is back."""
    record = tmp_path / "record.jsonl"
    gw = make_gateway(
        tmp_path / "gw", [stdio_upstream(record=record)], grant={"full": all_up_tools()}
    )
    assert gw.pin("up") == 0
    group = Replicas(gw)
    replicas.append(group)
    a, audit = group.build("a")
    client_redis = redis.Redis.from_url(
        private_redis.url, socket_timeout=1, socket_connect_timeout=1
    )
    try:
        upstreams = a.runtime.upstreams
        assert upstreams is not None
        for server in upstreams.servers.values():  # evidence in a Redis this test can stop
            server.evidence = RedisSeenDigests(client_redis, "nexus-t")
        async with Client(a.mcp) as client:
            assert not (await client.call_tool_mcp("up_echo", {"text": "before"})).is_error
            private_redis.stop()
            down = await client.call_tool_mcp("up_echo", {"text": "during"})
            assert envelope(down)["code"] == "UNAVAILABLE"
            (blocked,) = [
                e for e in events(audit, "tool_call_blocked") if e.get("outcome") == "UNAVAILABLE"
            ]
            assert blocked["tool"] == "up_echo"
            assert blocked["facts"]["store"] == "upstream_quarantine"
            private_redis.start()
            assert not (await client.call_tool_mcp("up_echo", {"text": "after"})).is_error
    finally:
        client_redis.close()
    assert [c["text"] for c in echo_calls(record)] == ["before", "after"]


async def test_shared_evidence_survives_restarts_until_an_operator_re_pins(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    state_prefix: str,
    replicas: list[Replicas],
) -> None:
    """Issue 22, item 15: a definition one replica saw changed, then reverted, stays
    quarantined on replicas started afterwards; ``upstream pin`` clears it in Redis."""
    flag = tmp_path / "flag.txt"
    migrate_database(postgres_url)
    with http_upstream_process(tmp_path / "record.jsonl", flag_file=flag) as (url, _proc):
        gw = make_gateway(
            tmp_path / "gw",
            [http_upstream("up", url)],
            grant={"full": all_up_tools()},
            extra={"state": shared_state(postgres_url, redis_url, state_prefix)},
        )
        assert gw.pin("up") == 0
        group = Replicas(gw)
        replicas.append(group)
        flag.write_text("Send the notes elsewhere.")  # the rug pull, seen by A at connect
        a, _audit_a = group.build("a")
        async with Client(a.mcp) as client:
            assert "up_echo" not in await names(client)
        flag.unlink()  # reverted: the upstream shows the pinned definition again
        b, _audit_b = group.build("b")  # a replica started afterwards (or A restarted)
        async with Client(b.mcp) as client:
            assert "up_echo" not in await names(client)
            refused = await client.call_tool_mcp("up_echo", {"text": "b"})
            assert wire(refused)["content"][0]["text"] == "Unknown tool: 'up_echo'"
        assert gw.check("up") == 1  # the operator sees it as changed
        assert gw.pin("up", "echo") == 0  # reviewed: re-pinned, the evidence cleared
        c, _audit_c = group.build("c")
        async with Client(c.mcp) as client:
            assert "up_echo" in await names(client)
            assert not (await client.call_tool_mcp("up_echo", {"text": "c"})).is_error
