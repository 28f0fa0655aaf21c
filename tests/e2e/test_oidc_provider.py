"""The OAuth test parts themselves, against the real provider (tests/support/oidc.py).

They prove what the OAuth tests of nexus-mcp stand on: oidc-provider issues RS256 JWT access
tokens bound to one resource (RFC 8707) with the account's claims, refuses a replayed code, an
unknown resource and a wrong password, registers public clients (RFC 7591), and stops without
leaving a process; the ``Browser`` follows a sign-in across hosts (a proxy in front of the
provider); and the TypeScript SDK's own OAuth flow (``oauth_flow.mjs``) signs in to a FastMCP
server that only trusts the provider's tokens. Nothing here is nexus-mcp code.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import jwt
import pytest
import uvicorn
from fastmcp import FastMCP
from fastmcp.server.auth import RemoteAuthProvider
from fastmcp.server.auth.providers.jwt import JWTVerifier
from fastmcp.server.dependencies import get_access_token
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.support.oidc import (
    Browser,
    LoginRefused,
    OAuthError,
    OidcProvider,
    authorize,
    client_credentials_grant,
    code_flow_grant,
    exchange_code,
    oidc_provider_fixture,
    parse_forms,
    require_oidc_node,
    sdk_oauth_flow,
    token_body,
)

API = "https://api.example.test/mcp"
AUDIENCED = "https://other.example.test/mcp"
CALLBACK = "http://127.0.0.1:1/callback"  # never requested: the browser stops at it
ALICE: dict[str, Any] = {
    "password": "alice-pw",
    "email": "alice@example.test",
    "groups": ["eng"],
    "roles": ["admin"],
}
BOB: dict[str, Any] = {
    "password": "bob-pw",
    "email": "bob@example.test",
    "groups": ["ops"],
    "roles": [],
}
ALL_SCOPES = "openid email groups roles offline_access nexus:read nexus:write"


@pytest.fixture(scope="module")
def mcp_socket() -> Iterator[socket.socket]:
    """The probe MCP server's listening socket, bound first: the provider names its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


def _mcp_url(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"


def _config(request: pytest.FixtureRequest) -> dict[str, Any]:
    mcp_url = _mcp_url(request.getfixturevalue("mcp_socket"))
    grants = ["authorization_code", "refresh_token", "client_credentials"]
    return {
        "accounts": {"alice": ALICE, "bob": BOB},
        "clients": [
            {
                "client_id": "static",
                "client_secret": "static-secret",
                "redirect_uris": [CALLBACK],
                "grant_types": grants,
                "scope": ALL_SCOPES,
            },
            {
                "client_id": "robot",
                "client_secret": "robot-secret",
                "redirect_uris": [],
                "response_types": [],
                "grant_types": ["client_credentials"],
                "scope": "nexus:read",
                "claims": {"groups": ["bots"], "roles": ["reader"]},
            },
        ],
        "resources": {
            API: {"scope": "nexus:read nexus:write"},
            AUDIENCED: {"scope": "nexus:read", "audience": "urn:nexus:other"},
            mcp_url: {"scope": "nexus:read"},
        },
    }


oidc = oidc_provider_fixture(_config)


def test_discovery_names_the_endpoints_and_s256_only(oidc: OidcProvider) -> None:
    d = oidc.discovery
    assert d["issuer"] == oidc.issuer == f"http://127.0.0.1:{oidc.port}"
    for name in ("jwks_uri", "token_endpoint", "authorization_endpoint", "registration_endpoint"):
        assert d[name].startswith(oidc.issuer + "/")
    assert d["code_challenge_methods_supported"] == ["S256"]
    assert {"authorization_code", "refresh_token", "client_credentials"} <= set(
        d["grant_types_supported"]
    )
    assert d["authorization_response_iss_parameter_supported"] is True
    keys = oidc.jwks()["keys"]
    assert [(k["kty"], k["alg"], k["use"]) for k in keys] == [("RSA", "RS256", "sig")]
    assert "d" not in keys[0]  # public part only


def test_code_flow_gives_a_resource_bound_jwt_with_the_account_claims(oidc: OidcProvider) -> None:
    grant = code_flow_grant(
        oidc,
        client_id="static",
        client_secret="static-secret",
        redirect_uri=CALLBACK,
        login="alice",
        password=ALICE["password"],
        scope="openid email groups nexus:read",
        resource=API,
    )
    claims = oidc.verify_access_token(grant["access_token"], audience=API)
    assert jwt.get_unverified_header(grant["access_token"])["typ"] == "at+jwt"
    assert claims["aud"] == API and claims["iss"] == oidc.issuer
    assert claims["sub"] == "alice" and claims["client_id"] == "static"
    assert claims["scope"] == "nexus:read"  # the resource's scopes only
    assert claims["email"] == ALICE["email"]
    assert claims["groups"] == ["eng"] and claims["roles"] == ["admin"]
    assert grant["refresh_token"]
    id_token = jwt.decode(grant["id_token"], options={"verify_signature": False})
    assert id_token["email"] == ALICE["email"] and id_token["groups"] == ["eng"]
    # Another audience for the same sign-in: the token is not valid for API.
    with pytest.raises(jwt.InvalidAudienceError):
        oidc.verify_access_token(grant["access_token"], audience=AUDIENCED)


def test_a_configured_audience_replaces_the_resource_url(oidc: OidcProvider) -> None:
    grant = client_credentials_grant(
        oidc, "robot", "robot-secret", resource=AUDIENCED, scope="nexus:read"
    )
    claims = oidc.verify_access_token(grant["access_token"], audience="urn:nexus:other")
    assert claims["sub"] == "robot" and claims["scope"] == "nexus:read"
    assert claims["groups"] == ["bots"] and claims["roles"] == ["reader"]


def test_a_replayed_code_is_refused(oidc: OidcProvider) -> None:
    authorization = authorize(
        oidc,
        client_id="static",
        redirect_uri=CALLBACK,
        login="alice",
        password=ALICE["password"],
        scope="nexus:read",
        resource=API,
    )
    assert authorization.params["iss"] == oidc.issuer
    kwargs: dict[str, Any] = {
        "client_id": "static",
        "client_secret": "static-secret",
        "redirect_uri": CALLBACK,
        "resource": API,
    }
    assert token_body(exchange_code(oidc, authorization, **kwargs))["access_token"]
    with pytest.raises(OAuthError) as replay:
        token_body(exchange_code(oidc, authorization, **kwargs))
    assert replay.value.error == "invalid_grant"


def test_a_resource_not_in_the_table_is_refused(oidc: OidcProvider) -> None:
    with pytest.raises(OAuthError) as at_token:
        client_credentials_grant(
            oidc, "robot", "robot-secret", resource="https://elsewhere.test/mcp", scope="nexus:read"
        )
    assert at_token.value.error == "invalid_target"
    refused = authorize(
        oidc,
        client_id="static",
        redirect_uri=CALLBACK,
        login="alice",
        password=ALICE["password"],
        scope="nexus:read",
        resource="https://elsewhere.test/mcp",
    )
    assert refused.params["error"] == "invalid_target"
    assert "code" not in refused.params


def test_a_wrong_password_does_not_sign_in(oidc: OidcProvider) -> None:
    with Browser() as browser:
        with pytest.raises(LoginRefused) as refused:
            authorize(
                oidc,
                client_id="static",
                redirect_uri=CALLBACK,
                login="alice",
                password="not-her-password",
                scope="nexus:read",
                resource=API,
                browser=browser,
            )
        page = refused.value.response
        assert page is not None and page.status_code == 200
        assert any(form.asks_password for form in parse_forms(page.text))
        assert "not-her-password" not in page.text
        assert "_session" not in browser.cookies
        # The same browser with the right password then goes through.
        assert authorize(
            oidc,
            client_id="static",
            redirect_uri=CALLBACK,
            login="alice",
            password=ALICE["password"],
            scope="nexus:read",
            resource=API,
            browser=browser,
        ).code


def test_two_browsers_keep_two_sessions(oidc: OidcProvider) -> None:
    subjects = []
    with Browser() as first, Browser() as second:
        for browser, login, account in ((first, "alice", ALICE), (second, "bob", BOB)):
            grant = code_flow_grant(
                oidc,
                client_id="static",
                client_secret="static-secret",
                redirect_uri=CALLBACK,
                login=login,
                password=str(account["password"]),
                scope="nexus:read",
                resource=API,
                browser=browser,
            )
            subjects.append(oidc.verify_access_token(grant["access_token"], audience=API)["sub"])
        # The first browser's session signs in again without a login form.
        logins_before = sum(1 for _, url, _ in first.visited if url.endswith("/login"))
        again = code_flow_grant(
            oidc,
            client_id="static",
            client_secret="static-secret",
            redirect_uri=CALLBACK,
            login="alice",
            password="unused",
            scope="nexus:read",
            resource=API,
            browser=first,
        )
        assert sum(1 for _, url, _ in first.visited if url.endswith("/login")) == logins_before
    assert subjects == ["alice", "bob"]
    assert oidc.verify_access_token(again["access_token"], audience=API)["sub"] == "alice"


def test_dynamic_registration_of_a_public_loopback_client(oidc: OidcProvider) -> None:
    redirect_uri = "http://127.0.0.1:4567/callback"
    response = httpx.post(
        oidc.registration_endpoint,
        json={
            "redirect_uris": [redirect_uri],
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "scope": "nexus:read",
        },
    )
    assert response.status_code == 201, response.text
    registered = response.json()
    assert registered["token_endpoint_auth_method"] == "none"
    assert "client_secret" not in registered
    client_id = registered["client_id"]
    grant = code_flow_grant(
        oidc,
        client_id=client_id,
        redirect_uri=redirect_uri,
        login="bob",
        password=BOB["password"],
        scope="nexus:read",
        resource=API,
    )
    claims = oidc.verify_access_token(grant["access_token"], audience=API)
    assert claims["client_id"] == client_id and claims["sub"] == "bob"
    # PKCE is required of a public client: no code_challenge, no code.
    with Browser() as browser:
        query = urlencode(
            {
                "response_type": "code",
                "client_id": client_id,
                "redirect_uri": redirect_uri,
                "scope": "nexus:read",
                "state": "s",
            }
        )
        redirect = browser.sign_in(
            f"{oidc.authorization_endpoint}?{query}",
            login="bob",
            password=BOB["password"],
            stop_at_prefix=redirect_uri,
        )
    params = parse_qs(urlsplit(redirect).query)
    assert params["error"] == ["invalid_request"] and "code" not in params


def test_stop_leaves_no_process_behind(oidc: OidcProvider, tmp_path: Path) -> None:
    provider = OidcProvider(oidc.config, work_dir=tmp_path)
    with provider:
        pid, port = provider.pid, provider.port
        assert httpx.get(provider.jwks_uri).status_code == 200
    assert provider.returncode == 0  # ended by SIGTERM, cleanly
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/jwks")


def test_a_consent_form_when_configured(oidc: OidcProvider, tmp_path: Path) -> None:
    config = {**oidc.config, "consent": "form"}
    with OidcProvider(config, work_dir=tmp_path) as provider, Browser() as browser:
        grant = code_flow_grant(
            provider,
            client_id="static",
            client_secret="static-secret",
            redirect_uri=CALLBACK,
            login="alice",
            password=ALICE["password"],
            scope="nexus:read",
            resource=API,
            browser=browser,
        )
        confirms = [url for method, url, _ in browser.visited if method == "POST"]
        assert [urlsplit(url).path.rsplit("/", 1)[1] for url in confirms] == ["login", "confirm"]
        assert provider.verify_access_token(grant["access_token"], audience=API)["sub"] == "alice"


def test_without_node_the_tests_skip_and_under_ci_they_fail(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no node on it
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="node is not installed"):
        require_oidc_node()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required under CI: node is not installed"):
        require_oidc_node()


# --- a proxy in front of the provider: the browser follows across hosts -------------------


def _proxy_app(oidc: OidcProvider, client: dict[str, Any], base: list[str]) -> Starlette:
    """An authorization server that delegates sign-in to the provider, then asks its own consent."""
    pending: dict[str, dict[str, str]] = {}

    async def start(request: Request) -> Response:
        key = os.urandom(8).hex()
        pending[key] = dict(request.query_params)
        query = urlencode(
            {
                "response_type": "code",
                "client_id": client["client_id"],
                "redirect_uri": f"{base[0]}/callback",
                "scope": "openid email",
                "state": key,
            }
        )
        return RedirectResponse(f"{oidc.authorization_endpoint}?{query}", status_code=302)

    async def callback(request: Request) -> Response:
        key = request.query_params["state"]
        assert request.query_params.get("code")
        return HTMLResponse(
            f'<form method="post" action="/consent"><input type="hidden" name="key" value="{key}">'
            '<button type="submit">Allow</button></form>'
        )

    async def consent(request: Request) -> Response:
        form = await request.form()
        original = pending.pop(str(form["key"]))
        answer = urlencode({"code": "proxy-code", "state": original["state"]})
        return RedirectResponse(f"{original['redirect_uri']}?{answer}", status_code=303)

    return Starlette(
        routes=[
            Route("/authorize", start),
            Route("/callback", callback),
            Route("/consent", consent, methods=["POST"]),
        ]
    )


def test_the_browser_follows_a_proxy_and_hands_its_pages_to_on_page(
    oidc: OidcProvider,
) -> None:
    base: list[str] = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    base.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
    registered = httpx.post(
        oidc.registration_endpoint,
        json={"redirect_uris": [f"{base[0]}/callback"], "grant_types": ["authorization_code"]},
    ).json()
    seen: list[str] = []

    def on_page(response: httpx.Response, browser: Browser) -> httpx.Request | None:
        seen.append(response.url.path)
        (form,) = parse_forms(response.text)
        return browser.submit(response, form, {})

    with _serve(_proxy_app(oidc, registered, base), sock), Browser() as browser:
        query = urlencode({"redirect_uri": CALLBACK, "state": "agent-state"})
        redirect = browser.sign_in(
            f"{base[0]}/authorize?{query}",
            login="alice",
            password=ALICE["password"],
            stop_at_prefix=CALLBACK,
            on_page=on_page,
            provider_origin=oidc.issuer,
        )
    assert parse_qs(urlsplit(redirect).query) == {"code": ["proxy-code"], "state": ["agent-state"]}
    assert seen == ["/callback"]  # the provider's login page was not handed over


# --- the TypeScript SDK's OAuth flow against a FastMCP server trusting the provider ---------


def _probe_app(oidc: OidcProvider, mcp_url: str) -> Any:
    base = mcp_url.removesuffix("/mcp")
    verifier = JWTVerifier(jwks_uri=oidc.jwks_uri, issuer=oidc.issuer, audience=mcp_url)
    auth = RemoteAuthProvider(
        token_verifier=verifier,
        authorization_servers=[AnyHttpUrl(oidc.issuer)],
        base_url=base,
        scopes_supported=["nexus:read"],
    )
    mcp = FastMCP("oidc-probe", auth=auth)

    @mcp.tool
    def whoami() -> dict[str, Any]:
        token = get_access_token()
        assert token is not None
        return {"sub": token.claims.get("sub"), "email": token.claims.get("email")}

    return mcp.http_app(path="/mcp")


class _serve:
    """uvicorn on an already bound socket, in a thread, with the app's lifespan."""

    def __init__(
        self, app: Any, sock: socket.socket, *, lifespan: Literal["auto", "on", "off"] = "auto"
    ) -> None:
        config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, log_config=None)
        self.server = uvicorn.Server(config)
        self.sock = sock
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )

    def __enter__(self) -> _serve:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the probe server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def probe(oidc: OidcProvider, mcp_socket: socket.socket) -> Iterator[str]:
    mcp_url = _mcp_url(mcp_socket)
    with _serve(_probe_app(oidc, mcp_url), mcp_socket):
        yield mcp_url


def _alice_signs_in(redirect_uri: str) -> Any:
    def sign_in(url: str) -> str:
        with Browser() as browser:
            return browser.sign_in(
                url, login="alice", password=ALICE["password"], stop_at_prefix=redirect_uri
            )

    return sign_in


def test_the_sdk_signs_in_and_calls_a_tool(oidc: OidcProvider, probe: str, tmp_path: Path) -> None:
    redirect_uri = "http://127.0.0.1:2/callback"
    plan = {"url": probe, "redirect_uri": redirect_uri, "calls": [{"name": "whoami"}]}
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=_alice_signs_in(redirect_uri))
    assert out["exit"] == 0, out
    assert out["tools"] == ["whoami"]
    (call,) = out["calls"]
    assert call["result"]["structuredContent"] == {"sub": "alice", "email": ALICE["email"]}
    assert out["tokens"] == {
        "scope": "nexus:read",
        "token_type": "Bearer",
        "has_refresh_token": True,
    }
    assert out["authorizations"] == 1
    assert out["registration"]["token_endpoint_auth_method"] == "none"
    (params,) = out["authorize_params"]
    assert params == {
        "resource": probe,
        "scope": "nexus:read",
        "code_challenge_method": "S256",
        "has_state": True,
    }
    assert out["iss"] == [oidc.issuer]
    assert out["token_requests"] == [{"grant_type": "authorization_code", "resource": probe}]


def test_the_sdk_refreshes_a_refused_token(probe: str, tmp_path: Path) -> None:
    redirect_uri = "http://127.0.0.1:2/callback"
    plan = {
        "url": probe,
        "redirect_uri": redirect_uri,
        "calls": [{"name": "whoami"}],
        "calls_after_refresh": [{"name": "whoami"}],
    }
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=_alice_signs_in(redirect_uri))
    assert out["exit"] == 0, out
    assert out["refreshed"] is True and out["authorizations"] == 1
    (call,) = out["calls_after_refresh"]
    assert call["result"]["structuredContent"]["sub"] == "alice"
    assert out["token_requests"] == [
        {"grant_type": "authorization_code", "resource": probe},
        {"grant_type": "refresh_token", "resource": probe},
    ]


def test_the_sdk_flow_refuses_a_redirect_with_another_state(
    oidc: OidcProvider, probe: str, tmp_path: Path
) -> None:
    redirect_uri = "http://127.0.0.1:2/callback"
    honest = _alice_signs_in(redirect_uri)

    def forged(url: str) -> str:
        redirect = honest(url)
        query = {k: v[0] for k, v in parse_qs(urlsplit(redirect).query).items()}
        query["state"] = "forged"
        return f"{redirect_uri}?{urlencode(query)}"

    plan = {"url": probe, "redirect_uri": redirect_uri, "calls": []}
    out = sdk_oauth_flow(plan, work=tmp_path, sign_in=forged)
    assert out == {"error": "state mismatch", "exit": 1}
