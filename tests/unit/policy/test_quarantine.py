"""Quarantine evidence in process memory: per (server, tool, pin), bounded, thread-safe."""

from __future__ import annotations

import threading

from nexus_mcp.policy.quarantine import SEEN_PER_TOOL, MemorySeenDigests, SeenDigests

PIN = "a" * 64
OTHER_PIN = "b" * 64


def digest(n: int) -> str:
    return f"{n:064x}"


def test_the_memory_store_is_a_seen_digests_store() -> None:
    assert isinstance(MemorySeenDigests(), SeenDigests)


def test_digests_are_kept_per_server_tool_and_pin() -> None:
    store = MemorySeenDigests()
    store.add("up", "echo", PIN, pinned=PIN)
    store.add("up", "echo", digest(1), pinned=PIN)
    store.add("up", "echo", digest(2), pinned=OTHER_PIN)
    store.add("up", "add", digest(3), pinned=PIN)
    store.add("other", "echo", digest(4), pinned=PIN)
    store.add("up", "echo", digest(5), pinned=None)
    assert store.get("up", "echo", pinned=PIN) == {PIN, digest(1)}
    assert store.get("up", "echo", pinned=OTHER_PIN) == {digest(2)}
    assert store.get("up", "echo", pinned=None) == {digest(5)}
    assert store.get("up", "add", pinned=PIN) == {digest(3)}
    assert store.get("other", "echo", pinned=PIN) == {digest(4)}
    assert store.get("up", "nothing", pinned=PIN) == frozenset()


def test_a_new_pin_starts_clean() -> None:
    store = MemorySeenDigests()
    store.add("up", "echo", digest(1), pinned=PIN)  # the rug pull, against the old pin
    # The operator re-pins the new definition: its evidence is a new set.
    assert store.get("up", "echo", pinned=digest(1)) == frozenset()
    # The evidence against the old pin stays (no expiry).
    assert store.get("up", "echo", pinned=PIN) == {digest(1)}


def test_at_most_sixteen_digests_per_tool_and_pin() -> None:
    store = MemorySeenDigests()
    for n in range(40):
        store.add("up", "echo", digest(n), pinned=PIN)
    kept = store.get("up", "echo", pinned=PIN)
    assert len(kept) == SEEN_PER_TOOL == 16
    assert kept == {digest(n) for n in range(16)}  # the first ones: later ones say nothing new
    store.add("up", "echo", digest(3), pinned=PIN)  # one already kept: still 16
    assert len(store.get("up", "echo", pinned=PIN)) == 16


def test_observe_adds_then_reads_each_tool() -> None:
    store = MemorySeenDigests()
    store.add("up", "echo", digest(9), pinned=PIN)
    got = store.observe("up", {"echo": (PIN, PIN), "add": (digest(1), None)})
    assert got == {"echo": {PIN, digest(9)}, "add": {digest(1)}}
    assert store.observe("up", {}) == {}


def test_merge_keeps_a_copy_bounded_like_any_other() -> None:
    store = MemorySeenDigests()
    store.merge("up", "echo", frozenset(digest(n) for n in range(20)), pinned=PIN)
    assert len(store.get("up", "echo", pinned=PIN)) == SEEN_PER_TOOL


def test_entries_list_one_servers_evidence() -> None:
    store = MemorySeenDigests()
    store.add("up", "echo", digest(1), pinned=PIN)
    store.add("up", "add", digest(2), pinned=None)
    store.add("other", "echo", digest(3), pinned=PIN)
    assert sorted(store.entries("up"), key=lambda e: e[0]) == [
        ("add", None, frozenset({digest(2)})),
        ("echo", PIN, frozenset({digest(1)})),
    ]


def test_the_key_bound_never_drops_evidence_against_a_pin() -> None:
    store = MemorySeenDigests(max_keys=4)
    store.add("up", "echo", digest(1), pinned=PIN)  # evidence of a change: kept
    # An upstream flooding new tool names (unpinned, or matching their pins).
    for n in range(50):
        store.add("up", f"tool{n}", digest(100 + n), pinned=None)
        store.add("up", f"pinned{n}", digest(200 + n), pinned=digest(200 + n))
    assert len(store) <= 4
    assert store.get("up", "echo", pinned=PIN) == {digest(1)}


def test_concurrent_adds_stay_bounded() -> None:
    store = MemorySeenDigests()

    def add(offset: int) -> None:
        for n in range(100):
            store.add("up", "echo", digest(offset * 1000 + n), pinned=PIN)

    threads = [threading.Thread(target=add, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store.get("up", "echo", pinned=PIN)) == SEEN_PER_TOOL
