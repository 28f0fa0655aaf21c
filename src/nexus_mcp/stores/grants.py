"""The ReBAC tuple store: (subject, relation, object) grants and profile assignments per zone.

``TupleStore`` is the small protocol policy code depends on (``policy/tuples.py``).
``SqlTupleStore`` is its one implementation: validation, revisions, ordering, export and
import, written once in ``?``-placeholder SQL (``stores/sql.py``). A ``GrantsBackend``
adapter brings what differs between databases: connections and transactions, a few SQL
spellings, change announcements, and whether text can hold NUL. ``SqliteTupleStore`` is
the embedded default (its adapter is here); ``postgres_grants.PostgresTupleStore`` the
shared one.

Every zone has a revision number stored in the database: each write, delete or
assignment batch commits in one transaction that first bumps it by one, so another
process sharing the database (or a restart) sees the same revision, and caches keyed by
it notice foreign writes.

SQLite concurrency: one connection per thread (WAL journal, so readers never block the
writer), write batches under ``BEGIN IMMEDIATE`` with a busy timeout, so several
processes may share the file.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from nexus_mcp.errors import ConfigError, InvalidInputError

# The store as policy sees it is policy's (policy/tuples.py); this module implements it.
from nexus_mcp.policy.tuples import TOOLS_PREFIX, RelationTuple, TupleStore
from nexus_mcp.stores.sql import Session, SqliteSession, immediate

# Revisions are 64-bit signed in PostgreSQL; an import bumps past the exported one.
MAX_REVISION = 2**63 - 2
DEFAULT_ZONE = "default"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_SECONDS = 5.0
# The last code point has no successor, so a prefix ending in it cannot bound a range scan.
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES_START, _SURROGATES_END = 0xD800, 0xDFFF

_SCHEMA = (
    # Primary key order serves list_objects: equality on zone/subject/relation, then a
    # range scan on object for the prefix, all inside the one clustered index.
    """CREATE TABLE IF NOT EXISTS tuples (
        zone TEXT NOT NULL, subject TEXT NOT NULL, relation TEXT NOT NULL, object TEXT NOT NULL,
        PRIMARY KEY (zone, subject, relation, object)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS zone_revisions (
        zone TEXT PRIMARY KEY, revision INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS assignments (
        zone TEXT NOT NULL, subject TEXT NOT NULL, profile TEXT NOT NULL,
        PRIMARY KEY (zone, subject)) WITHOUT ROWID""",
)

# The statements of every backend (``?`` placeholders; see ``GrantsBackend``).
_DELETE_TUPLE = "DELETE FROM tuples WHERE zone = ? AND subject = ? AND relation = ? AND object = ?"
_INSERT_TUPLE = """INSERT INTO tuples (zone, subject, relation, object)
    VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"""
_SELECT_TUPLE = (
    "SELECT 1 FROM tuples WHERE zone = ? AND subject = ? AND relation = ? AND object = ?"
)
_INSERT_ASSIGNMENT = "INSERT INTO assignments (zone, subject, profile) VALUES (?, ?, ?)"
_BUMP_REVISION = """INSERT INTO zone_revisions (zone, revision) VALUES (?, 1)
    ON CONFLICT (zone) DO UPDATE SET revision = zone_revisions.revision + 1
    RETURNING revision"""
# An import lands above both the zone's current revision and the exported one;
# {greatest} is the backend's two-argument maximum.
_RAISE_REVISION = """INSERT INTO zone_revisions (zone, revision) VALUES (?, ?)
    ON CONFLICT (zone) DO UPDATE
    SET revision = {greatest}(zone_revisions.revision + 1, excluded.revision)
    RETURNING revision"""
_SELECT_REVISION = "SELECT revision FROM zone_revisions WHERE zone = ?"
_SELECT_ASSIGNMENT = "SELECT profile FROM assignments WHERE zone = ? AND subject = ?"
_ZONES = """SELECT zone FROM tuples UNION SELECT zone FROM assignments
    UNION SELECT zone FROM zone_revisions ORDER BY zone"""


class TupleBatches:
    """``write`` and ``delete`` of every backend: one-sided ``update`` batches (each one
    transaction, one revision bump)."""

    def update(
        self,
        zone: str,
        *,
        write: Iterable[RelationTuple] = (),
        delete: Iterable[RelationTuple] = (),
    ) -> int:
        raise NotImplementedError

    def write(self, tuples: Iterable[RelationTuple], zone: str) -> int:
        """Add tuples (existing ones are kept); one transaction, one revision bump."""
        return self.update(zone, write=tuples)

    def delete(self, tuples: Iterable[RelationTuple], zone: str) -> int:
        """Remove tuples (absent ones are ignored); one transaction, one revision bump."""
        return self.update(zone, delete=tuples)


def checked_batch(
    zone: str, write: Iterable[RelationTuple], delete: Iterable[RelationTuple]
) -> tuple[list[RelationTuple], list[RelationTuple]]:
    """A batch both backends can store, checked whole before anything is written."""
    to_write = [_checked(t) for t in write]
    to_delete = [_checked(t) for t in delete]
    check_text(zone, "zone")
    return to_write, to_delete


class GrantsBackend(Protocol):
    """What ``SqlTupleStore`` needs from a database: where the backends differ.

    ``reading`` is a connection for single-statement reads, ``writing`` one transaction
    that commits on success and rolls back on any exception, ``snapshot`` a read-only
    transaction that sees one state of the database. Failures surface as each backend
    reports them (SQLite: ``sqlite3`` errors; PostgreSQL: ``UnavailableError``).
    """

    # True when the database refuses text holding NUL (PostgreSQL): a read of such a
    # value answers empty without asking it, as the value cannot have been stored.
    refuses_nul: bool
    # The SQL function returning the larger of two values.
    greatest: str
    # Appended to ORDER BY object: sort in code point order.
    code_point_order: str

    def reading(self) -> AbstractContextManager[Session]: ...

    def writing(self) -> AbstractContextManager[Session]: ...

    def snapshot(self) -> AbstractContextManager[Session]: ...

    def starts_with(self, prefix: str) -> tuple[str, list[object]]:
        """A condition (and its parameters) true for objects starting with ``prefix``."""
        ...

    def announce(self, session: Session, zone: str) -> None:
        """Inside a write transaction: tell other processes the zone changes on commit."""
        ...

    def close(self) -> None: ...


class SqlTupleStore(TupleBatches):
    """``TupleStore`` on a SQL database: the one implementation of both backends.

    Every write batch is one transaction that first bumps the zone's revision row, which
    also serializes writers of one zone (so revisions rise by exactly one per batch and
    batches never deadlock on each other's tuples), and ends by announcing the change
    (``_notify``), so a rolled-back change announces nothing.
    """

    def __init__(self, backend: GrantsBackend) -> None:
        self._db = backend
        self._raise_revision = _RAISE_REVISION.format(greatest=backend.greatest)

    # --- writes ----------------------------------------------------------------------

    def update(
        self,
        zone: str,
        *,
        write: Iterable[RelationTuple] = (),
        delete: Iterable[RelationTuple] = (),
    ) -> int:
        """Delete then add in one transaction; returns the new revision.

        An empty batch changes nothing and returns the current revision without a bump.
        """
        to_write, to_delete = checked_batch(zone, write, delete)
        if not to_write and not to_delete:
            return self.revision(zone)
        with self._db.writing() as tx:
            revision = _bump(tx, zone)
            tx.many(_DELETE_TUPLE, [(zone, *t) for t in to_delete])
            tx.many(_INSERT_TUPLE, [(zone, *t) for t in to_write])
            self._notify(tx, zone)
            return revision

    def set_assignment(self, subject: str, profile: str, zone: str) -> int:
        """Record which profile an operator assigned to a subject; bumps the revision."""
        _check_text(subject, "subject")
        _check_text(profile, "profile")
        _check_text(zone, "zone")
        with self._db.writing() as tx:
            revision = _bump(tx, zone)
            tx.run(
                _INSERT_ASSIGNMENT
                + " ON CONFLICT (zone, subject) DO UPDATE SET profile = excluded.profile",
                (zone, subject, profile),
            )
            self._notify(tx, zone)
            return revision

    def clear_assignment(self, subject: str, zone: str) -> int:
        """Forget a subject's assigned profile; bumps the revision."""
        if self._unstorable(zone):
            raise InvalidInputError(field="zone")
        with self._db.writing() as tx:
            revision = _bump(tx, zone)
            if not self._unstorable(subject):  # else it has no assignment: only the bump
                tx.run("DELETE FROM assignments WHERE zone = ? AND subject = ?", (zone, subject))
            self._notify(tx, zone)
            return revision

    # --- reads -----------------------------------------------------------------------
    # A value the database cannot store has no answer but the empty one.

    def check(self, subject: str, relation: str, object: str, zone: str) -> bool:
        if self._unstorable(subject, relation, object, zone):
            return False
        with self._db.reading() as db:
            return db.one(_SELECT_TUPLE, (zone, subject, relation, object)) is not None

    def list_objects(
        self, subject: str, relation: str, zone: str, prefix: str = TOOLS_PREFIX
    ) -> list[str]:
        """Objects the subject has ``relation`` on, filtered by prefix in SQL, sorted."""
        if self._unstorable(subject, relation, zone, prefix):
            return []
        query = "SELECT object FROM tuples WHERE zone = ? AND subject = ? AND relation = ?"
        params: list[object] = [zone, subject, relation]
        if prefix:
            # The half-open range [prefix, successor) in code point order scans the
            # primary key; LIKE would not (it is case-insensitive in SQLite) and needs
            # escaping.
            upper = _prefix_successor(prefix)
            if upper is None:
                condition, extra = self._db.starts_with(prefix)
                query += f" AND object >= ? AND {condition}"
                params += [prefix, *extra]
            else:
                query += " AND object >= ? AND object < ?"
                params += [prefix, upper]
        with self._db.reading() as db:
            rows = db.all(f"{query} ORDER BY object{self._db.code_point_order}", params)
        return [str(row[0]) for row in rows]

    def revision(self, zone: str) -> int:
        """The zone's current revision (0 before its first write); read from the database."""
        if self._unstorable(zone):
            return 0
        with self._db.reading() as db:
            row = db.one(_SELECT_REVISION, (zone,))
        return int(row[0]) if row is not None else 0

    def get_assignment(self, subject: str, zone: str) -> str | None:
        if self._unstorable(subject, zone):
            return None
        with self._db.reading() as db:
            row = db.one(_SELECT_ASSIGNMENT, (zone, subject))
        return str(row[0]) if row is not None else None

    def list_subjects(self, zone: str) -> list[str]:
        """Subjects with an assignment or at least one tuple in the zone, sorted."""
        if self._unstorable(zone):
            return []
        with self._db.reading() as db:
            rows = db.all(
                "SELECT subject FROM assignments WHERE zone = ?"
                " UNION SELECT subject FROM tuples WHERE zone = ? ORDER BY subject",
                (zone, zone),
            )
        return [str(row[0]) for row in rows]

    # --- export / import (``nexus-mcp state export|import``) ---------------------------

    def zones(self) -> list[str]:
        """Every zone with tuples, assignments or a revision, sorted."""
        with self._db.reading() as db:
            return [str(row[0]) for row in db.all(_ZONES)]

    def export_zone(self, zone: str) -> dict[str, Any]:
        """The zone as a JSON-able dict (``export_document``), read in one snapshot."""
        if self._unstorable(zone):
            return export_document(zone, 0, [], [])
        with self._db.snapshot() as db:
            row = db.one(_SELECT_REVISION, (zone,))
            tuples = db.all("SELECT subject, relation, object FROM tuples WHERE zone = ?", (zone,))
            assignments = db.all("SELECT subject, profile FROM assignments WHERE zone = ?", (zone,))
        return export_document(zone, int(row[0]) if row is not None else 0, tuples, assignments)

    def import_zone(self, data: Mapping[str, Any], zone: str) -> int:
        """Replace the zone's tuples and assignments with ``data`` (an ``export_zone``
        dict) in one transaction; returns the new revision, above both the current and
        the exported one, so caches keyed by revision notice."""
        exported, tuples, assignments = parse_export(data)
        _check_text(zone, "zone")
        with self._db.writing() as tx:
            row = tx.one(self._raise_revision, (zone, exported + 1))
            assert row is not None  # RETURNING always yields the row
            tx.run("DELETE FROM tuples WHERE zone = ?", (zone,))
            tx.run("DELETE FROM assignments WHERE zone = ?", (zone,))
            tx.many(_INSERT_TUPLE, [(zone, *t) for t in tuples])
            tx.many(_INSERT_ASSIGNMENT, [(zone, s, p) for s, p in assignments.items()])
            self._notify(tx, zone)
            return int(row[0])

    def close(self) -> None:
        """Refuse further calls (a shared pool is closed by its owner)."""
        self._db.close()

    # --- plumbing --------------------------------------------------------------------

    def _notify(self, session: Session, zone: str) -> None:
        """The last statement of every write transaction: announce the zone's change."""
        self._db.announce(session, zone)

    def _unstorable(self, *values: object) -> bool:
        return self._db.refuses_nul and any(
            isinstance(value, str) and "\x00" in value for value in values
        )


def _bump(session: Session, zone: str) -> int:
    row = session.one(_BUMP_REVISION, (zone,))
    assert row is not None  # RETURNING always yields the row
    return int(row[0])


class SqliteTupleStore(SqlTupleStore):
    """``TupleStore`` on one SQLite file, safe across threads and processes."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        """Open the database at ``path``, creating its folder, file and schema if needed.

        ``read_only`` is for inspection: it opens an existing database only, creates
        nothing (no folder, no file, no schema) and refuses every write.
        """
        self._sqlite = _SqliteGrants(Path(path), read_only=read_only)
        super().__init__(self._sqlite)

    @property
    def path(self) -> Path:
        return self._sqlite.path


class _SqliteGrants:
    """``GrantsBackend`` of one SQLite file: a connection per thread, ``BEGIN IMMEDIATE``
    writes; SQLite text may hold NUL, so every value is asked about."""

    refuses_nul = False
    greatest = "max"
    code_point_order = ""  # SQLite compares text bytewise (UTF-8: code point order)

    def __init__(self, path: Path, *, read_only: bool) -> None:
        self.path = path
        self._read_only = read_only
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        try:
            if read_only:
                self._check_schema(self._connection())
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._create_schema(self._connection())
        except (OSError, sqlite3.Error) as exc:
            self.close()
            raise ConfigError(
                f"{self.path}: grants database cannot be opened ({type(exc).__name__})"
            ) from None
        except ConfigError:
            self.close()
            raise

    @contextmanager
    def reading(self) -> Iterator[Session]:
        yield SqliteSession(self._connection())

    def writing(self) -> AbstractContextManager[Session]:
        return immediate(self._connection())

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            yield SqliteSession(conn)
        finally:
            conn.execute("COMMIT")

    def starts_with(self, prefix: str) -> tuple[str, list[object]]:
        return "substr(object, 1, ?) = ?", [len(prefix), prefix]

    def announce(self, session: Session, zone: str) -> None:
        """Nothing: other processes see the new revision when they next read it."""

    def close(self) -> None:
        """Close every thread's connection; the store cannot be used afterwards."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        self._local.conn = None
        for conn in connections:
            conn.close()

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError("grants store is closed")
            # check_same_thread=False only so close() may close it from another thread;
            # each connection is otherwise used by the thread that opened it.
            conn = sqlite3.connect(
                self._uri() if self._read_only else self.path,
                timeout=BUSY_TIMEOUT_SECONDS,
                isolation_level=None,
                check_same_thread=False,
                uri=self._read_only,
            )
            self._connections.append(conn)
        if self._read_only:
            conn.execute("PRAGMA query_only = ON")
        conn.execute("PRAGMA synchronous = NORMAL")
        self._local.conn = conn
        return conn

    def _uri(self) -> str:
        # mode=rw never creates the file; query_only (above) refuses every write. Not
        # mode=ro: a read-only connection cannot remove the WAL files it opens, so it
        # would leave them behind, while this one's close checkpoints and removes them.
        return self.path.absolute().as_uri() + "?mode=rw"

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version != SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path}: not a grants database this server understands"
                f" (schema {version}, expected {SCHEMA_VERSION})"
            )

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode = WAL")
        with immediate(conn):
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise ConfigError(
                    f"{self.path}: grants database schema {version} is newer than this"
                    f" server understands ({SCHEMA_VERSION})"
                )
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def check_text(value: object, field: str) -> None:
    """A subject, relation, object, profile or zone both backends can store, or
    ``InvalidInputError`` naming the field."""
    # NUL is refused like '': PostgreSQL text cannot hold it, and both backends must
    # accept the same grants (an export from one imports into the other).
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidInputError(field=field)
    try:
        value.encode("utf-8")  # a lone surrogate cannot be stored in either database
    except UnicodeEncodeError:
        raise InvalidInputError(field=field) from None


_check_text = check_text


def _checked(item: RelationTuple | tuple[str, str, str]) -> RelationTuple:
    subject, relation, obj = item
    _check_text(subject, "subject")
    _check_text(relation, "relation")
    _check_text(obj, "object")
    return RelationTuple(subject, relation, obj)


def export_document(
    zone: str,
    revision: int,
    tuples: Iterable[Iterable[str]],
    assignments: Iterable[Iterable[str]],
) -> dict[str, Any]:
    """The export format of one zone: plain JSON types, tuples sorted (code point order)."""
    return {
        "zone": zone,
        "revision": revision,
        "tuples": sorted([str(part) for part in row] for row in tuples),
        "assignments": dict(sorted((str(s), str(p)) for s, p in assignments)),
    }


def parse_export(data: Mapping[str, Any]) -> tuple[int, list[RelationTuple], dict[str, str]]:
    """(exported revision, tuples, assignments) of an ``export_zone`` dict, validated
    whole before anything is written (``InvalidInputError`` naming the field)."""
    if not isinstance(data, Mapping):
        raise InvalidInputError(field="zone")
    revision = data.get("revision", 0)
    if (
        not isinstance(revision, int)
        or isinstance(revision, bool)
        or not 0 <= revision <= MAX_REVISION
    ):
        raise InvalidInputError(field="revision")
    raw_tuples = data.get("tuples", [])
    raw_assignments = data.get("assignments", {})
    if not isinstance(raw_tuples, list | tuple):
        raise InvalidInputError(field="tuples")
    if not isinstance(raw_assignments, Mapping):
        raise InvalidInputError(field="assignments")
    tuples: list[RelationTuple] = []
    for item in raw_tuples:
        if not isinstance(item, list | tuple) or len(item) != 3:
            raise InvalidInputError(field="tuples")
        tuples.append(_checked((item[0], item[1], item[2])))
    assignments: dict[str, str] = {}
    for subject, profile in raw_assignments.items():
        _check_text(subject, "subject")
        _check_text(profile, "profile")
        assignments[subject] = profile
    return revision, tuples, assignments


def _prefix_successor(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix``, if any."""
    last = ord(prefix[-1])
    if last == _MAX_CODE_POINT:
        return None
    successor = last + 1
    if _SURROGATES_START <= successor <= _SURROGATES_END:
        # Lone surrogates cannot be encoded to UTF-8; the next encodable code point sorts
        # the same way in SQLite's byte order.
        successor = _SURROGATES_END + 1
    return prefix[:-1] + chr(successor)


__all__ = [
    "DEFAULT_ZONE",
    "TOOLS_PREFIX",
    "GrantsBackend",
    "RelationTuple",
    "SqlTupleStore",
    "SqliteTupleStore",
    "TupleBatches",
    "TupleStore",
    "check_text",
    "checked_batch",
    "export_document",
    "parse_export",
]
