"""Attacks on the OAuth sign-in (issue 25) that found defects, over real sockets.

- ``auth.required_scopes`` are "scopes every request needs", but the plain HTTP routes
  (``POST /approvals/mint``) verified the bearer token themselves and never asked for
  them: an approver's token without the required scope minted approval tokens that the
  MCP endpoint would have answered 403 for.
- The front door's IdP callback answered a request carrying ``error`` and
  ``error_description`` (no valid state needed) with an HTML page quoting both: any
  text an attacker puts in a link shown on this server's own origin (content spoofing),
  against the rule that errors never echo input.
- Signing in at a provider without ``auth.claims`` made every user the provider knows a
  viewer (the fallback role of a token without our ``role`` claim) who could read the
  workspace.
- In prod the front door took a provider whose discovery document names a plain-http
  key set or token endpoint (the resource server's discovery refused the first).

Guards that held (kept as regression tests): a tool call whose scope the token lacks does
not run whatever the body's shape (batch, name variants, duplicate JSON keys); the issuer
is compared exactly against the configured authorization servers (a trailing slash, case,
a dot segment, a parent path or no ``iss`` at all are refused).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings
from tests.support.oidc import OidcProvider

from .test_oauth_front_door import nexus, nexus_port, oidc  # noqa: F401 - fixtures
from .test_oauth_hostile import Provider, provider  # noqa: F401 - a fixture
from .test_oauth_resource import INIT, ISSUER, MCP_HEADERS, oauth_nexus, session, token

pytestmark = pytest.mark.slow

APPROVAL_SECRET = "attack-approval-secret-0123456789abcdef-CANARY"
ADMINS = {
    "subject": "email",
    "rules": [{"group": "nexus-admins", "role": "admin"}],
}
MINT = {"tool": "nexus_write_file", "arguments": {"path": "a.txt", "content": "x"}}


async def test_the_mint_route_asks_for_the_required_scopes_as_the_mcp_endpoint_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_MCP_APPROVAL_SECRET", APPROVAL_SECRET)
    async with oauth_nexus(tmp_path, required_scopes=["nexus:use"], claims=ADMINS) as base:
        lacking = token(base, groups=["nexus-admins"], scope="files:read")
        holding = token(base, groups=["nexus-admins"], scope="files:read nexus:use")
        async with httpx.AsyncClient() as client:
            # The MCP endpoint refuses the token without the required scope ...
            mcp = await client.post(
                f"{base}/mcp",
                content=INIT,
                headers={**MCP_HEADERS, "Authorization": f"Bearer {lacking}"},
            )
            assert mcp.status_code == 403
            # ... and so does the plain route: no approval token for it.
            refused = await client.post(
                f"{base}/approvals/mint",
                json=MINT,
                headers={"Authorization": f"Bearer {lacking}"},
            )
            assert refused.status_code in (401, 403), refused.text
            assert "approval_token" not in refused.text
            # The same caller with the scope mints (the route works).
            minted = await client.post(
                f"{base}/approvals/mint",
                json=MINT,
                headers={"Authorization": f"Bearer {holding}"},
            )
            assert minted.status_code == 200, minted.text
            assert "approval_token" in minted.json()


CANARY = "Your account is locked call 555-0100 CANARY"


@pytest.mark.parametrize("state", [None, "made-up-transaction"])
def test_the_idp_callback_error_page_quotes_nothing_of_the_request(
    nexus: str,  # noqa: F811 - the fixture
    oidc: OidcProvider,  # noqa: F811 - the fixture
    state: str | None,
) -> None:
    params = {"error": "access_denied<b>CANARY</b>", "error_description": CANARY}
    if state is not None:
        params["state"] = state
    response = httpx.get(f"{nexus}/auth/callback", params=params)
    assert response.status_code == 400
    assert "CANARY" not in response.text
    assert "555-0100" not in response.text
    assert "made-up-transaction" not in response.text


def _call(name: str, request_id: int = 3) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": {"path": "hello.txt"}},
    }


SMUGGLED = {
    "batch": json.dumps([_call("nexus_read_file")]),
    "batch-of-two": json.dumps([_call("nexus_list_files", 4), _call("nexus_read_file")]),
    "upper-case": json.dumps(_call("NEXUS_READ_FILE")),
    "fullwidth": json.dumps(_call("nexus_read_\uff46ile")),
    "trailing-space": json.dumps(_call("nexus_read_file ")),
    # Duplicate keys: the challenge and the handler must not read different names.
    "duplicate-name": (
        '{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": '
        '{"name": "nexus_list_files", "arguments": {"path": "hello.txt"}, '
        '"name": "nexus_read_file"}}'
    ),
    "duplicate-params": (
        '{"jsonrpc": "2.0", "id": 3, "method": "tools/call", '
        '"params": {"name": "nexus_list_files", "arguments": {}}, '
        '"params": {"name": "nexus_read_file", "arguments": {"path": "hello.txt"}}}'
    ),
}


@pytest.mark.parametrize("shape", sorted(SMUGGLED))
async def test_a_tool_call_past_the_scope_check_never_runs(tmp_path: Path, shape: str) -> None:
    """Whatever shape the body takes, a tool whose scope the token lacks does not run:
    either the 403 challenge or the chain's unknown-tool answer, never the file."""
    async with (
        oauth_nexus(tmp_path, tool_scopes={"nexus_read_file": ["files:secret"]}) as base,
        httpx.AsyncClient() as client,
    ):
        url = f"{base}/mcp"
        headers = await session(client, url, token(base))
        response = await client.post(url, content=SMUGGLED[shape], headers=headers)
        if shape == "upper-case":
            # The check can fail: with the scope, the file is read.
            scoped = await session(client, url, token(base, scope="files:read files:secret"))
            read = await client.post(
                url, content=json.dumps(_call("nexus_read_file")), headers=scoped
            )
            assert "hello" in read.text.replace("hello.txt", "")
        assert "hello" not in response.text.replace("hello.txt", "")
        if response.status_code == 403:
            assert 'scope="files:secret"' in response.headers["www-authenticate"]


async def test_without_a_claims_mapping_a_providers_user_is_not_viewer_by_accident(
    tmp_path: Path,
) -> None:
    """The team's provider signs in everyone it knows; without ``auth.claims`` its tokens
    (no ``role`` claim: no provider sends ours) made every such user a viewer who could
    read the workspace. Now start-up asks for the mapping; ``default_role`` is the way to
    let everyone in, and says so."""
    with pytest.raises(ValidationError, match="needs 'claims'"):
        async with oauth_nexus(tmp_path, claims=None):
            pass
    everyone = {"default_role": "viewer"}
    async with oauth_nexus(tmp_path, claims=everyone) as base, httpx.AsyncClient() as client:
        url = f"{base}/mcp"
        anyone = token(base, sub="someone-new", groups=[], email=None)
        headers = await session(client, url, anyone)
        read = json.dumps(_call("nexus_read_file"))
        response = await client.post(url, content=read, headers=headers)
        assert "hello" in response.text.replace("hello.txt", "")


@pytest.mark.parametrize("field", ["jwks_uri", "token_endpoint"])
def test_the_front_doors_discovered_endpoints_are_https_in_prod(
    tmp_path: Path,
    provider: Provider,  # noqa: F811 - the fixture
    field: str,
) -> None:
    """As for the resource server's discovery: a provider document (itself over https, or
    loopback here) naming a plain-http key set or token endpoint is refused in prod."""
    provider.metadata = {
        "issuer": provider.issuer,
        "jwks_uri": provider.issuer + "/jwks",
        "authorization_endpoint": provider.issuer + "/authorize",
        "token_endpoint": provider.issuer + "/token",
        "response_types_supported": ["code"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
        field: "http://idp.invalid/" + field,
    }
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=tmp_path / "data",
        auth={
            "base_url": "http://127.0.0.1:8765",
            "oidc_proxy": {
                "issuer": provider.issuer,
                "client_id": "nexus",
                "client_secret": "front-door-client-secret",
                "signing_key": "front-door-signing-key-0123456789abcdef",
            },
            "claims": {"default_role": "viewer"},
        },
    )
    with pytest.raises(ConfigError, match="https://"):
        build_server(settings, audit_sinks=[MemoryAuditSink()], env={})


async def test_the_issuer_is_compared_exactly_and_only_the_configured_ones_pass(
    tmp_path: Path,
) -> None:
    other = "https://idp.example.test/realms/ops"
    async with (
        oauth_nexus(tmp_path, authorization_servers=[ISSUER, other]) as base,
        httpx.AsyncClient() as client,
    ):
        url = f"{base}/mcp"

        async def status(bearer: str) -> int:
            headers = {**MCP_HEADERS, "Authorization": f"Bearer {bearer}"}
            return (await client.post(url, content=INIT, headers=headers)).status_code

        assert await status(token(base)) == 200
        assert await status(token(base, iss=other)) == 200
        for iss in (
            ISSUER + "/",
            ISSUER.upper(),
            "https://idp.example.test/realms/eng/../eng",
            "https://idp.example.test/realms",
            None,
        ):
            assert await status(token(base, iss=iss)) == 401, iss
