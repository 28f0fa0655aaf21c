"""The Redis stores (issue 15) on real Redis: nonces spent once across replicas, budgets
and rate limits shared by replicas with the in-process semantics, fail-closed outages that
recover by themselves, a bounded pool, and keys that stay under the prefix and hold only
digests.

"Replicas" are separate clients (each its own pool) on one server. The machine's Redis
(``redis_url`` + ``state_prefix``) serves the sharing tests; ``private_redis`` the ones that
stop, freeze or inspect a whole server.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest
import redis

from nexus_mcp.errors import (
    BudgetExceededError,
    Code,
    ConfigError,
    RateLimitedError,
    UnavailableError,
)
from nexus_mcp.policy.budgets import SeparateLimits, SessionBudget, SlidingWindowRateLimiter
from nexus_mcp.stores.nonces import NonceStore
from nexus_mcp.stores.redis_state import (
    CLOCK_SKEW_SECONDS,
    RedisCallLimits,
    RedisNonceStore,
    RedisRateLimiter,
    RedisSessionBudget,
    call_store,
    redis_client,
)
from tests.support.shared_state import PrivateRedis

TIMEOUT = 0.5


def new_client(url: str, pool_size: int = 4, name: str = "nexus-test") -> redis.Redis:
    return redis_client(
        url, pool_size=pool_size, connect_timeout=TIMEOUT, timeout=TIMEOUT, client_name=name
    )


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = new_client(redis_url)
    yield c
    c.close()


@pytest.fixture
def replicas(redis_url: str) -> Iterator[list[redis.Redis]]:
    """Five clients with pools of their own: five replicas on one Redis."""
    clients = [new_client(redis_url) for _ in range(5)]
    yield clients
    for c in clients:
        c.close()


@pytest.fixture
def admin(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def run_concurrently(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run every call at once (a barrier releases them together); each call's result or
    the exception it raised."""
    barrier = threading.Barrier(len(calls))

    def one(call: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return call()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(one, calls))


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:
        return (type(exc).__name__, getattr(exc, "facts", None))


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def assert_safe(error: UnavailableError, server_url: str, port: int) -> None:
    text = str(error) + repr(error.facts) + repr(error.args)
    for leak in (server_url, "127.0.0.1", str(port), "redis://", "localhost"):
        assert leak not in text
    assert error.code is Code.UNAVAILABLE


# --- nonces -----------------------------------------------------------------------------


def test_the_redis_store_is_a_nonce_store(client: redis.Redis, state_prefix: str) -> None:
    assert isinstance(RedisNonceStore(client, state_prefix), NonceStore)


def test_a_nonce_is_consumed_once_and_only_its_digest_is_stored(
    client: redis.Redis, admin: redis.Redis, state_prefix: str
) -> None:
    store = RedisNonceStore(client, state_prefix)
    jti = "token-id-" + os.urandom(4).hex()
    later = time.time() + 60
    assert [store.consume(jti, later) for _ in range(3)] == [True, False, False]
    assert store.consume(jti + "x", later) is True
    keys = sorted(k.decode() for k in admin.scan_iter(match=f"{state_prefix}:*"))
    assert keys == sorted(
        [f"{state_prefix}:nonce:{sha(jti)}", f"{state_prefix}:nonce:{sha(jti + 'x')}"]
    )
    assert all(jti not in k for k in keys)
    held = admin.get(keys[0])
    assert held is not None and len(held) == 32 and jti.encode() not in held  # a random token


def test_a_nonce_is_spent_once_across_fifty_concurrent_replicas(
    redis_url: str, state_prefix: str
) -> None:
    clients = [new_client(redis_url, pool_size=1) for _ in range(50)]
    try:
        stores = [RedisNonceStore(c, state_prefix) for c in clients]
        later = time.time() + 60
        results = run_concurrently([lambda s=s: s.consume("shared-jti", later) for s in stores])
    finally:
        for c in clients:
            c.close()
    assert results.count(True) == 1
    assert results.count(False) == 49


def test_a_used_id_outlives_its_token_by_the_clock_skew_allowance(
    client: redis.Redis, admin: redis.Redis, state_prefix: str
) -> None:
    """Replicas' clocks may disagree: the id is kept CLOCK_SKEW_SECONDS past the token's
    remaining life, relative to now (never an absolute time Redis reads by its clock)."""
    store = RedisNonceStore(client, state_prefix)
    assert store.consume("skewed", time.time() + 10) is True
    ttl = admin.ttl(store.key("skewed"))
    assert CLOCK_SKEW_SECONDS + 9 <= ttl <= CLOCK_SKEW_SECONDS + 11


def test_a_nonce_expires_at_its_expiry_rounded_up(
    client: redis.Redis, admin: redis.Redis, state_prefix: str
) -> None:
    store = RedisNonceStore(client, state_prefix, clock_skew_seconds=0)
    expires_at = time.time() + 1.2
    assert store.consume("soon", expires_at) is True
    key = store.key("soon")
    # Relative to now (Redis's own clock may differ from ours), rounded up.
    assert 1 <= admin.ttl(key) <= 2
    assert store.consume("soon", expires_at) is False
    deadline = time.monotonic() + 5
    while admin.exists(key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not admin.exists(key)
    assert time.time() >= expires_at - 0.01
    assert store.consume("soon", time.time() + 60) is True


def test_an_already_expired_nonce_is_still_remembered_for_a_second(
    client: redis.Redis, admin: redis.Redis, state_prefix: str
) -> None:
    store = RedisNonceStore(client, state_prefix, clock_skew_seconds=0)
    before = time.time()
    assert store.consume("past", before - 100) is True
    assert store.consume("past", before - 100) is False
    assert admin.ttl(store.key("past")) >= 1


def test_a_nonce_needs_a_finite_expiry(client: redis.Redis, state_prefix: str) -> None:
    store = RedisNonceStore(client, state_prefix)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError):
            store.consume("x", bad)


# --- budgets ----------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_matches_session_budget_on_shared_sequences(
    client: redis.Redis, state_prefix: str
) -> None:
    rng = random.Random(15)
    for round_ in range(5):
        max_calls = rng.randint(1, 6)
        sequence = [rng.choice("abcd") for _ in range(40)]
        local = SessionBudget(max_calls, FakeClock())
        shared = RedisSessionBudget(client, f"{state_prefix}:{round_}", max_calls)
        assert shared.max_calls == max_calls == local.max_calls
        expected = [outcome(partial(local.charge, k)) for k in sequence]
        got = [outcome(partial(shared.charge, k)) for k in sequence]
        assert got == expected


def test_two_replicas_share_one_budget_under_concurrency(
    replicas: list[redis.Redis], state_prefix: str
) -> None:
    budgets = [RedisSessionBudget(c, state_prefix, 5) for c in replicas[:2]]
    results = run_concurrently([lambda i=i: budgets[i % 2].charge("session") for i in range(50)])
    accepted = [r for r in results if isinstance(r, int)]
    refused = [r for r in results if isinstance(r, BudgetExceededError)]
    assert sorted(accepted) == [0, 1, 2, 3, 4]
    assert len(refused) == 45
    assert all(r.facts == {"limit": 5} for r in refused)


def test_an_idle_budget_is_forgotten_and_a_refused_call_renews_it(
    client: redis.Redis, admin: redis.Redis, state_prefix: str
) -> None:
    budget = RedisSessionBudget(client, state_prefix, 1, idle_ttl_seconds=0.6)
    key = budget.key("s")
    assert key == f"{state_prefix}:budget:{sha('s')}"
    assert budget.charge("s") == 0
    assert 0 < admin.pttl(key) <= 600
    # Hammering an exhausted budget keeps it exhausted: each refusal renews the TTL.
    for _ in range(4):
        time.sleep(0.3)
        with pytest.raises(BudgetExceededError):
            budget.charge("s")
    assert admin.pttl(key) > 300
    time.sleep(0.8)
    assert not admin.exists(key)
    assert budget.charge("s") == 0


def test_budget_settings_are_checked(client: redis.Redis, state_prefix: str) -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError):
            RedisSessionBudget(client, state_prefix, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        RedisSessionBudget(client, state_prefix, 3, idle_ttl_seconds=0)
    with pytest.raises(ConfigError):
        RedisSessionBudget(client, "", 3)


# --- rate limits ------------------------------------------------------------------------


def test_fifty_concurrent_calls_from_five_replicas_accept_exactly_the_limit(
    replicas: list[redis.Redis], admin: redis.Redis, state_prefix: str
) -> None:
    limiters = [RedisRateLimiter(c, state_prefix, 10, 5.0) for c in replicas]
    results = run_concurrently([lambda i=i: limiters[i % 5].check("alice") for i in range(50)])
    refused = [r for r in results if isinstance(r, RateLimitedError)]
    assert results.count(None) == 10
    assert len(refused) == 40
    for error in refused:
        assert error.facts["limit"] == 10
        assert error.facts["window_seconds"] == 5.0
        assert error.facts["retry_after_seconds"] in (4, 5)
    # Refused calls left no trace: only the accepted ones are in the window.
    assert admin.zcard(limiters[0].key("alice")) == 10


def test_refused_calls_are_not_counted_and_the_window_slides(
    client: redis.Redis, state_prefix: str
) -> None:
    limiter = RedisRateLimiter(client, state_prefix, 2, 1.0)
    limiter.check("s")
    time.sleep(0.5)
    limiter.check("s")
    for _ in range(5):
        with pytest.raises(RateLimitedError) as refused:
            limiter.check("s")
        assert refused.value.facts["retry_after_seconds"] == 1
    time.sleep(0.6)  # the first call slid out; the second is still in the window
    limiter.check("s")
    with pytest.raises(RateLimitedError):
        limiter.check("s")
    time.sleep(1.2)  # everything slid out; the refusals above never counted
    limiter.check("s")
    limiter.check("s")


def test_the_limiter_matches_the_local_one_on_a_shared_schedule(
    client: redis.Redis, state_prefix: str
) -> None:
    """The same calls at the same moments (a fake clock for the local limiter, real sleeps
    for Redis) are accepted and refused alike."""
    clock = FakeClock()
    local = SlidingWindowRateLimiter(2, 0.6, clock)
    shared = RedisRateLimiter(client, state_prefix, 2, 0.6)
    # Offsets in seconds; no call within 100 ms of a stamp's window end, so timing jitter
    # of the real sleeps cannot flip an answer: accepted, refused twice, both slid out,
    # accepted twice, refused, all slid out again, accepted twice, refused.
    schedule = [0.0, 0.1, 0.2, 0.3, 0.8, 0.85, 0.95, 1.6, 1.65, 1.7]
    start = time.monotonic()
    expected, got = [], []
    for at in schedule:
        clock.now = at
        expected.append(outcome(lambda: local.check("s")))
        time.sleep(max(0.0, start + at - time.monotonic()))
        got.append(outcome(lambda: shared.check("s")))
    assert [e is None for e in expected] == [1, 1, 0, 0, 1, 1, 0, 1, 1, 0]
    assert got == expected


def test_the_limiter_uses_the_server_clock_and_its_key_expires_a_window_later(
    client: redis.Redis, admin: redis.Redis, state_prefix: str
) -> None:
    limiter = RedisRateLimiter(client, state_prefix, 5, 0.5)
    limiter.check("s")
    key = limiter.key("s")
    assert key == f"{state_prefix}:rate:{sha('s')}"
    seconds, micros = admin.time()
    [(member, score)] = admin.zrange(key, 0, -1, withscores=True)
    assert abs(score - (seconds * 1_000_000 + micros)) < 1_000_000
    assert b"s" not in member.split(b":")[0]
    assert 0 < admin.pttl(key) <= 500
    time.sleep(0.6)
    assert not admin.exists(key)


def test_members_stay_unique_under_a_burst(
    replicas: list[redis.Redis], admin: redis.Redis, state_prefix: str
) -> None:
    limiters = [RedisRateLimiter(c, state_prefix, 1000, 30.0) for c in replicas]
    results = run_concurrently([lambda i=i: limiters[i % 5].check("b") for i in range(100)])
    assert results == [None] * 100
    assert admin.zcard(limiters[0].key("b")) == 100


def test_rate_limit_settings_are_checked(client: redis.Redis, state_prefix: str) -> None:
    for max_calls, window in ((0, 1.0), (True, 1.0), (1, 0), (1, math.inf), (1, -1.0)):
        with pytest.raises(ConfigError):
            RedisRateLimiter(client, state_prefix, max_calls, window)


# --- outages, recovery, the pool ----------------------------------------------------------


def stores_on(c: redis.Redis, prefix: str = "p") -> list[tuple[str, Callable[[], Any]]]:
    nonces = RedisNonceStore(c, prefix)
    budget = RedisSessionBudget(c, prefix, 1000)
    limiter = RedisRateLimiter(c, prefix, 1000, 60.0)
    return [
        ("nonces", lambda: nonces.consume(os.urandom(8).hex(), time.time() + 60)),
        ("limits", lambda: budget.charge("s")),
        ("limits", lambda: limiter.check("s")),
    ]


def test_a_stopped_redis_fails_closed_fast_and_the_same_objects_recover(
    private_redis: PrivateRedis,
) -> None:
    c = new_client(private_redis.url, pool_size=3)
    try:
        calls = stores_on(c)
        # Warm the pool: three connections the restart will leave dead.
        run_concurrently([call for _, call in calls])
        private_redis.stop()
        for store, call in calls:
            started = time.monotonic()
            with pytest.raises(UnavailableError) as refused:
                call()
            assert time.monotonic() - started < TIMEOUT * 3
            assert refused.value.facts["store"] == store
            assert_safe(refused.value, private_redis.url, private_redis.port)
        private_redis.start()
        for _, call in calls:
            call()
        assert calls[0][1]() is True
        assert calls[1][1]() == 1000 - 2
        calls[2][1]()
    finally:
        c.close()


def test_connections_a_restart_left_dead_in_the_pool_are_replaced_without_an_error(
    private_redis: PrivateRedis,
) -> None:
    c = new_client(private_redis.url, pool_size=4)
    try:
        calls = stores_on(c) * 4
        holders = [c.connection_pool.get_connection() for _ in range(4)]
        for conn in holders:  # four live connections, then back in the pool
            c.connection_pool.release(conn)
        private_redis.stop()
        private_redis.start()  # no call in between: every pooled socket is dead
        results = run_concurrently([call for _, call in calls])
        assert not [r for r in results if isinstance(r, Exception)]
    finally:
        c.close()


def test_scripts_are_reloaded_after_a_restart_empties_the_cache(
    private_redis: PrivateRedis,
) -> None:
    c = new_client(private_redis.url)
    try:
        budget = RedisSessionBudget(c, "p", 10)
        limiter = RedisRateLimiter(c, "p", 10, 60.0)
        budget.charge("s")
        limiter.check("s")
        shas = [budget._script.sha, limiter._script.sha]
        assert c.script_exists(*shas) == [True, True]
        private_redis.stop()
        private_redis.start()
        fresh = redis.Redis.from_url(private_redis.url)
        try:
            assert fresh.script_exists(*shas) == [False, False]
            assert budget.charge("s") == 9  # a new server: a new count
            limiter.check("s")
            assert fresh.script_exists(*shas) == [True, True]
            # And again when the cache is flushed under a running server.
            fresh.script_flush()
            assert budget.charge("s") == 8
            limiter.check("s")
        finally:
            fresh.close()
    finally:
        c.close()


def test_a_frozen_redis_times_out_within_the_timeout(private_redis: PrivateRedis) -> None:
    c = new_client(private_redis.url, pool_size=2)
    process = private_redis.process
    assert process is not None
    try:
        calls = stores_on(c)
        for _, call in calls:
            call()
        os.kill(process.pid, signal.SIGSTOP)
        try:
            for store, call in calls:
                started = time.monotonic()
                with pytest.raises(UnavailableError) as refused:
                    call()
                # One answer timeout (timeouts are not retried), plus scheduling slack.
                assert time.monotonic() - started < TIMEOUT * 2.5
                assert refused.value.facts == {"store": store, "error": "TimeoutError"}
                assert_safe(refused.value, private_redis.url, private_redis.port)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        for _, call in calls:
            call()
    finally:
        c.close()


def count_clients(admin: redis.Redis, name: str) -> int:
    return sum(1 for entry in admin.client_list() if entry.get("name") == name)


def test_the_pool_never_opens_more_connections_than_its_size(
    private_redis: PrivateRedis,
) -> None:
    name = "nexus-pool-" + os.urandom(3).hex()
    c = new_client(private_redis.url, pool_size=3, name=name)
    admin = redis.Redis.from_url(private_redis.url)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(count_clients(admin, name))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        calls = stores_on(c)

        def busy(i: int) -> list[Any]:
            return [outcome(calls[(i + n) % 3][1]) for n in range(30)]

        results = run_concurrently([lambda i=i: busy(i) for i in range(20)])
    finally:
        stop.set()
        watcher.join()
    try:
        flat = [r for batch in results for r in batch]
        # Every call either succeeded or failed closed, never anything else.
        assert all(
            not isinstance(r, tuple) or r[0] in ("UnavailableError", "RateLimitedError")
            for r in flat
        )
        assert max(seen) <= 3
        assert count_clients(admin, name) == 3
    finally:
        c.close()
        admin.close()


def test_a_caller_waits_for_a_free_connection_then_fails_closed(
    private_redis: PrivateRedis,
) -> None:
    c = new_client(private_redis.url, pool_size=1)
    try:
        budget = RedisSessionBudget(c, "p", 10)
        assert budget.charge("s") == 9
        held = c.connection_pool.get_connection()
        try:
            started = time.monotonic()
            with pytest.raises(UnavailableError) as refused:
                budget.charge("s")
            waited = time.monotonic() - started
            assert TIMEOUT * 0.8 <= waited < TIMEOUT * 3
            assert refused.value.facts["store"] == "limits"
        finally:
            c.connection_pool.release(held)
        assert budget.charge("s") == 8
    finally:
        c.close()


def test_every_key_stays_under_the_prefix_and_holds_no_clear_id(
    private_redis: PrivateRedis,
) -> None:
    c = new_client(private_redis.url)
    try:
        secret = "alice@example.com-session-" + os.urandom(4).hex()
        RedisNonceStore(c, "deploy-a").consume(secret, time.time() + 60)
        RedisSessionBudget(c, "deploy-a", 5).charge(secret)
        RedisRateLimiter(c, "deploy-a", 5, 10.0).check(secret)
        keys = [k.decode() for k in c.scan_iter(match="*")]
        assert len(keys) == 3
        assert all(k.startswith("deploy-a:") for k in keys)
        for k in keys:
            assert secret not in k
            kind = c.type(k)
            values = (
                [m for m, _ in c.zrange(k, 0, -1, withscores=True)]
                if kind == b"zset"
                else [c.get(k)]
            )
            assert all(secret.encode() not in (v or b"") for v in values)
    finally:
        c.close()


def test_an_invalid_url_is_a_config_error_that_does_not_quote_it() -> None:
    url = "http://user:hunter2@example.net:1/0"
    with pytest.raises(ConfigError) as refused:
        redis_client(url, pool_size=1, connect_timeout=1, timeout=1)
    assert "hunter2" not in str(refused.value)
    assert refused.value.__cause__ is None


def test_call_store_maps_every_driver_failure_and_keeps_other_errors() -> None:
    def fail(exc: Exception) -> Callable[[], None]:
        def call() -> None:
            raise exc

        return call

    for exc in (
        redis.exceptions.ConnectionError("Error 111 connecting to 10.0.0.1:6379"),
        redis.exceptions.TimeoutError("Timeout reading from 10.0.0.1:6379"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.ResponseError("ERR Error running script"),
        redis.exceptions.NoScriptError("NOSCRIPT"),
        OSError("socket"),
    ):
        with pytest.raises(UnavailableError) as refused:
            call_store("limits", "op", fail(exc))
        assert refused.value.facts == {"store": "limits", "error": type(exc).__name__}
        assert "10.0.0.1" not in str(refused.value)
    with pytest.raises(KeyError):
        call_store("limits", "op", fail(KeyError("x")))


# --- both limits in one round trip --------------------------------------------------------


def admitted(call: Callable[[], object]) -> str:
    try:
        call()
    except RateLimitedError:
        return "rate"
    except BudgetExceededError:
        return "budget"
    return "ok"


def test_one_round_trip_limits_answer_exactly_as_the_two_local_counters(
    client: redis.Redis, state_prefix: str
) -> None:
    """Rate first, then budget; a rate refusal counts nothing, a budget refusal stays
    counted against the rate: the same answers as SeparateLimits over the local counters."""
    schedule = [("alice", "s1")] * 4 + [("alice", "s2")] * 4 + [("bob", "s1")] * 3
    shared = RedisCallLimits(
        RedisRateLimiter(client, state_prefix, 6, 60), RedisSessionBudget(client, state_prefix, 3)
    )
    local = SeparateLimits(SlidingWindowRateLimiter(6, 60), SessionBudget(3))
    got = [admitted(lambda s=s, k=k: shared.admit(s, k)) for s, k in schedule]
    want = [admitted(lambda s=s, k=k: local.admit(s, k)) for s, k in schedule]
    assert got == want
    assert got == ["ok"] * 3 + ["budget"] + ["ok"] * 2 + ["rate"] * 2 + ["budget"] * 3


def test_one_round_trip_limits_fail_closed(private_redis: PrivateRedis, state_prefix: str) -> None:
    c = new_client(private_redis.url)
    try:
        limits = RedisCallLimits(
            RedisRateLimiter(c, state_prefix, 5, 60), RedisSessionBudget(c, state_prefix, 5)
        )
        limits.admit("alice", "s")
        private_redis.stop()
        with pytest.raises(UnavailableError) as caught:
            limits.admit("alice", "s")
        assert str(private_redis.port) not in str(caught.value)
        private_redis.start()
        limits.admit("alice", "s")  # the script is loaded again after the restart
    finally:
        c.close()
