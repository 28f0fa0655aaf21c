"""Helpers for the namespace and discovery e2e tests: tokens, an in-process HTTP server,
and the expected tool sets computed from the YAML and registry files without the server."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import jwt
import uvicorn
import yaml
from fastmcp import Client

from nexus_mcp import cli
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings
from nexus_mcp.transport.serve import http_options

from .conftest import REPO_ROOT

SECRET = "namespace-e2e-secret-0123456789abcdef"
AUDIENCE = "nexus-namespace-e2e"
PROFILES_FILE = REPO_ROOT / "config" / "tool_profiles.yaml"
REGISTRY_FILE = REPO_ROOT / "schemas" / "mcp" / "registries" / "nexus.json"
MISSING_TOOL = "nexus_frobnicate"  # never registered anywhere
TTL_SECONDS = 0.5  # visible-tools cache TTL for tests that watch a change arrive

T = TypeVar("T")
# Plain http, but each client would otherwise load the CA bundle (~0.1 s of CPU) again.
TLS = ssl.create_default_context()


def token(sub: str, **claims: Any) -> str:
    now = int(time.time())
    body: dict[str, Any] = {"sub": sub, "aud": AUDIENCE, "iat": now, "exp": now + 600}
    body.update({k: v for k, v in claims.items() if v is not None})
    return jwt.encode(body, SECRET, algorithm="HS256")


def resolved_profiles(
    path: Path = PROFILES_FILE, *, with_repos: bool = False
) -> dict[str, frozenset[str]]:
    """Every profile's tools with ``extends`` resolved here, from plain YAML.

    Without ``with_repos``, as a server without a ``repos:`` section mounts them: the
    ``repo`` profile's own tools (the repo toolset) are left out of every profile.
    """
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))["profiles"]
    unmounted = frozenset() if with_repos else frozenset(raw.get("repo", {}).get("tools") or [])

    def tools(name: str, seen: tuple[str, ...] = ()) -> frozenset[str]:
        assert name not in seen, f"cycle through {name}"
        body = raw[name]
        own = frozenset(body.get("tools") or [])
        parent = body.get("extends")
        return own | tools(parent, (*seen, name)) if parent else own

    return {name: tools(name) - unmounted for name in raw}


def role_profiles(path: Path = PROFILES_FILE) -> dict[str, str]:
    return dict(yaml.safe_load(path.read_text(encoding="utf-8"))["roles"])


def registry_write_tools() -> frozenset[str]:
    """Write-class tools according to the registry file (not the server's contracts)."""
    tools = json.loads(REGISTRY_FILE.read_text(encoding="utf-8"))["tools"]
    return frozenset(t["tool_name"] for t in tools if t["tool_class"] == "write")


def registered(server: NexusServer) -> frozenset[str]:
    return frozenset(server.runtime.book.contracts)


def grants_db(server: NexusServer) -> Path:
    return server.runtime.grants.path


def run_cli(*argv: str) -> None:
    """``nexus-mcp <argv>``: the operator's command, another writer on the grants file."""
    assert cli.main(list(argv)) == 0


async def tool_names(client: Client[Any]) -> frozenset[str]:
    return frozenset(t.name for t in await client.list_tools())


def http_client(url: str, bearer: str, *, mode: str = "auto") -> Client[Any]:
    return Client(url, auth=bearer, mode=mode, verify=TLS)


async def list_as(url: str, bearer: str, *, mode: str = "auto") -> frozenset[str]:
    async with http_client(url, bearer, mode=mode) as client:
        return await tool_names(client)


async def poll(
    read: Callable[[], Awaitable[T]], done: Callable[[T], bool], *, timeout: float = 5.0
) -> tuple[T, float]:
    """Read until ``done`` (bounded); returns the last value and the seconds it took."""
    start = time.monotonic()
    while True:
        value = await read()
        elapsed = time.monotonic() - start
        if done(value) or elapsed > timeout:
            return value, elapsed
        await asyncio.sleep(0.05)


def json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def renamed(result: dict[str, Any], name: str, placeholder: str = "<tool>") -> dict[str, Any]:
    """The wire result with a tool name replaced, so hidden and missing can be compared."""
    loaded: dict[str, Any] = json.loads(json.dumps(result).replace(name, placeholder))
    return loaded


@contextmanager
def tuples_table_missing(db: Path) -> Iterator[None]:
    """A real store fault: another connection renames the grants table away, then back."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("ALTER TABLE tuples RENAME TO tuples_offline")
        try:
            yield
        finally:
            conn.execute("ALTER TABLE tuples_offline RENAME TO tuples")
    finally:
        conn.close()


@asynccontextmanager
async def http_nexus(
    workspace: Path, data_dir: Path, audit: MemoryAuditSink, **overrides: Any
) -> AsyncIterator[tuple[NexusServer, str]]:
    """A prod server with bearer-token auth on a real uvicorn socket in this process.

    The app is built with the same ``http_options`` as ``nexus-mcp serve``; uvicorn is shut
    down gracefully (not cancelled), so its listening socket is closed before we return.
    """
    values: dict[str, Any] = {
        "mode": "prod",
        "transport": "http",
        "workspace": workspace,
        "data_dir": data_dir,
        "auth": {"jwt_secret": SECRET, "audience": AUDIENCE},
        "profiles": {"cache_ttl_seconds": TTL_SECONDS},
        "port": 0,
    }
    values.update(overrides)
    async with serve_settings(Settings(**values), audit) as served:
        yield served


@asynccontextmanager
async def serve_settings(
    settings: Settings,
    audit: MemoryAuditSink,
    *,
    config_file: Path | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[tuple[NexusServer, str]]:
    """``settings`` built and served on a real uvicorn socket in this process (port 0: a
    free one); yields the server and its MCP URL. The app is built with the same
    ``http_options`` as ``nexus-mcp serve``; uvicorn is shut down gracefully (not
    cancelled), so its listening socket is closed before we return."""
    server = build_server(settings, audit_sinks=[audit], config_file=config_file, env=env)
    app = server.mcp.http_app(**http_options(server.runtime.settings))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=settings.port, log_config=None, log_level="warning"
    )
    http = uvicorn.Server(config)
    task = asyncio.create_task(http.serve())
    try:
        deadline = time.monotonic() + 10
        while not http.started:
            assert not task.done(), "uvicorn exited during start-up"
            assert time.monotonic() < deadline, "uvicorn did not start"
            await asyncio.sleep(0.01)
        port = http.servers[0].sockets[0].getsockname()[1]
        yield server, f"http://127.0.0.1:{port}{settings.http_path}"
    finally:
        http.should_exit = True
        await asyncio.wait_for(task, timeout=10)
        server.close()
