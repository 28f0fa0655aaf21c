"""Opaque tokens: nexus-mcp asks the provider about each one (RFC 7662, ``auth.introspection``).

The provider issues reference tokens for nexus-mcp's resource; nexus-mcp introspects every
one with its own confidential client. A token for another resource, a revoked token and a
made-up one are refused; a live one maps through ``auth.claims`` like a JWT would.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.support.oidc import OidcProvider, client_credentials_token, oidc_provider_fixture

from .servers import http_server
from .test_oauth_resource import session, tool_names
from .test_oauth_signin import post_init

pytestmark = pytest.mark.slow

OTHER = "https://other.example.test/mcp"
RS_SECRET = "introspecting-client-secret-0123456789"
BOT_SECRET = "opaque-bot-secret-0123456789"


@pytest.fixture(scope="module")
def port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def provider_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    resource = f"http://127.0.0.1:{request.getfixturevalue('port')}/mcp"
    return {
        "accounts": {},
        "clients": [
            {
                "client_id": "nexus-rs",
                "client_secret": RS_SECRET,
                "redirect_uris": [],
                "response_types": [],
                "grant_types": ["client_credentials"],
            },
            {
                "client_id": "bot",
                "client_secret": BOT_SECRET,
                "redirect_uris": [],
                "response_types": [],
                "grant_types": ["client_credentials"],
                "scope": "files:read",
                "claims": {"groups": ["engineering"]},
            },
        ],
        "resources": {
            resource: {"scope": "files:read", "format": "opaque"},
            OTHER: {"scope": "files:read", "format": "opaque"},
        },
    }


oidc = oidc_provider_fixture(provider_config)


@pytest.fixture(scope="module")
def nexus(oidc: OidcProvider, port: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = f"http://127.0.0.1:{port}"
    workspace = tmp_path_factory.mktemp("ws")
    (workspace / "hello.txt").write_text("hello")
    config = tmp_path_factory.mktemp("cfg") / "nexus.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "mode": "prod",
                "auth": {
                    "base_url": base,
                    "authorization_servers": [oidc.issuer],
                    "introspection": {
                        "url": oidc.discovery["introspection_endpoint"],
                        "client_id": "nexus-rs",
                        "client_secret": "${RS_SECRET}",
                    },
                    # A client-credentials token has no sub: the client is the caller.
                    "claims": {
                        "subject": "client_id",
                        "subject_prefix": "client:",
                        "rules": [{"group": "engineering", "role": "editor"}],
                    },
                },
            }
        )
    )
    environ = {"NEXUS_MCP_DATA_DIR": str(tmp_path_factory.mktemp("data")), "RS_SECRET": RS_SECRET}
    with http_server(["--config", str(config), "--workspace", str(workspace)], environ, port=port):
        yield base


async def test_an_opaque_token_is_introspected(nexus: str, oidc: OidcProvider) -> None:
    url = f"{nexus}/mcp"
    token = client_credentials_token(oidc, "bot", BOT_SECRET, resource=url, scope="files:read")
    assert token.count(".") != 2  # a reference token, not a JWT
    async with httpx.AsyncClient() as client:
        headers = await session(client, url, token)
        # The introspection answer's groups map through auth.claims: an editor.
        assert "nexus_write_file" in await tool_names(client, url, headers)
    other = client_credentials_token(oidc, "bot", BOT_SECRET, resource=OTHER, scope="files:read")
    assert post_init(url, other).status_code == 401
    assert post_init(url, "made-up-" + token[8:]).status_code == 401
    # Revoked at the provider: refused at the next request (no introspection cache).
    revoked = httpx.post(
        oidc.discovery["revocation_endpoint"],
        data={"token": token},
        auth=("bot", BOT_SECRET),
        timeout=10,
    )
    assert revoked.status_code == 200
    assert post_init(url, token).status_code == 401
