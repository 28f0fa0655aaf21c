"""The nonce store: remembers which approval-token ids (``jti``) were already used.

An approval token is single use. The approval check consumes its ``jti`` here after
every other check passed; a second ``consume`` of the same id answers ``False`` and
the caller refuses the call as a replay. An id only has to be remembered until the
token could no longer verify anyway (its ``exp`` plus the clock-skew leeway), which is
what the caller passes as ``expires_at``; after that the entry is dropped.

``NonceStore`` is deliberately tiny (one atomic operation) so a shared backend such
as Redis (``SET jti 1 NX EXAT expires_at``) can replace the in-memory default later
without touching policy code.

The in-memory store fails closed when full: evicting an id that has not expired yet
would re-open a replay window, so instead new ids are refused with
``RateLimitedError`` until old ones expire. Only tokens that passed signature
verification reach the store, so filling it takes that many server-minted tokens.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from nexus_mcp.errors import ConfigError, RateLimitedError

DEFAULT_NONCE_STORE_MAXSIZE = 100_000
NONCE_STORE_FULL = "nonce_store_full"

Clock = Callable[[], float]


@runtime_checkable
class NonceStore(Protocol):
    """Remembers used token ids until they expire."""

    def consume(self, jti: str, expires_at: float) -> bool:
        """Record ``jti`` as used until ``expires_at`` (epoch seconds).

        Atomic: ``True`` for exactly one caller the first time an id is seen, ``False``
        for every later call while the id is remembered.
        """
        ...


class MemoryNonceStore:
    """Process-local ``NonceStore``: a dict plus an expiry heap under one lock.

    The lock makes ``consume`` atomic across threads; it never awaits, so it is also
    atomic across asyncio tasks on one loop. ``clock`` must be the same time base as
    ``expires_at`` (wall-clock epoch seconds: token ``exp`` is epoch time).
    """

    def __init__(
        self, maxsize: int = DEFAULT_NONCE_STORE_MAXSIZE, clock: Clock = time.time
    ) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ConfigError("nonce store maxsize must be a positive integer")
        self._maxsize = maxsize
        self._clock = clock
        self._lock = threading.Lock()
        self._expiry_by_jti: dict[str, float] = {}
        self._expiry_heap: list[tuple[float, str]] = []

    def consume(self, jti: str, expires_at: float) -> bool:
        with self._lock:
            now = self._clock()
            self._purge_expired(now)
            if jti in self._expiry_by_jti:
                return False
            if len(self._expiry_by_jti) >= self._maxsize:
                raise RateLimitedError(limit=NONCE_STORE_FULL, maxsize=self._maxsize)
            self._expiry_by_jti[jti] = expires_at
            heapq.heappush(self._expiry_heap, (expires_at, jti))
            return True

    def __len__(self) -> int:
        with self._lock:
            self._purge_expired(self._clock())
            return len(self._expiry_by_jti)

    def _purge_expired(self, now: float) -> None:
        # The heap holds every stored id exactly once, earliest expiry first, so
        # purging costs O(log n) per expired id and nothing when none expired.
        heap = self._expiry_heap
        while heap and heap[0][0] <= now:
            _, jti = heapq.heappop(heap)
            del self._expiry_by_jti[jti]


__all__ = [
    "DEFAULT_NONCE_STORE_MAXSIZE",
    "NONCE_STORE_FULL",
    "MemoryNonceStore",
    "NonceStore",
]
