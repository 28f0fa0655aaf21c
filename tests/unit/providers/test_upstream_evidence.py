"""An upstream's quarantine evidence across replicas, at the ``UpstreamServer`` level.

Two ``UpstreamServer`` objects for the same upstream stand for two replicas; the tool
lists they are given stand for what each one's sessions listed. The evidence store they
share is process memory here (``tests/unit/stores/test_redis_quarantine.py`` runs the
same on Redis; ``tests/e2e/test_upstream_replicas.py`` with real processes).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from nexus_mcp.errors import UnavailableError
from nexus_mcp.policy.pins import definition_digest, load_pins
from nexus_mcp.policy.quarantine import MemorySeenDigests, Observation
from tests.support.upstream_replicas import ADD, ECHO, EVIL, Replica, pin, registry_with_pins


@pytest.fixture
def registry_dir(tmp_path: Path) -> Path:
    return registry_with_pins(tmp_path)


async def test_embedded_evidence_is_the_servers_own(registry_dir: Path) -> None:
    replica = Replica(registry_dir)
    assert not replica.server.shares_evidence
    replica.sees(ECHO, ADD)
    assert await replica.may_call("echo")
    replica.sees(EVIL, authoritative=False)  # one caller's session shows another echo
    assert replica.status("echo") == "quarantined"
    assert not await replica.may_call("echo")
    assert await replica.may_call("add")
    # Listing the pinned definition again does not wash the evidence away.
    replica.sees(ECHO, ADD)
    assert replica.status("echo") == "quarantined"
    # A second process with its own memory knows nothing of it (one server process).
    other = Replica(registry_dir)
    other.sees(ECHO, ADD)
    assert await other.may_call("echo")


async def test_a_rug_pull_one_replica_saw_is_refused_by_another_at_its_next_call(
    registry_dir: Path,
) -> None:
    shared = MemorySeenDigests()
    a, b = Replica(registry_dir, shared), Replica(registry_dir, shared)
    a.sees(ECHO, ADD)
    b.sees(ECHO, ADD)
    assert await b.may_call("echo")
    a.sees(EVIL, ADD)  # replica A's sessions see the new echo
    assert a.status("echo") == "quarantined"
    # B has not listed again: echo is still in its list, until its next call.
    assert b.status("echo") == "exposed"
    assert "up_echo" in b.server.visible_tools()
    assert not await b.may_call("echo")
    assert b.status("echo") == "quarantined"
    assert "up_echo" not in b.server.visible_tools()
    assert await b.may_call("add")
    pinned = load_pins(registry_dir, "up").digests["echo"]
    for replica in (a, b):
        (event,) = replica.events("tool_definition_changed")
        assert event["tool"] == "echo"
        assert event["pinned_sha256"] == pinned
        assert event["seen_sha256"] == definition_digest(EVIL)  # not B's own (the pin)
    # B's next list of the pinned definition keeps it quarantined.
    b.sees(ECHO, ADD)
    assert b.status("echo") == "quarantined"
    # A third replica started later learns it at its first list.
    c = Replica(registry_dir, shared)
    c.sees(ECHO, ADD)
    assert c.status("echo") == "quarantined"


async def test_a_new_pin_starts_clean_and_is_read_at_call_time(registry_dir: Path) -> None:
    shared = MemorySeenDigests()
    a, b = Replica(registry_dir, shared), Replica(registry_dir, shared)
    a.sees(ECHO, ADD)
    b.sees(ECHO, ADD)
    a.sees(EVIL, ADD)
    assert a.status("echo") == "quarantined"
    # The operator reviews the new definition and pins it (a lock file every replica sees).
    pin(registry_dir, EVIL)
    a.sees(EVIL, ADD)
    assert a.status("echo") == "exposed"
    assert await a.may_call("echo")
    # B still shows the old echo (its definition no longer matches the new pin): at its
    # next call it reads the lock file (its mtime changed) and refuses.
    assert b.status("echo") == "exposed"
    assert not await b.may_call("echo")
    assert b.status("echo") == "quarantined"
    assert await b.may_call("add")


async def test_a_changed_lock_file_quarantines_at_call_time_without_a_list(
    registry_dir: Path,
) -> None:
    replica = Replica(registry_dir)  # embedded: no store call, a stat of the lock file
    replica.sees(ECHO, ADD)
    assert await replica.may_call("echo")
    pin(registry_dir, EVIL)  # pinned to another definition than the one listed
    assert not await replica.may_call("echo")
    assert [e["tool"] for e in replica.events("tool_definition_changed")] == ["echo"]


class Flaky(MemorySeenDigests):
    """Shared evidence whose store can be switched off: it then raises what a Redis
    outage raises."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise UnavailableError(store="upstream_quarantine", error="ConnectionError")

    def add(self, server_id: str, tool: str, digest: str, *, pinned: str | None) -> None:
        self._check()
        super().add(server_id, tool, digest, pinned=pinned)

    def get(self, server_id: str, tool: str, *, pinned: str | None) -> frozenset[str]:
        self._check()
        return super().get(server_id, tool, pinned=pinned)

    def observe(self, server_id: str, seen: Mapping[str, Observation]) -> dict[str, frozenset[str]]:
        self._check()
        return super().observe(server_id, seen)


async def test_an_unreachable_store_fails_closed_and_what_was_seen_is_sent_later(
    registry_dir: Path,
) -> None:
    shared = Flaky()
    a, b = Replica(registry_dir, shared), Replica(registry_dir, shared)
    a.sees(ECHO, ADD)
    b.sees(ECHO, ADD)
    shared.down = True
    # A lists during the outage: its own evidence still quarantines echo here.
    a.sees(EVIL, ADD)
    assert a.status("echo") == "quarantined"
    assert a.status("add") == "exposed"
    # No call of an upstream tool is forwarded unverified, on either replica.
    for replica, name in ((a, "add"), (b, "echo"), (b, "add")):
        tool = replica.server.visible_tools()[f"up_{name}"]
        with pytest.raises(UnavailableError) as caught:
            await replica.server.check_call(tool)
        assert caught.value.facts["store"] == "upstream_quarantine"
    shared.down = False
    # A's next call sends what A saw meanwhile; B then refuses echo.
    assert await a.may_call("add")
    assert not await b.may_call("echo")
    assert await b.may_call("add")


async def test_one_store_round_trip_per_call(registry_dir: Path) -> None:
    shared = Flaky()
    replica = Replica(registry_dir, shared)
    replica.sees(ECHO, ADD)
    before = shared.calls
    for _ in range(5):
        assert await replica.may_call("echo")
    assert shared.calls - before == 5


async def test_a_store_that_lost_its_data_learns_it_again(registry_dir: Path) -> None:
    shared = MemorySeenDigests()
    a, b = Replica(registry_dir, shared), Replica(registry_dir, shared)
    a.sees(ECHO, ADD)
    b.sees(ECHO, ADD)
    a.sees(EVIL, ADD)
    assert a.status("echo") == "quarantined"
    # Redis restarted without persistence: every set is gone.
    fresh = MemorySeenDigests()
    a.server.evidence = b.server.evidence = fresh
    # A's next call of any tool finds its own pin missing and sends back what it knows.
    assert await a.may_call("add")
    assert not await b.may_call("echo")
