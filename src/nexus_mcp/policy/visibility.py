"""The visible-tools cache and the filter the namespace middleware applies to tool lists.

Seed 004's session cache: a ``TTLCache`` keyed by ``(subject, zone, revision bucket)``
where ``bucket = revision // revision_window``, so a burst of writes does not empty the
cache on every one, and any entry lives at most ``ttl_seconds``.

When other processes' writes become visible here:

- a write through this process calls ``invalidate`` and is seen by the next ``get``;
- a write by another process that moves the zone into a new bucket is seen once the
  memoized revision is re-read (at most ``revision_refresh_seconds`` later);
- one that stays in the same bucket is seen when the entry expires (``ttl_seconds``).

Reading the revision is a database query, so it is memoized per zone for
``revision_refresh_seconds`` (default 1 s): a cached ``get`` then costs two dictionary
lookups under a lock (single-digit microseconds) instead of a query.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable

from cachetools import TTLCache

from nexus_mcp.errors import InternalError
from nexus_mcp.policy.grants import visible_tools
from nexus_mcp.policy.tuples import TupleStore

DEFAULT_TTL_SECONDS = 300.0
DEFAULT_REVISION_WINDOW = 10
DEFAULT_MAXSIZE = 10_000
DEFAULT_REVISION_REFRESH_SECONDS = 1.0

Lookup = Callable[[TupleStore, str, str], frozenset[str]]
CacheKey = tuple[str, str, int]


class GrantLookupError(InternalError):
    """The grants store could not answer; callers deny (show nothing) and nothing is cached."""


class VisibleToolsCache:
    """Thread-safe cache of each subject's visible tool names, revision-bucketed with a TTL."""

    def __init__(
        self,
        store: TupleStore,
        *,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        revision_window: int = DEFAULT_REVISION_WINDOW,
        maxsize: int = DEFAULT_MAXSIZE,
        clock: Callable[[], float] = time.monotonic,
        revision_refresh_seconds: float = DEFAULT_REVISION_REFRESH_SECONDS,
        lookup: Lookup = visible_tools,
    ) -> None:
        if revision_window < 1:
            raise ValueError("revision_window must be at least 1")
        self._store = store
        self._window = revision_window
        self._clock = clock
        self._refresh = revision_refresh_seconds
        self._lookup = lookup
        self._lock = threading.Lock()
        self._entries: TTLCache[CacheKey, frozenset[str]] = TTLCache(
            maxsize=maxsize, ttl=ttl_seconds, timer=clock
        )
        self._revisions: dict[str, tuple[int, float]] = {}
        # Bumped by invalidate(): a lookup that started before an invalidation must not
        # store its (possibly stale) answer after it.
        self._generation = 0
        self._counters = dict.fromkeys(("hits", "misses", "filtered", "rejected", "errors"), 0)

    def get(self, subject: str, zone: str) -> frozenset[str]:
        """The subject's visible tool names; raises ``GrantLookupError`` if the store fails."""
        with self._lock:
            memo = self._revisions.get(zone)
            generation = self._generation
            now = self._clock()
            if memo is not None and now - memo[1] < self._refresh:
                key = (subject, zone, memo[0] // self._window)
                cached = self._entries.get(key)
                if cached is not None:
                    self._counters["hits"] += 1
                    return cached
        # Slow path outside the lock: store queries must not serialize all callers.
        succeeded = False
        try:
            revision = self._read_revision(zone, memo, now)
            key = (subject, zone, revision // self._window)
            with self._lock:
                cached = self._entries.get(key)
                if cached is not None:
                    self._counters["hits"] += 1
                    succeeded = True
                    return cached
            tools = self._lookup(self._store, subject, zone)
            succeeded = True
        except (sqlite3.Error, OSError) as exc:
            raise GrantLookupError(exception=type(exc).__name__) from exc
        finally:
            if not succeeded:
                # Any failure counts, typed or not; nothing is cached on this path.
                with self._lock:
                    self._counters["errors"] += 1
        with self._lock:
            self._counters["misses"] += 1
            if generation == self._generation:
                self._entries[key] = tools
        return tools

    @property
    def generation(self) -> int:
        """Bumped by every ``invalidate``: answers read before it are stale."""
        return self._generation

    def record_hit(self) -> None:
        """Count a hit answered from a caller's own memo of this cache's answer."""
        with self._lock:
            self._counters["hits"] += 1

    def new_generation(self) -> None:
        """No recent answer built on the old generation is reused; entries stay."""
        with self._lock:
            self._generation += 1

    def invalidate(self, subject: str | None = None) -> None:
        """Forget one subject's entries (all zones) or everything; call after a grant change."""
        with self._lock:
            self._generation += 1
            self._revisions.clear()
            if subject is None:
                self._entries.clear()
                return
            for key in [k for k in self._entries if k[0] == subject]:
                self._entries.pop(key, None)

    def record_filtered(self, count: int) -> None:
        """Count tools hidden from a ``tools/list`` answer."""
        with self._lock:
            self._counters["filtered"] += count

    def record_rejected(self) -> None:
        """Count a ``tools/call`` refused because the tool is not visible."""
        with self._lock:
            self._counters["rejected"] += 1

    def metrics(self) -> dict[str, int]:
        """A snapshot of the counters and the current number of cached entries."""
        with self._lock:
            return {**self._counters, "entries": len(self._entries)}

    def _read_revision(self, zone: str, memo: tuple[int, float] | None, now: float) -> int:
        if memo is not None and now - memo[1] < self._refresh:
            return memo[0]
        revision = self._store.revision(zone)
        with self._lock:
            self._revisions[zone] = (revision, now)
        return revision


def filter_visible(
    tool_names: Iterable[str],
    visible: frozenset[str],
    *,
    read_only: bool,
    write_tools: frozenset[str],
) -> list[str]:
    """The names the caller may see, in their original order.

    A read-only caller additionally never sees write-class tools, even when granted.
    """
    allowed = visible - write_tools if read_only else visible
    # filter() with the set's own __contains__ keeps the per-name loop in C: this runs over
    # every listed tool on every tools/list.
    return list(filter(allowed.__contains__, tool_names))


__all__ = [
    "DEFAULT_REVISION_REFRESH_SECONDS",
    "DEFAULT_REVISION_WINDOW",
    "DEFAULT_TTL_SECONDS",
    "GrantLookupError",
    "VisibleToolsCache",
    "filter_visible",
]
