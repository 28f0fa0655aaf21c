"""Call budgets, rate limits and per-tool timeouts: how much a caller may do, and how fast.

- ``SessionBudget``: at most N calls per session key (the MCP session id, or the
  principal key where the protocol has no session). A key idle for ``idle_ttl_seconds``
  is forgotten, which bounds memory; so does ``maxsize`` (least recently used first).
- ``SlidingWindowRateLimiter``: at most N calls per subject in any window of W seconds,
  a true sliding window over the accepted calls' timestamps. A subject is forgotten W
  seconds after its last accepted call, when all its timestamps are stale anyway, so
  expiry loses nothing; ``maxsize`` bounds memory beyond that.
- ``ToolTimeouts``: the seconds each tool may run; the caller applies them with
  ``asyncio.timeout`` so cancellation propagates.

Both counters are thread-safe (one lock each) and never await, so they are also safe
across asyncio tasks. Clocks are injectable and must be monotonic.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar

from nexus_mcp.errors import BudgetExceededError, ConfigError, RateLimitedError

Clock = Callable[[], float]

DEFAULT_SESSION_IDLE_TTL_SECONDS = 3600.0
DEFAULT_TRACKED_KEYS = 10_000
DEFAULT_TOOL_TIMEOUT_SECONDS = 30.0
MAX_TOOL_TIMEOUT_SECONDS = 3600.0
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _require_positive_int(value: int, setting: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{setting} must be a positive integer")


def _require_positive_seconds(value: float, setting: str, maximum: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{setting} must be a number of seconds")
    if not math.isfinite(value) or value <= 0 or value > maximum:
        raise ConfigError(f"{setting} must be greater than 0 and at most {maximum} seconds")


K = TypeVar("K")
V = TypeVar("V")


class IdleExpiringMap(Generic[K, V]):
    """A map that forgets a key ``ttl`` seconds after it was last set, bounded to ``maxsize``.

    What ``cachetools.TTLCache`` does for these counters, at a fifth of the cost per call
    (benchmarks/bench_chain.py): with one TTL for all keys, the dict's own insertion order
    is the order in which keys expire if every set re-inserts its key, so expiry only
    looks at the front and the least recently set key is the one to drop when full.
    Not thread-safe by itself: the counters below hold their own lock.
    """

    def __init__(self, maxsize: int, ttl: float) -> None:
        self._maxsize = maxsize
        self._ttl = ttl
        self._data: dict[K, tuple[float, V]] = {}

    def get(self, key: K, now: float) -> V | None:
        self.expire(now)
        item = self._data.get(key)
        return None if item is None else item[1]

    def set(self, key: K, value: V, now: float) -> None:
        data = self._data
        data.pop(key, None)
        data[key] = (now + self._ttl, value)
        if len(data) > self._maxsize:
            del data[next(iter(data))]

    def expire(self, now: float) -> None:
        data = self._data
        while data:
            oldest = next(iter(data))
            if data[oldest][0] > now:
                return
            del data[oldest]

    def __len__(self) -> int:
        return len(self._data)


class CallBudget(Protocol):
    """Calls per session key: ``SessionBudget`` here, a Redis counter with the shared
    backend (``stores/redis_state.py``)."""

    @property
    def max_calls(self) -> int: ...

    def charge(self, key: str) -> int:
        """Count one call; the calls left, or ``BudgetExceededError`` (nothing counted)."""
        ...


class RateLimiter(Protocol):
    """Calls per subject in a sliding window: ``SlidingWindowRateLimiter`` here, one Lua
    script on Redis with the shared backend."""

    def check(self, subject: str) -> None:
        """Accept and count one call, or raise ``RateLimitedError`` (nothing counted)."""
        ...


class CallLimits(Protocol):
    """Both limits of one call, asked together: the rate of ``subject``, then the budget of
    ``session_key``. A shared backend answers both in one round trip."""

    def admit(self, subject: str, session_key: str) -> None:
        """Count one call, or raise ``RateLimitedError`` (nothing counted) or
        ``BudgetExceededError`` (counted against the rate only)."""
        ...


@dataclass(frozen=True)
class SeparateLimits:
    """``CallLimits`` from a ``RateLimiter`` and a ``CallBudget`` asked one after the
    other (the in-process counters: microseconds each)."""

    rate: RateLimiter
    budget: CallBudget

    def admit(self, subject: str, session_key: str) -> None:
        self.rate.check(subject)
        self.budget.charge(session_key)


class SessionBudget:
    """Counts calls per session key and refuses the call after the last one allowed."""

    def __init__(
        self,
        max_calls_per_session: int,
        clock: Clock = time.monotonic,
        *,
        idle_ttl_seconds: float = DEFAULT_SESSION_IDLE_TTL_SECONDS,
        maxsize: int = DEFAULT_TRACKED_KEYS,
    ) -> None:
        _require_positive_int(max_calls_per_session, "budgets.max_calls_per_session")
        _require_positive_seconds(idle_ttl_seconds, "budgets.idle_ttl_seconds")
        _require_positive_int(maxsize, "budgets.maxsize")
        self._max_calls = max_calls_per_session
        self._clock = clock
        self._lock = threading.Lock()
        # Re-setting a key renews its TTL, so expiry means "idle for the TTL".
        self._calls: IdleExpiringMap[str, int] = IdleExpiringMap(maxsize, idle_ttl_seconds)

    @property
    def max_calls(self) -> int:
        return self._max_calls

    def charge(self, key: str) -> int:
        """Count one call for ``key``; returns the calls left, or raises ``BudgetExceededError``."""
        with self._lock:
            now = self._clock()
            used = self._calls.get(key, now) or 0
            if used >= self._max_calls:
                # Renew the TTL: a session hammering an exhausted budget stays exhausted.
                self._calls.set(key, used, now)
                raise BudgetExceededError(limit=self._max_calls)
            self._calls.set(key, used + 1, now)
            return self._max_calls - used - 1

    def __len__(self) -> int:
        with self._lock:
            self._calls.expire(self._clock())
            return len(self._calls)


class SlidingWindowRateLimiter:
    """At most ``max_calls`` accepted calls per subject in any ``window_seconds``."""

    def __init__(
        self,
        max_calls: int,
        window_seconds: float,
        clock: Clock = time.monotonic,
        *,
        maxsize: int = DEFAULT_TRACKED_KEYS,
    ) -> None:
        _require_positive_int(max_calls, "rate_limit.max_calls")
        _require_positive_seconds(window_seconds, "rate_limit.window_seconds")
        _require_positive_int(maxsize, "rate_limit.maxsize")
        self._max_calls = max_calls
        self._window = float(window_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: IdleExpiringMap[str, deque[float]] = IdleExpiringMap(maxsize, self._window)

    def check(self, subject: str) -> None:
        """Accept and record one call for ``subject``, or raise ``RateLimitedError``."""
        with self._lock:
            now = self._clock()
            stamps = self._calls.get(subject, now)
            if stamps is None:
                stamps = deque(maxlen=self._max_calls)
            cutoff = now - self._window
            while stamps and stamps[0] <= cutoff:
                stamps.popleft()
            if len(stamps) >= self._max_calls:
                retry_after = max(0.0, stamps[0] + self._window - now)
                raise RateLimitedError(
                    limit=self._max_calls,
                    window_seconds=self._window,
                    retry_after_seconds=math.ceil(retry_after),
                )
            stamps.append(now)
            self._calls.set(subject, stamps, now)

    def __len__(self) -> int:
        with self._lock:
            self._calls.expire(self._clock())
            return len(self._calls)


@dataclass(frozen=True)
class ToolTimeouts:
    """Seconds per tool: ``default_seconds`` unless ``overrides`` names the tool."""

    default_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS
    overrides: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        _require_positive_seconds(
            self.default_seconds, "timeouts.default_seconds", MAX_TOOL_TIMEOUT_SECONDS
        )
        if not isinstance(self.overrides, Mapping):
            raise ConfigError("timeouts.overrides must be a mapping")
        for tool, seconds in self.overrides.items():
            if not isinstance(tool, str) or not _TOOL_NAME_RE.fullmatch(tool):
                raise ConfigError("timeouts.overrides keys must be tool names")
            _require_positive_seconds(
                seconds, f"timeouts.overrides.{tool}", MAX_TOOL_TIMEOUT_SECONDS
            )
        # Freeze a private copy so a caller's dict cannot change the limits later.
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))

    def timeout_for(self, tool_name: str) -> float:
        return float(self.overrides.get(tool_name, self.default_seconds))


__all__ = [
    "DEFAULT_SESSION_IDLE_TTL_SECONDS",
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "DEFAULT_TRACKED_KEYS",
    "MAX_TOOL_TIMEOUT_SECONDS",
    "SessionBudget",
    "SlidingWindowRateLimiter",
    "ToolTimeouts",
]
