"""``PostgresAuditHeads``: where each replica's audit head is anchored on the shared backend.

A replica's audit file is hash-chained and its head stored beside it
(``observability/audit_chain.py``); whoever can rewrite the file can rewrite that head
too. The same head, kept in PostgreSQL under (key prefix, replica, log name), cannot be
rolled back from the replica's machine: ``nexus-mcp audit verify --config ...`` checks
that the anchored hash is a record of the chain. Rows are keyed per replica, so replicas
keep one chain each, with their heads recorded side by side.
"""

from __future__ import annotations

import time

from nexus_mcp.stores.postgres import PostgresPool

STORE_AUDIT = "audit_heads"

_UPSERT = """
INSERT INTO audit_heads (key_prefix, replica, log, last_sha256, anchored_at)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (key_prefix, replica, log)
DO UPDATE SET last_sha256 = EXCLUDED.last_sha256, anchored_at = EXCLUDED.anchored_at
"""
_SELECT = """
SELECT last_sha256, anchored_at FROM audit_heads
WHERE key_prefix = %s AND replica = %s AND log = %s
"""


class PostgresAuditHeads:
    """Anchored audit heads in PostgreSQL; every failure is ``UnavailableError``."""

    def __init__(self, pool: PostgresPool, key_prefix: str) -> None:
        self.pool = pool
        self.key_prefix = key_prefix

    def anchor(self, replica: str, log: str, last_sha256: str) -> None:
        with self.pool.connection(STORE_AUDIT) as conn:
            conn.execute(_UPSERT, (self.key_prefix, replica, log, last_sha256, time.time()))

    def head(self, replica: str, log: str) -> tuple[str, float] | None:
        """The anchored ``(sha256, unix time)`` of ``replica``'s ``log``, or None."""
        with self.pool.connection(STORE_AUDIT) as conn:
            row = conn.execute(_SELECT, (self.key_prefix, replica, log)).fetchone()
        return (str(row[0]), float(row[1])) if row is not None else None


__all__ = ["STORE_AUDIT", "PostgresAuditHeads"]
