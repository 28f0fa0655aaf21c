"""The front door (``auth.oidc_proxy``): nexus-mcp signs agents in at a provider without DCR.

The provider is a real OpenID provider on a loopback port with one pre-registered
confidential client for nexus-mcp (as an Entra or Okta app registration would be), and no
client of the agents' own. nexus-mcp (``serve`` over HTTP, a subprocess) is then the
authorization server the agents see: they register with it, are shown its consent page
(bound to their browser), sign in at the provider, and get a token nexus-mcp signed for
its own resource. The attacks are the ones the front door exists to stop: a consent or a
callback carried to another browser, a replayed code, a code exchanged without its PKCE
verifier, a redirect URI the client never registered.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
import yaml

from tests.support.oidc import (
    Browser,
    OidcProvider,
    oidc_provider_fixture,
    parse_forms,
    sdk_oauth_flow,
)

from .servers import http_server

pytestmark = pytest.mark.slow

CALLBACK = "http://127.0.0.1:1/callback"  # the agent's redirect URI: never requested
FRONT_SECRET = "front-door-client-secret-0123456789"
SIGNING_KEY = "front-door-signing-key-0123456789abcdef"
ACCOUNTS: dict[str, Any] = {
    "alice": {"password": "alice-pw", "email": "alice@example.test", "groups": ["engineering"]},
    "mallory": {"password": "mallory-pw", "email": "m@example.test", "groups": ["contractors"]},
}


@pytest.fixture(scope="module")
def nexus_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def provider_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    base = f"http://127.0.0.1:{request.getfixturevalue('nexus_port')}"
    return {
        "accounts": ACCOUNTS,
        "clients": [
            {
                "client_id": "nexus-front",
                "client_secret": FRONT_SECRET,
                "redirect_uris": [f"{base}/auth/callback"],
                "grant_types": ["authorization_code", "refresh_token"],
                "scope": "openid email groups files:read files:write",
            }
        ],
        "resources": {f"{base}/mcp": {"scope": "files:read files:write"}},
    }


oidc = oidc_provider_fixture(provider_config)


def front_door_config(base: str, issuer: str, **proxy: Any) -> dict[str, Any]:
    return {
        "mode": "prod",
        "auth": {
            "base_url": base,
            "required_scopes": ["files:read"],
            "oidc_proxy": {
                "issuer": issuer,
                "client_id": "nexus-front",
                "client_secret": "${FRONT_SECRET}",
                "signing_key": "${NEXUS_OAUTH_SIGNING_KEY}",
                **proxy,
            },
            "claims": {
                "subject": "email",
                "rules": [{"group": "engineering", "role": "editor"}],
            },
        },
    }


@pytest.fixture(scope="module")
def nexus(
    oidc: OidcProvider, nexus_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    base = f"http://127.0.0.1:{nexus_port}"
    workspace = tmp_path_factory.mktemp("ws")
    (workspace / "hello.txt").write_text("hello through the front door")
    config = tmp_path_factory.mktemp("cfg") / "nexus.yaml"
    config.write_text(yaml.safe_dump(front_door_config(base, oidc.issuer)))
    environ = {
        "NEXUS_MCP_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "FRONT_SECRET": FRONT_SECRET,
        "NEXUS_OAUTH_SIGNING_KEY": SIGNING_KEY,
    }
    args = ["--config", str(config), "--workspace", str(workspace)]
    with http_server(args, environ, port=nexus_port):
        yield base


def approve_consent(base: str) -> Any:
    """The browser's answer to nexus-mcp's consent page: allow."""

    def on_page(response: httpx.Response, browser: Browser) -> httpx.Request | None:
        if not str(response.url).startswith(base):
            return None
        [form] = parse_forms(response.text)
        return browser.submit(response, form, {"action": "approve"})

    return on_page


def sign_in_as(login: str, base: str, issuer: str, browser: Browser | None = None) -> Any:
    def sign_in(authorize_url: str) -> str:
        return (browser or Browser()).sign_in(
            authorize_url,
            login=login,
            password=ACCOUNTS[login]["password"],
            stop_at_prefix=CALLBACK,
            on_page=approve_consent(base),
            provider_origin=issuer,
        )

    return sign_in


def text_of(call: dict[str, Any]) -> str:
    assert "result" in call, call
    return "".join(part.get("text", "") for part in call["result"]["content"])


def test_an_agent_signs_in_through_the_front_door(
    nexus: str, oidc: OidcProvider, tmp_path: Path
) -> None:
    plan = {
        "url": f"{nexus}/mcp",
        "redirect_uri": CALLBACK,
        "calls": [{"name": "nexus_read_file", "arguments": {"path": "hello.txt"}}],
        "calls_after_refresh": [{"name": "nexus_read_file", "arguments": {"path": "hello.txt"}}],
    }
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=sign_in_as("alice", nexus, oidc.issuer))
    assert out["exit"] == 0, out
    assert "hello through the front door" in text_of(out["calls"][0])
    assert "nexus_write_file" in out["tools"]  # alice is an editor by her group
    # The agent registered with nexus-mcp (the provider has no client of its own).
    assert out["registration"]["token_endpoint_auth_method"] == "none"
    assert out["authorize_params"][0]["resource"] == f"{nexus}/mcp"
    # The refresh token nexus-mcp issued works too.
    assert out["refreshed"] is True
    assert "hello through the front door" in text_of(out["calls_after_refresh"][0])


def test_the_front_door_publishes_its_metadata(nexus: str) -> None:
    resource = httpx.get(f"{nexus}/.well-known/oauth-protected-resource/mcp", timeout=5).json()
    assert resource["resource"] == f"{nexus}/mcp"
    assert [s.rstrip("/") for s in resource["authorization_servers"]] == [nexus]
    root = httpx.get(f"{nexus}/.well-known/oauth-protected-resource", timeout=5).json()
    assert root == resource
    server = httpx.get(f"{nexus}/.well-known/oauth-authorization-server", timeout=5).json()
    assert server["code_challenge_methods_supported"] == ["S256"]
    assert server["registration_endpoint"].startswith(nexus)
    assert server.get("client_id_metadata_document_supported") is True


def test_a_stranger_signs_in_and_gets_nothing(
    nexus: str, oidc: OidcProvider, tmp_path: Path
) -> None:
    plan = {
        "url": f"{nexus}/mcp",
        "redirect_uri": CALLBACK,
        "calls": [{"name": "nexus_read_file", "arguments": {"path": "hello.txt"}}],
    }
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=sign_in_as("mallory", nexus, oidc.issuer))
    assert out["exit"] == 0, out
    assert out["tools"] == []
    assert "hello through the front door" not in json.dumps(out)


# --- the attacks, driven by hand -------------------------------------------------------


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    return verifier, challenge.rstrip(b"=").decode()


def register(base: str, redirect_uris: list[str]) -> httpx.Response:
    return httpx.post(
        f"{base}/register",
        json={
            "redirect_uris": redirect_uris,
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "client_name": "hostile-test",
        },
        timeout=10,
    )


def authorize_url(base: str, client_id: str, challenge: str, redirect_uri: str = CALLBACK) -> str:
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": secrets.token_urlsafe(8),
        "scope": "files:read",
        "resource": f"{base}/mcp",
    }
    return f"{base}/authorize?{urlencode(query)}"


def exchange(
    base: str, client_id: str, code: str, verifier: str, redirect_uri: str = CALLBACK
) -> httpx.Response:
    return httpx.post(
        f"{base}/token",
        data={
            "grant_type": "authorization_code",
            "client_id": client_id,
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": redirect_uri,
            "resource": f"{base}/mcp",
        },
        timeout=10,
    )


def code_in(url: str) -> str:
    [code] = parse_qs(urlsplit(url).query)["code"]
    return code


@pytest.fixture
def client_id(nexus: str) -> str:
    response = register(nexus, [CALLBACK])
    assert response.status_code == 201, response.text
    return str(response.json()["client_id"])


def test_a_code_is_spent_once_and_only_with_its_verifier(
    nexus: str, oidc: OidcProvider, client_id: str
) -> None:
    verifier, challenge = pkce()
    redirect = sign_in_as("alice", nexus, oidc.issuer)(authorize_url(nexus, client_id, challenge))
    code = code_in(redirect)
    wrong = exchange(nexus, client_id, code, pkce()[0])
    # The SDK's token handler answers invalid_grant with 401 (RFC 6749 5.2 says 400).
    assert wrong.status_code in (400, 401) and wrong.json()["error"] == "invalid_grant"
    assert code not in wrong.text
    # A wrong verifier does not spend the code for its owner... or it does: either way the
    # code never yields two tokens.
    first = exchange(nexus, client_id, code, verifier)
    second = exchange(nexus, client_id, code, verifier)
    assert second.status_code in (400, 401) and second.json()["error"] == "invalid_grant"
    assert first.status_code in (200, 400, 401)
    if first.status_code == 200:
        assert first.json()["token_type"].lower() == "bearer"


def test_a_replayed_code_is_refused(nexus: str, oidc: OidcProvider, client_id: str) -> None:
    verifier, challenge = pkce()
    redirect = sign_in_as("alice", nexus, oidc.issuer)(authorize_url(nexus, client_id, challenge))
    code = code_in(redirect)
    first = exchange(nexus, client_id, code, verifier)
    assert first.status_code == 200, first.text
    replay = exchange(nexus, client_id, code, verifier)
    assert replay.status_code in (400, 401) and replay.json()["error"] == "invalid_grant"
    token = first.json()["access_token"]
    assert token not in replay.text


@pytest.mark.parametrize(
    "redirect_uri",
    [
        "http://evil.example.test/callback",
        "http://127.0.0.1:1/callback/../other",
        "http://127.0.0.1:1/other",
        "http://127.0.0.1.evil.example.test:1/callback",
        "http://127.0.0.1:1/callback?x=1",
        "https://127.0.0.1:1/callback",
        "javascript:alert(1)//",
    ],
)
def test_a_redirect_uri_the_client_never_registered_is_refused(
    nexus: str, client_id: str, redirect_uri: str
) -> None:
    _, challenge = pkce()
    response = httpx.get(authorize_url(nexus, client_id, challenge, redirect_uri), timeout=10)
    # An error page, never a redirect to it (RFC 6749 4.1.2.1), and nothing of it quoted.
    assert response.status_code == 400
    assert "location" not in response.headers
    assert response.json()["error"] == "invalid_request"
    assert redirect_uri not in response.text and "evil" not in response.text


def test_a_loopback_redirect_may_change_its_port_only(nexus: str, client_id: str) -> None:
    """RFC 8252 7.3: a native client's loopback listener gets a new port each time."""
    _, challenge = pkce()
    response = httpx.get(
        authorize_url(nexus, client_id, challenge, "http://127.0.0.1:2/callback"), timeout=10
    )
    assert response.status_code in (302, 303, 307)
    assert response.headers["location"].startswith(nexus)  # on to the consent page


@pytest.mark.parametrize(
    "redirect_uris",
    [
        ["javascript:alert(1)"],
        ["data:text/html,<script>alert(1)</script>"],
        [],
    ],
)
def test_registering_a_hostile_redirect_uri_is_refused(
    nexus: str, redirect_uris: list[str]
) -> None:
    response = register(nexus, redirect_uris)
    assert response.status_code == 400
    assert response.json()["error"] in ("invalid_redirect_uri", "invalid_client_metadata")
    for uri in redirect_uris:
        assert uri not in response.text
    assert "<script" not in response.text and "javascript" not in response.text


def test_oauth_errors_never_quote_the_request(nexus: str) -> None:
    canary = "<svg onload=1>CANARY"
    answers = [
        httpx.post(
            f"{nexus}/token",
            data={"grant_type": "authorization_code", "client_id": canary, "code": canary},
            timeout=10,
        ),
        httpx.post(f"{nexus}/token", data={"grant_type": canary}, timeout=10),
        httpx.get(f"{nexus}/authorize", params={"client_id": canary, "redirect_uri": canary}),
        httpx.post(f"{nexus}/register", json={"redirect_uris": [canary], "client_name": canary}),
        httpx.post(f"{nexus}/register", content=canary.encode(), timeout=10),
    ]
    for response in answers:
        assert 400 <= response.status_code < 500, response.status_code
        assert "CANARY" not in response.text and "svg" not in response.text
        assert response.json()["error_description"]


def test_a_consent_carried_to_another_browser_is_refused(
    nexus: str, oidc: OidcProvider, client_id: str
) -> None:
    _, challenge = pkce()
    victim, attacker = Browser(), Browser()
    # The attacker starts a sign-in and sends the consent page's form to the victim.
    page = attacker.send(attacker.build_request("GET", authorize_url(nexus, client_id, challenge)))
    while page.status_code in (302, 303, 307) and page.headers["location"].startswith(nexus):
        page = attacker.get(page.headers["location"])
    assert page.status_code == 200, page.status_code
    [form] = parse_forms(page.text)
    # The victim's browser posts it (the CSRF token is in the page; the cookie is not).
    carried = victim.send(victim.submit(page, form, {"action": "approve"}))
    assert carried.status_code in (400, 403), carried.status_code
    assert not carried.headers.get("location", "").startswith(oidc.issuer)


def test_a_callback_carried_to_another_browser_is_refused(
    nexus: str, oidc: OidcProvider, client_id: str
) -> None:
    _, challenge = pkce()
    victim, attacker = Browser(), Browser()
    # The attacker signs in at the provider as itself, stopping at nexus-mcp's callback...
    callback = attacker.sign_in(
        authorize_url(nexus, client_id, challenge),
        login="mallory",
        password=ACCOUNTS["mallory"]["password"],
        stop_at_prefix=f"{nexus}/auth/callback",
        on_page=approve_consent(nexus),
        provider_origin=oidc.issuer,
    )
    # ...and lures the victim's browser into finishing it (login CSRF / session mix-up).
    finished = victim.get(callback)
    assert finished.status_code in (400, 403), finished.status_code
    assert "code=" not in finished.headers.get("location", "")
