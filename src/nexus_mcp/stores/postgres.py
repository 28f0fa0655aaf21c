"""The shared state backend's PostgreSQL side: grants, assignments, idempotency records.

- ``PostgresPool``: a bounded connection pool (``psycopg_pool``) whose every failure
  (server down, pool exhausted, statement timeout, connection lost) reaches callers as
  ``UnavailableError(store=...)``, never as the driver's text or the URL. Connections are
  checked before use and replaced when broken, so the pool recovers by itself once the
  server is back: nothing has to be restarted or rebuilt.
- Versioned migrations (``nexus_mcp/data/migrations/postgres/NNNN_name.sql``), recorded in
  ``schema_migrations``: ``migrate`` applies the missing ones in order, each in its own
  transaction under an advisory lock (several replicas may migrate at once);
  ``check_schema`` stops a server whose database is unmigrated or newer than this build.
- ``PostgresSession``: the ``stores/sql.py`` session on a pooled connection, so the
  grants and idempotency stores run the statements they share with SQLite (``?``
  placeholders, turned into psycopg's ``%s`` here). The stores themselves, the SQLite
  stores' logic on a PostgreSQL adapter, are in ``postgres_grants.py`` and
  ``postgres_idempotency.py``. Text is compared and sorted in the "C" collation, code
  point order, as SQLite does.
- ``GrantsListener``: ``LISTEN`` on a dedicated connection; every committed grant change
  is announced by ``pg_notify(channel, zone)`` inside the writing transaction, so a
  rolled-back change announces nothing. After a lost connection the listener reconnects
  and reports ``"*"`` (changes may have been missed meanwhile).

Every call is synchronous and short (one pool connection, one transaction at most); an
async caller may run them in a thread.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from nexus_mcp.errors import ConfigError, InternalError, UnavailableError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.stores.sql import Row

log = get_logger(__name__)

Connection = psycopg.Connection[TupleRow]

DEFAULT_POOL_SIZE = 10
DEFAULT_TIMEOUT_SECONDS = 2.0
APPLICATION_NAME = "nexus-mcp"
# How long the pool keeps retrying one lost connection (backoff 1 s, 2 s, 4 s...) before it
# gives up on it; the next request then starts a fresh attempt at once. Short, so a server
# that comes back after a long outage is used within seconds, not after a long backoff.
RECONNECT_TIMEOUT_SECONDS = 5.0
POOL_CLOSE_TIMEOUT_SECONDS = 5.0

STORE_GRANTS = "grants"
STORE_IDEMPOTENCY = "idempotency"
STORE_SCHEMA = "postgres"

MIGRATIONS_PACKAGE = "nexus_mcp"
MIGRATIONS_PATH = ("data", "migrations", "postgres")
_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# pg_advisory_xact_lock key serializing migrations across replicas ("nexusmcp" in hex).
MIGRATIONS_LOCK_KEY = 0x6E657875736D6370
MIGRATE_COMMAND = "`nexus-mcp state migrate`"
_SCHEMA_MIGRATIONS = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now())"""

# NOTIFY payloads are limited to 8000 bytes: a longer zone is announced as "*".
MAX_NOTIFY_PAYLOAD_BYTES = 7999
_MAX_CHANNEL_BYTES = 63  # NAMEDATALEN - 1
ALL_ZONES = "*"

LISTENER_FIRST_BACKOFF_SECONDS = 0.05
LISTENER_MAX_BACKOFF_SECONDS = 1.0
LISTENER_POLL_SECONDS = 0.2
LISTENER_PING_SECONDS = 10.0


# --- the pool ---------------------------------------------------------------------------


def unavailable(store: str, exc: BaseException) -> UnavailableError:
    """The refusal for a store failure: logged by type (and SQLSTATE), never by text."""
    log.warning(
        "state_store_unavailable",
        store=store,
        exc_type=type(exc).__name__,
        sqlstate=getattr(exc, "sqlstate", None),
    )
    return UnavailableError(store=store)


def _connect_kwargs(
    conninfo: str, *, connect_timeout: float, statement_timeout: float | None, application: str
) -> dict[str, Any]:
    """Connection parameters added to ``conninfo``: ours win, its ``options`` are kept."""
    try:
        given = conninfo_to_dict(conninfo)
    except psycopg.Error:
        raise ConfigError("invalid PostgreSQL connection URL") from None
    options = [str(given["options"])] if given.get("options") else []
    if statement_timeout is not None:
        options.append(f"-c statement_timeout={max(1, math.ceil(statement_timeout * 1000))}")
    kwargs: dict[str, Any] = {
        # libpq takes whole seconds (and treats 1 as 2).
        "connect_timeout": max(1, math.ceil(connect_timeout)),
        "autocommit": True,
    }
    if options:
        kwargs["options"] = " ".join(options)
    if not given.get("application_name"):
        kwargs["application_name"] = application
    return kwargs


class PostgresPool:
    """A bounded pool of autocommit connections; ``connection()`` refuses as UNAVAILABLE.

    ``pool_size`` bounds the connections this process opens; ``timeout`` bounds both the
    wait for a free connection and every statement (``statement_timeout``), so a call
    never hangs on a slow or absent server; ``connect_timeout`` bounds one connection
    attempt. The pool opens at once without waiting for the server (``open=False``
    defers it to ``open()``); a server that is down is reported by the first call.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        connect_timeout: float = DEFAULT_TIMEOUT_SECONDS,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        open: bool = True,
        name: str = APPLICATION_NAME,
    ) -> None:
        if pool_size < 1 or connect_timeout <= 0 or timeout <= 0:
            raise ValueError("need pool_size >= 1 and positive timeouts")
        self.conninfo = conninfo
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        kwargs = _connect_kwargs(
            conninfo,
            connect_timeout=connect_timeout,
            statement_timeout=timeout,
            application=APPLICATION_NAME,
        )
        # psycopg_pool is psycopg's own, maintained pool: bounded (max_size), thread-safe,
        # replaces broken connections in the background. `check` tests a connection
        # before handing it out, so one the server dropped (restart, failover) is
        # discarded instead of failing the caller's statement.
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=pool_size,
            timeout=timeout,
            kwargs=kwargs,
            check=ConnectionPool.check_connection,
            reconnect_timeout=max(RECONNECT_TIMEOUT_SECONDS, 2 * timeout),
            name=name,
            open=False,
        )
        if open:
            self.open()

    def open(self) -> None:
        """Start the pool's workers; connecting happens in the background."""
        self._pool.open(wait=False)

    @contextmanager
    def connection(self, store: str = STORE_SCHEMA) -> Iterator[Connection]:
        """A pooled autocommit connection. A failure of the server or the connection
        (``OperationalError``: refused, lost, timed out, cancelled, the pool empty;
        ``InterfaceError``) becomes ``UnavailableError(store=store)``: retrying later can
        work. Any other driver error (data out of range, a constraint, a bad statement)
        is a fault of the request or of this code, never an outage: ``InternalError``.
        Other exceptions pass unchanged."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise unavailable(store, exc) from None
        except psycopg.Error as exc:
            log.error("store_statement_failed", store=store, error=type(exc).__name__)
            raise InternalError(store=store, error=type(exc).__name__) from None

    def close(self) -> None:
        self._pool.close(timeout=POOL_CLOSE_TIMEOUT_SECONDS)

    def __enter__(self) -> PostgresPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@lru_cache(maxsize=256)
def _pyformat(query: str) -> str:
    """``query`` with psycopg's placeholders: the stores write ``?`` (SQLite's style)."""
    if "%" in query:  # psycopg would read it as a placeholder
        raise ValueError("a store statement may not hold a literal %")
    return query.replace("?", "%s")


class PostgresSession:
    """``sql.Session`` on one psycopg connection: the stores' ``?`` become ``%s``."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def one(self, query: str, params: Sequence[object] = ()) -> Row | None:
        return self.conn.execute(_pyformat(query), tuple(params)).fetchone()

    def all(self, query: str, params: Sequence[object] = ()) -> list[Row]:
        return self.conn.execute(_pyformat(query), tuple(params)).fetchall()

    def run(self, query: str, params: Sequence[object] = ()) -> int:
        return self.conn.execute(_pyformat(query), tuple(params)).rowcount

    def many(self, query: str, rows: Sequence[Sequence[object]]) -> None:
        if rows:
            with self.conn.cursor() as cursor:
                cursor.executemany(_pyformat(query), rows)


# --- migrations ---------------------------------------------------------------------------


def migrations() -> list[tuple[int, str]]:
    """(version, SQL) of every packaged migration, in order; versions run 1, 2, ... N."""
    folder = resources.files(MIGRATIONS_PACKAGE).joinpath(*MIGRATIONS_PATH)
    found: list[tuple[int, str]] = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match is not None:
            found.append((int(match[1]), entry.read_text(encoding="utf-8")))
    found.sort()
    if [version for version, _ in found] != list(range(1, len(found) + 1)):
        raise ConfigError("packaged PostgreSQL migrations are not numbered 1..N")
    return found


def latest_version() -> int:
    """The schema version this build needs and understands."""
    return len(migrations())


def _current_version(conn: Connection) -> int:
    row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row is not None else 0


def _newer_than_this_build(current: int, latest: int) -> ConfigError:
    return ConfigError(
        f"the PostgreSQL state schema is version {current}, newer than this build "
        f"understands ({latest}): upgrade nexus-mcp ({MIGRATE_COMMAND} never downgrades)"
    )


def migrate(pool: PostgresPool) -> list[int]:
    """Apply the missing migrations in order; returns the versions applied (maybe none).

    Each migration runs in one transaction with its ``schema_migrations`` row, under a
    transaction-level advisory lock: a second replica migrating at the same time waits,
    then finds the version applied and skips it.
    """
    applied: list[int] = []
    with pool.connection(STORE_SCHEMA) as conn:
        scripts = migrations()
        for version, script in scripts:
            with conn.transaction():
                # Migrations and the wait for the lock may outlast the pool's statement
                # timeout; this is an operator's command, not a request.
                conn.execute("SET LOCAL statement_timeout = 0")
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATIONS_LOCK_KEY,))
                conn.execute(_SCHEMA_MIGRATIONS)
                current = _current_version(conn)
                if current > len(scripts):
                    raise _newer_than_this_build(current, len(scripts))
                if version <= current:
                    continue
                try:
                    conn.execute(script.encode("utf-8"))
                except psycopg.OperationalError:
                    raise  # the server or the connection: UNAVAILABLE, retry later
                except psycopg.Error as exc:
                    # Refused by the server (e.g. permissions): the operator must act.
                    raise ConfigError(
                        f"PostgreSQL migration {version} failed ({type(exc).__name__}); "
                        "nothing of it was applied"
                    ) from None
                conn.execute(
                    "INSERT INTO schema_migrations (version, applied_at) VALUES (%s, now())",
                    (version,),
                )
            applied.append(version)
    if applied:
        log.info("state_schema_migrated", versions=applied)
    return applied


def schema_status(pool: PostgresPool) -> tuple[int, int]:
    """(the database's schema version, 0 when unmigrated; this build's version)."""
    with pool.connection(STORE_SCHEMA) as conn:
        current = _current_version(conn)
    return current, latest_version()


def check_schema(pool: PostgresPool) -> None:
    """``ConfigError`` unless the database holds exactly the schema this build needs."""
    current, latest = schema_status(pool)
    if current == 0:
        raise ConfigError(
            f"the PostgreSQL database has no nexus-mcp state schema: run {MIGRATE_COMMAND}"
        )
    if current < latest:
        raise ConfigError(
            f"the PostgreSQL state schema is version {current}, this build needs "
            f"{latest}: run {MIGRATE_COMMAND}"
        )
    if current > latest:
        raise _newer_than_this_build(current, latest)


# --- grant change notifications ------------------------------------------------------------


def check_channel(channel: str) -> None:
    """``ConfigError`` unless ``channel`` is a name both ``pg_notify`` and ``LISTEN`` take."""
    # pg_notify refuses a longer name (every write would fail); LISTEN would truncate it.
    if not channel or "\x00" in channel or len(channel.encode("utf-8")) > _MAX_CHANNEL_BYTES:
        raise ConfigError(
            f"PostgreSQL notification channel name must be 1 to {_MAX_CHANNEL_BYTES} bytes"
        )


class GrantsListener:
    """Calls ``on_change(zone)`` for every grant change committed by any replica.

    A daemon thread holds one dedicated connection (outside the pool) that ``LISTEN``s on
    ``channel``. When the connection is lost it reconnects with backoff (at most
    ``max_backoff`` seconds between attempts) and then calls ``on_change("*")``: changes
    made meanwhile were not announced. An exception from ``on_change`` is logged and
    never ends the thread. ``stop`` ends it within about ``poll_interval``.
    """

    def __init__(
        self,
        conninfo: str | PostgresPool,
        channel: str,
        on_change: Callable[[str], None],
        *,
        connect_timeout: float | None = None,
        max_backoff: float = LISTENER_MAX_BACKOFF_SECONDS,
        poll_interval: float = LISTENER_POLL_SECONDS,
        start: bool = True,
    ) -> None:
        if isinstance(conninfo, PostgresPool):
            url, timeout = conninfo.conninfo, conninfo.connect_timeout
        else:
            url, timeout = conninfo, DEFAULT_TIMEOUT_SECONDS
        self._conninfo = url
        self._kwargs = _connect_kwargs(
            url,
            connect_timeout=connect_timeout if connect_timeout is not None else timeout,
            statement_timeout=None,
            application=f"{APPLICATION_NAME}-listener",
        )
        # Notice a silently dead peer (no FIN, e.g. a failover) within seconds.
        self._kwargs.update(keepalives=1, keepalives_idle=5, keepalives_interval=2)
        self._kwargs.update(keepalives_count=3)
        check_channel(channel)
        self._channel = channel
        self._on_change = on_change
        self._max_backoff = max_backoff
        self._poll = poll_interval
        self._stopping = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nexus-grants-listener", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        self._thread.start()

    @property
    def listening(self) -> bool:
        """True while ``LISTEN`` is active on a live connection."""
        return self._listening.is_set()

    def is_alive(self) -> bool:
        """True until ``stop`` has ended the thread."""
        return self._thread.is_alive()

    def wait_listening(self, timeout: float) -> bool:
        """Wait until the listener is listening; False after ``timeout``."""
        return self._listening.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread (within about the poll interval) and close its connection."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        missed = False
        delay = LISTENER_FIRST_BACKOFF_SECONDS
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._listen(report_missed=missed)
            except psycopg.Error as exc:
                log.warning("grants_listener_disconnected", exc_type=type(exc).__name__)
            except Exception as exc:  # noqa: BLE001 - logged by type; the thread lives on
                log.warning("grants_listener_failed", exc_type=type(exc).__name__)
            finally:
                self._listening.clear()
            if self._stopping.is_set():
                break
            missed = True
            if time.monotonic() - started > self._max_backoff:
                delay = LISTENER_FIRST_BACKOFF_SECONDS  # it was connected for a while
            self._stopping.wait(delay)
            delay = min(delay * 2, self._max_backoff)

    def _listen(self, *, report_missed: bool) -> None:
        with psycopg.connect(self._conninfo, **self._kwargs) as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self._listening.set()
            if report_missed:
                log.info("grants_listener_reconnected")
                self._emit(ALL_ZONES)
            last_ping = time.monotonic()
            while not self._stopping.is_set():
                for notify in conn.notifies(timeout=self._poll):
                    if notify.channel == self._channel:
                        self._emit(notify.payload)
                    if self._stopping.is_set():
                        return
                if time.monotonic() - last_ping >= LISTENER_PING_SECONDS:
                    conn.execute("SELECT 1")
                    last_ping = time.monotonic()

    def _emit(self, zone: str) -> None:
        try:
            self._on_change(zone)
        except Exception as exc:  # noqa: BLE001 - a callback bug must not stop listening
            log.warning("grants_listener_callback_failed", exc_type=type(exc).__name__)


__all__ = [
    "ALL_ZONES",
    "GrantsListener",
    "PostgresPool",
    "PostgresSession",
    "check_channel",
    "check_schema",
    "latest_version",
    "migrate",
    "migrations",
    "schema_status",
    "unavailable",
]
