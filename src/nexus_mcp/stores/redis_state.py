"""Approval nonces, call budgets and rate limits in Redis, shared by every replica (issue 15).

- ``RedisNonceStore``: ``SET {prefix}:nonce:{sha256(jti)} 1 NX EXAT ...``. Redis executes
  commands one at a time, so exactly one caller on any replica sees the id set; the key
  expires by itself when the token could no longer verify.
- ``RedisSessionBudget``: ``SessionBudget``'s semantics in one Lua script per call.
- ``RedisRateLimiter``: ``SlidingWindowRateLimiter``'s semantics in one Lua script per
  call, timed by the Redis server's clock.

Every key starts with the configured prefix and holds only sha256 digests of token ids,
session keys and subjects, never the values themselves.

Fail closed: any Redis failure (refused or lost connection, timeout, a server still
loading its data, a script error, no free connection in the pool) is
``UnavailableError(store="nonces")`` or ``UnavailableError(store="limits")``. A nonce is
never accepted and a call never counted as allowed on an error. The error says which
store, never its address or the driver's text.

Recovery needs no restart: a connection that broke is dropped and the next call opens a
new one (the pool reconnects a pooled socket the server closed before handing it out, the
health check PINGs long-idle ones, and one immediate retry on a connection error covers a
socket that breaks in between), and the scripts are loaded again when a restarted Redis
answers ``NOSCRIPT`` (redis-py's ``Script`` does this on ``NoScriptError``).
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.retry import Retry

from nexus_mcp.errors import BudgetExceededError, ConfigError, RateLimitedError, UnavailableError
from nexus_mcp.policy.budgets import DEFAULT_SESSION_IDLE_TTL_SECONDS

NONCES = "nonces"
# How far replica clocks may disagree (NTP keeps them far closer): a used id is kept this
# much longer than its token could verify by the consuming replica's clock.
CLOCK_SKEW_SECONDS = 300
LIMITS = "limits"
DEFAULT_CLIENT_NAME = "nexus-mcp"
# Idle pooled connections are PINGed before reuse after this many seconds, so a socket a
# Redis restart (or a proxy) closed is found and replaced before a command is sent on it.
HEALTH_CHECK_INTERVAL_SECONDS = 15
_MICROSECONDS = 1_000_000

T = TypeVar("T")


def redis_client(
    url: str,
    *,
    pool_size: int,
    connect_timeout: float,
    timeout: float,
    client_name: str = DEFAULT_CLIENT_NAME,
) -> redis.Redis:
    """A Redis client on a bounded, blocking pool of at most ``pool_size`` connections.

    A caller waits at most ``timeout`` seconds for a free connection (then the call fails
    closed), ``connect_timeout`` to connect and ``timeout`` for each answer. The pool
    reconnects a pooled socket the server closed (a Redis restart) before handing it out,
    and PINGs one idle for ``HEALTH_CHECK_INTERVAL_SECONDS``; a connection error is retried
    once, immediately, on a fresh connection (a socket that broke in between), never long
    enough to stretch an outage past the timeouts. Timeouts are not retried (the server
    is slow; waiting twice would double the caller's wait). ``client_name`` is sent with
    ``CLIENT SETNAME`` so an operator can count this process's connections in
    ``CLIENT LIST``.

    ``close()`` on the returned client closes the pool.
    """
    try:
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=pool_size,
            timeout=timeout,
            socket_connect_timeout=connect_timeout,
            socket_timeout=timeout,
            health_check_interval=HEALTH_CHECK_INTERVAL_SECONDS,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            client_name=client_name,
        )
    except (ValueError, TypeError):
        # Not chained: the driver's message may quote the URL, which may hold a password.
        raise ConfigError("state.redis_url is not a valid Redis URL") from None
    return redis.Redis.from_pool(pool)


def call_store(store: str, operation: str, call: Callable[[], T]) -> T:
    """Run one Redis operation of ``store``; any Redis failure is ``UnavailableError``.

    The one boundary every Redis call of this module goes through, so latency and errors
    can be measured per store and operation in one place (``operation`` names it).
    """
    try:
        return call()
    except (RedisError, OSError) as exc:
        # Only the store and the failure's class: the driver's text names the host.
        raise UnavailableError(store=store, error=type(exc).__name__) from exc


def key_digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def require_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError("state.key_prefix must be a non-empty string")


def _require_positive_int(value: int, setting: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{setting} must be a positive integer")


def _require_positive_seconds(value: float, setting: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{setting} must be a number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{setting} must be greater than 0 seconds")


# --- nonces -------------------------------------------------------------------------------


class RedisNonceStore:
    """``NonceStore`` on Redis: a used id is a key that expires with its token.

    ``SET key <token> NX GET`` is atomic on the server, so the first caller on any replica
    gets ``True`` and every later one ``False`` while the key lives. Each call stores its
    own random token and ``GET`` answers what the key held: when the client re-sends the
    command after a lost reply (its one retry on a broken connection), the second attempt
    finds this call's own token and still answers ``True``, not a replay of itself.

    The lifetime is relative (``EX``), never an absolute time: Redis would apply an
    absolute one by its own clock, and a replica whose clock is behind Redis's would store
    an id already expired, i.e. nothing. It is the token's remaining life by this
    replica's clock plus ``CLOCK_SKEW_SECONDS``, so replicas whose clocks disagree by up to
    that much still all find the id while any of them would accept the token.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        clock: Callable[[], float] = time.time,
        clock_skew_seconds: int = CLOCK_SKEW_SECONDS,
    ) -> None:
        require_prefix(prefix)
        if clock_skew_seconds < 0:
            raise ValueError("clock_skew_seconds must not be negative")
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._skew = clock_skew_seconds

    def key(self, jti: str) -> str:
        """The Redis key that remembers ``jti`` (its sha256 only)."""
        return f"{self._prefix}:nonce:{key_digest(jti)}"

    def consume(self, jti: str, expires_at: float) -> bool:
        if not math.isfinite(expires_at):
            raise ValueError("expires_at must be a finite epoch time")
        remaining = max(0, math.ceil(expires_at - self._clock()))
        seconds = max(1, remaining + self._skew)
        key = self.key(jti)
        token = secrets.token_hex(16)
        previous = call_store(
            NONCES,
            "consume",
            lambda: self._client.set(key, token, nx=True, ex=seconds, get=True),
        )
        # SET NX GET answers nil when it stored the key, else what the key held: this
        # call's own token only if an earlier attempt of this very call stored it.
        if previous is None:
            return True
        held = previous.decode("ascii", "replace") if isinstance(previous, bytes) else previous
        return bool(held == token)

    def spent(self, jti: str) -> bool:
        key = self.key(jti)
        return bool(call_store(NONCES, "spent", lambda: self._client.exists(key)))

    def close(self) -> None:
        """Release the client's connections (shared with the budget and rate limiter,
        which reopen them if still used)."""
        self._client.close()


# --- budgets --------------------------------------------------------------------------------

# budget(key, max calls, idle TTL in milliseconds): the calls left, or -1 when the budget
# is exhausted (nothing counted; the TTL is renewed so a session hammering an exhausted
# budget stays exhausted, as SessionBudget).
_BUDGET_LUA = """
local function budget(key, max, ttl)
  max = tonumber(max)
  local used = tonumber(redis.call('GET', key) or '0')
  if used >= max then
    redis.call('PEXPIRE', key, ttl)
    return -1
  end
  used = redis.call('INCR', key)
  redis.call('PEXPIRE', key, ttl)
  return max - used
end
"""
_BUDGET_SCRIPT = _BUDGET_LUA + "return budget(KEYS[1], ARGV[1], ARGV[2])\n"


class RedisSessionBudget:
    """``CallBudget`` on Redis: ``SessionBudget``'s rules, one counter per session key.

    At most ``max_calls_per_session`` calls per key across every replica; a key idle for
    ``idle_ttl_seconds`` is forgotten (the counter's TTL, renewed on every call, refused
    ones too). The read, the check and the increment are one script, so concurrent calls
    on several replicas never overspend. No ``maxsize``: Redis's memory is bounded by the
    idle TTL, every counter being one small key.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        max_calls_per_session: int,
        *,
        idle_ttl_seconds: float = DEFAULT_SESSION_IDLE_TTL_SECONDS,
    ) -> None:
        require_prefix(prefix)
        _require_positive_int(max_calls_per_session, "budgets.max_calls_per_session")
        _require_positive_seconds(idle_ttl_seconds, "budgets.idle_ttl_seconds")
        self._client = client
        self._prefix = prefix
        self._max_calls = max_calls_per_session
        self._ttl_ms = max(1, math.ceil(idle_ttl_seconds * 1000))
        self._script = client.register_script(_BUDGET_SCRIPT)

    @property
    def max_calls(self) -> int:
        return self._max_calls

    @property
    def ttl_ms(self) -> int:
        return self._ttl_ms

    def key(self, session_key: str) -> str:
        """The Redis key counting ``session_key``'s calls (its sha256 only)."""
        return f"{self._prefix}:budget:{key_digest(session_key)}"

    def charge(self, key: str) -> int:
        """Count one call for ``key``; returns the calls left, or raises ``BudgetExceededError``."""
        redis_key = self.key(key)
        left = call_store(
            LIMITS,
            "budget",
            lambda: self._script(keys=[redis_key], args=[self._max_calls, self._ttl_ms]),
        )
        left = _as_int(left)
        if left < 0:
            raise BudgetExceededError(limit=self._max_calls)
        return left


# --- rate limits ----------------------------------------------------------------------------

# Why one Lua script rather than the ``limits`` library: its moving window stamps calls
# with the *client's* clock (replicas with skewed clocks would disagree about the window),
# it has its own key layout (raw subjects in key names, where we keep only digests), and
# it answers a boolean with the driver's exceptions passing through, where we need the
# retry time of the refusal and typed fail-closed errors. The script is short, atomic and
# timed by the server: every replica sees one clock.
#
# rate(key, max calls, window in microseconds, window in milliseconds (the key's TTL), a
# random token keeping members unique within one microsecond): the key is the subject's
# sorted set of accepted calls (score = server time in microseconds). Answers {1, 0} when
# accepted, {0, microseconds until a call would be accepted} when not.
_RATE_LUA = """
local function rate(key, max, window, ttl, token)
  max = tonumber(max)
  window = tonumber(window)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  if count >= max then
    local oldest = redis.call('ZRANGE', key, count - max, count - max, 'WITHSCORES')
    local wait = tonumber(oldest[2]) + window - now
    if wait < 0 then wait = 0 end
    return {0, wait}
  end
  redis.call('ZADD', key, now, t[1] .. '.' .. t[2] .. ':' .. token)
  redis.call('PEXPIRE', key, ttl)
  return {1, 0}
end
"""
_RATE_SCRIPT = _RATE_LUA + "return rate(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])\n"

# Both in one round trip, in the order LimitsMiddleware asks them (rate, then budget):
# {1, calls left}, {0, microseconds to wait} (rate refused: nothing counted), or {-1, 0}
# (budget exhausted: the call stays counted against the rate, as in process).
_LIMITS_SCRIPT = (
    _RATE_LUA
    + _BUDGET_LUA
    + """
local r = rate(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if r[1] ~= 1 then return {0, r[2]} end
local left = budget(KEYS[2], ARGV[5], ARGV[6])
if left < 0 then return {-1, 0} end
return {1, left}
"""
)


class RedisRateLimiter:
    """``RateLimiter`` on Redis: ``SlidingWindowRateLimiter``'s rules for every replica.

    At most ``max_calls`` accepted calls per subject in any ``window_seconds``, a true
    sliding window over the accepted calls' server timestamps (a call exactly one window
    old no longer counts, as locally). Refused calls are not recorded. The subject's key
    expires one window after its last accepted call, when all its stamps are stale.
    ``retry_after_seconds`` is rounded up to whole seconds, like the local limiter's.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        max_calls: int,
        window_seconds: float,
    ) -> None:
        require_prefix(prefix)
        _require_positive_int(max_calls, "rate_limit.max_calls")
        _require_positive_seconds(window_seconds, "rate_limit.window_seconds")
        self._client = client
        self._prefix = prefix
        self._max_calls = max_calls
        self._window = float(window_seconds)
        self._window_us = max(1, round(window_seconds * _MICROSECONDS))
        self._window_ms = max(1, math.ceil(self._window_us / 1000))
        self._script = client.register_script(_RATE_SCRIPT)

    def key(self, subject: str) -> str:
        """The Redis key holding ``subject``'s accepted calls (its sha256 only)."""
        return f"{self._prefix}:rate:{key_digest(subject)}"

    def check(self, subject: str) -> None:
        """Accept and record one call for ``subject``, or raise ``RateLimitedError``."""
        redis_key = self.key(subject)
        args = self.script_args()
        answer = call_store(LIMITS, "rate", lambda: self._script(keys=[redis_key], args=args))
        accepted, wait_us = _pair(answer)
        if accepted != 1:
            raise self.refusal(wait_us)

    def script_args(self) -> list[int | str]:
        return [self._max_calls, self._window_us, self._window_ms, secrets.token_hex(8)]

    def refusal(self, wait_us: int) -> RateLimitedError:
        return RateLimitedError(
            limit=self._max_calls,
            window_seconds=self._window,
            retry_after_seconds=math.ceil(max(0, wait_us) / _MICROSECONDS),
        )


class RedisCallLimits:
    """``CallLimits`` on Redis: the rate limit and the session budget of one call in one
    script, one round trip (the same Lua functions the two stores run alone), with their
    exact in-process semantics and order."""

    def __init__(self, rate: RedisRateLimiter, budget: RedisSessionBudget) -> None:
        self.rate = rate
        self.budget = budget
        self._script = rate._client.register_script(_LIMITS_SCRIPT)

    def admit(self, subject: str, session_key: str) -> None:
        keys = [self.rate.key(subject), self.budget.key(session_key)]
        args = [*self.rate.script_args(), self.budget.max_calls, self.budget.ttl_ms]
        answer = call_store(LIMITS, "admit", lambda: self._script(keys=keys, args=args))
        status, value = _pair(answer)
        if status == 0:
            raise self.rate.refusal(value)
        if status == -1:
            raise BudgetExceededError(limit=self.budget.max_calls)


def _pair(answer: Any) -> tuple[int, int]:
    if not isinstance(answer, list | tuple) or len(answer) != 2:
        raise UnavailableError(store=LIMITS, error="UnexpectedReply")
    return _as_int(answer[0]), _as_int(answer[1])


def _as_int(value: Any) -> int:
    """A script's integer reply; anything else means the store misbehaved (fail closed)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnavailableError(store=LIMITS, error="UnexpectedReply")
    return value


__all__ = [
    "DEFAULT_CLIENT_NAME",
    "HEALTH_CHECK_INTERVAL_SECONDS",
    "LIMITS",
    "NONCES",
    "RedisCallLimits",
    "RedisNonceStore",
    "RedisRateLimiter",
    "RedisSessionBudget",
    "call_store",
    "key_digest",
    "redis_client",
    "require_prefix",
]
