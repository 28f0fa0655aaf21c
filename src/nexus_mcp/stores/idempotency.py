"""Idempotency records: run a write once per key, replay its result to every retry.

A key is scoped by ``(subject, server_id, tool_name, idempotency_key)`` and the identity
of the target the tool acts on (``policy/targets.py``: the workspace, the vault, later the
upstream server or repository), so two callers never share one and a record never
replays against another target: the same key sent to a server now serving another folder
runs (or is refused) there, while a retry on the same target after a restart replays.
Only the sha256 of the scope is stored, never the subject, key or target. Records written
before the target joined the scope (schema version 1) match no scope and expire unused.

Life of a key (``begin`` claims it atomically, across threads and processes):

- ``NEW``: nobody holds the key; this caller now owns a *pending* claim and runs the tool,
  then calls ``complete`` (success: the result becomes replayable), ``abandon`` (the call
  was refused or failed without effect: the claim is deleted and a retry runs again) or
  ``mark_unknown`` (the tool may have acted but no result was recorded, e.g. a timeout).
- ``REPLAY``: a result was recorded for the same arguments; return it, do not run the tool.
- ``CONFLICT``: the key was used with different arguments (``IDEMPOTENCY_KEY_CONFLICT``).
- ``IN_PROGRESS``: another caller holds a live claim (its owner may ``renew`` the lease
  while its call waits for an approver before running); ``wait`` polls, bounded, until it
  resolves, so concurrent calls with one key run the tool once and all get its result.
- ``OUTCOME_UNKNOWN``: the claim's lease ran out without ``complete`` (the process died
  between running the tool and recording it) or the owner marked it unknown. The write
  may have happened, so it is never run again under this key: the caller must check the
  target and retry with a new key. Refused as ``IDEMPOTENCY_KEY_CONFLICT``.

Only successes are recorded. Typed refusals (approval, policy, limits, NOT_FOUND from a
tool that changed nothing) are abandoned, so a retry after fixing the cause works. A
record, pending or not, is forgotten ``ttl_seconds`` after its claim; the lease must
outlast the longest tool timeout. The clock is injectable for tests; it is wall-clock
time because records are shared between processes.

``SqlIdempotencyStore`` is the one implementation of this life cycle; an
``IdempotencyBackend`` adapter brings what differs between databases (transactions, row
locks, the clock). ``SqliteIdempotencyStore`` is the embedded store (its adapter is here),
``postgres_idempotency.PostgresIdempotencyStore`` the shared one. Calls are short
synchronous transactions; an async caller may run them in a thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from nexus_mcp.errors import IdempotencyKeyConflictError
from nexus_mcp.stores.sql import Session, immediate

DEFAULT_TTL_SECONDS = 86_400.0
DEFAULT_LEASE_SECONDS = 300.0
BUSY_TIMEOUT_SECONDS = 10.0
WAIT_FIRST_POLL_SECONDS = 0.005
WAIT_MAX_POLL_SECONDS = 0.1
SCHEMA_VERSION = 2  # 2: the scope digest includes the target

STATE_PENDING = "pending"
STATE_SUCCEEDED = "succeeded"
STATE_UNKNOWN = "unknown"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_records (
    scope_key   TEXT PRIMARY KEY,
    args_digest TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'succeeded', 'unknown')),
    owner       TEXT,
    result_json TEXT,
    created_at  REAL NOT NULL,
    lease_until REAL NOT NULL,
    expires_at  REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_records_expiry ON idempotency_records (expires_at);
"""


class ClaimStatus(StrEnum):
    NEW = "new"
    REPLAY = "replay"
    CONFLICT = "conflict"
    IN_PROGRESS = "in_progress"
    OUTCOME_UNKNOWN = "outcome_unknown"


@dataclass(frozen=True, slots=True)
class IdempotencyScope:
    """Who retries what, where: ``target`` is the identity of what the tool acts on."""

    subject: str
    server_id: str
    tool_name: str
    idempotency_key: str
    target: str = field(kw_only=True)

    def digest(self) -> str:
        parts = [self.subject, self.server_id, self.target, self.tool_name, self.idempotency_key]
        return hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Claim:
    """What ``begin`` found; ``token`` identifies the owner of a NEW claim."""

    status: ClaimStatus
    scope: IdempotencyScope
    args_digest: str
    token: str | None = None
    result_json: str | None = None


class IdempotencyStore(Protocol):
    @property
    def lease_seconds(self) -> float: ...

    def begin(self, scope: IdempotencyScope, args_digest: str) -> Claim: ...

    def complete(self, claim: Claim, result_json: str) -> bool: ...

    def abandon(self, claim: Claim) -> bool: ...

    def mark_unknown(self, claim: Claim) -> bool: ...

    def renew(self, claim: Claim) -> bool: ...

    async def wait(self, scope: IdempotencyScope, args_digest: str, timeout: float) -> Claim: ...

    def purge_expired(self, now: float | None = None) -> int: ...

    def close(self) -> None: ...


def to_refusal(claim: Claim) -> IdempotencyKeyConflictError | None:
    """The refusal for a claim that may not run the tool (None for NEW and REPLAY)."""
    if claim.status is ClaimStatus.CONFLICT:
        return IdempotencyKeyConflictError(reason="different_arguments")
    if claim.status is ClaimStatus.OUTCOME_UNKNOWN:
        return IdempotencyKeyConflictError(
            "the outcome of an earlier call with this idempotency_key is unknown: "
            "check the target, then retry with a new idempotency_key",
            reason="outcome_unknown",
        )
    if claim.status is ClaimStatus.IN_PROGRESS:
        return IdempotencyKeyConflictError(
            "a call with this idempotency_key is still running; retry later",
            reason="in_progress",
        )
    return None


def existing_claim(
    scope: IdempotencyScope,
    args_digest: str,
    stored_digest: str,
    state: str,
    result_json: str | None,
    lease_until: float,
    now: float,
) -> Claim:
    """What ``begin`` answers for a live (unexpired) record held by someone else."""
    if stored_digest != args_digest:
        return Claim(ClaimStatus.CONFLICT, scope, args_digest)
    if state == STATE_SUCCEEDED:
        return Claim(ClaimStatus.REPLAY, scope, args_digest, result_json=result_json)
    if state == STATE_PENDING and lease_until > now:
        return Claim(ClaimStatus.IN_PROGRESS, scope, args_digest)
    return Claim(ClaimStatus.OUTCOME_UNKNOWN, scope, args_digest)


async def wait_for_claim(
    begin: Callable[[IdempotencyScope, str], Claim],
    scope: IdempotencyScope,
    args_digest: str,
    timeout: float,
    *,
    in_thread: bool = False,
) -> Claim:
    """Poll ``begin`` until the key is no longer IN_PROGRESS or ``timeout`` passes.

    The one wait loop of every store. A waiter may come back NEW (the owner abandoned):
    it then owns the claim. ``in_thread`` runs each ``begin`` in a worker thread, for a
    store whose call is a network round trip that must not block the event loop.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = WAIT_FIRST_POLL_SECONDS
    while True:
        if in_thread:
            claim = await asyncio.to_thread(begin, scope, args_digest)
        else:
            claim = begin(scope, args_digest)
        remaining = deadline - loop.time()
        if claim.status is not ClaimStatus.IN_PROGRESS or remaining <= 0:
            return claim
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, WAIT_MAX_POLL_SECONDS)


# The record of a key in ``begin``; {lock_row} is the backend's ``lock_row``.
_SELECT_RECORD = """SELECT args_digest, state, result_json, lease_until, expires_at
    FROM idempotency_records WHERE scope_key = ?{lock_row}"""


class IdempotencyBackend(Protocol):
    """What ``SqlIdempotencyStore`` needs from a database: where the backends differ."""

    # Appended to the SELECT of ``begin``: lock the key's row until the transaction ends
    # ("" where the transaction already holds the database's write lock).
    lock_row: str
    # True when each call is a network round trip: ``wait`` polls in a worker thread.
    remote: bool

    def transaction(self) -> AbstractContextManager[Session]:
        """One transaction: commits on success, rolls back on any exception."""
        ...

    def statement(self) -> AbstractContextManager[Session]:
        """A session for one statement, atomic by itself."""
        ...

    def now(self, session: Session) -> float:
        """The time leases and expiry are judged by when the store has no ``clock``:
        the database's own, in seconds since the epoch."""
        ...

    def close(self) -> None: ...


def check_lifetimes(ttl_seconds: float, lease_seconds: float) -> None:
    if ttl_seconds <= 0 or lease_seconds <= 0 or lease_seconds > ttl_seconds:
        raise ValueError("need 0 < lease_seconds <= ttl_seconds")


class SqlIdempotencyStore:
    """``IdempotencyStore`` on a SQL database: the one life cycle of both backends.

    ``begin`` is one transaction: read the key's record (locked: ``lock_row``), forget it
    if expired, else claim the key with ``INSERT .. ON CONFLICT DO NOTHING``; when another
    process claimed the same new key at the same moment, the insert waits for it and does
    nothing, and its claim is read back: exactly one caller gets NEW.

    ``clock`` (seconds since the epoch) judges leases and expiry; None leaves it to the
    backend (``now``).
    """

    def __init__(
        self,
        backend: IdempotencyBackend,
        *,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        check_lifetimes(ttl_seconds, lease_seconds)
        self._db = backend
        self._clock = clock
        self._select_record = _SELECT_RECORD.format(lock_row=backend.lock_row)
        self._ttl = ttl_seconds
        self._lease = lease_seconds

    def begin(self, scope: IdempotencyScope, args_digest: str) -> Claim:
        key = scope.digest()
        with self._db.transaction() as tx:
            now = self._now(tx)
            for _ in range(3):
                row = tx.one(self._select_record, (key,))
                if row is not None and row[4] <= now:
                    tx.run("DELETE FROM idempotency_records WHERE scope_key = ?", (key,))
                    row = None
                if row is not None:
                    stored_digest, state, result_json, lease_until, _ = row
                    return existing_claim(
                        scope, args_digest, stored_digest, state, result_json, lease_until, now
                    )
                token = os.urandom(16).hex()
                inserted = tx.one(
                    "INSERT INTO idempotency_records (scope_key, args_digest, state, owner,"
                    " result_json, created_at, lease_until, expires_at)"
                    " VALUES (?, ?, ?, ?, NULL, ?, ?, ?)"
                    " ON CONFLICT (scope_key) DO NOTHING RETURNING 1",
                    (
                        key,
                        args_digest,
                        STATE_PENDING,
                        token,
                        now,
                        now + self._lease,
                        now + self._ttl,
                    ),
                )
                if inserted is not None:
                    return Claim(ClaimStatus.NEW, scope, args_digest, token=token)
                # Another caller committed a claim on this key meanwhile: read theirs.
        # Claimed and released repeatedly under us: someone is working on the key.
        return Claim(ClaimStatus.IN_PROGRESS, scope, args_digest)

    def complete(self, claim: Claim, result_json: str) -> bool:
        """Record the success of an owned claim; False when the claim is no longer ours."""
        return self._update_owned(
            claim,
            "UPDATE idempotency_records SET state = ?, result_json = ?, owner = NULL"
            " WHERE scope_key = ? AND owner = ? AND state = ?",
            (STATE_SUCCEEDED, result_json),
        )

    def abandon(self, claim: Claim) -> bool:
        """Delete an owned pending claim: the call had no effect, so a retry may run."""
        return self._update_owned(
            claim, "DELETE FROM idempotency_records WHERE scope_key = ? AND owner = ? AND state = ?"
        )

    def mark_unknown(self, claim: Claim) -> bool:
        """The tool may have acted without a recorded result: retries are refused."""
        return self._update_owned(
            claim,
            "UPDATE idempotency_records SET state = ?, owner = NULL"
            " WHERE scope_key = ? AND owner = ? AND state = ?",
            (STATE_UNKNOWN,),
        )

    @property
    def lease_seconds(self) -> float:
        """How long a pending claim is trusted without ``complete`` (or ``renew``)."""
        return self._lease

    def renew(self, claim: Claim) -> bool:
        """A fresh lease (and a record that outlives it) for an owned pending claim whose
        call still waits before running (for an approver: ``middleware/waiting.py``), so
        retries under its key keep waiting for it instead of being refused as outcome
        unknown. False when the claim is no longer this caller's."""
        if claim.status is not ClaimStatus.NEW or claim.token is None:
            return False
        with self._db.statement() as db:
            lease_until = self._now(db) + self._lease
            return (
                db.run(
                    "UPDATE idempotency_records SET lease_until = ?,"
                    " expires_at = CASE WHEN expires_at < ? THEN ? ELSE expires_at END"
                    " WHERE scope_key = ? AND owner = ? AND state = ?",
                    (
                        lease_until,
                        lease_until,
                        lease_until,
                        claim.scope.digest(),
                        claim.token,
                        STATE_PENDING,
                    ),
                )
                == 1
            )

    async def wait(self, scope: IdempotencyScope, args_digest: str, timeout: float) -> Claim:
        """Poll ``begin`` until the key is no longer IN_PROGRESS or ``timeout`` passes.

        A waiter may come back NEW (the owner abandoned): it then owns the claim. With a
        remote database each poll runs in a worker thread: it is a round trip.
        """
        return await wait_for_claim(
            self.begin, scope, args_digest, timeout, in_thread=self._db.remote
        )

    def purge_expired(self, now: float | None = None) -> int:
        with self._db.statement() as db:
            moment = self._now(db) if now is None else now
            return db.run("DELETE FROM idempotency_records WHERE expires_at <= ?", (moment,))

    def close(self) -> None:
        self._db.close()

    def _now(self, session: Session) -> float:
        return self._clock() if self._clock is not None else self._db.now(session)

    def _update_owned(self, claim: Claim, query: str, leading: tuple[str, ...] = ()) -> bool:
        if claim.status is not ClaimStatus.NEW or claim.token is None:
            return False
        with self._db.statement() as db:
            params = (*leading, claim.scope.digest(), claim.token, STATE_PENDING)
            return db.run(query, params) == 1


class SqliteIdempotencyStore(SqlIdempotencyStore):
    """SQLite (WAL) store; one connection behind a lock, ``BEGIN IMMEDIATE`` per claim."""

    def __init__(
        self,
        path: Path | str,
        *,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_lifetimes(ttl_seconds, lease_seconds)  # before the file is opened
        super().__init__(
            _SqliteIdempotency(path),
            ttl_seconds=ttl_seconds,
            lease_seconds=lease_seconds,
            clock=clock,
        )


class _SqliteIdempotency:
    """``IdempotencyBackend`` of one SQLite file: every statement runs under the thread
    lock in ``BEGIN IMMEDIATE``, which takes SQLite's write lock before reading, so two
    processes cannot both see "no record" and both claim. SQLite has no clock: the
    store's (wall-clock time by default) judges."""

    lock_row = ""
    remote = False

    def __init__(self, path: Path | str) -> None:
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            str(path), timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
        )
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_SECONDS * 1000)}")
            self._conn.executescript(_SCHEMA)
            self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self._lock, immediate(self._conn) as session:
            yield session

    def statement(self) -> AbstractContextManager[Session]:
        return self.transaction()

    def now(self, session: Session) -> float:
        return time.time()

    def close(self) -> None:
        with self._lock:
            self._conn.close()


__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_TTL_SECONDS",
    "Claim",
    "ClaimStatus",
    "IdempotencyBackend",
    "IdempotencyScope",
    "IdempotencyStore",
    "SqlIdempotencyStore",
    "SqliteIdempotencyStore",
    "existing_claim",
    "to_refusal",
    "wait_for_claim",
]
