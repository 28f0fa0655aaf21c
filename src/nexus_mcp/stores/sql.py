"""The statements the SQL stores run, whatever the database: a ``Session`` per backend.

The grants and idempotency stores (``grants.SqlTupleStore``,
``idempotency.SqlIdempotencyStore``) make their decisions once, in statements written
with ``?`` placeholders, and run them through a ``Session``: ``SqliteSession`` here,
``postgres.PostgresSession`` (which turns ``?`` into psycopg's ``%s``) for the shared
backend. Transactions, locking, error mapping and what a database cannot store belong to
each store's small backend adapter, never to the store's logic.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

Row = tuple[Any, ...]


class Session(Protocol):
    """One connection (inside a transaction or not) running ``?``-placeholder SQL."""

    def one(self, query: str, params: Sequence[object] = ()) -> Row | None:
        """The first row of the result, if any."""
        ...

    def all(self, query: str, params: Sequence[object] = ()) -> list[Row]: ...

    def run(self, query: str, params: Sequence[object] = ()) -> int:
        """Execute; the number of rows changed."""
        ...

    def many(self, query: str, rows: Sequence[Sequence[object]]) -> None:
        """Execute once per parameter row (nothing for none)."""
        ...


class SqliteSession:
    """``Session`` on a ``sqlite3`` connection (``?`` is its own paramstyle)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def one(self, query: str, params: Sequence[object] = ()) -> Row | None:
        row: Row | None = self.conn.execute(query, params).fetchone()
        return row

    def all(self, query: str, params: Sequence[object] = ()) -> list[Row]:
        return self.conn.execute(query, params).fetchall()

    def run(self, query: str, params: Sequence[object] = ()) -> int:
        return self.conn.execute(query, params).rowcount

    def many(self, query: str, rows: Sequence[Sequence[object]]) -> None:
        self.conn.executemany(query, rows)


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[SqliteSession]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolls back on any exception and re-raises it.

    IMMEDIATE takes the write lock up front, so two processes cannot both read then fail
    to upgrade (SQLITE_BUSY without waiting), nor both see "no record" and both write.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield SqliteSession(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


__all__ = ["Row", "Session", "SqliteSession", "immediate"]
