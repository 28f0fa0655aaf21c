"""nexus-mcp as an OAuth 2.1 resource server (issue 25), over a real socket.

Tokens here are HS256 (the shared-secret form scripts use) so that every claim can be set
by hand; the same checks against a real OpenID provider's RS256 tokens, and the clients'
own sign-in, are in ``test_oauth_provider.py``. What is pinned here:

- RFC 9728 metadata at both well-known paths, and the 401 challenge that points to it;
- a token must be for this resource (``aud`` is the resource URL) and from the configured
  authorization server (``iss``): others are refused with 401 ``invalid_token``;
- claims to principal: groups map to roles; an unknown group gets nothing;
- a granted tool the token's scopes do not cover answers 403 ``insufficient_scope`` with
  the scope to ask for; a tool the profile does not grant stays hidden (no challenge).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.settings import Settings
from tests.support.tokens import FromNow, claims_json, hs256

from .access_helpers import serve_settings
from .servers import free_port

pytestmark = pytest.mark.slow

SECRET = "oauth-resource-secret-0123456789abcdef-0123"
ISSUER = "https://idp.example.test/realms/eng"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
CLAIMS = {
    "subject": "email",
    "rules": [
        {"group": "nexus-admins", "role": "admin"},
        {"group": "engineering", "role": "editor"},
        {"email": "*@readers.example.test", "role": "viewer", "read_only": True},
    ],
}


@asynccontextmanager
async def served(settings: Settings, audit: MemoryAuditSink | None = None) -> AsyncIterator[str]:
    """``settings`` served on a real socket at ``settings.port``; yields the base URL."""
    sink = audit if audit is not None else MemoryAuditSink()
    async with serve_settings(settings, sink) as (_, url):
        yield url.removesuffix(settings.http_path)


@asynccontextmanager
async def oauth_nexus(
    tmp_path: Path, audit: MemoryAuditSink | None = None, **auth: Any
) -> AsyncIterator[str]:
    """A prod server on a real socket whose resource URL is its own address."""
    port = free_port()
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    (workspace / "hello.txt").write_text("hello")
    settings = Settings(
        mode="prod",
        transport="http",
        port=port,
        workspace=workspace,
        data_dir=tmp_path / "data",
        auth={
            "jwt_secret": SECRET,
            "base_url": f"http://127.0.0.1:{port}",
            "authorization_servers": [ISSUER],
            "claims": CLAIMS,
            **auth,
        },
    )
    async with served(settings, audit) as base:
        yield base


def token(base: str, **claims: Any) -> str:
    values: dict[str, Any] = {
        "iss": ISSUER,
        "sub": "u-1",
        "email": "ada@eng.example.test",
        "groups": ["engineering"],
        "aud": f"{base}/mcp",
        "exp": FromNow(300),
        "iat": FromNow(0),
        "scope": "files:read",
    }
    values.update(claims)
    return hs256(claims_json({k: v for k, v in values.items() if v is not None}), SECRET)


def rpc(method: str, params: dict[str, Any] | None = None, request_id: int = 1) -> str:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
    )


INIT = rpc(
    "initialize",
    {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
)


async def session(client: httpx.AsyncClient, url: str, bearer: str) -> dict[str, str]:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {bearer}"}
    response = await client.post(url, content=INIT, headers=headers)
    assert response.status_code == 200, response.text
    sid = response.headers.get("mcp-session-id")
    if sid:
        headers["Mcp-Session-Id"] = sid
    headers["MCP-Protocol-Version"] = "2025-11-25"
    await client.post(
        url,
        content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        headers=headers,
    )
    return headers


def result_of(response: httpx.Response) -> dict[str, Any]:
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        text = data[-1]
    return json.loads(text)


async def tool_names(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> set[str]:
    response = await client.post(url, content=rpc("tools/list", request_id=2), headers=headers)
    assert response.status_code == 200
    return {t["name"] for t in result_of(response)["result"]["tools"]}


async def test_metadata_is_served_at_both_well_known_paths(tmp_path: Path) -> None:
    async with (
        oauth_nexus(tmp_path, tool_scopes={"nexus_write_file": ["files:write"]}) as base,
        httpx.AsyncClient() as client,
    ):
        for path in (
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-protected-resource",
        ):
            response = await client.get(base + path)
            assert response.status_code == 200, path
            document = response.json()
            assert document["resource"] == f"{base}/mcp"
            assert document["authorization_servers"] == [ISSUER]
            assert document["bearer_methods_supported"] == ["header"]
            assert "files:write" in document["scopes_supported"]


async def test_a_missing_token_is_challenged_with_the_metadata_url(tmp_path: Path) -> None:
    async with oauth_nexus(tmp_path) as base, httpx.AsyncClient() as client:
        response = await client.post(f"{base}/mcp", content=INIT, headers=MCP_HEADERS)
        assert response.status_code == 401
        challenge = response.headers["www-authenticate"]
        assert challenge.startswith("Bearer ")
        assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"' in challenge
        assert "error=" not in challenge  # RFC 6750 3.1: no error without credentials


@pytest.mark.parametrize(
    "claims",
    [
        pytest.param({"aud": "https://other.example.test/mcp"}, id="token-for-another-resource"),
        pytest.param({"aud": "nexus-mcp"}, id="legacy-audience"),
        pytest.param({"aud": None}, id="no-audience"),
        pytest.param({"iss": "https://rogue.example.test"}, id="another-issuer"),
        pytest.param({"iss": None}, id="no-issuer"),
        pytest.param({"exp": FromNow(-120)}, id="expired"),
        pytest.param({"nbf": FromNow(3600)}, id="not-yet-valid"),
    ],
)
async def test_tokens_not_for_this_resource_are_refused(
    tmp_path: Path, claims: dict[str, Any]
) -> None:
    async with oauth_nexus(tmp_path) as base, httpx.AsyncClient() as client:
        bad = token(base, **claims)
        response = await client.post(
            f"{base}/mcp", content=INIT, headers={**MCP_HEADERS, "Authorization": f"Bearer {bad}"}
        )
        assert response.status_code == 401
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
        assert "resource_metadata=" in response.headers["www-authenticate"]
        assert bad not in response.text and "other.example" not in response.text


async def test_alg_none_is_refused(tmp_path: Path) -> None:
    import base64

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    async with oauth_nexus(tmp_path) as base, httpx.AsyncClient() as client:
        claims = {
            "iss": ISSUER,
            "sub": "u",
            "email": "a@eng.example.test",
            "groups": ["nexus-admins"],
            "aud": f"{base}/mcp",
            "exp": int(time.time()) + 300,
        }
        for alg in ("none", "None", "NONE"):
            unsigned = f"{part({'alg': alg, 'typ': 'JWT'})}.{part(claims)}."
            response = await client.post(
                f"{base}/mcp",
                content=INIT,
                headers={**MCP_HEADERS, "Authorization": f"Bearer {unsigned}"},
            )
            assert response.status_code == 401, alg


async def test_groups_map_to_roles_and_an_unknown_group_gets_nothing(tmp_path: Path) -> None:
    async with oauth_nexus(tmp_path) as base, httpx.AsyncClient() as client:
        url = f"{base}/mcp"
        editor = await session(client, url, token(base))
        assert "nexus_write_file" in await tool_names(client, url, editor)
        admin = await session(client, url, token(base, groups=["nexus-admins", "engineering"]))
        assert "nexus_write_file" in await tool_names(client, url, admin)
        reader = await session(client, url, token(base, email="bo@readers.example.test", groups=[]))
        names = await tool_names(client, url, reader)
        assert "nexus_read_file" in names and "nexus_write_file" not in names
        for groups in (["contractors"], [], "engineering-x", None):
            stranger = await session(client, url, token(base, groups=groups))
            assert await tool_names(client, url, stranger) == set(), groups
        # A group claim of another type, or an unverified email, never matches a rule.
        unverified = await session(
            client,
            url,
            token(base, email="bo@readers.example.test", email_verified=False, groups=[]),
        )
        assert await tool_names(client, url, unverified) == set()


async def test_a_granted_tool_without_its_scope_is_challenged(tmp_path: Path) -> None:
    audit = MemoryAuditSink()
    async with (
        oauth_nexus(tmp_path, audit, tool_scopes={"nexus_write_file": ["files:write"]}) as base,
        httpx.AsyncClient() as client,
    ):
        url = f"{base}/mcp"
        editor = await session(client, url, token(base))
        assert "nexus_write_file" not in await tool_names(client, url, editor)
        call = rpc(
            "tools/call",
            {"name": "nexus_write_file", "arguments": {"path": "x.txt", "content": "y"}},
            request_id=3,
        )
        response = await client.post(url, content=call, headers=editor)
        assert response.status_code == 403
        challenge = response.headers["www-authenticate"]
        assert 'error="insufficient_scope"' in challenge
        assert 'scope="files:write"' in challenge
        assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"' in challenge
        assert "x.txt" not in response.text
        # Audited as the refusal it is, without the arguments.
        [blocked] = [r for r in audit.records() if r.get("outcome") == "INSUFFICIENT_SCOPE"]
        assert blocked["event"] == "tool_call_blocked" and blocked["tool"] == "nexus_write_file"
        assert blocked["subject"] == "ada@eng.example.test" and blocked["role"] == "editor"
        assert "x.txt" not in json.dumps(blocked)
        # With the scope the same call runs.
        scoped = await session(client, url, token(base, scope="files:read files:write"))
        assert "nexus_write_file" in await tool_names(client, url, scoped)
        response = await client.post(url, content=call, headers=scoped)
        assert response.status_code == 200
        # Past the scope, into the write path (which then asks for its idempotency key).
        assert "IDEMPOTENCY_KEY_REQUIRED" in response.text


async def test_a_tool_the_profile_does_not_grant_is_never_challenged(tmp_path: Path) -> None:
    async with (
        oauth_nexus(
            tmp_path, tool_scopes={"nexus_write_file": ["files:write"], "nexus_*": ["files:read"]}
        ) as base,
        httpx.AsyncClient() as client,
    ):
        url = f"{base}/mcp"
        reader = await session(client, url, token(base, email="bo@readers.example.test", groups=[]))
        call = rpc(
            "tools/call",
            {"name": "nexus_write_file", "arguments": {"path": "x.txt", "content": "y"}},
            request_id=3,
        )
        response = await client.post(url, content=call, headers=reader)
        # Hidden, as any tool the caller may not see: the chain's unknown-tool answer.
        assert response.status_code == 200
        answer = result_of(response)
        assert "insufficient" not in json.dumps(answer)
        assert not (tmp_path / "ws" / "x.txt").exists()
        # A pattern applies to every tool it matches: a token without files:read is
        # challenged for a granted read tool.
        bare = await session(client, url, token(base, scope=""))
        read = rpc("tools/call", {"name": "nexus_read_file", "arguments": {"path": "hello.txt"}})
        response = await client.post(url, content=read, headers=bare)
        assert response.status_code == 403
        assert 'scope="files:read"' in response.headers["www-authenticate"]
