"""The visible-tools cache (hits, buckets, TTL, invalidation, failures, threads) and the filter."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nexus_mcp.errors import Code
from nexus_mcp.policy.grants import grant_tool, visible_tools
from nexus_mcp.policy.visibility import GrantLookupError, VisibleToolsCache, filter_visible
from nexus_mcp.stores.grants import RelationTuple, SqliteTupleStore, TupleStore

ZONE = "default"
TTL = 300.0
REFRESH = 1.0


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteTupleStore]:
    opened = SqliteTupleStore(tmp_path / "grants.sqlite3")
    yield opened
    opened.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_cache(store: TupleStore, clock: FakeClock, **overrides: object) -> VisibleToolsCache:
    options: dict[str, object] = {
        "ttl_seconds": TTL,
        "revision_window": 10,
        "revision_refresh_seconds": REFRESH,
    }
    options.update(overrides)
    return VisibleToolsCache(store, clock=clock, **options)  # type: ignore[arg-type]


def test_second_get_is_a_hit_with_the_same_tools(store: SqliteTupleStore, clock: FakeClock) -> None:
    grant_tool(store, "alice", "nexus_read_file", ZONE)
    cache = make_cache(store, clock)

    first = cache.get("alice", ZONE)
    second = cache.get("alice", ZONE)

    assert first == second == {"nexus_read_file"}
    metrics = cache.metrics()
    assert (metrics["misses"], metrics["hits"], metrics["entries"]) == (1, 1, 1)


def test_invalidating_a_subject_shows_its_new_grant_and_keeps_others_cached(
    store: SqliteTupleStore, clock: FakeClock
) -> None:
    grant_tool(store, "alice", "nexus_read_file", ZONE)
    grant_tool(store, "bob", "nexus_glob", ZONE)
    cache = make_cache(store, clock)
    cache.get("alice", ZONE)
    cache.get("bob", ZONE)

    grant_tool(store, "alice", "nexus_grep", ZONE)
    cache.invalidate("alice")

    assert cache.get("alice", ZONE) == {"nexus_read_file", "nexus_grep"}
    assert cache.get("bob", ZONE) == {"nexus_glob"}
    assert cache.metrics()["misses"] == 3
    assert cache.metrics()["hits"] == 1


def test_invalidating_everything_empties_the_cache(
    store: SqliteTupleStore, clock: FakeClock
) -> None:
    grant_tool(store, "alice", "nexus_read_file", ZONE)
    cache = make_cache(store, clock)
    cache.get("alice", ZONE)
    cache.get("bob", ZONE)

    cache.invalidate()

    assert cache.metrics()["entries"] == 0


def test_revoke_without_invalidate_stays_cached_until_the_ttl_expires(
    store: SqliteTupleStore, clock: FakeClock
) -> None:
    grant_tool(store, "alice", "nexus_read_file", ZONE)
    grant_tool(store, "alice", "nexus_grep", ZONE)
    cache = make_cache(store, clock)
    cache.get("alice", ZONE)

    store.delete([RelationTuple("alice", "direct_viewer", "/tools/nexus_grep")], ZONE)
    clock.advance(TTL - 1)
    still_cached = cache.get("alice", ZONE)
    clock.advance(2)
    after_ttl = cache.get("alice", ZONE)

    assert still_cached == {"nexus_read_file", "nexus_grep"}
    assert after_ttl == {"nexus_read_file"}


def test_another_process_write_in_the_same_bucket_is_visible_after_the_ttl(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "grants.sqlite3"
    ours, theirs = SqliteTupleStore(path), SqliteTupleStore(path)
    try:
        cache = make_cache(ours, clock)
        assert cache.get("alice", ZONE) == frozenset()

        grant_tool(theirs, "alice", "nexus_read_file", ZONE)  # revision 0 -> 1: same bucket
        clock.advance(REFRESH * 5)
        before_ttl = cache.get("alice", ZONE)
        clock.advance(TTL)
        after_ttl = cache.get("alice", ZONE)

        assert before_ttl == frozenset()
        assert after_ttl == {"nexus_read_file"}
    finally:
        ours.close()
        theirs.close()


def test_another_process_write_into_a_new_bucket_is_visible_after_the_revision_refresh(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "grants.sqlite3"
    ours, theirs = SqliteTupleStore(path), SqliteTupleStore(path)
    try:
        for i in range(9):
            grant_tool(theirs, "bob", f"t{i}", ZONE)
        cache = make_cache(ours, clock, revision_window=10)
        assert cache.get("alice", ZONE) == frozenset()

        grant_tool(theirs, "alice", "nexus_read_file", ZONE)  # revision 9 -> 10: next bucket
        within_refresh = cache.get("alice", ZONE)
        clock.advance(REFRESH)
        after_refresh = cache.get("alice", ZONE)

        assert within_refresh == frozenset()
        assert after_refresh == {"nexus_read_file"}
    finally:
        ours.close()
        theirs.close()


def test_a_failed_lookup_raises_a_typed_error_and_is_not_cached(
    store: SqliteTupleStore, clock: FakeClock
) -> None:
    grant_tool(store, "alice", "nexus_read_file", ZONE)
    cache = make_cache(store, clock)
    raw = sqlite3.connect(store.path)
    raw.execute("ALTER TABLE tuples RENAME TO tuples_away")

    with pytest.raises(GrantLookupError) as raised:
        cache.get("alice", ZONE)

    assert raised.value.code is Code.INTERNAL_ERROR
    assert isinstance(raised.value.__cause__, sqlite3.Error)
    assert cache.metrics()["errors"] == 1
    assert cache.metrics()["entries"] == 0

    raw.execute("ALTER TABLE tuples_away RENAME TO tuples")
    raw.close()
    assert cache.get("alice", ZONE) == {"nexus_read_file"}
    assert cache.metrics()["misses"] == 1


def test_an_invalidation_during_a_lookup_discards_that_lookups_answer(
    store: SqliteTupleStore, clock: FakeClock
) -> None:
    grant_tool(store, "alice", "nexus_read_file", ZONE)
    cache: VisibleToolsCache

    def lookup_racing_a_revoke(s: TupleStore, subject: str, zone: str) -> frozenset[str]:
        answer = visible_tools(s, subject, zone)
        cache.invalidate(subject)  # a revoke finishing while this lookup was in flight
        return answer

    cache = make_cache(store, clock, lookup=lookup_racing_a_revoke)

    assert cache.get("alice", ZONE) == {"nexus_read_file"}
    assert cache.metrics()["entries"] == 0


def test_concurrent_gets_from_threads_return_each_subjects_own_tools(
    store: SqliteTupleStore, clock: FakeClock
) -> None:
    subjects = [f"agent-{i}" for i in range(4)]
    for i, subject in enumerate(subjects):
        for j in range(i + 1):
            grant_tool(store, subject, f"tool_{j}", ZONE)
    expected = {s: frozenset(f"tool_{j}" for j in range(i + 1)) for i, s in enumerate(subjects)}
    cache = make_cache(store, clock)
    rounds, thread_count = 200, 8
    wrong: list[tuple[str, frozenset[str]]] = []
    start = threading.Barrier(thread_count)

    def run(offset: int) -> None:
        start.wait(timeout=10)
        for n in range(rounds):
            subject = subjects[(n + offset) % len(subjects)]
            got = cache.get(subject, ZONE)
            if got != expected[subject]:
                wrong.append((subject, got))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(thread_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    metrics = cache.metrics()
    assert wrong == []
    assert metrics["hits"] + metrics["misses"] == rounds * thread_count
    assert metrics["errors"] == 0
    assert metrics["entries"] == len(subjects)


def test_the_cache_never_holds_more_than_maxsize_entries(
    store: SqliteTupleStore, clock: FakeClock
) -> None:
    cache = make_cache(store, clock, maxsize=3)

    for i in range(10):
        cache.get(f"agent-{i}", ZONE)

    assert cache.metrics()["entries"] == 3


def test_filtered_and_rejected_counters_accumulate(
    store: SqliteTupleStore, clock: FakeClock
) -> None:
    cache = make_cache(store, clock)

    cache.record_filtered(7)
    cache.record_filtered(3)
    cache.record_rejected()

    assert cache.metrics() == {
        "hits": 0,
        "misses": 0,
        "filtered": 10,
        "rejected": 1,
        "errors": 0,
        "entries": 0,
    }


def test_a_revision_window_below_one_is_refused(store: SqliteTupleStore) -> None:
    with pytest.raises(ValueError, match="revision_window"):
        VisibleToolsCache(store, revision_window=0)


WRITE_TOOLS = frozenset({"nexus_write_file", "nexus_delete_file"})
LISTED = ["nexus_write_file", "nexus_read_file", "nexus_grep", "nexus_delete_file", "nexus_glob"]


@pytest.mark.parametrize(
    ("visible", "read_only", "expected"),
    [
        (frozenset(LISTED), False, LISTED),
        (frozenset(LISTED), True, ["nexus_read_file", "nexus_grep", "nexus_glob"]),
        (frozenset({"nexus_glob", "nexus_write_file"}), False, ["nexus_write_file", "nexus_glob"]),
        (frozenset({"nexus_glob", "nexus_write_file"}), True, ["nexus_glob"]),
        (frozenset({"not_listed"}), False, []),
        (frozenset(), False, []),
    ],
    ids=["all", "all-read-only", "some", "some-read-only", "unlisted-grant", "nothing"],
)
def test_filter_keeps_visible_tools_in_order_and_hides_writes_from_read_only_callers(
    visible: frozenset[str], read_only: bool, expected: list[str]
) -> None:
    assert filter_visible(LISTED, visible, read_only=read_only, write_tools=WRITE_TOOLS) == expected
