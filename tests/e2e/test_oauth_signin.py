"""Agents sign in to nexus-mcp with the team's identity provider (issue 25), end to end.

Everything is real: ``nexus-mcp serve`` over HTTP as a subprocess (a resource server with
``auth.base_url`` and ``auth.authorization_servers``), a real OpenID provider on a loopback
port (``oidc-provider``, tests/support/oidc.py), the official TypeScript SDK's own OAuth
flow (discovery from the 401, dynamic registration, PKCE, the resource indicator, the
token, the tool call), the MCP Inspector CLI with a token, and a scripted browser for the
login. The provider's claims reach the principal through ``auth.claims``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.oidc import (
    Browser,
    OidcProvider,
    client_credentials_token,
    code_flow_grant,
    oidc_provider_fixture,
    sdk_oauth_flow,
)

from .node_clients import InspectorTarget, find_node_clients, inspector_command, run_inspector
from .servers import http_server

pytestmark = pytest.mark.slow

CALLBACK = "http://127.0.0.1:1/callback"  # never requested: the browser stops at it
OTHER_RESOURCE = "https://other.example.test/mcp"
ACCOUNTS: dict[str, Any] = {
    "alice": {"password": "alice-pw", "email": "alice@example.test", "groups": ["engineering"]},
    "bob": {"password": "bob-pw", "email": "bob@example.test", "groups": ["readers"]},
    "mallory": {"password": "mallory-pw", "email": "m@example.test", "groups": ["contractors"]},
}


@pytest.fixture(scope="module")
def nexus_socket() -> Iterator[socket.socket]:
    """nexus-mcp's port, reserved first: the provider's resource table names its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


@pytest.fixture(scope="module")
def nexus_port(nexus_socket: socket.socket) -> int:
    return int(nexus_socket.getsockname()[1])


def provider_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    resource = f"http://127.0.0.1:{request.getfixturevalue('nexus_port')}/mcp"
    return {
        "accounts": ACCOUNTS,
        "clients": [
            {
                "client_id": "ci-bot",
                "client_secret": "ci-bot-secret-0123456789",
                "redirect_uris": [],
                "response_types": [],
                "grant_types": ["client_credentials"],
                "scope": "files:read files:write",
                "claims": {"groups": ["engineering"], "email": "bot@example.test"},
            },
            {
                "client_id": "static",
                "client_secret": "static-secret-0123456789",
                "redirect_uris": [CALLBACK],
                "grant_types": ["authorization_code", "refresh_token"],
                "scope": "openid email groups files:read files:write",
            },
            {
                # A public client the operator registered for every scope (no DCR).
                "client_id": "desktop",
                "redirect_uris": [CALLBACK],
                "grant_types": ["authorization_code"],
                "token_endpoint_auth_method": "none",
                "scope": "files:read files:write",
            },
        ],
        "resources": {
            resource: {"scope": "files:read files:write"},
            OTHER_RESOURCE: {"scope": "files:read files:write"},
        },
    }


oidc = oidc_provider_fixture(provider_config)
other_oidc = oidc_provider_fixture(provider_config)  # another issuer, another key set


@pytest.fixture(scope="module")
def nexus(
    oidc: OidcProvider,
    nexus_socket: socket.socket,
    nexus_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    port = nexus_port
    base = f"http://127.0.0.1:{port}"
    workspace = tmp_path_factory.mktemp("ws")
    (workspace / "hello.txt").write_text("hello from the workspace")
    config = tmp_path_factory.mktemp("cfg") / "nexus.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "mode": "prod",
                "auth": {
                    "base_url": base,
                    "authorization_servers": [oidc.issuer],
                    # Every token needs files:read: the 401 asks for it, so a client's
                    # first sign-in asks for no more; files:write comes by step-up.
                    "required_scopes": ["files:read"],
                    "tool_scopes": {"nexus_write_file": ["files:write"]},
                    "claims": {
                        "subject": "email",
                        "rules": [
                            {"group": "engineering", "role": "editor"},
                            {"group": "readers", "role": "viewer"},
                        ],
                    },
                },
            }
        )
    )
    nexus_socket.close()  # the server binds the port itself now
    environ = {
        "NEXUS_MCP_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "NEXUS_MCP_APPROVAL_SECRET": "signin-approval-secret-0123456789abcdef",
    }
    args = ["--config", str(config), "--workspace", str(workspace)]
    with http_server(args, environ, port=port):
        yield base


def sign_in_as(login: str) -> Any:
    def sign_in(authorize_url: str) -> str:
        browser = Browser()
        return browser.sign_in(
            authorize_url,
            login=login,
            password=ACCOUNTS[login]["password"],
            stop_at_prefix=CALLBACK,
        )

    return sign_in


def text_of(call: dict[str, Any]) -> str:
    assert "result" in call, call
    return "".join(part.get("text", "") for part in call["result"]["content"])


def test_the_typescript_sdk_signs_in_from_the_401_and_calls_a_tool(
    nexus: str, tmp_path: Path
) -> None:
    plan = {
        "url": f"{nexus}/mcp",
        "redirect_uri": CALLBACK,
        "calls": [{"name": "nexus_read_file", "arguments": {"path": "hello.txt"}}],
    }
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=sign_in_as("alice"))
    assert out["exit"] == 0, out
    assert "hello from the workspace" in text_of(out["calls"][0])
    assert "nexus_read_file" in out["tools"]
    # files:write was not asked for (the 401 challenge names files:read only): hidden.
    assert "nexus_write_file" not in out["tools"]
    assert out["authorizations"] == 1
    [params] = out["authorize_params"]
    assert params["resource"] == f"{nexus}/mcp"  # RFC 8707: a token for this server only
    assert params["code_challenge_method"] == "S256" and params["has_state"]
    assert out["registration"]["token_endpoint_auth_method"] == "none"  # registered by DCR
    assert out["tokens"]["token_type"].lower() == "bearer"


def test_the_sdk_steps_up_for_a_scope_a_tool_needs(nexus: str, tmp_path: Path) -> None:
    """The 403 names the scope; the client signs in again for it and the call goes through.

    The client is one the operator registered for both scopes: SDK 1.32.2 registers a
    dynamic client for the scope of the first challenge only (files:read), which the
    provider then holds it to, and it tries a refresh token first, which never widens a
    grant (RFC 6749 section 6).
    """
    plan = {
        "url": f"{nexus}/mcp",
        "redirect_uri": CALLBACK,
        # Registered for both scopes, signed in for files:read first (the 401's scope).
        "client_information": {"client_id": "desktop", "token_endpoint_auth_method": "none"},
        "calls": [
            {
                "name": "nexus_write_file",
                "arguments": {"path": "new.txt", "content": "x", "idempotency_key": "k-1"},
            }
        ],
    }
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=sign_in_as("alice"))
    assert out["exit"] == 0, out
    [call] = out["calls"]
    assert call.get("stepped_up") is True, call
    assert out["authorizations"] == 2
    assert out["authorize_params"][0]["scope"] == "files:read"
    assert "files:write" in (out["authorize_params"][1]["scope"] or "")
    # Past the scope: the write path itself answers (no write policy here denies it).
    assert "WRITE_POLICY_DENIED" in text_of(call)


def test_a_signed_in_stranger_gets_nothing(nexus: str, tmp_path: Path) -> None:
    plan = {
        "url": f"{nexus}/mcp",
        "redirect_uri": CALLBACK,
        "calls": [{"name": "nexus_read_file", "arguments": {"path": "hello.txt"}}],
    }
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=sign_in_as("mallory"))
    assert out["exit"] == 0, out
    assert out["tools"] == []
    assert out["calls"][0]["result"]["isError"] is True
    assert "hello from the workspace" not in json.dumps(out)


def test_a_reader_sees_only_the_viewer_tools(nexus: str, tmp_path: Path) -> None:
    plan = {"url": f"{nexus}/mcp", "redirect_uri": CALLBACK, "calls": []}
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=sign_in_as("bob"))
    assert out["exit"] == 0, out
    assert "nexus_read_file" in out["tools"]
    assert not {"nexus_write_file", "nexus_edit_file", "nexus_grep"} & set(out["tools"])


def test_the_inspector_cli_connects_with_a_token(
    nexus: str, oidc: OidcProvider, tmp_path: Path
) -> None:
    clients, why = find_node_clients()
    if clients is None:
        pytest.skip(why)
    token = client_credentials_token(
        oidc, "ci-bot", "ci-bot-secret-0123456789", resource=f"{nexus}/mcp", scope="files:read"
    )
    target = InspectorTarget(
        leading=(
            f"{nexus}/mcp",
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {token}",
        )
    )
    run = run_inspector(
        inspector_command(clients, target, "nexus_read_file", {"path": "hello.txt"}),
        home=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.result is not None
    assert "hello from the workspace" in json.dumps(run.result)


def post_init(url: str, token: str) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    return httpx.post(
        url,
        json=body,
        headers={
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token}",
        },
        timeout=10,
    )


def test_real_tokens_not_for_this_server_are_refused(
    nexus: str, oidc: OidcProvider, other_oidc: OidcProvider
) -> None:
    url = f"{nexus}/mcp"
    good = client_credentials_token(
        oidc, "ci-bot", "ci-bot-secret-0123456789", resource=url, scope="files:read"
    )
    assert post_init(url, good).status_code == 200
    refused = {
        # The same provider, a token for another resource (RFC 8707): never accepted here.
        "other-resource": client_credentials_token(
            oidc, "ci-bot", "ci-bot-secret-0123456789", resource=OTHER_RESOURCE, scope="files:read"
        ),
        # A token for this resource from an issuer this server does not name.
        "other-issuer": client_credentials_token(
            other_oidc, "ci-bot", "ci-bot-secret-0123456789", resource=url, scope="files:read"
        ),
        # An ID token is for the client, not for this resource.
        "id-token": code_flow_grant(
            oidc,
            client_id="static",
            client_secret="static-secret-0123456789",
            redirect_uri=CALLBACK,
            login="alice",
            password=ACCOUNTS["alice"]["password"],
            scope="openid email groups",
        )["id_token"],
    }
    for name, token in refused.items():
        response = post_init(url, token)
        assert response.status_code == 401, name
        challenge = response.headers["www-authenticate"]
        assert 'error="invalid_token"' in challenge, name
        assert f'resource_metadata="{nexus}/.well-known/oauth-protected-resource/mcp"' in challenge
        assert token not in response.text


def test_the_metadata_names_the_provider(nexus: str, oidc: OidcProvider) -> None:
    document = httpx.get(f"{nexus}/.well-known/oauth-protected-resource/mcp", timeout=5).json()
    assert document["resource"] == f"{nexus}/mcp"
    # Exactly the issuer (no trailing slash added): RFC 8414 3.3 compares them.
    assert document["authorization_servers"] == [oidc.issuer]
    assert document["scopes_supported"] == ["files:read", "files:write"]


def test_a_token_without_the_required_scope_is_challenged(nexus: str, oidc: OidcProvider) -> None:
    url = f"{nexus}/mcp"
    token = client_credentials_token(
        oidc, "ci-bot", "ci-bot-secret-0123456789", resource=url, scope="files:write"
    )
    response = post_init(url, token)
    assert response.status_code == 403
    challenge = response.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="files:read"' in challenge
