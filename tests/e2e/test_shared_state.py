"""Issue 15 in process: two servers on one PostgreSQL database and one Redis prefix are two
replicas, and every guarantee holds across them (the process-and-nginx version is
``test_replicas.py``). Real PostgreSQL and Redis; in-memory FastMCP clients.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastmcp import Client
from mcp.server.request_state import RequestStateSecurity

from nexus_mcp.console.security import ConsoleKeys, load_console_key
from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.policy.approvals import mint_approval_token
from nexus_mcp.policy.grants import PROFILE_RELATION
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from nexus_mcp.stores.grants import RelationTuple
from nexus_mcp.stores.postgres import PostgresPool, migrate, migrations
from nexus_mcp.transport.serve import http_options

from .conftest import snapshot, wire

pytestmark = pytest.mark.slow

SECRET = "approval-secret-CANARY-77aa-0123456789abcdef"
STATE_KEY = "request-state-key-CANARY-0123456789abcdef"
CONTENT = "CONTENT-CANARY-shared approved text\n"
CONSOLE_SECRET = "console-secret-CANARY-0123456789abcdef-0123"
WRITE = "nexus_write_file"

Builder = Callable[..., NexusServer]


def envelope(result: dict[str, Any]) -> dict[str, str]:
    assert result["isError"] is True, result
    assert "structuredContent" not in result
    payload: dict[str, str] = json.loads(result["content"][0]["text"])
    assert set(payload) == {"error", "code"}
    return payload


def write_args(key: str, path: str = "scratch/shared.txt") -> dict[str, Any]:
    return {"path": path, "content": CONTENT, "idempotency_key": key}


def mint(server: NexusServer, arguments: dict[str, Any]) -> str:
    assert server.runtime.approval_keys is not None
    return mint_approval_token(
        server.runtime.approval_keys,
        server.runtime.approval_settings,
        approver="bob-approver",
        subject="alice",
        tool=WRITE,
        arguments=arguments,
        host_id="ci-host",
    )


async def call(server: NexusServer, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async with Client(server.mcp) as client:
        return wire(await client.call_tool_mcp(tool, args))


@pytest.fixture
def migrated(postgres_url: str) -> str:
    pool = PostgresPool(postgres_url, pool_size=2)
    try:
        assert migrate(pool) == list(range(1, len(migrations()) + 1))
    finally:
        pool.close()
    return postgres_url


@pytest.fixture
def replicas(
    tmp_path: Path, workspace: Path, migrated: str, redis_url: str, state_prefix: str
) -> Iterator[Builder]:
    """A factory of replicas: prod servers on one workspace, each with its own data dir,
    sharing the database and the key prefix."""
    built: list[NexusServer] = []
    config = tmp_path / "nexus.yaml"
    policy = {
        "workspace": {
            "allowed_paths": ["scratch/**"],
            "allowed_operations": ["write"],
            "require_approval": True,
        }
    }
    config.write_text(yaml.safe_dump({"write_policies": policy}), encoding="utf-8")

    def factory(
        number: int = 0, *, redis: str | None = None, postgres: str | None = None, **overrides: Any
    ) -> NexusServer:
        values: dict[str, Any] = {
            "mode": "prod",
            "subject": "alice",
            "role": "editor",
            "workspace": workspace,
            "data_dir": tmp_path / f"data-{number}",
            "state": {
                "backend": "shared",
                "postgres_url": {"env": "PG"},
                "redis_url": {"env": "RD"},
                "key_prefix": state_prefix,
                "request_state_keys": [{"env": "RSK"}],
                "timeout_seconds": 1.0,
                "connect_timeout_seconds": 1.0,
            },
        }
        values.update(overrides)
        server = build_server(
            Settings(**values),
            config_file=config,
            audit_sinks=[MemoryAuditSink()],
            env={
                "NEXUS_MCP_APPROVAL_SECRET": SECRET,
                "PG": postgres or migrated,
                "RD": redis or redis_url,
                "RSK": STATE_KEY,
                "CS": CONSOLE_SECRET,
            },
        )
        built.append(server)
        return server

    yield factory
    for server in built:
        server.close()


async def test_an_approval_spent_on_one_replica_is_spent_on_every_replica(
    replicas: Builder, workspace: Path
) -> None:
    a, b = replicas(1), replicas(2)
    args = write_args("k-spend")
    token = mint(a, args)
    first = await call(a, WRITE, {**args, "approval_token": token})
    assert first["isError"] is False, first
    before = snapshot(workspace)
    # Another key, so the idempotency record cannot be what stops it: the nonce does.
    again = await call(b, WRITE, {**write_args("k-other"), "approval_token": token})
    assert envelope(again)["code"] in {"APPROVAL_REPLAYED", "APPROVAL_INVALID"}
    assert snapshot(workspace) == before


async def test_fifty_concurrent_uses_of_one_token_across_replicas_accept_exactly_one(
    replicas: Builder, workspace: Path
) -> None:
    servers = [replicas(n) for n in range(3)]
    args = write_args("k-race", path="scratch/race.txt")
    token = mint(servers[0], args)

    async def attempt(n: int) -> dict[str, Any]:
        return await call(
            servers[n % 3],
            WRITE,
            {**args, "idempotency_key": f"race-{n}", "approval_token": token},
        )

    results = await asyncio.gather(*(attempt(n) for n in range(50)))
    accepted = [r for r in results if r["isError"] is False]
    assert len(accepted) == 1
    codes = {envelope(r)["code"] for r in results if r["isError"]}
    assert codes <= {"APPROVAL_REPLAYED", "APPROVAL_INVALID"}, codes


async def test_the_inbox_is_the_fleet_s_and_an_approved_request_runs_once_across_it(
    replicas: Builder, workspace: Path
) -> None:
    servers = [replicas(n) for n in range(3)]
    args = write_args("k-inbox", path="scratch/inbox.txt")
    opened = await call(servers[0], WRITE, args)
    assert envelope(opened)["code"] == "APPROVAL_REQUIRED"
    request_id = opened["_meta"]["nexus.mcp/approval_request_id"]
    # Another replica finds the same request, and decides it on the shared store.
    again = await call(servers[1], WRITE, {**args, "idempotency_key": "k-inbox-2"})
    assert again["_meta"]["nexus.mcp/approval_request_id"] == request_id
    store = servers[2].runtime.state.approval_requests
    assert [r.id for r in store.pending()] == [request_id]
    store.decide(request_id, approve=True, approver="bob-approver")

    async def attempt(n: int) -> dict[str, Any]:
        return await call(servers[n % 3], WRITE, {**args, "idempotency_key": f"inbox-{n}"})

    results = await asyncio.gather(*(attempt(n) for n in range(30)))
    accepted = [r for r in results if r["isError"] is False]
    assert len(accepted) == 1
    assert (workspace / "scratch/inbox.txt").read_text() == CONTENT
    assert {envelope(r)["code"] for r in results if r["isError"]} == {"APPROVAL_REQUIRED"}


async def test_the_console_is_the_fleet_s_a_link_is_spent_once_and_a_session_works_anywhere(
    replicas: Builder, workspace: Path
) -> None:
    http = {
        "transport": "http",
        "auth": {"jwt_secret": CONSOLE_SECRET[::-1], "audience": "nexus-shared"},
        "console": {"secret": {"env": "CS"}},
    }
    agents = replicas(0)
    consoles = [replicas(n, **http) for n in (1, 2)]
    args = write_args("k-console", path="scratch/console.txt")
    request_id = (await call(agents, WRITE, args))["_meta"]["nexus.mcp/approval_request_id"]
    keys = ConsoleKeys(
        load_console_key(consoles[0].runtime.settings, {"CS": CONSOLE_SECRET}),
        session_ttl_seconds=600,
    )
    link = keys.mint_link(subject="bob-approver", role="admin")
    origin = {"Origin": "http://testserver"}
    apps = [
        httpx.ASGITransport(app=c.mcp.http_app(**http_options(c.runtime.settings)))
        for c in consoles
    ]
    async with (
        httpx.AsyncClient(transport=apps[0], base_url="http://testserver") as first,
        httpx.AsyncClient(transport=apps[1], base_url="http://testserver") as second,
    ):
        signed = await first.post("/console/login", data={"t": link}, headers=origin)
        assert signed.status_code == 303
        # The same link on the other replica: spent already (the nonce store is shared).
        assert (
            await second.post("/console/login", data={"t": link}, headers=origin)
        ).status_code == 403
        # The session signed by one replica is good on the other (one console.secret).
        second.cookies = first.cookies
        page = await second.get(f"/console/inbox/{request_id}")
        assert page.status_code == 200 and "scratch/console.txt" in page.text
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        decided = await second.post(
            f"/console/inbox/{request_id}",
            data={"decision": "approve", "csrf": csrf},
            headers=origin,
        )
        assert decided.status_code == 303
    ran = await call(agents, WRITE, args)
    assert ran["isError"] is False
    assert (workspace / "scratch/console.txt").read_text() == CONTENT


async def test_an_idempotent_write_runs_once_and_replays_on_another_replica(
    replicas: Builder, workspace: Path
) -> None:
    a, b = replicas(1), replicas(2)
    args = write_args("k-idem", path="scratch/idem.txt")
    first = await call(a, WRITE, {**args, "approval_token": mint(a, args)})
    assert first["isError"] is False, first
    (workspace / "scratch/idem.txt").write_text("changed by someone else\n")
    retry = await call(b, WRITE, {**args, "approval_token": mint(b, args)})
    assert retry["isError"] is False, retry
    assert retry.get("structuredContent") == first.get("structuredContent")
    # Replayed from the shared record: the file was not written again.
    assert (workspace / "scratch/idem.txt").read_text() == "changed by someone else\n"


async def test_the_rate_limit_is_counted_once_across_replicas(replicas: Builder) -> None:
    settings = {"budgets": {"rate_limit_calls": 4, "rate_limit_window_seconds": 60}}
    servers = [replicas(n, **settings) for n in range(2)]
    results = [await call(servers[n % 2], "nexus_list_files", {"path": "."}) for n in range(10)]
    ok = [r for r in results if r["isError"] is False]
    refused = [envelope(r)["code"] for r in results if r["isError"]]
    assert len(ok) == 4
    assert refused == ["RATE_LIMITED"] * 6


async def test_a_revoke_through_the_shared_store_reaches_the_other_replica_within_a_second(
    replicas: Builder,
) -> None:
    a, b = replicas(1), replicas(2)
    async with Client(b.mcp) as client:
        names = {t.name for t in await client.list_tools()}
    assert "nexus_list_files" in names
    # The operator takes the tool away from alice's profile through replica A's store.
    profile = a.runtime.access.select(a.runtime.identity.launch)  # type: ignore[arg-type]
    assert profile is not None
    a.runtime.grants.delete(
        [RelationTuple(f"profile:{profile}", PROFILE_RELATION, "/tools/nexus_list_files")],
        "default",
    )
    started = time.monotonic()
    while True:
        async with Client(b.mcp) as client:
            names = {t.name for t in await client.list_tools()}
        if "nexus_list_files" not in names:
            break
        assert time.monotonic() - started < 1.0, "revoke not enforced on B within 1 s"
        await asyncio.sleep(0.02)
    result = await call(b, "nexus_list_files", {"path": "."})
    assert result["isError"] is True


def test_a_replica_refuses_to_start_on_an_unmigrated_database(
    tmp_path: Path, workspace: Path, postgres_url: str, redis_url: str, state_prefix: str
) -> None:
    settings = Settings(
        mode="prod",
        subject="alice",
        role="editor",
        workspace=workspace,
        data_dir=tmp_path / "data",
        state={
            "backend": "shared",
            "postgres_url": {"env": "PG"},
            "redis_url": {"env": "RD"},
            "key_prefix": state_prefix,
            "request_state_keys": [{"env": "RSK"}],
        },
    )
    with pytest.raises(ConfigError, match="nexus-mcp state migrate"):
        build_server(
            settings,
            audit_sinks=[MemoryAuditSink()],
            env={"PG": postgres_url, "RD": redis_url, "RSK": STATE_KEY},
        )


async def test_redis_down_refuses_calls_as_unavailable_and_recovers_without_restart(
    replicas: Builder, private_redis: Any, workspace: Path
) -> None:
    server = replicas(1, redis=private_redis.url)
    ok = await call(server, "nexus_list_files", {"path": "."})
    assert ok["isError"] is False, ok
    private_redis.stop()
    before = snapshot(workspace)
    args = write_args("k-down", path="scratch/down.txt")
    for tool, arguments in (
        ("nexus_list_files", {"path": "."}),
        (WRITE, {**args, "approval_token": mint(server, args)}),
    ):
        refused = envelope(await call(server, tool, arguments))
        assert refused["code"] == "UNAVAILABLE"
        assert str(private_redis.port) not in refused["error"]
        assert "127.0.0.1" not in refused["error"]
    assert snapshot(workspace) == before
    private_redis.start()
    back = await call(server, "nexus_list_files", {"path": "."})
    assert back["isError"] is False, back
    written = await call(server, WRITE, {**args, "approval_token": mint(server, args)})
    assert written["isError"] is False, written


def test_every_replica_seals_request_state_with_the_configured_keys(replicas: Builder) -> None:
    """What one replica hands a client (FastMCP's sealed requestState), another opens:
    both hold the configured key, never a per-process one."""
    a, b = replicas(1), replicas(2)
    security_a = a.mcp._request_state_security
    security_b = b.mcp._request_state_security
    assert security_a is not None and security_b is not None
    sealed = security_a.codec.seal(b"elicitation round")
    assert security_b.codec.unseal(sealed) == b"elicitation round"
    outsider = RequestStateSecurity(keys=[b"x" * 40], audience="nexus")
    with pytest.raises(Exception):  # noqa: B017 - the codec's own refusal type
        outsider.codec.unseal(sealed)


async def test_postgres_down_refuses_calls_as_unavailable_not_as_unknown_tools(
    private_postgres: Any, replicas: Builder
) -> None:
    """With the grants store down, the visible tools cannot be known: a call is refused
    with the typed, retryable UNAVAILABLE (never answered as if the tool did not exist, and
    never run), a listing shows nothing; both recover when PostgreSQL is back."""
    pool = PostgresPool(private_postgres.url, pool_size=1)
    try:
        migrate(pool)
    finally:
        pool.close()
    server = replicas(1, postgres=private_postgres.url)
    assert (await call(server, "nexus_list_files", {"path": "."}))["isError"] is False
    private_postgres.stop()
    server.runtime.access.forget()  # as the cache's refresh would, a moment later
    refused = envelope(await call(server, "nexus_list_files", {"path": "."}))
    assert refused == {
        "error": "the grants store is unavailable; retry later",
        "code": "UNAVAILABLE",
    }
    async with Client(server.mcp) as client:
        assert await client.list_tools() == []
    private_postgres.start()
    deadline = time.monotonic() + 10
    while True:
        server.runtime.access.forget()
        result = await call(server, "nexus_list_files", {"path": "."})
        if result["isError"] is False:
            break
        assert time.monotonic() < deadline, result
        await asyncio.sleep(0.2)
