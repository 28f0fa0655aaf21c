"""``PostgresTupleStore``: the grants store (``grants.SqlTupleStore``) on PostgreSQL.

The store's logic is the SQLite store's; this module is only its PostgreSQL adapter
(``GrantsBackend``): a pooled connection per call (failures become
``UnavailableError(store="grants")``), ``REPEATABLE READ`` snapshots for exports,
``greatest`` and ``starts_with`` for SQLite's ``max`` and ``substr``, ``COLLATE "C"``
for code point order, no text holding NUL (its reads answer empty without a round
trip), and change announcements: with ``notify_channel`` set, every write transaction
ends with ``pg_notify(channel, zone)``, delivered on commit only (``GrantsListener`` in
``postgres.py`` receives them).

Every write batch first bumps the zone's revision row, which also serializes writers
of one zone (so revisions rise by exactly one per batch and batches never deadlock on
each other's tuples). ``close`` leaves the pool, which the stores share, to its owner.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from nexus_mcp.errors import UnavailableError
from nexus_mcp.stores.grants import SqlTupleStore
from nexus_mcp.stores.postgres import (
    ALL_ZONES,
    MAX_NOTIFY_PAYLOAD_BYTES,
    STORE_GRANTS,
    Connection,
    PostgresPool,
    PostgresSession,
    check_channel,
)
from nexus_mcp.stores.sql import Session


class PostgresTupleStore(SqlTupleStore):
    """``TupleStore`` in PostgreSQL, shared by every replica (semantics of the SQLite one)."""

    def __init__(self, pool: PostgresPool, *, notify_channel: str | None = None) -> None:
        super().__init__(_PostgresGrants(pool, notify_channel))


class _PostgresGrants:
    """``GrantsBackend`` on a shared ``PostgresPool``."""

    refuses_nul = True
    greatest = "greatest"
    # The columns are "C" already (migration 0001); stated where the order is the point.
    code_point_order = ' COLLATE "C"'

    def __init__(self, pool: PostgresPool, channel: str | None) -> None:
        if channel is not None:
            check_channel(channel)
        self._pool = pool
        self._channel = channel
        self._closed = False

    @contextmanager
    def reading(self) -> Iterator[Session]:
        with self._connection() as conn:
            yield PostgresSession(conn)

    @contextmanager
    def writing(self) -> Iterator[Session]:
        with self._connection() as conn, conn.transaction():
            yield PostgresSession(conn)

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        with self._connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield PostgresSession(conn)

    def starts_with(self, prefix: str) -> tuple[str, list[object]]:
        return "starts_with(object, ?)", [prefix]

    def announce(self, session: Session, zone: str) -> None:
        if self._channel is None:
            return
        payload = zone if len(zone.encode("utf-8")) <= MAX_NOTIFY_PAYLOAD_BYTES else ALL_ZONES
        session.run("SELECT pg_notify(?, ?)", (self._channel, payload))

    def close(self) -> None:
        """Refuse further calls; the shared pool is closed by its owner."""
        self._closed = True

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        if self._closed:
            raise UnavailableError(store=STORE_GRANTS)
        with self._pool.connection(STORE_GRANTS) as conn:
            yield conn


__all__ = ["PostgresTupleStore"]
