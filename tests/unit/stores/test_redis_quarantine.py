"""Upstream quarantine evidence on a real Redis: keys, bound, no expiry, fail closed.

The machine's Redis with a key prefix of the test's own (``redis_url``, ``state_prefix``);
the outage tests stop a private ``redis-server`` of their own (``private_redis``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from nexus_mcp.errors import Code, ConfigError, UnavailableError
from nexus_mcp.policy.pins import definition_digest
from nexus_mcp.policy.quarantine import SEEN_PER_TOOL, SeenDigests
from nexus_mcp.stores.redis_quarantine import RedisSeenDigests
from tests.support.shared_state import PrivateRedis
from tests.support.upstream_replicas import ADD, ECHO, EVIL, Replica, registry_with_pins

PIN = "a" * 64


def digest(n: int) -> str:
    return f"{n:064x}"


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    opened = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    yield opened
    opened.close()


@pytest.fixture
def store(client: redis.Redis, state_prefix: str) -> RedisSeenDigests:
    return RedisSeenDigests(client, state_prefix)


def test_the_redis_store_is_a_seen_digests_store(store: RedisSeenDigests) -> None:
    assert isinstance(store, SeenDigests)


def test_keys_hash_the_names_carry_the_pin_and_never_expire(
    store: RedisSeenDigests, client: redis.Redis, state_prefix: str
) -> None:
    store.add("up", "echo", digest(1), pinned=PIN)
    store.add("up", "echo", digest(2), pinned=None)
    keys = sorted(k.decode() for k in client.scan_iter(match=f"{state_prefix}:*"))
    assert keys == sorted(
        [
            f"{state_prefix}:upstream:{sha('up')}:{sha('echo')}:{PIN}:seen",
            f"{state_prefix}:upstream:{sha('up')}:{sha('echo')}:unpinned:seen",
        ]
    )
    for key in keys:
        assert client.ttl(key) == -1  # no expiry: the evidence stays until the pin changes
    assert store.get("up", "echo", pinned=PIN) == {digest(1)}
    assert store.get("up", "echo", pinned=None) == {digest(2)}
    assert store.get("up", "echo", pinned=digest(1)) == frozenset()  # a new pin: clean
    assert store.get("up", "nothing", pinned=PIN) == frozenset()


def test_at_most_sixteen_digests_even_under_concurrent_adds(store: RedisSeenDigests) -> None:
    def add(offset: int) -> None:
        for n in range(20):
            store.add("up", "echo", digest(offset * 1000 + n), pinned=PIN)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(add, range(8)))
    assert len(store.get("up", "echo", pinned=PIN)) == SEEN_PER_TOOL == 16
    kept = store.get("up", "echo", pinned=PIN)
    store.add("up", "echo", next(iter(kept)), pinned=PIN)
    assert store.get("up", "echo", pinned=PIN) == kept


def test_observe_adds_then_reads_every_tool_in_one_round_trip(
    store: RedisSeenDigests, client: redis.Redis
) -> None:
    store.add("up", "echo", digest(9), pinned=PIN)
    before = client.info("stats")["total_commands_processed"]
    got = store.observe("up", {"echo": (PIN, PIN), "add": (digest(1), None)})
    assert got == {"echo": {PIN, digest(9)}, "add": {digest(1)}}
    assert store.observe("up", {}) == {}
    # Two scripts (and, the first time, their load) in one pipeline: a handful of
    # commands, whatever the number of tools. The count is the server's, other clients
    # may add to it, so the bound is loose.
    assert client.info("stats")["total_commands_processed"] - before < 20


def test_two_replicas_see_each_others_digests(
    client: redis.Redis, state_prefix: str, redis_url: str
) -> None:
    other_client = redis.Redis.from_url(redis_url)
    try:
        a = RedisSeenDigests(client, state_prefix)
        b = RedisSeenDigests(other_client, state_prefix)
        a.add("up", "echo", digest(1), pinned=PIN)
        assert b.get("up", "echo", pinned=PIN) == {digest(1)}
        # Another deployment (another prefix) is another set.
        assert RedisSeenDigests(client, state_prefix + "x").get("up", "echo", pinned=PIN) == (
            frozenset()
        )
    finally:
        other_client.close()


def test_an_empty_prefix_is_refused(client: redis.Redis) -> None:
    with pytest.raises(ConfigError):
        RedisSeenDigests(client, "")


def test_an_outage_is_unavailable_and_recovers_without_a_restart(
    private_redis: PrivateRedis,
) -> None:
    client = redis.Redis.from_url(private_redis.url, socket_timeout=1, socket_connect_timeout=1)
    try:
        store = RedisSeenDigests(client, "nexus-t")
        store.add("up", "echo", digest(1), pinned=PIN)
        private_redis.stop()
        for attempt in (
            lambda: store.add("up", "echo", digest(2), pinned=PIN),
            lambda: store.get("up", "echo", pinned=PIN),
            lambda: store.observe("up", {"echo": (digest(2), PIN)}),
        ):
            with pytest.raises(UnavailableError) as caught:
                attempt()
            assert caught.value.code is Code.UNAVAILABLE
            assert caught.value.facts["store"] == "upstream_quarantine"
            assert "127.0.0.1" not in caught.value.message
            assert str(private_redis.port) not in json.dumps(caught.value.facts)
        private_redis.start()  # empty: no persistence; its script cache is empty too
        store.add("up", "echo", digest(3), pinned=PIN)
        assert store.observe("up", {"add": (digest(4), PIN)}) == {"add": {digest(4)}}
        assert store.get("up", "echo", pinned=PIN) == {digest(3)}
    finally:
        client.close()


# --- two gateways' upstream servers on Redis -------------------------------------------


@pytest.fixture
def registry_dir(tmp_path: Path) -> Path:
    return registry_with_pins(tmp_path)


async def test_a_rug_pull_one_replica_saw_is_refused_by_another_on_redis(
    registry_dir: Path, client: redis.Redis, state_prefix: str, redis_url: str
) -> None:
    other_client = redis.Redis.from_url(redis_url)
    try:
        a = Replica(registry_dir, RedisSeenDigests(client, state_prefix))
        b = Replica(registry_dir, RedisSeenDigests(other_client, state_prefix))
        a.sees(ECHO, ADD)
        b.sees(ECHO, ADD)
        assert await b.may_call("echo")
        a.sees(EVIL, ADD)
        assert a.status("echo") == "quarantined"
        assert b.status("echo") == "exposed"
        assert not await b.may_call("echo")
        assert b.status("echo") == "quarantined"
        assert await b.may_call("add")
        (event,) = b.events("tool_definition_changed")
        assert event["seen_sha256"] == definition_digest(EVIL)
    finally:
        other_client.close()


async def test_calls_fail_closed_while_redis_is_down(
    registry_dir: Path, private_redis: PrivateRedis
) -> None:
    client = redis.Redis.from_url(private_redis.url, socket_timeout=1, socket_connect_timeout=1)
    try:
        a = Replica(registry_dir, RedisSeenDigests(client, "nexus-t"))
        b = Replica(registry_dir, RedisSeenDigests(client, "nexus-t"))
        a.sees(ECHO, ADD)
        b.sees(ECHO, ADD)
        private_redis.stop()
        a.sees(EVIL, ADD)  # seen during the outage: quarantined here, sent later
        assert a.status("echo") == "quarantined"
        tool = b.server.visible_tools()["up_echo"]
        with pytest.raises(UnavailableError):
            await b.server.check_call(tool)
        private_redis.start()  # empty
        assert await a.may_call("add")  # sends what A saw, and its pins
        assert not await b.may_call("echo")
        assert await b.may_call("add")
    finally:
        client.close()
