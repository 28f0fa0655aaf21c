"""``/readyz`` says what is not ready and why, to a load balancer and to an operator.

Real parts: a shared state store of the test's own that it stops (Redis, PostgreSQL), an
upstream whose process dies at once and one at a closed port. The balancer reads the
status code (503 only while the store is down); the plain body names components and a
fixed reason word, the operator's detail also the upstream by id. No body carries an
address, a port, an exception's text or an upstream's output.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.server.health import STORE_PROBE_INTERVAL_SECONDS
from nexus_mcp.settings import Settings
from nexus_mcp.stores.postgres import PostgresPool, migrate
from tests.support.shared_state import free_port

from .upstream_harness import http_upstream, make_gateway, poll

OPERATOR_TOKEN = "operator-token-readiness-0123456789abcdef"
TOKEN_ENV = "NEXUS_TEST_READYZ_TOKEN"
STATE_KEY = "request-state-key-readiness-0123456789abcdef"
DEAD_OUTPUT = "CANARY-UPSTREAM-STDERR-91c"


async def readyz(server: NexusServer, *, operator: bool = False) -> httpx.Response:
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"} if operator else {}
    transport = httpx.ASGITransport(app=server.mcp.http_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        return await http.get("/readyz", headers=headers)


async def readyz_after_probe(server: NexusServer, **kwargs: Any) -> httpx.Response:
    """The answer once the cached probe result is stale (at most one probe a second)."""
    await asyncio.sleep(STORE_PROBE_INTERVAL_SECONDS + 0.1)
    return await readyz(server, **kwargs)


def says_nothing_more(body: str, *secrets: str) -> None:
    for word in ("127.0.0.1", "localhost", "redis://", "postgresql://", "Error", *secrets):
        assert word not in body, word


@pytest.fixture
def shared(tmp_path: Path, redis_url: str, postgres_url: str, state_prefix: str) -> Iterator[Any]:
    """A factory of prod servers on the shared backend, with the operator's token."""
    built: list[NexusServer] = []
    workspace = tmp_path / "ws"
    workspace.mkdir()

    def factory(*, redis: str = redis_url, postgres: str = postgres_url) -> NexusServer:
        pool = PostgresPool(postgres, pool_size=1)
        try:
            migrate(pool)
        finally:
            pool.close()
        settings = Settings(
            mode="prod",
            subject="alice",
            role="editor",
            workspace=workspace,
            data_dir=tmp_path / "data",
            health={"bearer_token": {"env": TOKEN_ENV}},
            state={
                "backend": "shared",
                "postgres_url": {"env": "PG"},
                "redis_url": {"env": "RD"},
                "key_prefix": state_prefix,
                "request_state_keys": [{"env": "RSK"}],
                "timeout_seconds": 1.0,
                "connect_timeout_seconds": 1.0,
            },
        )
        server = build_server(
            settings,
            audit_sinks=[MemoryAuditSink()],
            env={"PG": postgres, "RD": redis, "RSK": STATE_KEY, TOKEN_ENV: OPERATOR_TOKEN},
        )
        built.append(server)
        return server

    yield factory
    for server in built:
        server.close()


async def test_redis_down_is_503_naming_the_state_store_and_ready_again_when_back(
    shared: Any, private_redis: Any
) -> None:
    server = shared(redis=private_redis.url)
    ready = await readyz(server)
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "components": {"server": "ready", "state_store": "ready"},
    }
    private_redis.stop()
    down = await readyz_after_probe(server)
    assert down.status_code == 503
    assert down.json() == {
        "status": "not_ready",
        "components": {"server": "ready", "state_store": "unavailable"},
        "reasons": {"state_store": "unreachable"},
    }
    assert down.headers["cache-control"] == "no-store"
    says_nothing_more(down.text, str(private_redis.port))
    detail = await readyz(server, operator=True)
    assert detail.status_code == 503
    assert detail.json()["reasons"] == {"state_store": "unreachable"}
    says_nothing_more(detail.text, str(private_redis.port))
    private_redis.start()
    deadline = time.monotonic() + 15
    while (back := await readyz_after_probe(server)).status_code != 200:
        assert time.monotonic() < deadline, back.text
    assert back.json()["status"] == "ready"


async def test_postgres_down_is_503_naming_the_state_store(
    shared: Any, private_postgres: Any
) -> None:
    server = shared(postgres=private_postgres.url)
    assert (await readyz(server)).status_code == 200
    private_postgres.stop()
    down = await readyz_after_probe(server)
    assert down.status_code == 503
    assert down.json()["reasons"] == {"state_store": "unreachable"}
    says_nothing_more(down.text, str(private_postgres.port))


async def test_probing_the_route_hard_asks_the_store_at_most_once_a_second(
    shared: Any, private_redis: Any
) -> None:
    """Whoever reaches the port could otherwise turn /readyz into load on the store."""
    server = shared(redis=private_redis.url)
    first = await readyz(server)
    assert first.status_code == 200
    private_redis.stop()
    # Within the interval, 50 concurrent probes all get the cached answer; none waits.
    began = time.monotonic()
    answers = await asyncio.gather(*(readyz(server) for _ in range(50)))
    assert {a.status_code for a in answers} == {200}
    assert time.monotonic() - began < STORE_PROBE_INTERVAL_SECONDS
    assert (await readyz_after_probe(server)).status_code == 503


async def test_an_upstream_that_cannot_start_is_named_for_the_operator_only(
    tmp_path: Path,
) -> None:
    dead = {
        "server_id": "dead",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-c", f"import sys; sys.stderr.write('{DEAD_OUTPUT}'); sys.exit(3)"],
    }
    closed = http_upstream("gone", f"http://127.0.0.1:{free_port()}/mcp")
    gw = make_gateway(
        tmp_path / "gw",
        [dead, closed],
        extra={"health": {"bearer_token": {"env": TOKEN_ENV}}},
    )
    server = gw.build(env={TOKEN_ENV: OPERATOR_TOKEN})
    upstreams = server.runtime.upstreams
    assert upstreams is not None
    async with Client(server.mcp) as client:
        await client.list_tools()
        await poll(lambda: all(s["state"] == "degraded" for s in upstreams.summary().values()))
        plain = await readyz(server)
        detail = await readyz(server, operator=True)
    # Degraded, not down: the server's own tools still serve, so the balancer keeps it.
    assert plain.status_code == 200
    assert plain.json() == {
        "status": "degraded",
        "components": {"server": "ready", "state_store": "ready", "upstreams": "degraded"},
        "reasons": {"upstreams": "unreachable"},
    }
    for word in ("dead", "gone", DEAD_OUTPUT):
        assert word not in plain.text
    assert detail.status_code == 200
    assert detail.json()["reasons"] == {
        "upstreams": "unreachable",
        "upstream:dead": "unreachable",
        "upstream:gone": "unreachable",
    }
    says_nothing_more(detail.text, DEAD_OUTPUT)
