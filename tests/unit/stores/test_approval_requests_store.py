"""The approval request stores (issue 26): one conformance suite over the in-process
store, SQLite files in tmp_path and a real Redis (a key prefix of the test's own).

Each "store" fixture opens its backend twice on the same state where the backend is
shared (two SQLite connections to one file, two Redis clients), so the races run between
separate connections, as between processes or replicas."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from nexus_mcp.errors import Code, NexusError
from nexus_mcp.ids import new_id
from nexus_mcp.settings import Settings
from nexus_mcp.stores.approval_requests import (
    APPROVED,
    DENIED,
    EXPIRED,
    KEEP_AFTER_EXPIRY_SECONDS,
    MAX_PREVIEW_BYTES,
    PENDING,
    USED,
    ApprovalDecisionError,
    ApprovalRequest,
    ApprovalRequestStore,
    MemoryApprovalRequestStore,
    SqliteApprovalRequestStore,
    request_key,
)
from nexus_mcp.stores.backends import open_state
from nexus_mcp.stores.locations import approval_requests_path
from nexus_mcp.stores.redis_approvals import RedisApprovalRequestStore
from nexus_mcp.stores.redis_state import redis_client

BACKENDS = ["memory", "sqlite", "redis"]
SHARED = ["sqlite", "redis"]
T0 = 1_800_000_000.0
DIGEST = "a" * 64


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


Opener = Callable[[], ApprovalRequestStore]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def opener(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Opener]:
    """``open()``: another store object on the same state (a second process or replica)."""
    backend = request.param
    closers: list[Callable[[], None]] = []
    memory = MemoryApprovalRequestStore(clock=clock)

    def open_store() -> ApprovalRequestStore:
        store: Any
        if backend == "memory":
            return memory
        if backend == "sqlite":
            store = SqliteApprovalRequestStore(tmp_path / "approval_requests.sqlite3", clock=clock)
            closers.append(store.close)
            return store  # type: ignore[no-any-return]
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("state_prefix")
        client = redis.Redis.from_url(url, max_connections=16)
        closers.append(client.close)
        return RedisApprovalRequestStore(client, prefix, clock=clock)

    yield open_store
    for close in closers:
        close()


@pytest.fixture
def store(opener: Opener) -> ApprovalRequestStore:
    return opener()


def make(
    *,
    subject: str = "user:alice",
    tool: str = "write_file",
    server_id: str | None = None,
    args_digest: str = DIGEST,
    created_at: float = T0,
    ttl: float = 600.0,
    **changes: Any,
) -> ApprovalRequest:
    request = ApprovalRequest(
        id=new_id(),
        created_at=created_at,
        expires_at=created_at + ttl,
        tool=tool,
        server_id=server_id,
        subject=subject,
        log_subject="u:3f2a",
        role="editor",
        args_digest=args_digest,
        target="notes/todo.md",
        preview="--- a\n+++ b\n",
        policy_rule="writes-need-approval",
        status=PENDING,
    )
    return replace(request, **changes)


def why(call: Callable[[], object]) -> str:
    with pytest.raises(ApprovalDecisionError) as raised:
        call()
    return raised.value.why


def race(count: int, call: Callable[[], object]) -> list[object]:
    """``count`` threads released together; each answer, or the exception it raised."""
    barrier = threading.Barrier(count)

    def run() -> object:
        barrier.wait()
        try:
            return call()
        except Exception as exc:  # the race's losers are part of the answer
            return exc

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: run(), range(count)))


parametrize_all = pytest.mark.parametrize("opener", BACKENDS, indirect=True)
parametrize_shared = pytest.mark.parametrize("opener", SHARED, indirect=True)


@parametrize_all
def test_every_backend_is_an_approval_request_store(store: ApprovalRequestStore) -> None:
    assert isinstance(store, ApprovalRequestStore)


@parametrize_all
def test_open_stores_a_request_and_get_reads_it_back_field_for_field(
    store: ApprovalRequestStore,
) -> None:
    request = make(server_id="forge", target=None, policy_rule=None)
    assert store.open(request) == request
    assert store.get(request.id) == request
    assert store.get(new_id()) is None
    assert store.get("not a valid id!") is None


@parametrize_all
def test_open_is_idempotent_per_key(store: ApprovalRequestStore) -> None:
    first = store.open(make())
    again = store.open(make(preview="another preview"))
    assert again == first
    assert store.find("user:alice", "write_file", None, DIGEST) == first
    assert [r.id for r in store.pending()] == [first.id]


@parametrize_all
def test_a_different_subject_tool_server_or_digest_is_a_different_request(
    store: ApprovalRequestStore,
) -> None:
    base = store.open(make())
    others = [
        make(subject="user:bob"),
        make(tool="delete_file"),
        make(server_id="forge"),
        make(args_digest="b" * 64),
    ]
    ids = {store.open(other).id for other in others}
    assert len(ids) == 4 and base.id not in ids
    assert store.find("user:bob", "write_file", None, DIGEST) is not None
    assert store.find("user:carol", "write_file", None, DIGEST) is None
    # A native tool (server None) and a server literally named "" never share a key.
    assert request_key("s", "t", None, DIGEST) != request_key("s", "t", "", DIGEST)


@parametrize_all
def test_pending_lists_oldest_first_and_hides_expired_and_decided(
    store: ApprovalRequestStore, clock: FakeClock
) -> None:
    newer = store.open(make(tool="c", created_at=T0 + 2))
    older = store.open(make(tool="a", created_at=T0))
    middle = store.open(make(tool="b", created_at=T0 + 1))
    short = store.open(make(tool="d", created_at=T0 + 3, ttl=5))
    decided = store.open(make(tool="e", created_at=T0 - 1))
    store.decide(decided.id, approve=False, approver="admin:ops", now=T0)
    assert [r.id for r in store.pending()] == [older.id, middle.id, newer.id, short.id]
    assert [r.id for r in store.pending(limit=2)] == [older.id, middle.id]
    clock.now = T0 + 8
    assert [r.id for r in store.pending()] == [older.id, middle.id, newer.id]
    got = store.get(short.id)
    assert got is not None and got.status == EXPIRED
    with pytest.raises(ValueError):
        store.pending(limit=0)


@parametrize_all
def test_a_request_is_approved_or_denied_once(store: ApprovalRequestStore) -> None:
    approved = store.open(make())
    denied = store.open(make(tool="delete_file"))
    decision = store.decide(approved.id, approve=True, approver="admin:ops", now=T0 + 1)
    assert (decision.status, decision.decided_by, decision.decided_at) == (
        APPROVED,
        "admin:ops",
        T0 + 1,
    )
    refusal = store.decide(denied.id, approve=False, approver="admin:ops", reason="no", now=T0)
    assert (refusal.status, refusal.reason) == (DENIED, "no")
    assert store.get(approved.id) == decision
    assert store.get(denied.id) == refusal
    for request_id in (approved.id, denied.id):
        for approve in (True, False):

            def again(r: str = request_id, a: bool = approve) -> object:
                return store.decide(r, approve=a, approver="x")

            assert why(again) == "decided"
    assert why(lambda: store.decide(new_id(), approve=True, approver="x")) == "unknown"
    assert why(lambda: store.decide("../etc", approve=True, approver="x")) == "unknown"


@parametrize_all
def test_a_decision_after_expiry_is_refused(store: ApprovalRequestStore) -> None:
    request = store.open(make(ttl=60))
    assert why(lambda: store.decide(request.id, approve=True, approver="a", now=T0 + 60)) == (
        "expired"
    )
    got = store.get(request.id)
    assert got is not None and got.status == PENDING  # the store's clock says T0: not yet


@parametrize_all
def test_decide_checks_its_inputs(store: ApprovalRequestStore) -> None:
    request = store.open(make())
    with pytest.raises(ValueError, match="reason") as raised:
        store.decide(request.id, approve=False, approver="a", reason="x" * 501)
    assert "xxx" not in str(raised.value)
    with pytest.raises(ValueError, match="approver"):
        store.decide(request.id, approve=True, approver="")
    assert store.decide(request.id, approve=False, approver="a", reason="x" * 500).status == DENIED


@parametrize_all
def test_use_needs_an_approval_and_works_once(store: ApprovalRequestStore) -> None:
    request = store.open(make())
    assert why(lambda: store.use(request.id)) == "not_approved"
    store.decide(request.id, approve=True, approver="admin:ops")
    used = store.use(request.id)
    assert used.status == USED and used.decided_by == "admin:ops"
    assert why(lambda: store.use(request.id)) == "decided"
    assert why(lambda: store.use(new_id())) == "unknown"
    # Spent: the same call needs a new approval.
    assert store.find("user:alice", "write_file", None, DIGEST) is None
    fresh = store.open(make())
    assert fresh.id != request.id and fresh.status == PENDING


@parametrize_all
def test_a_denied_or_expired_approval_is_never_used(store: ApprovalRequestStore) -> None:
    denied = store.open(make())
    store.decide(denied.id, approve=False, approver="a")
    assert why(lambda: store.use(denied.id)) == "not_approved"
    approved = store.open(make(tool="other", ttl=60))
    store.decide(approved.id, approve=True, approver="a")
    assert why(lambda: store.use(approved.id, now=T0 + 60)) == "expired"
    assert store.use(approved.id, now=T0 + 59).status == USED


@parametrize_all
def test_a_denied_request_is_returned_until_it_expires_then_a_new_one_opens(
    store: ApprovalRequestStore, clock: FakeClock
) -> None:
    denied = store.open(make(ttl=60))
    store.decide(denied.id, approve=False, approver="a", reason="not today")
    assert store.find("user:alice", "write_file", None, DIGEST) == store.get(denied.id)
    again = store.open(make(created_at=T0 + 30))
    assert again.id == denied.id and again.status == DENIED
    clock.now = T0 + 60
    assert store.find("user:alice", "write_file", None, DIGEST) is None
    fresh = store.open(make(created_at=T0 + 60))
    assert fresh.id != denied.id and fresh.status == PENDING
    assert store.find("user:alice", "write_file", None, DIGEST) == fresh


@parametrize_all
def test_an_expired_pending_request_gives_way_to_a_new_one(
    store: ApprovalRequestStore, clock: FakeClock
) -> None:
    old = store.open(make(ttl=60))
    clock.now = T0 + 61
    assert store.find("user:alice", "write_file", None, DIGEST) is None
    got = store.get(old.id)
    assert got is not None and got.status == EXPIRED
    assert store.open(make(created_at=T0 + 61)).id != old.id


@parametrize_all
def test_purge_deletes_requests_a_day_after_they_expired(
    store: ApprovalRequestStore, clock: FakeClock
) -> None:
    gone = store.open(make(tool="a", ttl=60))
    used = store.open(make(tool="b", ttl=60))
    store.decide(used.id, approve=True, approver="a")
    store.use(used.id)
    kept = store.open(make(tool="c", ttl=3600))
    assert store.purge(now=T0 + 60 + KEEP_AFTER_EXPIRY_SECONDS - 1) == 0
    assert store.purge(now=T0 + 60 + KEEP_AFTER_EXPIRY_SECONDS) == 2
    assert store.get(gone.id) is None and store.get(used.id) is None
    assert store.get(kept.id) is not None
    assert store.purge(now=T0 + 60 + KEEP_AFTER_EXPIRY_SECONDS) == 0
    clock.now = T0 + 3600 + KEEP_AFTER_EXPIRY_SECONDS
    assert store.purge() == 1
    assert store.pending() == []


@parametrize_all
def test_open_refuses_what_it_must_not_store_without_echoing_it(
    store: ApprovalRequestStore,
) -> None:
    secret = "s3cr3t-value"
    bad = [
        make(id="no/slashes"),
        make(id="x" * 65),
        make(preview=secret + "x" * MAX_PREVIEW_BYTES),
        make(target=secret + "x" * 1024),
        make(status=APPROVED),
        make(decided_by=secret),
        make(subject=""),
        make(tool=""),
        make(server_id=""),
        make(ttl=0),
        make(created_at=float("nan")),
    ]
    for request in bad:
        with pytest.raises(ValueError) as raised:
            store.open(request)
        assert secret not in str(raised.value)
    assert store.pending() == []
    assert store.open(make(preview="é" * (MAX_PREVIEW_BYTES // 2))).status == PENDING
    taken = store.open(make(tool="a"))
    with pytest.raises(ValueError):
        store.open(make(tool="b", id=taken.id))


@parametrize_shared
def test_two_store_objects_on_one_state_see_each_others_requests(opener: Opener) -> None:
    first, second = opener(), opener()
    request = first.open(make())
    assert second.get(request.id) == request
    assert second.open(make()).id == request.id
    second.decide(request.id, approve=True, approver="admin:ops")
    found = first.find("user:alice", "write_file", None, DIGEST)
    assert found is not None and found.status == APPROVED
    first.use(request.id)
    assert why(lambda: second.use(request.id)) == "decided"


@parametrize_all
def test_of_eight_racing_decisions_exactly_one_wins(opener: Opener) -> None:
    stores = [opener() for _ in range(8)]
    request = stores[0].open(make())
    turn = iter(range(8))
    lock = threading.Lock()

    def decide() -> object:
        with lock:
            index = next(turn)
        return stores[index].decide(request.id, approve=index % 2 == 0, approver=f"op{index}")

    answers = race(8, decide)
    winners = [a for a in answers if isinstance(a, ApprovalRequest)]
    assert len(winners) == 1
    assert all(
        isinstance(a, ApprovalDecisionError) and a.why == "decided"
        for a in answers
        if a not in winners
    )
    assert stores[0].get(request.id) == winners[0]


@parametrize_all
def test_of_eight_racing_uses_exactly_one_wins(opener: Opener) -> None:
    stores = [opener() for _ in range(8)]
    request = stores[0].open(make())
    stores[0].decide(request.id, approve=True, approver="admin:ops")
    turn = iter(range(8))
    lock = threading.Lock()

    def use() -> object:
        with lock:
            index = next(turn)
        return stores[index].use(request.id)

    answers = race(8, use)
    assert sum(isinstance(a, ApprovalRequest) for a in answers) == 1
    losers = [a for a in answers if not isinstance(a, ApprovalRequest)]
    assert all(isinstance(a, ApprovalDecisionError) and a.why == "decided" for a in losers)


@parametrize_all
def test_eight_racing_opens_for_one_key_store_one_request(opener: Opener) -> None:
    stores = [opener() for _ in range(8)]
    turn = iter(range(8))
    lock = threading.Lock()

    def open_one() -> object:
        with lock:
            index = next(turn)
        return stores[index].open(make())

    answers = race(8, open_one)
    assert all(isinstance(a, ApprovalRequest) for a in answers)
    ids = {a.id for a in answers if isinstance(a, ApprovalRequest)}
    assert len(ids) == 1
    assert [r.id for r in stores[0].pending()] == list(ids)


def test_sqlite_requests_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "approval_requests.sqlite3"
    store = SqliteApprovalRequestStore(path, clock=FakeClock())
    request = store.open(make())
    store.decide(request.id, approve=True, approver="admin:ops")
    store.close()
    reopened = SqliteApprovalRequestStore(path, clock=FakeClock())
    try:
        assert reopened.use(request.id).status == USED
    finally:
        reopened.close()


def test_a_closed_sqlite_store_refuses_instead_of_answering(tmp_path: Path) -> None:
    store = SqliteApprovalRequestStore(tmp_path / "a.sqlite3", clock=FakeClock())
    request = store.open(make())
    store.close()
    with pytest.raises(NexusError) as raised:
        store.use(request.id)
    assert raised.value.code == Code.INTERNAL_ERROR


def test_redis_keys_hold_digests_never_the_subject(redis_url: str, state_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        store = RedisApprovalRequestStore(client, state_prefix, clock=FakeClock())
        request = store.open(make(subject="user:alice@example.com"))
        keys = sorted(k.decode() for k in client.scan_iter(match=f"{state_prefix}:*"))
        assert all(k.startswith(f"{state_prefix}:approval:") for k in keys)
        assert not any("alice" in k for k in keys)
        pointer = f"{state_prefix}:approval:key:" + request_key(
            request.subject, request.tool, None, DIGEST
        )
        assert pointer in keys and client.get(pointer) == request.id.encode()
        # Kept one day past expiry (the TTL is relative to the fake clock's now).
        ttl = client.ttl(f"{state_prefix}:approval:req:{request.id}")
        assert 600 + KEEP_AFTER_EXPIRY_SECONDS - 5 <= ttl <= 600 + KEEP_AFTER_EXPIRY_SECONDS
    finally:
        client.close()


def test_an_unreachable_redis_is_unavailable_not_an_answer() -> None:
    from tests.support.shared_state import free_port

    client = redis_client(
        f"redis://127.0.0.1:{free_port()}/0", pool_size=2, connect_timeout=0.5, timeout=0.5
    )
    try:
        store = RedisApprovalRequestStore(client, "nexus-t-down", clock=FakeClock())
        for call in (
            lambda: store.open(make()),
            lambda: store.use(new_id()),
            lambda: store.decide(new_id(), approve=True, approver="a"),
            lambda: store.pending(),
        ):
            with pytest.raises(NexusError) as raised:
                call()
            assert raised.value.code == Code.UNAVAILABLE
            assert "127.0.0.1" not in str(raised.value)
    finally:
        client.close()


def test_the_embedded_backend_keeps_approval_requests_in_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    state = open_state(settings, {})
    try:
        assert isinstance(state.approval_requests, SqliteApprovalRequestStore)
        request = state.approval_requests.open(make(created_at=time.time()))
    finally:
        state.close()
    reopened = SqliteApprovalRequestStore(approval_requests_path(settings))
    try:
        assert reopened.get(request.id) == request
    finally:
        reopened.close()
    assert approval_requests_path(settings) == tmp_path / "approval_requests.sqlite3"


def test_the_shared_backend_keeps_approval_requests_in_redis(
    tmp_path: Path, migrated_url: str, redis_url: str, state_prefix: str
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        state={
            "backend": "shared",
            "postgres_url": migrated_url,
            "redis_url": redis_url,
            "key_prefix": state_prefix,
        },
    )
    replicas = [open_state(settings, {}), open_state(settings, {})]
    try:
        first, second = (replica.approval_requests for replica in replicas)
        assert isinstance(first, RedisApprovalRequestStore)
        request = first.open(make(created_at=time.time()))
        assert second.get(request.id) == request
        assert not (tmp_path / "approval_requests.sqlite3").exists()
    finally:
        for replica in replicas:
            replica.close()
