"""The nonce store: remembers which approval-token ids (``jti``) were already used.

An approval token is single use. The approval check consumes its ``jti`` here after
every other check passed; a second ``consume`` of the same id answers ``False`` and
the caller refuses the call as a replay. An id only has to be remembered until the
token could no longer verify anyway (its ``exp`` plus the clock-skew leeway), which is
what the caller passes as ``expires_at``; after that the entry is dropped.

``NonceStore`` is deliberately tiny (one atomic operation) so a shared backend such
as Redis (``SET jti 1 NX EXAT expires_at``) can replace the embedded one later
without touching policy code.

The server uses ``SqliteNonceStore``: used ids live in ``nonces.sqlite3`` in the data
directory until they expire, so a token spent before a restart stays spent after it, and
processes sharing the file (several servers on one machine) spend each id once. Replicas
on other machines need the shared store (a later release). It stores only the sha256 of
each id, and fails closed: when the file cannot be read or written (locked past the busy
timeout, disk full, closed) ``consume`` refuses with ``INTERNAL_ERROR`` (reason
``nonce_store_unavailable``) rather than answer, so a store it cannot check never lets a
replay through.

``MemoryNonceStore`` (process-local, forgotten on restart) stays for tests and benchmarks.
It fails closed when full: evicting an id that has not expired yet would re-open a replay
window, so instead new ids are refused with ``RateLimitedError`` until old ones expire.
Only tokens that passed signature verification reach a store, so filling it takes that
many server-minted tokens; the SQLite store is bounded by the same fact (each id lives at
most one token lifetime plus the leeway) and needs no size limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from nexus_mcp.errors import ConfigError, InternalError, RateLimitedError

# The protocol is policy's (what spending an approval needs); these are its backends.
from nexus_mcp.policy.approvals import NonceStore

DEFAULT_NONCE_STORE_MAXSIZE = 100_000
NONCE_STORE_FULL = "nonce_store_full"
NONCE_STORE_UNAVAILABLE = "nonce_store_unavailable"
BUSY_TIMEOUT_SECONDS = 10.0
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS used_nonces (
    jti_sha256 TEXT PRIMARY KEY,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS used_nonces_expiry ON used_nonces (expires_at);
"""

Clock = Callable[[], float]


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

    def spent(self, jti: str) -> bool:
        with self._lock:
            self._purge_expired(self._clock())
            return jti in self._expiry_by_jti

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


class SqliteNonceStore:
    """``NonceStore`` on SQLite (WAL): used ids survive restarts and are shared by processes.

    ``consume`` is one ``BEGIN IMMEDIATE`` transaction: drop expired ids, then insert this
    one under its primary key. SQLite's write lock serializes every connection to the file,
    and the key makes a second insert of one id a no-op, so exactly one caller (thread or
    process) sees it inserted. ``clock`` is wall-clock epoch time, the base of
    ``expires_at``; ``busy_timeout_seconds`` bounds how long a call waits for the lock
    before it fails closed.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        clock: Clock = time.time,
        busy_timeout_seconds: float = BUSY_TIMEOUT_SECONDS,
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            str(path), timeout=busy_timeout_seconds, isolation_level=None, check_same_thread=False
        )
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
            self._conn.executescript(_SCHEMA)
            self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def consume(self, jti: str, expires_at: float) -> bool:
        key = _digest(jti)
        with self._transaction() as conn:
            conn.execute("DELETE FROM used_nonces WHERE expires_at <= ?", (self._clock(),))
            cursor = conn.execute(
                "INSERT INTO used_nonces VALUES (?, ?) ON CONFLICT (jti_sha256) DO NOTHING",
                (key, float(expires_at)),
            )
            return cursor.rowcount == 1

    def spent(self, jti: str) -> bool:
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT 1 FROM used_nonces WHERE jti_sha256 = ? AND expires_at > ?",
                (_digest(jti), self._clock()),
            ).fetchone()
            return row is not None

    def purge_expired(self, now: float | None = None) -> int:
        """Drop the ids whose tokens can no longer verify; the number dropped."""
        moment = self._clock() if now is None else now
        with self._transaction() as conn:
            return conn.execute("DELETE FROM used_nonces WHERE expires_at <= ?", (moment,)).rowcount

    def __len__(self) -> int:
        """Ids still remembered (not yet expired)."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT count(*) FROM used_nonces WHERE expires_at > ?", (self._clock(),)
            ).fetchone()
            return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # Any SQLite failure (locked past the busy timeout, disk full or read-only, a closed
        # connection) is a typed refusal: an id we could not record must not be accepted,
        # and an id we could not look up might be a replay.
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise InternalError(reason=NONCE_STORE_UNAVAILABLE) from exc
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(self._conn)
                raise InternalError(reason=NONCE_STORE_UNAVAILABLE) from exc
            except BaseException:
                _rollback(self._conn)
                raise


def _digest(jti: str) -> str:
    # Only the hash is kept: the file never holds token material (the audit log hashes
    # ids the same way).
    return hashlib.sha256(jti.encode("utf-8")).hexdigest()


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite may have rolled back already (e.g. after SQLITE_FULL): nothing is left open.
    with contextlib.suppress(sqlite3.Error):
        conn.execute("ROLLBACK")


__all__ = [
    "BUSY_TIMEOUT_SECONDS",
    "DEFAULT_NONCE_STORE_MAXSIZE",
    "NONCE_STORE_FULL",
    "NONCE_STORE_UNAVAILABLE",
    "MemoryNonceStore",
    "NonceStore",
    "SqliteNonceStore",
]
