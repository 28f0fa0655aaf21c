"""The one place that picks the state backend (``state.backend``) and opens its stores.

- ``embedded`` (default): grants, idempotency records, used approval nonces and approval
  requests in SQLite files in the data dir; call budgets, rate limits and session taint
  (the flow policy) in process memory. One server process (several processes sharing one
  data dir share the SQLite files, but not the budgets or the taint).
- ``shared``: grants, assignments and idempotency records in PostgreSQL
  (``stores/postgres.py``, ``postgres_grants.py``, ``postgres_idempotency.py``); approval
  nonces, budgets and rate limits in Redis (``stores/redis_state.py``), approval requests
  and session taint in Redis too (``stores/redis_approvals.py``, ``redis_flow.py``); a
  grant change made anywhere reaches every replica's visible-tools cache through
  PostgreSQL ``LISTEN/NOTIFY`` (the cache's TTL and its one-second revision refresh are
  the backstop). Every replica enforces the same limits, sees the same taint, and
  anchors the head of its audit file in PostgreSQL (``postgres_audit.py``).

Policy code and middleware see the protocols only (``TupleStore``, ``IdempotencyStore``,
``NonceStore``, ``CallBudget``, ``RateLimiter``, ``ApprovalRequestStore``,
``TaintStore``). The shared backend refuses to start against a database this build has
not migrated (``nexus-mcp state migrate``) or a newer one, and against a store it cannot
reach; once running, an outage refuses calls with ``UNAVAILABLE`` and the pools reconnect
by themselves.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.budgets import (
    CallLimits,
    SeparateLimits,
    SessionBudget,
    SlidingWindowRateLimiter,
)
from nexus_mcp.policy.flow import DEFAULT_TAINT_TTL_SECONDS
from nexus_mcp.policy.upstreams import SecretValue, resolve_secret
from nexus_mcp.settings import Settings
from nexus_mcp.stores.approval_requests import (
    ApprovalRequestStore,
    MemoryApprovalRequestStore,
    SqliteApprovalRequestStore,
)
from nexus_mcp.stores.flow_taint import MemoryTaintStore, TaintStore
from nexus_mcp.stores.grants import SqliteTupleStore, TupleStore
from nexus_mcp.stores.idempotency import IdempotencyStore, SqliteIdempotencyStore
from nexus_mcp.stores.locations import (
    approval_requests_path,
    grants_path,
    idempotency_path,
    nonces_path,
)
from nexus_mcp.stores.nonces import NonceStore, SqliteNonceStore

log = get_logger(__name__)

EMBEDDED = "embedded"
SHARED = "shared"
GRANTS_CHANNEL_SUFFIX = "_grants"


@dataclass
class StateStores:
    """The chain's stores for one server process, and how to close them."""

    backend: str
    grants: TupleStore
    idempotency: IdempotencyStore
    nonces: NonceStore
    limits: CallLimits  # the rate limit and the session budget of every call
    # Shared backend: the Redis client the stores above use (upstream quarantine evidence).
    redis: Any = None
    # Approval requests waiting for an operator (issue 26). Keyword-only in practice: the
    # default (process memory) keeps older positional callers working.
    approval_requests: ApprovalRequestStore = field(default_factory=MemoryApprovalRequestStore)
    # Shared backend: where each replica's audit head is anchored (PostgresAuditHeads).
    audit_heads: Any = None
    # Which flow labels each session touched (policy/flow.py), shared by replicas if shared.
    taint: TaintStore = field(default_factory=MemoryTaintStore)
    # Shared backend: start the cross-replica grant-change listener (watch_grants).
    _watch: Callable[[Callable[[str], None]], None] | None = None
    # Shared backend: one round trip to each server (``probe``); blocking.
    _probe: Callable[[], None] | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def shared(self) -> bool:
        return self.backend == SHARED

    def probe(self) -> None:
        """Raise unless every store answers now (``/readyz``): a Redis PING and a PostgreSQL
        ``SELECT 1``, each bounded by ``state.timeout_seconds``. Blocking; a no-op for the
        embedded backend, whose SQLite files opened at start-up."""
        if self._probe is not None:
            self._probe()

    def watch_grants(self, on_change: Callable[[str], None]) -> None:
        """Call ``on_change(zone)`` when any replica changes grants (shared backend only)."""
        if self._watch is not None:
            self._watch(on_change)

    def close(self) -> None:
        closers, self._closers = self._closers, []
        for close in reversed(closers):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - closing must go on
                log.warning("state_store_close_failed", error=type(exc).__name__)


def resolve_url(
    value: SecretValue | None, setting: str, settings: Settings, environ: Mapping[str, str]
) -> str:
    """A store URL from its reference; an inline URL holding a password is refused in prod
    (the configuration file would carry the credential)."""
    if value is None:
        raise ConfigError(f"state.backend 'shared' needs '{setting}'")
    if isinstance(value, str) and not settings.is_dev and _has_password(value):
        raise ConfigError(
            f"invalid setting '{setting}': give a URL holding a password by reference "
            "({env: NAME} or {file: path}), not inline"
        )
    return resolve_secret(value, environ).get_secret_value()


def _has_password(url: str) -> bool:
    try:
        return urlsplit(url).password is not None
    except ValueError:
        return False


def describe_address(url: str) -> str:
    """``host:port`` of a store URL for operator messages: never its user or password."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        return f"{host}:{parts.port}" if parts.port else host
    except ValueError:
        return "the configured address"


def idempotency_lease(settings: Settings) -> float:
    """How long a pending idempotency claim is trusted: twice the longest tool timeout.

    After it, the claim's outcome is unknown (the process may have died mid-call). A record
    must outlive its lease, so a TTL shorter than the lease is refused by name.
    """
    longest = max([settings.budgets.tool_timeout_seconds, *settings.budgets.tool_timeouts.values()])
    lease = 2 * longest
    if settings.registry.idempotency_ttl_seconds < lease:
        raise ConfigError(
            f"invalid setting 'registry.idempotency_ttl_seconds' "
            f"(NEXUS_MCP_REGISTRY__IDEMPOTENCY_TTL_SECONDS): must be at least {lease:g} "
            "seconds, twice the longest tool timeout"
        )
    return lease


MIN_REQUEST_STATE_KEY_BYTES = 32


def request_state_keys(settings: Settings, environ: Mapping[str, str]) -> list[bytes]:
    """The keys sealing the ``requestState`` FastMCP hands clients (first seals, all open).

    Every replica must hold the same ones, or a client's answer to an elicitation reaches
    a replica that cannot open it: the shared backend refuses to start without them. None
    configured on the embedded backend: FastMCP's per-process key (one server process).
    Inline keys are for dev only, like every other secret.
    """
    refs = settings.state.request_state_keys
    if not refs:
        if settings.state.backend == SHARED:
            raise ConfigError(
                "state.backend 'shared' needs 'state.request_state_keys' (at least one key "
                f"of {MIN_REQUEST_STATE_KEY_BYTES}+ bytes, by reference, the same on every "
                "replica) so any replica can open the requestState another one sealed"
            )
        return []
    keys: list[bytes] = []
    for index, ref in enumerate(refs):
        if isinstance(ref, str) and not settings.is_dev:
            raise ConfigError(
                f"invalid setting 'state.request_state_keys[{index}]': give it by reference "
                "({env: NAME} or {file: path}); inline keys are for dev mode only"
            )
        key = resolve_secret(ref, environ).get_secret_value().encode("utf-8")
        if len(key) < MIN_REQUEST_STATE_KEY_BYTES:
            raise ConfigError(
                f"invalid setting 'state.request_state_keys[{index}]': must be at least "
                f"{MIN_REQUEST_STATE_KEY_BYTES} bytes"
            )
        keys.append(key)
    return keys


def open_state(
    settings: Settings,
    environ: Mapping[str, str],
    *,
    taint_ttl_seconds: float = DEFAULT_TAINT_TTL_SECONDS,
) -> StateStores:
    """Open the stores of the configured backend (module docstring)."""
    if settings.state.backend == SHARED:
        return _open_shared(settings, environ, taint_ttl_seconds)
    return _open_embedded(settings, taint_ttl_seconds)


def _limits(settings: Settings) -> SeparateLimits:
    budgets = settings.budgets
    return SeparateLimits(
        SlidingWindowRateLimiter(budgets.rate_limit_calls, budgets.rate_limit_window_seconds),
        SessionBudget(budgets.max_calls_per_session),
    )


def _open_embedded(
    settings: Settings, taint_ttl_seconds: float = DEFAULT_TAINT_TTL_SECONDS
) -> StateStores:
    lease = idempotency_lease(settings)
    closers: list[Callable[[], None]] = []
    try:
        grants = SqliteTupleStore(grants_path(settings))
        closers.append(grants.close)
        idempotency = SqliteIdempotencyStore(
            idempotency_path(settings),
            ttl_seconds=settings.registry.idempotency_ttl_seconds,
            lease_seconds=lease,
        )
        closers.append(idempotency.close)
        nonces = SqliteNonceStore(nonces_path(settings))
        closers.append(nonces.close)
        approval_requests = SqliteApprovalRequestStore(approval_requests_path(settings))
        closers.append(approval_requests.close)
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    return StateStores(
        EMBEDDED,
        grants,
        idempotency,
        nonces,
        _limits(settings),
        approval_requests=approval_requests,
        taint=MemoryTaintStore(taint_ttl_seconds),
        _closers=closers,
    )


def _open_shared(
    settings: Settings,
    environ: Mapping[str, str],
    taint_ttl_seconds: float = DEFAULT_TAINT_TTL_SECONDS,
) -> StateStores:
    from nexus_mcp.stores.postgres import GrantsListener, PostgresPool, check_schema
    from nexus_mcp.stores.postgres_audit import PostgresAuditHeads
    from nexus_mcp.stores.postgres_grants import PostgresTupleStore
    from nexus_mcp.stores.postgres_idempotency import PostgresIdempotencyStore
    from nexus_mcp.stores.redis_approvals import RedisApprovalRequestStore
    from nexus_mcp.stores.redis_flow import RedisTaintStore
    from nexus_mcp.stores.redis_state import (
        RedisCallLimits,
        RedisNonceStore,
        RedisRateLimiter,
        RedisSessionBudget,
        redis_client,
    )

    state = settings.state
    lease = idempotency_lease(settings)
    pg_url = resolve_url(state.postgres_url, "state.postgres_url", settings, environ)
    redis_url = resolve_url(state.redis_url, "state.redis_url", settings, environ)
    channel = grants_channel(settings)
    closers: list[Callable[[], None]] = []
    try:
        pool = PostgresPool(
            pg_url,
            pool_size=state.pool_size,
            connect_timeout=state.connect_timeout_seconds,
            timeout=state.timeout_seconds,
        )
        closers.append(pool.close)
        _reachable(lambda: check_schema(pool), "PostgreSQL", "state.postgres_url", pg_url)
        client = redis_client(
            redis_url,
            pool_size=state.pool_size,
            connect_timeout=state.connect_timeout_seconds,
            timeout=state.timeout_seconds,
        )
        closers.append(client.close)
        _reachable(client.ping, "Redis", "state.redis_url", redis_url)
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    budgets = settings.budgets
    listener: list[GrantsListener] = []

    def probe() -> None:
        client.ping()
        with pool.connection() as conn:
            conn.execute("SELECT 1")

    def watch(on_change: Callable[[str], None]) -> None:
        started = GrantsListener(pool, channel, on_change)
        listener.append(started)
        closers.append(started.stop)

    return StateStores(
        SHARED,
        PostgresTupleStore(pool, notify_channel=channel),
        PostgresIdempotencyStore(
            pool, ttl_seconds=settings.registry.idempotency_ttl_seconds, lease_seconds=lease
        ),
        RedisNonceStore(client, state.key_prefix),
        RedisCallLimits(
            RedisRateLimiter(
                client,
                state.key_prefix,
                budgets.rate_limit_calls,
                budgets.rate_limit_window_seconds,
            ),
            RedisSessionBudget(client, state.key_prefix, budgets.max_calls_per_session),
        ),
        redis=client,
        approval_requests=RedisApprovalRequestStore(client, state.key_prefix),
        audit_heads=PostgresAuditHeads(pool, state.key_prefix),
        taint=RedisTaintStore(client, state.key_prefix, taint_ttl_seconds),
        _watch=watch,
        _probe=probe,
        _closers=closers,
    )


def audit_replica(settings: Settings) -> str:
    """The name this process's audit head is anchored under: ``state.instance_id``, else
    the host's name (replicas on one host sharing an audit file share one chain)."""
    return settings.state.instance_id or socket.gethostname()


def grants_channel(settings: Settings) -> str:
    """The PostgreSQL notification channel grant changes are announced on."""
    return f"{settings.state.key_prefix.replace('-', '_').replace('.', '_')}{GRANTS_CHANNEL_SUFFIX}"


def open_postgres(settings: Settings, environ: Mapping[str, str]) -> Any:
    """The configured PostgreSQL pool (``PostgresPool``); the schema is not
    checked (``state migrate`` uses it on an unmigrated database)."""
    from nexus_mcp.stores.postgres import PostgresPool

    state = settings.state
    url = resolve_url(state.postgres_url, "state.postgres_url", settings, environ)
    pool = PostgresPool(
        url,
        pool_size=state.pool_size,
        connect_timeout=state.connect_timeout_seconds,
        timeout=state.timeout_seconds,
    )
    return pool


def open_shared_grants(
    settings: Settings, environ: Mapping[str, str]
) -> tuple[TupleStore, Callable[[], None]]:
    """The shared grants store for operator commands (``profiles``, ``state import``):
    a change made through it is announced to every running replica."""
    from nexus_mcp.stores.postgres import check_schema
    from nexus_mcp.stores.postgres_grants import PostgresTupleStore

    pool = open_postgres(settings, environ)
    try:
        _reachable(lambda: check_schema(pool), "PostgreSQL", "state.postgres_url", pool.conninfo)
    except BaseException:
        pool.close()
        raise
    return PostgresTupleStore(pool, notify_channel=grants_channel(settings)), pool.close


def _reachable(probe: Callable[[], Any], engine: str, setting: str, url: str) -> None:
    """Start-up: a store that cannot be reached stops the server with one clear line
    (its address, never its credentials); a schema problem is the probe's own message."""
    from nexus_mcp.errors import UnavailableError

    try:
        probe()
    except ConfigError:
        raise
    except UnavailableError:
        raise ConfigError(
            f"{engine} at {describe_address(url)} cannot be reached ('{setting}')"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any driver failure at start-up
        raise ConfigError(
            f"{engine} at {describe_address(url)} cannot be reached ('{setting}'; "
            f"{type(exc).__name__})"
        ) from None


__all__ = [
    "EMBEDDED",
    "SHARED",
    "StateStores",
    "describe_address",
    "grants_channel",
    "idempotency_lease",
    "open_postgres",
    "open_shared_grants",
    "open_state",
    "request_state_keys",
    "resolve_url",
]
