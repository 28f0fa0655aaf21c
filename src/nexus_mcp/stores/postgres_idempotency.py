"""``PostgresIdempotencyStore``: the idempotency store (``idempotency.SqlIdempotencyStore``)
on PostgreSQL.

The claim life cycle is the SQLite store's; this module is only its PostgreSQL adapter
(``IdempotencyBackend``): a pooled connection per call (failures become
``UnavailableError(store="idempotency")``), the key's row locked with ``FOR UPDATE``
inside ``begin``'s transaction, single statements in autocommit, and ``wait`` polling in
a worker thread (each poll is a round trip).

Leases and expiry are judged by the database's clock (``clock_timestamp()``), the one
clock every replica shares: a replica whose own clock runs ahead can neither take over a
live claim nor forget a record early. ``clock`` replaces it in tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from nexus_mcp.errors import UnavailableError
from nexus_mcp.stores.idempotency import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_TTL_SECONDS,
    SqlIdempotencyStore,
)
from nexus_mcp.stores.postgres import STORE_IDEMPOTENCY, Connection, PostgresPool, PostgresSession
from nexus_mcp.stores.sql import Session

_DATABASE_NOW = "SELECT extract(epoch FROM clock_timestamp())::float8"


class PostgresIdempotencyStore(SqlIdempotencyStore):
    """``IdempotencyStore`` in PostgreSQL (the life cycle of ``stores/idempotency.py``).

    When another replica claims the same new key at the same moment, ``begin``'s insert
    waits for it and does nothing, and its claim is read back: exactly one caller gets
    NEW. ``close`` leaves the pool, which the stores share, to its owner.
    """

    def __init__(
        self,
        pool: PostgresPool,
        *,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            _PostgresIdempotency(pool),
            ttl_seconds=ttl_seconds,
            lease_seconds=lease_seconds,
            clock=clock,
        )


class _PostgresIdempotency:
    """``IdempotencyBackend`` on a shared ``PostgresPool``."""

    lock_row = " FOR UPDATE"
    remote = True

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool
        self._closed = False

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self._connection() as conn, conn.transaction():
            yield PostgresSession(conn)

    @contextmanager
    def statement(self) -> Iterator[Session]:
        with self._connection() as conn:
            yield PostgresSession(conn)

    def now(self, session: Session) -> float:
        row = session.one(_DATABASE_NOW)
        assert row is not None
        return float(row[0])

    def close(self) -> None:
        """Refuse further calls; the shared pool is closed by its owner."""
        self._closed = True

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        if self._closed:
            raise UnavailableError(store=STORE_IDEMPOTENCY)
        with self._pool.connection(STORE_IDEMPOTENCY) as conn:
            yield conn


__all__ = ["PostgresIdempotencyStore"]
