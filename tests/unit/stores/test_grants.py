"""The tuple store on SQLite and PostgreSQL: tuples, per-zone revisions, prefix listing,
assignments, sharing, export and import. SQLite-only tests (files, WAL, read_only) say so."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import Code, ConfigError, InvalidInputError, UnavailableError
from nexus_mcp.stores.grants import RelationTuple, SqliteTupleStore, TupleStore
from nexus_mcp.stores.postgres_grants import PostgresTupleStore
from tests.unit.stores.conftest import BACKENDS, PoolFactory

ZONE = "default"


class Backend:
    """Opens stores on one storage: a SQLite file, or a PostgreSQL database through a
    new pool each (another replica)."""

    def __init__(self, name: str, open_store: Callable[[], TupleStore]) -> None:
        self.name = name
        self._open = open_store
        self._opened: list[TupleStore] = []

    def open(self) -> TupleStore:
        store = self._open()
        self._opened.append(store)
        return store

    def close(self) -> None:
        for store in self._opened:
            store.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        path = tmp_path / "grants.sqlite3"
        opened = Backend("sqlite", lambda: SqliteTupleStore(path))
    else:
        url: str = request.getfixturevalue("migrated_url")
        pools: PoolFactory = request.getfixturevalue("pg_pools")
        opened = Backend("postgres", lambda: PostgresTupleStore(pools(url)))
    yield opened
    opened.close()


@pytest.fixture
def store(backend: Backend) -> TupleStore:
    return backend.open()


def viewer(subject: str, tool: str) -> RelationTuple:
    return RelationTuple(subject, "viewer", f"/tools/{tool}")


def test_written_tuple_checks_true_and_deleted_tuple_checks_false(store: TupleStore) -> None:
    store.write([viewer("alice", "nexus_read_file")], ZONE)

    assert store.check("alice", "viewer", "/tools/nexus_read_file", ZONE)
    assert not store.check("bob", "viewer", "/tools/nexus_read_file", ZONE)
    assert not store.check("alice", "direct_viewer", "/tools/nexus_read_file", ZONE)

    store.delete([viewer("alice", "nexus_read_file")], ZONE)

    assert not store.check("alice", "viewer", "/tools/nexus_read_file", ZONE)


def test_revision_starts_at_zero_and_rises_by_one_per_batch(store: TupleStore) -> None:
    assert store.revision(ZONE) == 0

    first = store.write([viewer("a", "t1"), viewer("a", "t2"), viewer("b", "t1")], ZONE)
    second = store.delete([viewer("a", "t1"), viewer("a", "never-written")], ZONE)
    third = store.update(ZONE, write=[viewer("a", "t3")], delete=[viewer("a", "t2")])

    assert (first, second, third) == (1, 2, 3)
    assert store.revision(ZONE) == 3
    assert store.list_objects("a", "viewer", ZONE) == ["/tools/t3"]


def test_empty_batch_changes_nothing_and_keeps_the_revision(store: TupleStore) -> None:
    store.write([viewer("a", "t1")], ZONE)

    assert store.write([], ZONE) == 1
    assert store.delete([], ZONE) == 1
    assert store.revision(ZONE) == 1


def test_zones_have_separate_tuples_and_revisions(store: TupleStore) -> None:
    store.write([viewer("a", "t1")], "zone-1")
    store.write([viewer("a", "t2")], "zone-2")
    store.write([viewer("a", "t3")], "zone-2")

    assert store.list_objects("a", "viewer", "zone-1") == ["/tools/t1"]
    assert store.list_objects("a", "viewer", "zone-2") == ["/tools/t2", "/tools/t3"]
    assert (store.revision("zone-1"), store.revision("zone-2")) == (1, 2)


def test_list_objects_keeps_only_the_prefix_relation_and_subject_asked_for(
    store: TupleStore,
) -> None:
    store.write(
        [
            RelationTuple("a", "viewer", "/tools/b"),
            RelationTuple("a", "viewer", "/tools/a"),
            RelationTuple("a", "viewer", "/tools"),
            RelationTuple("a", "viewer", "/toolsX/a"),
            RelationTuple("a", "viewer", "/tool/a"),
            RelationTuple("a", "viewer", "/files/x"),
            RelationTuple("a", "direct_viewer", "/tools/c"),
            RelationTuple("b", "viewer", "/tools/d"),
        ],
        ZONE,
    )

    assert store.list_objects("a", "viewer", ZONE) == ["/tools/a", "/tools/b"]
    assert store.list_objects("a", "viewer", ZONE, prefix="/files/") == ["/files/x"]
    assert len(store.list_objects("a", "viewer", ZONE, prefix="")) == 6


@pytest.mark.parametrize(
    ("prefix", "inside", "outside"),
    [
        ("p\ud7ff", "p\ud7ffz", "p\ue000"),
        ("p\U0010ffff", "p\U0010ffffz", "q"),
    ],
    ids=["successor-skips-surrogates", "prefix-ends-in-last-code-point"],
)
def test_list_objects_bounds_prefixes_at_the_edges_of_unicode(
    store: TupleStore, prefix: str, inside: str, outside: str
) -> None:
    store.write([RelationTuple("a", "r", inside), RelationTuple("a", "r", outside)], ZONE)

    assert store.list_objects("a", "r", ZONE, prefix=prefix) == [inside]


def test_tuples_revision_and_assignments_survive_reopening(backend: Backend) -> None:
    first = backend.open()
    first.write([viewer("a", "t1")], ZONE)
    first.set_assignment("a", "coding", ZONE)
    first.close()

    reopened = backend.open()
    assert reopened.list_objects("a", "viewer", ZONE) == ["/tools/t1"]
    assert reopened.get_assignment("a", ZONE) == "coding"
    assert reopened.revision(ZONE) == 2


def test_assignment_is_set_replaced_and_cleared_with_a_revision_bump(
    store: TupleStore,
) -> None:
    assert store.get_assignment("a", ZONE) is None

    assert store.set_assignment("a", "minimal", ZONE) == 1
    assert store.set_assignment("a", "coding", ZONE) == 2
    assert store.get_assignment("a", ZONE) == "coding"
    assert store.get_assignment("a", "other-zone") is None

    assert store.clear_assignment("a", ZONE) == 3
    assert store.get_assignment("a", ZONE) is None


def test_list_subjects_names_assigned_and_granted_subjects_once(store: TupleStore) -> None:
    store.set_assignment("carol", "minimal", ZONE)
    store.write([viewer("alice", "t1"), viewer("alice", "t2"), viewer("carol", "t1")], ZONE)
    store.write([viewer("zed", "t1")], "other-zone")

    assert store.list_subjects(ZONE) == ["alice", "carol"]


def test_a_write_through_another_connection_is_visible_with_its_revision(
    backend: Backend,
) -> None:
    ours, theirs = backend.open(), backend.open()
    ours.write([viewer("a", "t1")], ZONE)
    assert ours.list_objects("a", "viewer", ZONE) == ["/tools/t1"]

    theirs.write([viewer("a", "t2")], ZONE)
    theirs.set_assignment("a", "search", ZONE)

    assert ours.revision(ZONE) == 3
    assert ours.list_objects("a", "viewer", ZONE) == ["/tools/t1", "/tools/t2"]
    assert ours.get_assignment("a", ZONE) == "search"


def test_concurrent_batches_from_threads_and_connections_all_commit(backend: Backend) -> None:
    stores = [backend.open(), backend.open()]
    batches_per_thread, threads_per_store = 15, 3
    failures: list[BaseException] = []

    def run(store: TupleStore, worker: int) -> None:
        try:
            for batch in range(batches_per_thread):
                store.write([viewer(f"s{worker}", f"t{batch}"), viewer("shared", "t")], ZONE)
        except BaseException as exc:  # surfaced by the assertion below
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(store, i * threads_per_store + j))
        for i, store in enumerate(stores)
        for j in range(threads_per_store)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert failures == []
    workers = len(threads)
    assert stores[0].revision(ZONE) == workers * batches_per_thread
    assert all(
        len(stores[1].list_objects(f"s{w}", "viewer", ZONE)) == batches_per_thread
        for w in range(workers)
    )


@pytest.mark.parametrize(
    "bad",
    [RelationTuple("", "viewer", "/tools/x"), RelationTuple("a", "", "/tools/x"), ("a", "r", "")],
)
def test_empty_tuple_fields_are_invalid_input_and_write_nothing(
    store: TupleStore, bad: RelationTuple
) -> None:
    with pytest.raises(InvalidInputError) as raised:
        store.write([viewer("a", "ok"), bad], ZONE)

    assert raised.value.code is Code.INVALID_INPUT
    assert store.revision(ZONE) == 0
    assert store.list_objects("a", "viewer", ZONE) == []


def test_a_closed_store_refuses_to_work(backend: Backend) -> None:
    closed = backend.open()
    closed.close()

    with pytest.raises(sqlite3.ProgrammingError if backend.name == "sqlite" else UnavailableError):
        closed.revision(ZONE)


def test_listings_sort_in_code_point_order_on_every_backend(store: TupleStore) -> None:
    objects = ["/tools/é", "/tools/a", "/tools/Z", "/tools/_", "/tools/\U0001f600", "/tools/b"]
    store.write([RelationTuple("a", "viewer", o) for o in objects], ZONE)
    for subject in ["é", "b", "Z", "_", "a"]:
        store.set_assignment(subject, "minimal", ZONE)

    assert store.list_objects("a", "viewer", ZONE) == sorted(objects)
    assert store.list_subjects(ZONE) == sorted(["é", "b", "Z", "_", "a"])


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (RelationTuple("a\x00b", "viewer", "/tools/x"), "subject"),
        (RelationTuple("a", "vie\x00wer", "/tools/x"), "relation"),
        (RelationTuple("a", "viewer", "/tools/\x00"), "object"),
    ],
)
def test_text_holding_nul_is_invalid_input_and_writes_nothing(
    store: TupleStore, bad: RelationTuple, field: str
) -> None:
    for attempt in (
        lambda: store.write([viewer("a", "ok"), bad], ZONE),
        lambda: store.delete([bad], ZONE),
        lambda: store.update(ZONE, write=[viewer("a", "ok")], delete=[bad]),
    ):
        with pytest.raises(InvalidInputError) as raised:
            attempt()
        assert raised.value.facts == {"field": field}
    with pytest.raises(InvalidInputError) as raised:
        store.write([viewer("a", "ok")], "zo\x00ne")
    assert raised.value.facts == {"field": "zone"}
    with pytest.raises(InvalidInputError) as raised:
        store.set_assignment("a", "cod\x00ing", ZONE)
    assert raised.value.facts == {"field": "profile"}

    assert store.revision(ZONE) == 0
    assert store.list_subjects(ZONE) == []


def test_reads_with_nul_find_nothing(store: TupleStore) -> None:
    store.write([viewer("a", "t1")], ZONE)
    store.set_assignment("a", "coding", ZONE)

    assert not store.check("a\x00", "viewer", "/tools/t1", ZONE)
    assert store.list_objects("a", "viewer", ZONE, prefix="/tools/\x00") == []
    assert store.get_assignment("a\x00", ZONE) is None
    assert store.revision("zo\x00ne") == 0
    assert store.list_subjects("zo\x00ne") == []
    # Clearing an assignment nobody can hold still bumps, as for any other subject.
    assert store.clear_assignment("a\x00", ZONE) == 3
    assert store.get_assignment("a", ZONE) == "coding"


def fill(store: TupleStore) -> None:
    store.write([viewer("alice", "t1"), viewer("alice", "t2"), viewer("bob", "t1")], ZONE)
    store.write([RelationTuple("carol", "direct_viewer", "/tools/é")], ZONE)
    store.set_assignment("alice", "coding", ZONE)
    store.set_assignment("dave", "minimal", ZONE)
    store.write([viewer("zed", "t9")], "other-zone")


def test_export_lists_every_zone_and_its_content_as_plain_data(store: TupleStore) -> None:
    fill(store)

    assert store.zones() == ["default", "other-zone"]
    assert store.export_zone(ZONE) == {
        "zone": ZONE,
        "revision": 4,
        "tuples": [
            ["alice", "viewer", "/tools/t1"],
            ["alice", "viewer", "/tools/t2"],
            ["bob", "viewer", "/tools/t1"],
            ["carol", "direct_viewer", "/tools/é"],
        ],
        "assignments": {"alice": "coding", "dave": "minimal"},
    }
    assert store.export_zone("never-written") == {
        "zone": "never-written",
        "revision": 0,
        "tuples": [],
        "assignments": {},
    }


def test_import_replaces_the_zone_and_lands_above_both_revisions(backend: Backend) -> None:
    source, target = backend.open(), backend.open()
    fill(source)
    exported = source.export_zone(ZONE)
    # What the target holds is replaced, not merged.
    source.write([viewer("mallory", "t1")], "target-zone")
    source.set_assignment("mallory", "full", "target-zone")

    revision = target.import_zone(exported, "target-zone")

    assert revision == exported["revision"] + 1
    assert target.export_zone("target-zone") == {**exported, "zone": "target-zone", "revision": 5}
    assert target.check("carol", "direct_viewer", "/tools/é", "target-zone")
    assert target.get_assignment("mallory", "target-zone") is None
    # A zone already past the exported revision still rises by one.
    for _ in range(10):
        target.set_assignment("x", "minimal", "busy-zone")
    assert target.import_zone(exported, "busy-zone") == 11


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"revision": -1, "tuples": [], "assignments": {}}, "revision"),
        ({"revision": True, "tuples": [], "assignments": {}}, "revision"),
        ({"tuples": [["a", "viewer"]], "assignments": {}}, "tuples"),
        ({"tuples": [["a", "viewer", ""]], "assignments": {}}, "object"),
        ({"tuples": [["a", "viewer", 3]], "assignments": {}}, "object"),
        ({"tuples": {}, "assignments": {}}, "tuples"),
        ({"tuples": [], "assignments": {"a": "\x00"}}, "profile"),
        ({"tuples": [], "assignments": []}, "assignments"),
    ],
)
def test_an_invalid_import_changes_nothing(
    store: TupleStore, data: dict[str, Any], field: str
) -> None:
    fill(store)
    before = store.export_zone(ZONE)

    with pytest.raises(InvalidInputError) as raised:
        store.import_zone(data, ZONE)

    assert raised.value.facts == {"field": field}
    assert store.export_zone(ZONE) == before


# -- SQLite only: the file, its schema version, its journal ------------------------------


def test_a_file_that_is_not_a_database_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "grants.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)

    with pytest.raises(ConfigError) as raised:
        SqliteTupleStore(path)

    assert str(path) in str(raised.value)


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "grants.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()

    with pytest.raises(ConfigError) as raised:
        SqliteTupleStore(path)

    assert str(path) in str(raised.value)


def test_the_database_uses_the_wal_journal(tmp_path: Path) -> None:
    store = SqliteTupleStore(tmp_path / "grants.sqlite3")
    store.close()
    raw = sqlite3.connect(store.path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


# -- read_only: inspection that creates and changes nothing --------------------------------


def test_read_only_on_a_missing_database_creates_neither_file_nor_folder(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "grants.sqlite3"

    with pytest.raises(ConfigError):
        SqliteTupleStore(path, read_only=True)

    assert not path.parent.exists()


@pytest.mark.parametrize("name", ["a b?c#d.sqlite3", "x%20y.sqlite3", "ünï.sqlite3"])
def test_read_only_reads_what_a_writer_stored_whatever_the_file_name(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    writer = SqliteTupleStore(path)
    writer.write([viewer("alice", "nexus_grep")], ZONE)
    writer.set_assignment("alice", "coding", ZONE)
    writer.close()

    reader = SqliteTupleStore(path, read_only=True)
    try:
        assert reader.check("alice", "viewer", "/tools/nexus_grep", ZONE)
        assert reader.get_assignment("alice", ZONE) == "coding"
        assert reader.list_subjects(ZONE) == ["alice"]
    finally:
        reader.close()


def test_read_only_refuses_every_write_and_leaves_the_files_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "grants.sqlite3"
    writer = SqliteTupleStore(path)
    writer.write([viewer("alice", "nexus_grep")], ZONE)
    writer.close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    reader = SqliteTupleStore(path, read_only=True)
    try:
        for attempt in (
            lambda: reader.write([viewer("mallory", "nexus_grep")], ZONE),
            lambda: reader.delete([viewer("alice", "nexus_grep")], ZONE),
            lambda: reader.set_assignment("mallory", "full", ZONE),
            lambda: reader.clear_assignment("alice", ZONE),
        ):
            with pytest.raises(sqlite3.Error):
                attempt()
    finally:
        reader.close()

    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_read_only_sees_a_live_writers_changes(tmp_path: Path) -> None:
    path = tmp_path / "grants.sqlite3"
    writer = SqliteTupleStore(path)
    reader = SqliteTupleStore(path, read_only=True)
    try:
        writer.set_assignment("alice", "minimal", ZONE)
        assert reader.get_assignment("alice", ZONE) == "minimal"
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("content", [b"", b"not a database at all, just text\n"])
def test_read_only_refuses_a_file_that_is_not_a_grants_database(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "grants.sqlite3"
    path.write_bytes(content)

    with pytest.raises(ConfigError):
        SqliteTupleStore(path, read_only=True)

    assert path.read_bytes() == content
