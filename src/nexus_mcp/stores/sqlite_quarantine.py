"""Upstream quarantine evidence that outlives the process (embedded backend; issue 22,
item 15).

``SqliteQuarantineEvidence`` is ``policy/quarantine.py``'s ``PersistedEvidence`` in a small
SQLite file in the data directory (``upstream_quarantine.sqlite3``): one row per (upstream
server, tool, pin, digest) where a session showed a definition that differs from the pin.
The server adds rows as it sees them and reads them back at start-up, so a definition
that was changed and then reverted stays quarantined across a restart; ``nexus-mcp
upstream pin`` deletes a tool's rows when an operator re-pins it. It holds digests only.

SQLite's own transactions make each write atomic and let the CLI and a running server
share the file (WAL, a busy timeout). A connection per operation: writes are rare (a
changed definition) and come from worker threads.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.quarantine import Proof
from nexus_mcp.settings import Settings
from nexus_mcp.stores.locations import DATA_DIR_SETTING, upstream_quarantine_path

BUSY_TIMEOUT_SECONDS = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS upstream_evidence (
    server_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    pinned_sha256 TEXT NOT NULL,
    seen_sha256 TEXT NOT NULL,
    PRIMARY KEY (server_id, tool, pinned_sha256, seen_sha256)
) WITHOUT ROWID;
"""


class SqliteQuarantineEvidence:
    """``PersistedEvidence`` in SQLite (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def load(self, server_id: str) -> list[Proof]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT tool, pinned_sha256, seen_sha256 FROM upstream_evidence"
                " WHERE server_id = ? ORDER BY tool, pinned_sha256, seen_sha256",
                (server_id,),
            ).fetchall()
        return [(str(tool), str(pin), str(digest)) for tool, pin, digest in rows]

    def record(self, server_id: str, proofs: frozenset[Proof]) -> None:
        if not proofs:
            return
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT OR IGNORE INTO upstream_evidence VALUES (?, ?, ?, ?)",
                    [(server_id, tool, pin, digest) for tool, pin, digest in sorted(proofs)],
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def clear(self, server_id: str, tools: frozenset[str]) -> None:
        if not tools:
            return
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "DELETE FROM upstream_evidence WHERE server_id = ? AND tool = ?",
                    [(server_id, tool) for tool in sorted(tools)],
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


def open_quarantine_evidence(settings: Settings) -> SqliteQuarantineEvidence:
    """The data directory's evidence file; one that cannot be opened stops start-up (a
    server that forgot its evidence would trust a reverted definition again)."""
    try:
        return SqliteQuarantineEvidence(upstream_quarantine_path(settings))
    except sqlite3.Error as exc:
        raise ConfigError(
            f"upstream quarantine evidence cannot be opened ({type(exc).__name__}):"
            f" check {DATA_DIR_SETTING}"
        ) from None


__all__ = ["SqliteQuarantineEvidence", "open_quarantine_evidence"]
