"""PostgreSQL specifics of the shared state backend, on a real server (issue 15).

Migrations (versioned, concurrent-safe, refusing unmigrated or newer databases), replicas
racing on one idempotency key or one zone, grant-change notifications (on commit only,
surviving a server restart), outages (UNAVAILABLE within the timeout, recovery without a
new store), the pool's bound, statement timeouts, and export/import between backends.
The behaviour both backends share is tested in test_grants.py and test_idempotency.py.
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from nexus_mcp.errors import ConfigError, InvalidInputError, UnavailableError
from nexus_mcp.stores import postgres
from nexus_mcp.stores.grants import RelationTuple, SqliteTupleStore
from nexus_mcp.stores.idempotency import ClaimStatus, IdempotencyScope
from nexus_mcp.stores.postgres import (
    GrantsListener,
    PostgresPool,
    check_schema,
    migrate,
    migrations,
    schema_status,
)
from nexus_mcp.stores.postgres_grants import PostgresTupleStore
from nexus_mcp.stores.postgres_idempotency import PostgresIdempotencyStore
from tests.support.shared_state import PrivatePostgres
from tests.unit.stores.conftest import PoolFactory

LATEST = len(migrations())  # the packaged schema version
NEXT = LATEST + 1  # a migration this build does not have

ZONE = "default"
TARGET = "f" * 64
ARGS = "a" * 64
MIGRATE_HINT = "nexus-mcp state migrate"


def viewer(subject: str, tool: str) -> RelationTuple:
    return RelationTuple(subject, "viewer", f"/tools/{tool}")


def scope(key: str) -> IdempotencyScope:
    return IdempotencyScope("alice", "nexus", "nexus_write_file", key, target=TARGET)


def run_threads(count: int, work: Callable[[int], None], timeout: float = 60) -> None:
    """Run ``work(i)`` in ``count`` threads released together; re-raise the first failure."""
    failures: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            barrier.wait()
            work(index)
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads)
    if failures:
        raise failures[0]


def eventually(probe: Callable[[], Any], timeout: float) -> Any:
    """``probe()``'s first answer that does not raise UnavailableError within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# --- migrations ---------------------------------------------------------------------------


def test_migrate_applies_the_missing_versions_once(
    postgres_url: str, pg_pools: PoolFactory
) -> None:
    pool = pg_pools(postgres_url)
    assert schema_status(pool) == (0, LATEST)

    assert migrate(pool) == list(range(1, LATEST + 1))
    assert migrate(pool) == []

    assert schema_status(pool) == (LATEST, LATEST)
    check_schema(pool)
    with pool.connection() as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        }
        collation = conn.execute(
            "SELECT collation_name FROM information_schema.columns"
            " WHERE table_name = 'tuples' AND column_name = 'object'"
        ).fetchone()
    assert tables == {
        "schema_migrations",
        "tuples",
        "zone_revisions",
        "assignments",
        "idempotency_records",
        "audit_heads",
    }
    assert collation == ("C",)


def test_the_packaged_migrations_are_numbered_from_one() -> None:
    versions = [version for version, _ in migrations()]
    assert versions == list(range(1, len(versions) + 1))
    assert versions[0] == 1


def test_an_unmigrated_database_is_refused_naming_the_command(
    postgres_url: str, pg_pools: PoolFactory
) -> None:
    pool = pg_pools(postgres_url)

    with pytest.raises(ConfigError) as raised:
        check_schema(pool)

    assert MIGRATE_HINT in str(raised.value)


def test_a_database_behind_this_build_is_refused_until_migrated(
    postgres_url: str, pg_pools: PoolFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = pg_pools(postgres_url)
    migrate(pool)
    newer = [*migrations(), (NEXT, "CREATE TABLE later_feature (id integer PRIMARY KEY);")]
    monkeypatch.setattr(postgres, "migrations", lambda: newer)

    with pytest.raises(ConfigError) as raised:
        check_schema(pool)
    assert MIGRATE_HINT in str(raised.value)
    assert f"version {LATEST}" in str(raised.value)

    assert migrate(pool) == [NEXT]
    check_schema(pool)


def test_a_database_newer_than_this_build_is_refused(
    postgres_url: str, pg_pools: PoolFactory
) -> None:
    pool = pg_pools(postgres_url)
    migrate(pool)
    with pool.connection() as conn:
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (NEXT,))

    with pytest.raises(ConfigError) as raised:
        check_schema(pool)
    assert "newer" in str(raised.value) and MIGRATE_HINT in str(raised.value)
    with pytest.raises(ConfigError):
        migrate(pool)
    assert schema_status(pool) == (NEXT, LATEST)


def test_a_failing_migration_applies_nothing_of_itself(
    postgres_url: str, pg_pools: PoolFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = pg_pools(postgres_url)
    broken = [*migrations(), (NEXT, "CREATE TABLE half_done (id integer); SELECT * FROM nowhere;")]
    monkeypatch.setattr(postgres, "migrations", lambda: broken)

    with pytest.raises(ConfigError) as raised:
        migrate(pool)

    assert f"migration {NEXT}" in str(raised.value)
    # The packaged ones committed, each in its own transaction; the broken one not at all.
    assert schema_status(pool) == (LATEST, NEXT)
    with pool.connection() as conn:
        assert conn.execute("SELECT to_regclass('half_done')").fetchone() == (None,)


def test_replicas_migrating_at_once_apply_each_version_once(
    postgres_url: str, pg_pools: PoolFactory
) -> None:
    pools = [pg_pools(postgres_url, pool_size=1) for _ in range(8)]
    applied: list[list[int]] = [[] for _ in pools]

    def work(index: int) -> None:
        applied[index] = migrate(pools[index])

    run_threads(len(pools), work)

    assert sorted(applied) == [[]] * 7 + [list(range(1, LATEST + 1))]
    assert schema_status(pools[0]) == (LATEST, LATEST)


# --- replicas on one database ----------------------------------------------------------------


def test_fifty_threads_on_two_replicas_racing_on_one_key_get_one_new(
    migrated_url: str, pg_pools: PoolFactory
) -> None:
    replicas = [
        PostgresIdempotencyStore(pg_pools(migrated_url, pool_size=10), lease_seconds=60)
        for _ in range(2)
    ]
    for round_ in range(3):
        statuses: list[ClaimStatus] = []
        key = f"key-{round_}"
        run_threads(
            50,
            lambda index, key=key, found=statuses: found.append(
                replicas[index % 2].begin(scope(key), ARGS).status
            ),
        )

        assert statuses.count(ClaimStatus.NEW) == 1
        assert statuses.count(ClaimStatus.IN_PROGRESS) == 49


def test_replicas_racing_on_an_expired_key_get_one_new(
    migrated_url: str, pg_pools: PoolFactory
) -> None:
    now = [1_000_000.0]
    replicas = [
        PostgresIdempotencyStore(
            pg_pools(migrated_url, pool_size=10),
            ttl_seconds=100,
            lease_seconds=10,
            clock=lambda: now[0],
        )
        for _ in range(2)
    ]
    old = replicas[0].begin(scope("k"), ARGS)
    assert replicas[0].complete(old, "{}")
    now[0] += 100
    claims: list[Any] = []

    run_threads(20, lambda i: claims.append(replicas[i % 2].begin(scope("k"), ARGS)))

    assert [c.status for c in claims].count(ClaimStatus.NEW) == 1
    winner = next(c for c in claims if c.status is ClaimStatus.NEW)
    assert replicas[1].complete(winner, '{"again":1}')
    assert not replicas[0].complete(old, "{}")


def test_a_replica_whose_clock_runs_ahead_cannot_take_over_a_live_claim(
    migrated_url: str, pg_pools: PoolFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases are judged by the database's clock, which every replica shares: a replica
    whose own clock is a day ahead still sees another's fresh claim as in progress."""
    a = PostgresIdempotencyStore(pg_pools(migrated_url), ttl_seconds=600, lease_seconds=60)
    b = PostgresIdempotencyStore(pg_pools(migrated_url), ttl_seconds=600, lease_seconds=60)
    claim = a.begin(scope("skew"), ARGS)
    assert claim.status is ClaimStatus.NEW
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86_400)
    assert b.begin(scope("skew"), ARGS).status is ClaimStatus.IN_PROGRESS
    assert b.purge_expired() == 0
    monkeypatch.undo()
    assert a.complete(claim, "{}")


def test_revisions_rise_by_one_per_batch_under_writers_on_two_replicas(
    migrated_url: str, pg_pools: PoolFactory
) -> None:
    replicas = [PostgresTupleStore(pg_pools(migrated_url, pool_size=4)) for _ in range(2)]
    threads, batches = 8, 20
    seen: list[list[int]] = [[] for _ in range(threads)]

    def work(index: int) -> None:
        store = replicas[index % 2]
        for batch in range(batches):
            if batch % 3 == 2:
                seen[index].append(store.set_assignment(f"s{index}", f"p{batch}", ZONE))
            else:
                # Overlapping tuples across threads: batches must not deadlock.
                tuples = [viewer("shared", f"t{(batch + k) % 5}") for k in range(3)]
                seen[index].append(store.update(ZONE, write=tuples, delete=tuples[:1]))

    run_threads(threads, work)

    total = threads * batches
    for revisions in seen:
        assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
    assert sorted(r for revisions in seen for r in revisions) == list(range(1, total + 1))
    assert replicas[1].revision(ZONE) == total


# --- notifications ---------------------------------------------------------------------------


@pytest.fixture
def channel() -> str:
    return "nexus_t_" + secrets.token_hex(4) + "_grants"


@pytest.fixture
def listen(channel: str) -> Iterator[Callable[..., tuple[GrantsListener, queue.Queue[str]]]]:
    started: list[GrantsListener] = []

    def start(
        conninfo: str | PostgresPool, on_change: Callable[[str], None] | None = None
    ) -> tuple[GrantsListener, queue.Queue[str]]:
        received: queue.Queue[str] = queue.Queue()
        listener = GrantsListener(conninfo, channel, on_change or received.put)
        started.append(listener)
        assert listener.wait_listening(10)
        return listener, received

    yield start
    for listener in started:
        listener.stop()


def nothing_arrives(received: queue.Queue[str], within: float = 0.5) -> bool:
    try:
        received.get(timeout=within)
    except queue.Empty:
        return True
    return False


def test_every_committed_grant_change_reaches_a_listener_within_a_second(
    migrated_url: str, pg_pools: PoolFactory, channel: str, listen: Any
) -> None:
    _, received = listen(migrated_url)
    store = PostgresTupleStore(pg_pools(migrated_url), notify_channel=channel)
    silent = PostgresTupleStore(pg_pools(migrated_url))

    for change, zone in [
        (lambda: store.write([viewer("a", "t1")], "zone-a"), "zone-a"),
        (lambda: store.delete([viewer("a", "t1")], "zone-a"), "zone-a"),
        (lambda: store.update("zone-b", write=[viewer("a", "t2")]), "zone-b"),
        (lambda: store.set_assignment("a", "coding", ZONE), ZONE),
        (lambda: store.clear_assignment("a", ZONE), ZONE),
        (lambda: store.import_zone({"tuples": [], "assignments": {}}, "zone-c"), "zone-c"),
    ]:
        change()
        assert received.get(timeout=1.0) == zone

    silent.write([viewer("a", "t3")], ZONE)  # a store without a channel announces nothing
    store.write([], ZONE)  # an empty batch changes nothing
    assert nothing_arrives(received)


def test_a_rolled_back_change_announces_nothing(
    migrated_url: str, pg_pools: PoolFactory, channel: str, listen: Any
) -> None:
    class FailsAfterAnnouncing(PostgresTupleStore):
        def _notify(self, conn: Any, zone: str) -> None:
            super()._notify(conn, zone)
            raise RuntimeError("the transaction fails after pg_notify")

    _, received = listen(migrated_url)
    pool = pg_pools(migrated_url)
    failing = FailsAfterAnnouncing(pool, notify_channel=channel)
    store = PostgresTupleStore(pool, notify_channel=channel)

    with pytest.raises(RuntimeError):
        failing.write([viewer("a", "t1")], ZONE)
    with pytest.raises(InvalidInputError):
        store.write([viewer("a", "t1"), RelationTuple("a", "viewer", "")], ZONE)

    assert nothing_arrives(received)
    assert store.revision(ZONE) == 0
    assert not store.check("a", "viewer", "/tools/t1", ZONE)


def test_an_announcement_waits_for_its_commit(
    migrated_url: str, pg_pools: PoolFactory, channel: str, listen: Any
) -> None:
    _, received = listen(migrated_url)
    with pg_pools(migrated_url).connection() as conn:
        with conn.transaction():
            conn.execute("SELECT pg_notify(%s, 'zone-x')", (channel,))
            assert nothing_arrives(received, 0.3)
        assert received.get(timeout=1.0) == "zone-x"


def test_a_failing_callback_does_not_stop_the_listener(
    migrated_url: str, pg_pools: PoolFactory, channel: str, listen: Any
) -> None:
    received: queue.Queue[str] = queue.Queue()

    def on_change(zone: str) -> None:
        received.put(zone)
        if zone == "bad":
            raise RuntimeError("callback bug")

    listener, _ = listen(migrated_url, on_change)
    store = PostgresTupleStore(pg_pools(migrated_url), notify_channel=channel)
    store.write([viewer("a", "t1")], "bad")
    store.write([viewer("a", "t1")], "good")

    assert [received.get(timeout=1.0), received.get(timeout=1.0)] == ["bad", "good"]
    assert listener.is_alive() and listener.listening


def test_a_listener_stops_promptly(migrated_url: str, listen: Any) -> None:
    listener, _ = listen(migrated_url)
    started = time.monotonic()
    listener.stop()
    assert not listener.is_alive()
    assert time.monotonic() - started < 1.0


def test_a_listener_without_a_server_keeps_trying_and_stops_promptly(channel: str) -> None:
    from tests.support.shared_state import free_port

    listener = GrantsListener(
        f"postgresql://postgres@127.0.0.1:{free_port()}/none", channel, lambda zone: None
    )
    try:
        assert not listener.wait_listening(0.5)
        assert listener.is_alive()
    finally:
        started = time.monotonic()
        listener.stop()
    assert not listener.is_alive()
    assert time.monotonic() - started < 1.5


def test_a_listener_reconnects_after_a_restart_and_reports_possible_misses(
    private_postgres: PrivatePostgres, pg_pools: PoolFactory, channel: str, listen: Any
) -> None:
    pool = pg_pools(private_postgres.url, timeout=1.0, connect_timeout=1.0)
    migrate(pool)
    listener, received = listen(pool)
    store = PostgresTupleStore(pool, notify_channel=channel)

    private_postgres.stop()
    deadline = time.monotonic() + 10
    while listener.listening and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not listener.listening
    private_postgres.start()

    assert received.get(timeout=10) == "*"
    assert listener.listening
    eventually(lambda: store.write([viewer("a", "t1")], "after-restart"), 15)
    assert received.get(timeout=1.0) == "after-restart"


# --- outages, timeouts, bounds ---------------------------------------------------------------


def test_an_outage_refuses_every_call_in_time_and_recovery_needs_no_new_store(
    private_postgres: PrivatePostgres, pg_pools: PoolFactory
) -> None:
    timeout = 0.5
    pool = pg_pools(private_postgres.url, timeout=timeout, connect_timeout=1.0, pool_size=2)
    migrate(pool)
    grants = PostgresTupleStore(pool, notify_channel="nexus_outage_grants")
    records = PostgresIdempotencyStore(pool, ttl_seconds=1000, lease_seconds=60)
    grants.write([viewer("a", "t1")], ZONE)
    claims = [records.begin(scope(f"k{i}"), ARGS) for i in range(3)]
    export = grants.export_zone(ZONE)

    private_postgres.stop()
    calls: list[Callable[[], object]] = [
        lambda: grants.write([viewer("a", "t2")], ZONE),
        lambda: grants.delete([viewer("a", "t1")], ZONE),
        lambda: grants.check("a", "viewer", "/tools/t1", ZONE),
        lambda: grants.list_objects("a", "viewer", ZONE),
        lambda: grants.revision(ZONE),
        lambda: grants.set_assignment("a", "coding", ZONE),
        lambda: grants.get_assignment("a", ZONE),
        lambda: grants.clear_assignment("a", ZONE),
        lambda: grants.list_subjects(ZONE),
        lambda: grants.zones(),
        lambda: grants.export_zone(ZONE),
        lambda: grants.import_zone(export, ZONE),
        lambda: records.begin(scope("new"), ARGS),
        lambda: records.complete(claims[0], "{}"),
        lambda: records.abandon(claims[1]),
        lambda: records.mark_unknown(claims[2]),
        lambda: records.purge_expired(),
        lambda: schema_status(pool),
        lambda: check_schema(pool),
    ]
    address = ("127.0.0.1", str(private_postgres.port), "postgresql://", "postgres@")
    for call in calls:
        started = time.monotonic()
        with pytest.raises(UnavailableError) as raised:
            call()
        assert time.monotonic() - started < timeout + 2.5
        said = f"{raised.value} {raised.value.message} {raised.value.facts!r}"
        assert not any(part in said for part in address)
        assert raised.value.facts["store"] in {"grants", "idempotency", "postgres"}

    private_postgres.start()
    started = time.monotonic()
    assert eventually(lambda: grants.revision(ZONE), 20) == 1
    assert time.monotonic() - started < 10
    assert grants.write([viewer("a", "t2")], ZONE) == 2
    assert records.complete(claims[0], "{}")
    assert records.begin(scope("k0"), ARGS).status is ClaimStatus.REPLAY
    check_schema(pool)


def test_a_statement_that_waits_too_long_is_unavailable_not_a_hang(
    migrated_url: str, pg_pools: PoolFactory
) -> None:
    store = PostgresTupleStore(pg_pools(migrated_url, timeout=0.5))
    store.write([viewer("a", "t1")], ZONE)
    with pg_pools(migrated_url).connection() as conn, conn.transaction():
        conn.execute("SELECT 1 FROM zone_revisions WHERE zone = %s FOR UPDATE", (ZONE,))
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            store.write([viewer("a", "t2")], ZONE)
        assert time.monotonic() - started < 2.0
        assert store.revision(ZONE) == 1  # readers are not blocked by the writer
    assert store.write([viewer("a", "t2")], ZONE) == 2


def test_the_pool_never_opens_more_than_its_size(
    migrated_url: str, pg_pools: PoolFactory, postgres_url: str
) -> None:
    app = "nexus-bound-" + secrets.token_hex(3)
    size = 3
    pool = pg_pools(f"{migrated_url}?application_name={app}", pool_size=size, timeout=20.0)
    store = PostgresTupleStore(pool)
    records = PostgresIdempotencyStore(pool)
    counts: list[int] = []
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            while not done.is_set():
                row = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
                ).fetchone()
                assert row is not None
                counts.append(int(row[0]))
                time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:

        def work(index: int) -> None:
            if index % 3 == 0:
                with pool.connection() as conn:
                    conn.execute("SELECT pg_sleep(0.2)")
            for batch in range(10):
                store.write([viewer(f"s{index}", f"t{batch}")], ZONE)
                records.begin(scope(f"{index}-{batch}"), ARGS)

        run_threads(24, work)
    finally:
        done.set()
        sampler.join(10)

    assert counts and max(counts) <= size
    assert max(counts) == size  # the load did need every connection


def test_a_closed_pool_is_unavailable(migrated_url: str) -> None:
    pool = PostgresPool(migrated_url)
    store = PostgresTupleStore(pool)
    assert store.revision(ZONE) == 0
    pool.close()

    with pytest.raises(UnavailableError) as raised:
        store.revision(ZONE)
    assert raised.value.facts == {"store": "grants"}


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:s3cret-pw@db:5432/x?bogus_option=1",
        "host='unterminated password=s3cret-pw",
    ],
)
def test_an_invalid_url_is_a_config_error_that_does_not_repeat_it(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        PostgresPool(url)
    assert "s3cret-pw" not in str(raised.value)


def test_a_database_that_refuses_us_is_unavailable_without_its_words(
    pg_pools: PoolFactory,
) -> None:
    pool = pg_pools("postgresql://postgres@127.0.0.1:5432/nexus_absent_db", timeout=0.5)

    with pytest.raises(UnavailableError) as raised:
        PostgresTupleStore(pool).revision(ZONE)

    said = f"{raised.value} {raised.value.facts!r}"
    assert "nexus_absent_db" not in said and "5432" not in said


@pytest.mark.parametrize("channel_name", ["", "x" * 64, "a\x00b"])
def test_a_channel_postgresql_cannot_carry_is_a_config_error(
    migrated_url: str, pg_pools: PoolFactory, channel_name: str
) -> None:
    with pytest.raises(ConfigError):
        PostgresTupleStore(pg_pools(migrated_url), notify_channel=channel_name)
    with pytest.raises(ConfigError):
        GrantsListener(migrated_url, channel_name, lambda zone: None, start=False)


def test_options_given_in_the_url_are_kept(migrated_url: str, pg_pools: PoolFactory) -> None:
    pool = pg_pools(f"{migrated_url}?options=-c%20work_mem%3D8MB", timeout=3.0)
    with pool.connection() as conn:
        assert conn.execute("SHOW work_mem").fetchone() == ("8MB",)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("3s",)


# --- export and import across backends ---------------------------------------------------


def test_export_and_import_round_trip_sqlite_postgres_sqlite(
    tmp_path: Path, migrated_url: str, pg_pools: PoolFactory
) -> None:
    source = SqliteTupleStore(tmp_path / "source.sqlite3")
    back = SqliteTupleStore(tmp_path / "back.sqlite3")
    shared = PostgresTupleStore(pg_pools(migrated_url))
    try:
        source.write([viewer("alice", "t1"), viewer("bob", "t2")], ZONE)
        source.write([RelationTuple("carol", "direct_viewer", "/tools/é\U0001f600")], ZONE)
        source.set_assignment("alice", "coding", ZONE)
        source.set_assignment("dave", "minimal", "team-b")
        source.write([viewer("erin", "t3")], "team-b")

        def document(store: Any) -> list[dict[str, Any]]:
            # Through JSON, as the CLI moves it.
            exported = [store.export_zone(zone) for zone in store.zones()]
            loaded: list[dict[str, Any]] = json.loads(json.dumps(exported))
            return loaded

        first = document(source)
        for zone in first:
            shared.import_zone(zone, zone["zone"])
        second = document(shared)
        for zone in second:
            back.import_zone(zone, zone["zone"])
        third = document(back)

        def content(zones: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{k: v for k, v in zone.items() if k != "revision"} for zone in zones]

        assert content(first) == content(second) == content(third)
        assert [z["zone"] for z in first] == [ZONE, "team-b"]
        revisions = [[z["revision"] for z in doc] for doc in (first, second, third)]
        assert revisions == [[3, 2], [4, 3], [5, 4]]
    finally:
        source.close()
        back.close()
