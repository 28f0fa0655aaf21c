"""The resource server against a hostile or broken authorization server, and forged tokens.

The authorization server here is a small loopback app (an outside boundary): it serves a
metadata document and a JWKS that each test shapes, so a rogue document, a redirecting one
or a key set an attacker wants used can be served for real. Tokens are RS256, minted with
keys the test holds; the forgeries are the classic ones: ``alg: none``, HS256 signed with
the provider's public key (key confusion), a key the provider never published under a
``kid`` it did, a ``jku`` header naming the attacker's key set.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from fastmcp.server.auth.providers.jwt import RSAKeyPair
from joserfc.jwk import RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings
from tests.support.loopback import drip_fed_response, serve_in_thread

from .test_oauth_resource import INIT, MCP_HEADERS, served, session, tool_names

pytestmark = pytest.mark.slow

KID = "k1"


class Provider:
    """What the loopback authorization server answers; tests change it between requests."""

    def __init__(self) -> None:
        self.keys = RSAKeyPair.generate()
        self.issuer = ""
        self.metadata: dict[str, Any] | None = None
        self.redirect_to: str | None = None
        self.jwks_hits = 0

    def jwk(self) -> dict[str, Any]:
        key = RSAKey.import_key(self.keys.public_key)
        return {**key.as_dict(private=False), "kid": KID, "use": "sig", "alg": "RS256"}

    def token(self, audience: str, **claims: Any) -> str:
        base = {"groups": ["engineering"], "email": "ada@eng.example.test"}
        return self.keys.create_token(
            subject="u-1",
            issuer=self.issuer,
            audience=audience,
            scopes=["files:read"],
            additional_claims={**base, **claims},
            kid=KID,
        )


def app_for(provider: Provider) -> Starlette:
    async def metadata(request: Request) -> Response:
        if provider.redirect_to is not None:
            return RedirectResponse(provider.redirect_to, status_code=302)
        document = provider.metadata or {
            "issuer": provider.issuer,
            "jwks_uri": provider.issuer + "/jwks",
            "authorization_endpoint": provider.issuer + "/authorize",
            "token_endpoint": provider.issuer + "/token",
        }
        return JSONResponse(document)

    async def huge(request: Request) -> Response:
        return Response(b"{" + b" " * (600 * 1024) + b"}", media_type="application/json")

    async def drip(request: Request) -> Response:
        return drip_fed_response(b'{"issuer": "')

    async def jwks(request: Request) -> Response:
        provider.jwks_hits += 1
        return JSONResponse({"keys": [provider.jwk()]})

    return Starlette(
        routes=[
            Route("/.well-known/openid-configuration", metadata),
            Route("/jwks", jwks),
            Route("/huge/.well-known/openid-configuration", huge),
            Route("/drip/.well-known/openid-configuration", drip),
        ]
    )


@pytest.fixture
def provider() -> Iterator[Provider]:
    state = Provider()
    with serve_in_thread(app_for(state)) as url:
        state.issuer = url
        yield state


def settings_for(tmp_path: Path, provider: Provider, port: int = 8765) -> Settings:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return Settings(
        mode="prod",
        transport="http",
        port=port,
        workspace=workspace,
        data_dir=tmp_path / "data",
        auth={
            "base_url": f"http://127.0.0.1:{port}",
            "authorization_servers": [provider.issuer],
            "claims": {"rules": [{"group": "engineering", "role": "editor"}]},
        },
    )


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(
            lambda p: {"issuer": "https://rogue.example.test", "jwks_uri": p.issuer + "/jwks"},
            id="other-issuer",
        ),
        pytest.param(
            lambda p: {"issuer": p.issuer + "/", "jwks_uri": "https://rogue.example.test/jwks"},
            id="issuer-with-slash",
        ),
        pytest.param(lambda p: {"jwks_uri": p.issuer + "/jwks"}, id="no-issuer"),
        pytest.param(lambda p: {"issuer": p.issuer}, id="no-jwks"),
        pytest.param(lambda p: ["not", "an", "object"], id="not-an-object"),
    ],
)
def test_a_rogue_or_broken_metadata_document_stops_start_up(
    tmp_path: Path, provider: Provider, document: Any
) -> None:
    provider.metadata = document(provider)
    with pytest.raises(ConfigError) as caught:
        build_server(settings_for(tmp_path, provider), audit_sinks=[MemoryAuditSink()])
    assert "rogue" not in str(caught.value)
    assert provider.jwks_hits == 0


@pytest.mark.parametrize("shape", ["huge", "drip"])
def test_a_huge_or_drip_fed_metadata_document_stops_start_up_in_time(
    tmp_path: Path, provider: Provider, shape: str
) -> None:
    settings = settings_for(tmp_path, provider)
    auth = settings.auth.model_copy(
        update={
            "authorization_servers": (f"{provider.issuer}/{shape}",),
            "discovery_timeout_seconds": 1,
        }
    )
    started = time.monotonic()
    with pytest.raises(ConfigError, match="cannot read the authorization server metadata"):
        build_server(settings.model_copy(update={"auth": auth}), audit_sinks=[MemoryAuditSink()])
    # Two well-known paths tried, each bounded in all (the drip never ends by itself).
    assert time.monotonic() - started < 5


def test_discovery_does_not_follow_redirects(tmp_path: Path, provider: Provider) -> None:
    provider.redirect_to = "https://rogue.example.test/.well-known/openid-configuration"
    with pytest.raises(ConfigError, match="cannot read the authorization server metadata"):
        build_server(settings_for(tmp_path, provider), audit_sinks=[MemoryAuditSink()])


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged(header: dict[str, Any], claims: dict[str, Any], key: bytes | None) -> str:
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    signature = (
        b"" if key is None else hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    )
    return f"{signing_input}.{b64(signature)}"


async def test_forged_tokens_are_refused_and_a_real_one_works(
    tmp_path: Path, provider: Provider
) -> None:
    async with served(settings_for_port(tmp_path, provider)) as base:
        url = f"{base}/mcp"
        audience = url
        async with httpx.AsyncClient() as client:
            good = provider.token(audience)
            headers = await session(client, url, good)
            assert "nexus_write_file" in await tool_names(client, url, headers)

            claims = json.loads(base64.urlsafe_b64decode(good.split(".")[1] + "=="))
            public_pem = (
                provider.keys.public_key.get_secret_value().encode()
                if hasattr(provider.keys.public_key, "get_secret_value")
                else str(provider.keys.public_key).encode()
            )
            jwk_json = json.dumps(provider.jwk()).encode()
            attacker = RSAKeyPair.generate()
            forgeries = {
                "alg-none": forged({"alg": "none", "typ": "JWT", "kid": KID}, claims, None),
                "hs256-with-public-pem": forged({"alg": "HS256", "kid": KID}, claims, public_pem),
                "hs256-with-public-jwk": forged({"alg": "HS256", "kid": KID}, claims, jwk_json),
                "unpublished-key-same-kid": attacker.create_token(
                    subject="u-1",
                    issuer=provider.issuer,
                    audience=audience,
                    additional_claims={"groups": ["engineering"]},
                    kid=KID,
                ),
                "jku-to-attacker": _with_header(
                    attacker, provider, audience, {"jku": "https://rogue.example.test/jwks"}
                ),
                "other-resource": provider.token("http://127.0.0.1:1/mcp"),
                "expired": provider.token(audience, exp=int(time.time()) - 120),
                "signature-stripped": good.rsplit(".", 1)[0] + ".",
            }
            for name, bad in forgeries.items():
                response = await client.post(
                    url, content=INIT, headers={**MCP_HEADERS, "Authorization": f"Bearer {bad}"}
                )
                assert response.status_code == 401, name
                assert bad not in response.text


def _with_header(
    attacker: RSAKeyPair, provider: Provider, audience: str, extra: dict[str, Any]
) -> str:
    from joserfc import jwt

    key = RSAKey.import_key(attacker.private_key.get_secret_value())
    claims = {
        "sub": "u-1",
        "iss": provider.issuer,
        "aud": audience,
        "exp": int(time.time()) + 300,
        "groups": ["engineering"],
    }
    return jwt.encode({"alg": "RS256", "kid": KID, **extra}, claims, key)


def settings_for_port(tmp_path: Path, provider: Provider) -> Settings:
    from .servers import free_port

    return settings_for(tmp_path, provider, port=free_port())


def test_public_key_shape(provider: Provider) -> None:
    # The forgeries above use the public key as the attacker would find it: a PEM.
    pem = provider.keys.public_key
    text = pem.get_secret_value() if hasattr(pem, "get_secret_value") else str(pem)
    serialization.load_pem_public_key(text.encode())


def test_stdio_keeps_its_launch_identity_and_never_asks_the_provider(tmp_path: Path) -> None:
    """Sign-in settings are HTTP's: a stdio server neither discovers nor verifies tokens."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(
        mode="prod",
        transport="stdio",
        workspace=workspace,
        data_dir=tmp_path / "data",
        subject="alice",
        role="editor",
        auth={
            "base_url": "https://nexus.example.test",
            # Nothing listens there: a discovery attempt would stop start-up.
            "authorization_servers": ["http://127.0.0.1:9"],
            "claims": {"rules": [{"group": "engineering", "role": "editor"}]},
        },
    )
    server = build_server(settings, audit_sinks=[MemoryAuditSink()])
    try:
        assert server.runtime.verifier is None
        principal = server.runtime.identity.resolve(
            transport="stdio", token_claims=None, token_subject=None
        )
        assert principal is not None and principal.subject == "alice"
    finally:
        server.close()


def test_the_front_door_key_may_not_be_the_approval_secret(
    tmp_path: Path, provider: Provider
) -> None:
    shared = "one-secret-for-two-kinds-of-token-0123456789"
    provider.metadata = {
        "issuer": provider.issuer,
        "jwks_uri": provider.issuer + "/jwks",
        "authorization_endpoint": provider.issuer + "/authorize",
        "token_endpoint": provider.issuer + "/token",
        "response_types_supported": ["code"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
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
                "signing_key": shared,
            },
            "claims": {"rules": [{"group": "engineering", "role": "editor"}]},
        },
    )
    with pytest.raises(ConfigError, match=r"approval secret must differ from auth\.oidc_proxy"):
        build_server(
            settings,
            audit_sinks=[MemoryAuditSink()],
            env={"NEXUS_MCP_APPROVAL_SECRET": shared},
        )
