"""A real socket: ``nexus-mcp serve --transport http`` with bearer tokens, via the mcp SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from .servers import free_port, http_server

pytestmark = pytest.mark.slow

SECRET = "test-secret-0123456789abcdef-0123456789"
AUDIENCE = "nexus-test"
OPERATOR_TOKEN = "operator-token-for-the-http-tests-0123456789"


def token(**overrides: Any) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": "carol",
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 300,
        "role": "editor",
    }
    claims.update(overrides)
    secret = claims.pop("_secret", SECRET)
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, secret, algorithm="HS256")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workspace = tmp_path_factory.mktemp("ws")
    (workspace / "hello.txt").write_text("hello over http")
    port = free_port()
    env = {
        "NEXUS_MCP_MODE": "prod",
        "NEXUS_MCP_AUTH__JWT_SECRET": SECRET,
        "NEXUS_MCP_AUTH__AUDIENCE": AUDIENCE,
        "NEXUS_MCP_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "NEXUS_MCP_HEALTH__BEARER_TOKEN": '{"env": "NEXUS_TEST_OPERATOR_TOKEN"}',
        "NEXUS_TEST_OPERATOR_TOKEN": OPERATOR_TOKEN,
    }
    with http_server(["--workspace", str(workspace)], env, port=port):
        yield f"http://127.0.0.1:{port}"


async def list_and_read(url: str, bearer: str) -> tuple[set[str], Any]:
    headers = {"Authorization": f"Bearer {bearer}"}
    async with httpx2.AsyncClient(headers=headers, timeout=10) as http:
        async with streamable_http_client(f"{url}/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                names = {t.name for t in (await session.list_tools()).tools}
                result = await session.call_tool("nexus_read_file", {"path": "hello.txt"})
    return names, result


async def test_valid_token_lists_and_calls(server_url: str) -> None:
    names, result = await list_and_read(server_url, token())
    assert "nexus_read_file" in names
    assert result.is_error is False
    assert result.structured_content["content"] == "hello over http"


async def test_read_only_claim_hides_write_tools(server_url: str) -> None:
    names, _ = await list_and_read(server_url, token(read_only=True))
    assert "nexus_read_file" in names and "nexus_write_file" not in names


def initialize_body() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}},
    }  # fmt: skip


@pytest.mark.parametrize(
    "bearer",
    [
        None,
        "not-a-jwt",
        token(aud="someone-else"),
        token(exp=int(time.time()) - 3600, iat=int(time.time()) - 7200),
        token(_secret="another-secret-0123456789abcdef-xyz"),
    ],
    ids=["missing", "garbage", "wrong-audience", "expired", "wrong-key"],
)
def test_bad_tokens_get_401_from_the_transport(server_url: str, bearer: str | None) -> None:
    headers = {"Accept": "application/json, text/event-stream"}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    response = httpx.post(f"{server_url}/mcp", json=initialize_body(), headers=headers, timeout=10)
    assert response.status_code == 401
    if bearer is not None:
        assert bearer not in response.text


def test_foreign_host_header_is_refused(server_url: str) -> None:
    headers = {"Authorization": f"Bearer {token()}", "Host": "evil.example:80",
               "Accept": "application/json, text/event-stream"}  # fmt: skip
    response = httpx.post(f"{server_url}/mcp", json=initialize_body(), headers=headers, timeout=10)
    assert response.status_code == 421


def test_oversized_request_bodies_are_refused(server_url: str) -> None:
    headers = {"Authorization": f"Bearer {token()}", "Content-Type": "application/json"}
    response = httpx.post(
        f"{server_url}/mcp", content=b"x" * (64 * 1024 * 1024 + 1), headers=headers, timeout=30
    )
    assert response.status_code == 413


def test_health_and_readiness(server_url: str) -> None:
    assert httpx.get(f"{server_url}/healthz", timeout=5).json() == {"status": "ok"}
    operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    ready = httpx.get(f"{server_url}/readyz", headers=operator, timeout=5).json()
    assert ready["status"] == "ready" and ready["mode"] == "prod"


def test_readiness_detail_is_the_operators_alone(server_url: str) -> None:
    anyone = httpx.get(f"{server_url}/readyz", timeout=5)
    assert anyone.json() == {
        "status": "ready",
        "components": {"server": "ready", "state_store": "ready"},
    }
    assert anyone.headers["cache-control"] == "no-store"
    # A caller's own valid token is no operator's.
    caller = {"Authorization": f"Bearer {token(role='admin')}"}
    refused = httpx.get(f"{server_url}/readyz", headers=caller, timeout=5)
    assert refused.status_code == 401
    assert refused.json() == {"error": "authentication required"}


def test_prod_http_without_token_verification_refuses_to_start(tmp_path: Path) -> None:
    import subprocess

    from .servers import serve_command, server_env

    done = subprocess.run(
        serve_command("--transport", "http", "--mode", "prod", "--workspace", str(tmp_path)),
        env=server_env(), capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert b"NEXUS_MCP_AUTH__JWT_SECRET" in done.stderr
    assert b"Traceback" not in done.stderr


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_stateless_http_serves_every_call_without_a_session(
    tmp_path: Path, mode: str
) -> None:
    """--stateless-http: replicas behind a load balancer keep no per-connection session."""
    from fastmcp import Client

    from nexus_mcp.server import build_server
    from nexus_mcp.settings import Settings
    from nexus_mcp.transport.serve import http_options
    from tests.support.loopback import serve_in_thread

    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "hello.txt").write_text("stateless")
    settings = Settings(
        mode="prod", transport="http", stateless_http=True, workspace=tmp_path / "ws",
        data_dir=tmp_path / "data", auth={"jwt_secret": SECRET, "audience": AUDIENCE},
    )  # fmt: skip
    server = build_server(settings, audit_sinks=[])
    app = server.mcp.http_app(**http_options(settings))
    try:
        with serve_in_thread(app, lifespan="on") as base_url:
            async with Client(f"{base_url}/mcp", auth=token(), mode=mode) as client:
                first = await client.call_tool("nexus_read_file", {"path": "hello.txt"})
                second = await client.call_tool("nexus_read_file", {"path": "hello.txt"})
    finally:
        server.close()
    assert first.structured_content == second.structured_content
    assert first.structured_content is not None
    assert first.structured_content["content"] == "stateless"
