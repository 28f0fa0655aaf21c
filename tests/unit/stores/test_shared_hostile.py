"""Hostile review of issue 15's shared state stores (real Redis / PostgreSQL).

Each test is an attack: the ones a hostile review found to succeed failed before their
fix and now guard it (a nonce under clock skew and a lost reply, a partial import, an
out-of-range revision reported as an outage, an export's permissions); the others guard
attacks that were defended from the start.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from nexus_mcp.errors import InvalidInputError, UnavailableError
from nexus_mcp.settings import Settings
from nexus_mcp.stores.grants import RelationTuple, SqliteTupleStore
from nexus_mcp.stores.postgres import PostgresPool, migrate
from nexus_mcp.stores.postgres_grants import PostgresTupleStore
from nexus_mcp.stores.redis_state import (
    RedisNonceStore,
    RedisRateLimiter,
    RedisSessionBudget,
    redis_client,
)

TIMEOUT = 1.0


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis_client(redis_url, pool_size=2, connect_timeout=TIMEOUT, timeout=TIMEOUT)
    yield c
    c.close()


def redis_now(c: redis.Redis) -> float:
    seconds, micros = c.time()
    return float(seconds) + micros / 1_000_000


# --- nonces ------------------------------------------------------------------------------


def test_nonce_spent_twice_when_the_replica_clock_is_behind_redis(
    client: redis.Redis, state_prefix: str
) -> None:
    """DEFECT. ``RedisNonceStore.consume`` turns ``expires_at`` (the replica's clock) into
    an absolute ``EXAT``, which Redis judges on *its* clock; its floor is also the
    replica's clock. A replica 30 s behind Redis still accepts a token with 10 s left, but
    the EXAT lies in Redis's past: ``SET NX EXAT <past>`` answers OK and stores nothing,
    so the same token id is accepted again and again (approval replay across the fleet).
    """
    skew = 30.0
    store = RedisNonceStore(client, state_prefix, clock=lambda: redis_now(client) - skew)
    replica_now = redis_now(client) - skew
    expires_at = replica_now + 10  # the token verifies on this replica for 10 more seconds
    assert store.consume("jti-skewed", expires_at) is True
    assert store.consume("jti-skewed", expires_at) is False, "token id accepted twice"


def test_nonce_with_expires_at_in_the_past_is_still_remembered(
    client: redis.Redis, state_prefix: str
) -> None:
    """GUARD: an expires_at already past (same clocks) is floored to now + 1 s."""
    store = RedisNonceStore(client, state_prefix)
    past = time.time() - 3600
    assert store.consume("jti-past", past) is True
    assert store.consume("jti-past", past) is False


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonce_refuses_non_finite_expiry(
    client: redis.Redis, state_prefix: str, value: float
) -> None:
    store = RedisNonceStore(client, state_prefix)
    with pytest.raises(ValueError):
        store.consume("jti-nan", value)


# --- budgets and rate limits: keys --------------------------------------------------------


def test_budget_rate_and_nonce_keys_never_collide(client: redis.Redis, state_prefix: str) -> None:
    """GUARD: a subject, a session key and a token id spelled alike land on different
    keys (prefix:kind:sha256), and a prefix that contains ':' does not alias another."""
    budget = RedisSessionBudget(client, state_prefix, 1)
    rate = RedisRateLimiter(client, state_prefix, 1, 60)
    nonces = RedisNonceStore(client, state_prefix)
    same = "principal:alice"
    assert len({budget.key(same), rate.key(same), nonces.key(same)}) == 3
    other = RedisSessionBudget(client, state_prefix + ":budget", 1)
    assert other.key("x") != budget.key("x")
    budget.charge(same)
    rate.check(same)
    assert nonces.consume(same, time.time() + 60) is True


# --- state import / export ---------------------------------------------------------------


def export_doc(*zones: dict[str, Any]) -> str:
    return json.dumps({"format": "nexus-mcp.grants-export", "version": 1, "zones": list(zones)})


def zone(name: str, tuples: list[list[str]], revision: int = 1) -> dict[str, Any]:
    return {"zone": name, "revision": revision, "tuples": tuples, "assignments": {}}


GOOD = zone("aaa-first", [["mallory", "direct_viewer", "/tools/nexus_write_file"]])


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(zone("zzz", [["a\x00", "direct_viewer", "/tools/x"]]), id="nul-in-subject"),
        pytest.param(zone("zzz\x00", [["a", "direct_viewer", "/tools/x"]]), id="nul-in-zone"),
        pytest.param(zone("zzz", [["a", "direct_viewer", "/tools/x"]], 2**64), id="huge-revision"),
    ],
)
def test_embedded_import_of_a_bad_export_leaves_earlier_zones_imported(
    tmp_path: Path,
    bad: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DEFECT. ``commands/state.py::_valid_zone`` does not apply the stores' own checks
    (NUL, the revision's range), so a file it passes fails in the *second* zone's
    ``import_zone``, after the first zone was committed: a refused import leaves
    partial state (here: a write grant for mallory). A revision past 2**63 even ends in
    an uncaught OverflowError (a traceback) rather than the one-line refusal."""
    from nexus_mcp.cli import main
    from nexus_mcp.stores.locations import grants_path

    monkeypatch.delenv("NEXUS_MCP_CONFIG", raising=False)
    data = tmp_path / "d"
    path = tmp_path / "in.json"
    path.write_text(export_doc(GOOD, bad), encoding="utf-8")
    try:
        code = main(["state", "import", "--data-dir", str(data), str(path)])
    except Exception as exc:  # an uncaught exception is itself the defect
        code = f"uncaught {type(exc).__name__}"
    store = SqliteTupleStore(grants_path(Settings(data_dir=data)))
    try:
        leaked = store.check("mallory", "direct_viewer", "/tools/nexus_write_file", "aaa-first")
    finally:
        store.close()
    assert not leaked, f"a refused import ({code}) left the first zone's grants in place"
    assert isinstance(code, int) and code != 0, code


def test_postgres_import_overflowing_revision_is_misreported_as_unavailable(
    postgres_url: str,
) -> None:
    """DEFECT. An export whose revision is past PostgreSQL's bigint (it passes
    ``parse_export``: any int >= 0) fails inside the transaction with
    NumericValueOutOfRange, which ``PostgresPool.connection`` turns into
    ``UnavailableError(store="grants")``: the operator is told the store is down (retry
    later) when the input is invalid and a retry can never work."""
    pool = PostgresPool(postgres_url, pool_size=1, timeout=5)
    try:
        migrate(pool)
        store = PostgresTupleStore(pool)
        doc = zone("z", [["a", "direct_viewer", "/tools/x"]], 2**63)
        with pytest.raises(InvalidInputError):
            store.import_zone(doc, "z")
    except UnavailableError as exc:
        pytest.fail(f"invalid input reported as {exc.code}: {exc.message}")
    finally:
        pool.close()


def test_export_over_an_existing_file_keeps_it_world_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DEFECT (low). ``run_export`` opens the output with mode 0o600, but ``os.open``'s mode
    applies only when it creates the file: exporting over an existing 0o644 file (a
    re-run, or a file another user pre-created in a shared folder) writes every grant
    into a file anyone can read, against the code's own comment."""
    from nexus_mcp.cli import main
    from nexus_mcp.stores.locations import grants_path

    monkeypatch.delenv("NEXUS_MCP_CONFIG", raising=False)
    data = tmp_path / "d"
    store = SqliteTupleStore(grants_path(Settings(data_dir=data)))
    store.write([RelationTuple("alice", "direct_viewer", "/tools/nexus_grep")], "default")
    store.close()
    out = tmp_path / "grants.json"
    out.write_text("old\n")
    os.chmod(out, 0o644)
    assert main(["state", "export", "--data-dir", str(data), "-o", str(out)]) == 0
    assert "alice" in out.read_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600, oct(out.stat().st_mode)


# --- the one retry of a lost reply ------------------------------------------------------


class ReplyDroppingProxy:
    """A TCP proxy to Redis that, once armed, forwards the next command holding
    ``marker`` to Redis, waits for Redis's answer, then cuts the client's connection
    without passing the answer on: the command ran, its reply was lost."""

    def __init__(self, upstream_port: int, marker: bytes) -> None:
        import socket
        import threading

        self.marker = marker
        self.armed = threading.Event()
        self.cutting: set[int] = set()
        self.upstream_port = upstream_port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self.stopped:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump_up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(upstream, client), daemon=True).start()

    def _pump_up(self, client: Any, upstream: Any) -> None:
        try:
            while data := client.recv(65536):
                drop = self.armed.is_set() and self.marker in data
                if drop:
                    self.cutting.add(id(client))
                upstream.sendall(data)
                if drop:
                    self.armed.clear()
                    time.sleep(0.2)  # Redis answers; _pump_down is told to swallow it
                    client.close()
                    upstream.close()
                    return
        except OSError:
            pass

    def _pump_down(self, upstream: Any, client: Any) -> None:
        try:
            while data := upstream.recv(65536):
                if id(client) in self.cutting or client.fileno() == -1:
                    return
                client.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.stopped = True
        self.server.close()


def test_a_lost_set_reply_is_retried_and_spends_a_fresh_token_as_a_replay(
    redis_url: str, state_prefix: str
) -> None:
    """DEFECT (availability). ``redis_client`` retries a ConnectionError once, and
    ``SET NX`` is not idempotent: when the connection breaks after Redis stored the id
    but before its OK arrived, the retry finds the id stored and ``consume`` answers
    False. The caller's first and only use of a fresh token is refused as
    APPROVAL_REPLAYED and the token is burned; and a consume that is being retried can
    never tell its own earlier write from a replay. Expected: either no retry for the
    nonce SET (fail closed as UNAVAILABLE, the id may or may not be stored), or a SET
    whose value is a per-call token and a GET on retry to recognise it as ours."""
    from urllib.parse import urlsplit

    upstream_port = urlsplit(redis_url).port or 6379
    proxy = ReplyDroppingProxy(upstream_port, b":nonce:")
    c = redis_client(f"redis://127.0.0.1:{proxy.port}/0", pool_size=1, connect_timeout=1, timeout=1)
    try:
        store = RedisNonceStore(c, state_prefix)
        proxy.armed.set()
        try:
            first = store.consume("fresh-jti", time.time() + 300)
        except UnavailableError:
            first = None  # failing closed would be acceptable
        assert first is not False, "the first use of a fresh token was answered as a replay"
    finally:
        c.close()
        proxy.close()
