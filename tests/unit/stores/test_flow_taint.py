"""Session taint (issue 28) on both backends: labels per (subject, session), the first
call per label, TTL, replicas sharing one taint, principals never sharing it, and a
Redis that is down failing closed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from nexus_mcp.errors import Code, UnavailableError
from nexus_mcp.policy.flow import EGRESS, READS_PRIVATE, READS_UNTRUSTED, TaintSource
from nexus_mcp.stores.flow_taint import MemoryTaintStore, TaintStore
from nexus_mcp.stores.redis_flow import RedisTaintStore
from nexus_mcp.stores.redis_state import redis_client
from tests.support.shared_state import PrivateRedis

TIMEOUT = 0.5
SESSION = "session:alice:0123"
FIRST = TaintSource("call-1", "get_section_source")
SECOND = TaintSource("call-2", "web/fetch")


def new_client(url: str) -> redis.Redis:
    return redis_client(url, pool_size=4, connect_timeout=TIMEOUT, timeout=TIMEOUT)


@pytest.fixture
def clients(redis_url: str) -> Iterator[list[redis.Redis]]:
    made = [new_client(redis_url) for _ in range(2)]
    yield made
    for c in made:
        c.close()


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> TaintStore:
    if request.param == "memory":
        return MemoryTaintStore()
    made: list[redis.Redis] = request.getfixturevalue("clients")
    prefix: str = request.getfixturevalue("state_prefix")
    return RedisTaintStore(made[0], prefix)


def test_a_label_keeps_the_call_that_first_touched_it(store: TaintStore) -> None:
    assert store.taint("alice", SESSION) == {}
    assert store.add("alice", SESSION, [READS_PRIVATE], FIRST) == {READS_PRIVATE}
    added = store.add("alice", SESSION, [READS_PRIVATE, READS_UNTRUSTED], SECOND)
    assert added == {READS_UNTRUSTED}
    assert store.add("alice", SESSION, [READS_UNTRUSTED], FIRST) == frozenset()
    assert store.taint("alice", SESSION) == {READS_PRIVATE: FIRST, READS_UNTRUSTED: SECOND}


def test_another_principal_with_the_same_session_key_sees_and_inherits_nothing(
    store: TaintStore,
) -> None:
    """The session key is the client's to choose on some transports: the subject is part
    of the key, so a hostile caller reusing a victim's session id starts clean and its
    own calls never land in the victim's taint."""
    store.add("alice", SESSION, [READS_PRIVATE, READS_UNTRUSTED], FIRST)
    assert store.taint("mallory", SESSION) == {}
    assert store.add("mallory", SESSION, [EGRESS], SECOND) == {EGRESS}
    assert store.taint("alice", SESSION) == {READS_PRIVATE: FIRST, READS_UNTRUSTED: FIRST}
    # Nor can a subject or session text be built to collide with another pair.
    assert store.taint("alice\x1fsession:alice", "0123") == {}
    assert store.taint("", "alice" + SESSION) == {}


def test_the_memory_store_forgets_a_session_idle_for_the_ttl() -> None:
    now = [0.0]
    store = MemoryTaintStore(60, clock=lambda: now[0])
    store.add("alice", SESSION, [READS_PRIVATE], FIRST)
    now[0] = 59.0
    store.add("alice", SESSION, [READS_UNTRUSTED], SECOND)  # renews the session
    now[0] = 118.0
    assert set(store.taint("alice", SESSION)) == {READS_PRIVATE, READS_UNTRUSTED}
    now[0] = 120.0
    assert store.taint("alice", SESSION) == {}


def test_replicas_share_one_taint_and_one_first_call(
    clients: list[redis.Redis], state_prefix: str
) -> None:
    a, b = (RedisTaintStore(c, state_prefix) for c in clients)
    a.add("alice", SESSION, [READS_PRIVATE], FIRST)
    assert b.taint("alice", SESSION) == {READS_PRIVATE: FIRST}
    sources = [TaintSource(f"call-{n}", "web/fetch") for n in range(20)]
    stores = [a, b] * 10
    with ThreadPoolExecutor(8) as pool:
        added = list(
            pool.map(
                lambda pair: pair[0].add("alice", SESSION, [READS_UNTRUSTED], pair[1]),
                zip(stores, sources, strict=True),
            )
        )
    # Exactly one replica saw the label as new: the audit records one taint change.
    assert sum(bool(result) for result in added) == 1
    winner = sources[next(i for i, result in enumerate(added) if result)]
    assert a.taint("alice", SESSION)[READS_UNTRUSTED] == winner


def test_the_redis_key_holds_a_digest_and_expires(
    clients: list[redis.Redis], state_prefix: str
) -> None:
    store = RedisTaintStore(clients[0], state_prefix, ttl_seconds=30)
    store.add("alice@example.com", SESSION, [READS_PRIVATE], FIRST)
    key = store.key("alice@example.com", SESSION)
    digest = hashlib.sha256(f"alice@example.com\x1f{SESSION}".encode()).hexdigest()
    assert key == f"{state_prefix}:taint:{digest}"
    assert "alice" not in key
    assert 0 < clients[0].pttl(key) <= 30_000


def test_a_stopped_redis_fails_closed(private_redis: PrivateRedis) -> None:
    c = new_client(private_redis.url)
    try:
        store = RedisTaintStore(c, "nexus-flow-test")
        store.add("alice", SESSION, [READS_PRIVATE], FIRST)
        private_redis.stop()
        for attempt in (
            lambda: store.taint("alice", SESSION),
            lambda: store.add("alice", SESSION, [READS_UNTRUSTED], SECOND),
        ):
            with pytest.raises(UnavailableError) as refused:
                attempt()
            assert refused.value.code == Code.UNAVAILABLE
            assert refused.value.facts["store"] == "flow"
            assert str(private_redis.port) not in refused.value.message
        private_redis.start()
        assert set(store.taint("alice", SESSION)) <= {READS_PRIVATE}
    finally:
        c.close()
