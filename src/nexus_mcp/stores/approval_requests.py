"""Approval requests (issue 26): a write call that needs a human's approval waits here.

The approvals middleware opens a request for a call the write policy holds back; an
operator lists the pending ones, approves or denies each once; the caller's retry of the
same call (same subject, tool, server and argument digest) finds the approved request and
spends it once. A request is bound to the caller's subject and the digest of its
arguments: an approval never covers another caller or other arguments.

States: ``pending`` -> ``approved`` | ``denied``; ``approved`` -> ``used``. A pending
request past ``expires_at`` reads as ``expired`` (nothing is written for it). Requests
are deleted a day after they expire (``purge``; the SQLite and Redis stores also purge a
bounded batch on every ``open``, and Redis keys expire by themselves).

Backends: ``MemoryApprovalRequestStore`` (tests, one process), ``SqliteApprovalRequestStore``
(embedded backend: ``approval_requests.sqlite3`` in the data dir, shared by processes on
one machine), ``RedisApprovalRequestStore`` (shared backend, ``stores/redis_approvals.py``).
Every transition is atomic across threads, processes and replicas: of two concurrent
``decide`` or ``use`` calls exactly one wins, and concurrent ``open`` calls for one key
store one request.

Inputs are checked at the boundary (``ValueError`` naming the field, never its value).
Fail closed: a store that cannot be read or written refuses (SQLite: ``InternalError``,
reason ``approval_store_unavailable``; Redis: ``UnavailableError(store="approvals")``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from nexus_mcp.errors import InternalError

PENDING, APPROVED, DENIED, USED, EXPIRED = "pending", "approved", "denied", "used", "expired"
STATUSES = frozenset({PENDING, APPROVED, DENIED, USED, EXPIRED})
# What ``find``/``open`` return while not expired (``used`` ones are spent: a new request).
MATCHING = (PENDING, APPROVED, DENIED)
KEEP_AFTER_EXPIRY_SECONDS = 86_400.0
MAX_ID_CHARS = 64
MAX_TARGET_BYTES = 1024
MAX_PREVIEW_BYTES = 64 * 1024
MAX_REASON_CHARS = 500
MAX_NAME_CHARS = 1024
MAX_PENDING_LIMIT = 1000
PURGE_BATCH = 100
APPROVAL_STORE_UNAVAILABLE = "approval_store_unavailable"
BUSY_TIMEOUT_SECONDS = 10.0
SCHEMA_VERSION = 1
_ID_RE = re.compile(r"^[0-9A-Za-z_-]{1,64}$")

Clock = Callable[[], float]


@dataclass(frozen=True)
class ApprovalRequest:
    id: str  # nexus_mcp.ids.new_id() (uuid7 text)
    created_at: float  # unix seconds
    expires_at: float
    tool: str
    server_id: str | None  # upstream server id, None for native tools
    subject: str  # the caller's subject as the chain knows it (the approval is bound to it)
    log_subject: str  # Principal.log_subject (what may be shown/logged)
    role: str
    args_digest: str  # policy.approvals.digest_approved_arguments(arguments)
    target: str | None  # what the call touches, <= 1 KiB
    preview: str  # redacted, bounded preview text, <= 64 KiB
    policy_rule: str | None  # the write-policy rule that required approval
    status: str  # one of STATUSES; a pending request past expires_at reads as EXPIRED
    decided_by: str | None = None
    decided_at: float | None = None
    reason: str | None = None  # deny reason, <= 500 chars


FIELDS = tuple(f.name for f in fields(ApprovalRequest))
_FLOATS = frozenset({"created_at", "expires_at", "decided_at"})


class ApprovalDecisionError(Exception):
    """decide()/use() on a request that is unknown, expired, or not in the state required.

    ``why``: ``unknown`` | ``expired`` | ``decided`` (already approved/denied/used) |
    ``not_approved`` (``use`` of a pending or denied request)."""

    def __init__(self, why: str) -> None:
        super().__init__(f"approval request {why}")
        self.why = why


@runtime_checkable
class ApprovalRequestStore(Protocol):
    def open(self, request: ApprovalRequest) -> ApprovalRequest: ...
    def get(self, request_id: str) -> ApprovalRequest | None: ...
    def find(
        self, subject: str, tool: str, server_id: str | None, args_digest: str
    ) -> ApprovalRequest | None: ...
    def pending(self, *, limit: int = 100) -> list[ApprovalRequest]: ...
    def decide(
        self,
        request_id: str,
        *,
        approve: bool,
        approver: str,
        reason: str | None = None,
        now: float | None = None,
    ) -> ApprovalRequest: ...
    def use(self, request_id: str, *, now: float | None = None) -> ApprovalRequest: ...
    def purge(self, now: float | None = None) -> int: ...
    def close(self) -> None: ...


# --- shared rules ---------------------------------------------------------------------------


def request_key(subject: str, tool: str, server_id: str | None, args_digest: str) -> str:
    """sha256 of the (subject, tool, server_id, args_digest) a request is bound to."""
    text = json.dumps([subject, tool, server_id, args_digest], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def well_formed_id(request_id: object) -> bool:
    return isinstance(request_id, str) and bool(_ID_RE.fullmatch(request_id))


def _text(value: object, name: str, limit: int, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ValueError(f"approval request: invalid {name}")


def _seconds(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"approval request: invalid {name}")


def validate_new(request: ApprovalRequest) -> None:
    """Refuse a request ``open`` must not store (``ValueError`` names the field only)."""
    if not isinstance(request, ApprovalRequest):
        raise ValueError("approval request: not an ApprovalRequest")
    if not well_formed_id(request.id):
        raise ValueError("approval request: invalid id")
    _seconds(request.created_at, "created_at")
    _seconds(request.expires_at, "expires_at")
    if request.expires_at <= request.created_at:
        raise ValueError("approval request: expires_at must be after created_at")
    for name in ("tool", "subject", "log_subject", "role", "args_digest"):
        _text(getattr(request, name), name, MAX_NAME_CHARS)
    _text(request.server_id, "server_id", MAX_NAME_CHARS, optional=True)
    _text(request.policy_rule, "policy_rule", MAX_NAME_CHARS, optional=True)
    if request.target is not None and (
        not isinstance(request.target, str) or len(request.target.encode()) > MAX_TARGET_BYTES
    ):
        raise ValueError("approval request: invalid target")
    if not isinstance(request.preview, str) or len(request.preview.encode()) > MAX_PREVIEW_BYTES:
        raise ValueError("approval request: invalid preview")
    if request.status != PENDING:
        raise ValueError("approval request: a new request must be pending")
    if (request.decided_by, request.decided_at, request.reason) != (None, None, None):
        raise ValueError("approval request: a new request carries no decision")


def validate_decision(approver: object, reason: object) -> None:
    _text(approver, "approver", MAX_NAME_CHARS)
    _text(reason, "reason", MAX_REASON_CHARS, optional=True)


def validate_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PENDING_LIMIT:
        raise ValueError("approval request: invalid limit")
    return limit


def as_read(request: ApprovalRequest, now: float) -> ApprovalRequest:
    """A pending request past its expiry reads as ``expired``."""
    if request.status == PENDING and now >= request.expires_at:
        return replace(request, status=EXPIRED)
    return request


def matches(request: ApprovalRequest, now: float) -> bool:
    """What ``find``/``open`` return for its key: pending, approved or denied, not expired."""
    return request.status in MATCHING and now < request.expires_at


def decide_refusal(status: str, expired: bool) -> str | None:
    if status != PENDING:
        return "decided"
    return "expired" if expired else None


def apply_decision(
    found: ApprovalRequest, *, approve: bool, approver: str, reason: str | None, moment: float
) -> ApprovalRequest:
    """``found`` decided at ``moment``, or ``ApprovalDecisionError`` when it cannot be."""
    why = decide_refusal(found.status, moment >= found.expires_at)
    if why is not None:
        raise ApprovalDecisionError(why)
    return replace(
        found,
        status=APPROVED if approve else DENIED,
        decided_by=approver,
        decided_at=moment,
        reason=reason,
    )


def use_refusal(status: str, expired: bool) -> str | None:
    if status == APPROVED:
        return "expired" if expired else None
    if status == USED:
        return "decided"
    if status == PENDING and expired:
        return "expired"
    return "not_approved"


def from_mapping(values: dict[str, Any]) -> ApprovalRequest:
    """A request from stored column or hash values (absent or ``None``: ``None``)."""
    kwargs: dict[str, Any] = {}
    for name in FIELDS:
        value = values.get(name)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        if value is not None and name in _FLOATS:
            value = float(value)
        kwargs[name] = value
    return ApprovalRequest(**kwargs)


# --- in process -----------------------------------------------------------------------------


class MemoryApprovalRequestStore:
    """Process-local store (tests): dicts under one lock."""

    def __init__(self, *, clock: Clock = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_id: dict[str, ApprovalRequest] = {}
        self._by_key: dict[str, str] = {}

    def open(self, request: ApprovalRequest) -> ApprovalRequest:
        validate_new(request)
        key = request_key(request.subject, request.tool, request.server_id, request.args_digest)
        with self._lock:
            found = self._find(key, self._clock())
            if found is not None:
                return found
            if request.id in self._by_id:
                raise ValueError("approval request: id already used")
            self._by_id[request.id] = request
            self._by_key[key] = request.id
            return request

    def get(self, request_id: str) -> ApprovalRequest | None:
        with self._lock:
            found = self._by_id.get(request_id) if well_formed_id(request_id) else None
            return None if found is None else as_read(found, self._clock())

    def find(
        self, subject: str, tool: str, server_id: str | None, args_digest: str
    ) -> ApprovalRequest | None:
        key = request_key(subject, tool, server_id, args_digest)
        with self._lock:
            return self._find(key, self._clock())

    def _find(self, key: str, now: float) -> ApprovalRequest | None:
        request_id = self._by_key.get(key)
        found = None if request_id is None else self._by_id.get(request_id)
        return found if found is not None and matches(found, now) else None

    def pending(self, *, limit: int = 100) -> list[ApprovalRequest]:
        validate_limit(limit)
        with self._lock:
            now = self._clock()
            live = [r for r in self._by_id.values() if r.status == PENDING and now < r.expires_at]
        return sorted(live, key=lambda r: (r.created_at, r.id))[:limit]

    def decide(
        self,
        request_id: str,
        *,
        approve: bool,
        approver: str,
        reason: str | None = None,
        now: float | None = None,
    ) -> ApprovalRequest:
        validate_decision(approver, reason)
        with self._lock:
            moment = self._clock() if now is None else now
            found = self._by_id.get(request_id) if well_formed_id(request_id) else None
            if found is None:
                raise ApprovalDecisionError("unknown")
            decided = apply_decision(
                found, approve=approve, approver=approver, reason=reason, moment=moment
            )
            self._by_id[request_id] = decided
            return decided

    def use(self, request_id: str, *, now: float | None = None) -> ApprovalRequest:
        with self._lock:
            moment = self._clock() if now is None else now
            found = self._by_id.get(request_id) if well_formed_id(request_id) else None
            if found is None:
                raise ApprovalDecisionError("unknown")
            why = use_refusal(found.status, moment >= found.expires_at)
            if why is not None:
                raise ApprovalDecisionError(why)
            used = replace(found, status=USED)
            self._by_id[request_id] = used
            return used

    def purge(self, now: float | None = None) -> int:
        with self._lock:
            cutoff = (self._clock() if now is None else now) - KEEP_AFTER_EXPIRY_SECONDS
            gone = [r for r in self._by_id.values() if r.expires_at <= cutoff]
            for request in gone:
                del self._by_id[request.id]
                key = request_key(
                    request.subject, request.tool, request.server_id, request.args_digest
                )
                if self._by_key.get(key) == request.id:
                    del self._by_key[key]
            return len(gone)

    def close(self) -> None:
        return None


# --- SQLite (embedded backend) --------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS approval_requests (
    id TEXT PRIMARY KEY,
    key_sha256 TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    tool TEXT NOT NULL,
    server_id TEXT,
    subject TEXT NOT NULL,
    log_subject TEXT NOT NULL,
    role TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    target TEXT,
    preview TEXT NOT NULL,
    policy_rule TEXT,
    status TEXT NOT NULL,
    decided_by TEXT,
    decided_at REAL,
    reason TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS approval_requests_key ON approval_requests (key_sha256, created_at);
CREATE INDEX IF NOT EXISTS approval_requests_status ON approval_requests (status, created_at);
CREATE INDEX IF NOT EXISTS approval_requests_expiry ON approval_requests (expires_at);
"""
_COLUMNS = ", ".join(FIELDS)
_SELECT = f"SELECT {_COLUMNS} FROM approval_requests"  # noqa: S608 - constant column names
_INSERT = (
    f"INSERT INTO approval_requests (key_sha256, {_COLUMNS}) "  # noqa: S608 - constant names
    f"VALUES (?{', ?' * len(FIELDS)})"
)
_PURGE = (
    "DELETE FROM approval_requests WHERE id IN "
    "(SELECT id FROM approval_requests WHERE expires_at <= ? LIMIT ?)"
)


class SqliteApprovalRequestStore:
    """The store on SQLite (WAL): requests survive restarts and are shared by processes.

    Every change is one ``BEGIN IMMEDIATE`` transaction: SQLite's write lock serializes
    every connection to the file, so a check and the write it allows happen together.
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

    def open(self, request: ApprovalRequest) -> ApprovalRequest:
        validate_new(request)
        key = request_key(request.subject, request.tool, request.server_id, request.args_digest)
        with self._transaction() as conn:
            now = self._clock()
            conn.execute(_PURGE, (now - KEEP_AFTER_EXPIRY_SECONDS, PURGE_BATCH))
            found = self._find(conn, key, now)
            if found is not None:
                return found
            if conn.execute(
                "SELECT 1 FROM approval_requests WHERE id = ?", (request.id,)
            ).fetchone():
                raise ValueError("approval request: id already used")
            values = [getattr(request, name) for name in FIELDS]
            conn.execute(_INSERT, (key, *values))
            return request

    def get(self, request_id: str) -> ApprovalRequest | None:
        if not well_formed_id(request_id):
            return None
        with self._transaction(write=False) as conn:
            found = self._row(conn, request_id)
        return None if found is None else as_read(found, self._clock())

    def find(
        self, subject: str, tool: str, server_id: str | None, args_digest: str
    ) -> ApprovalRequest | None:
        key = request_key(subject, tool, server_id, args_digest)
        with self._transaction(write=False) as conn:
            return self._find(conn, key, self._clock())

    def pending(self, *, limit: int = 100) -> list[ApprovalRequest]:
        validate_limit(limit)
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE status = ? AND expires_at > ? ORDER BY created_at, id LIMIT ?",
                (PENDING, self._clock(), limit),
            ).fetchall()
        return [_from_row(row) for row in rows]

    def decide(
        self,
        request_id: str,
        *,
        approve: bool,
        approver: str,
        reason: str | None = None,
        now: float | None = None,
    ) -> ApprovalRequest:
        validate_decision(approver, reason)
        if not well_formed_id(request_id):
            raise ApprovalDecisionError("unknown")
        with self._transaction() as conn:
            moment = self._clock() if now is None else now
            found = self._row(conn, request_id)
            if found is None:
                raise ApprovalDecisionError("unknown")
            decided = apply_decision(
                found, approve=approve, approver=approver, reason=reason, moment=moment
            )
            conn.execute(
                "UPDATE approval_requests SET status = ?, decided_by = ?, decided_at = ?, "
                "reason = ? WHERE id = ?",
                (decided.status, approver, moment, reason, request_id),
            )
            return decided

    def use(self, request_id: str, *, now: float | None = None) -> ApprovalRequest:
        if not well_formed_id(request_id):
            raise ApprovalDecisionError("unknown")
        with self._transaction() as conn:
            moment = self._clock() if now is None else now
            found = self._row(conn, request_id)
            if found is None:
                raise ApprovalDecisionError("unknown")
            why = use_refusal(found.status, moment >= found.expires_at)
            if why is not None:
                raise ApprovalDecisionError(why)
            conn.execute("UPDATE approval_requests SET status = ? WHERE id = ?", (USED, request_id))
            return replace(found, status=USED)

    def purge(self, now: float | None = None) -> int:
        cutoff = (self._clock() if now is None else now) - KEEP_AFTER_EXPIRY_SECONDS
        with self._transaction() as conn:
            return conn.execute(
                "DELETE FROM approval_requests WHERE expires_at <= ?", (cutoff,)
            ).rowcount

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @staticmethod
    def _row(conn: sqlite3.Connection, request_id: str) -> ApprovalRequest | None:
        row = conn.execute(f"{_SELECT} WHERE id = ?", (request_id,)).fetchone()
        return None if row is None else _from_row(row)

    @staticmethod
    def _find(conn: sqlite3.Connection, key: str, now: float) -> ApprovalRequest | None:
        row = conn.execute(
            f"{_SELECT} WHERE key_sha256 = ? AND status IN (?, ?, ?) AND expires_at > ? "
            "ORDER BY created_at DESC, id DESC LIMIT 1",
            (key, *MATCHING, now),
        ).fetchone()
        return None if row is None else _from_row(row)

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        # Any SQLite failure is a typed refusal: an approval we could not check is never
        # granted, and one we could not record is never reported as decided.
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise InternalError(reason=APPROVAL_STORE_UNAVAILABLE) from exc
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(self._conn)
                raise InternalError(reason=APPROVAL_STORE_UNAVAILABLE) from exc
            except BaseException:
                _rollback(self._conn)
                raise


def _from_row(row: tuple[Any, ...]) -> ApprovalRequest:
    return from_mapping(dict(zip(FIELDS, row, strict=True)))


def _rollback(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.execute("ROLLBACK")


__all__ = [
    "APPROVAL_STORE_UNAVAILABLE",
    "APPROVED",
    "DENIED",
    "EXPIRED",
    "KEEP_AFTER_EXPIRY_SECONDS",
    "MAX_PREVIEW_BYTES",
    "MAX_REASON_CHARS",
    "MAX_TARGET_BYTES",
    "PENDING",
    "STATUSES",
    "USED",
    "ApprovalDecisionError",
    "ApprovalRequest",
    "ApprovalRequestStore",
    "MemoryApprovalRequestStore",
    "SqliteApprovalRequestStore",
    "request_key",
]
