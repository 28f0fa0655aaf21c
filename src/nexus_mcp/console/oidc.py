"""Signing in to the console with the team's identity provider (OpenID Connect).

nexus-mcp is the relying party of an authorization-code flow with PKCE (S256), ``state``
and ``nonce``, at the provider and with the client the front door already uses
(``auth.oidc_proxy``: its issuer, client id and secret); the redirect URI is
``<auth.base_url>/console/oidc/callback``, which the provider's app registration must list.

We write none of the protocol by hand (house rule): Authlib's ``AsyncOAuth2Client`` (the
OAuth client FastMCP itself depends on) builds the authorization request with its PKCE
challenge and exchanges the code; joserfc (the JOSE library the bearer checks use) verifies
the ID token: signature against the provider's key set, ``iss``, ``aud`` = the client id
(and ``azp`` when there are several), ``nonce``, ``exp`` and ``iat``. The provider's
endpoints come from the discovery the front door did at start-up, with its issuer checks.

- ``POST /console/oidc/start`` (from the console's own origin) keeps state, nonce and PKCE
  verifier in a cookie signed with the console key (its own salt), ``HttpOnly``,
  ``SameSite=Lax`` (it must come back with the provider's top-level redirect) and good for
  ten minutes, then sends the browser to the provider.
- ``GET /console/oidc/callback`` needs that cookie and the same ``state``, spends the state
  once in the nonce store (a replayed callback is refused before anything else happens),
  exchanges the code, verifies the ID token, maps its claims with the server's claims
  mapping, and signs the person in with their role's console role (``signin.py``). The
  session cookie is ``SameSite=Strict``, which a browser does not send on the provider's
  cross-site redirect chain: the callback answers with a same-origin page that moves on to
  the inbox (a meta refresh; the CSP allows no inline script).

Every failure is a fixed refusal, audited under its own code: nothing of the provider's
error, its codes or its tokens is shown or recorded.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from authlib.integrations.httpx_client import AsyncOAuth2Client
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError
from joserfc.jwk import KeySet
from joserfc.jwt import JWTClaimsRegistry
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from nexus_mcp.console.pages import PREFIX, Console
from nexus_mcp.console.security import ConsoleCookie, same_origin
from nexus_mcp.console.signin import start_session
from nexus_mcp.policy.claims import ClaimsMapper

CALLBACK_PATH = f"{PREFIX}/oidc/callback"
FLOW_COOKIE = "nexus_console_oidc"
SECURE_FLOW_COOKIE = "__Host-nexus_console_oidc"
# SameSite=Lax: it must come back with the provider's top-level redirect.
FLOW = ConsoleCookie(FLOW_COOKIE, "lax")
FLOW_FIELDS = ("state", "nonce", "verifier")
FLOW_TTL_SECONDS = 600
STATE_PREFIX = "console-oidc:"
MAX_PARAM_CHARS = 4096
MAX_ID_TOKEN_CHARS = 64 * 1024
MAX_KEYS_BYTES = 512 * 1024
# A key set is read again for an unknown key id (the provider rotated), at most this often.
KEYS_REFRESH_SECONDS = 60.0
KEYS_TTL_SECONDS = 3600.0
# ID tokens signed with the provider's keys only: never "none", never HS* (a shared secret
# would be the client secret, which is not a key set's business).
ID_TOKEN_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)

# What people read: fixed sentences, never the provider's words.
EXPIRED = "this sign-in expired or was started in another browser: start again"
REPLAYED = "this sign-in was already used: start again"
DENIED = "the identity provider did not sign you in"
UNUSABLE = "the identity provider's answer could not be used: start again"
NO_ROLE = "your account has no role on this server"
NOT_SET_UP = "sign-in with an identity provider is not set up on this server"


class SignInFailed(Exception):
    """The provider's answer could not be used (the reason is the audit's, not the page's)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class ProviderEndpoints:
    """The provider as the front door discovered it at start-up."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    algorithms: tuple[str, ...] = ("RS256",)


def id_token_algorithms(advertised: object) -> tuple[str, ...]:
    """The provider's ID token algorithms we accept (RS256 when it names none)."""
    if not isinstance(advertised, list | tuple):
        return ("RS256",)
    chosen = tuple(a for a in ID_TOKEN_ALGORITHMS if a in advertised)
    return chosen or ("RS256",)


class OidcSignIn:
    """The console as an OpenID Connect relying party of one provider."""

    def __init__(
        self,
        *,
        endpoints: ProviderEndpoints,
        client_id: str,
        client_secret: str | None,
        scopes: tuple[str, ...],
        redirect_uri: str,
        mapper: ClaimsMapper,
        leeway_seconds: int,
        timeout_seconds: float,
    ) -> None:
        self.endpoints = endpoints
        self.client_id = client_id
        self._client_secret = client_secret
        self.scopes = ("openid", *(s for s in scopes if s != "openid"))
        self.redirect_uri = redirect_uri
        self.mapper = mapper
        self.leeway_seconds = leeway_seconds
        self.timeout_seconds = timeout_seconds
        self._keys: KeySet | None = None
        self._keys_read_at = 0.0
        self._keys_lock = asyncio.Lock()

    @property
    def authorization_origin(self) -> str:
        """Where the sign-in page's button leads (its ``form-action``, ``security.py``)."""
        parts = urlsplit(self.endpoints.authorization_endpoint)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def issuers(self) -> tuple[str, str]:
        # The configured issuer, with and without the slash a URL type may have added.
        bare = self.endpoints.issuer.rstrip("/")
        return bare, bare + "/"

    def _client(self) -> AsyncOAuth2Client:
        return AsyncOAuth2Client(
            client_id=self.client_id,
            client_secret=self._client_secret,
            token_endpoint_auth_method=(
                "client_secret_basic" if self._client_secret is not None else "none"
            ),
            scope=" ".join(self.scopes),
            redirect_uri=self.redirect_uri,
            code_challenge_method="S256",
            timeout=self.timeout_seconds,
            follow_redirects=False,
        )

    async def authorization_url(self, flow: Mapping[str, str]) -> str:
        """Where the browser goes to sign in (PKCE S256, state and nonce from ``flow``)."""
        async with self._client() as client:
            url, _ = client.create_authorization_url(
                self.endpoints.authorization_endpoint,
                state=flow["state"],
                code_verifier=flow["verifier"],
                nonce=flow["nonce"],
            )
        return str(url)

    async def exchange(self, code: str, verifier: str) -> str:
        """The ID token the provider gives for ``code`` (with its PKCE verifier)."""
        try:
            async with self._client() as client:
                token = await client.fetch_token(
                    self.endpoints.token_endpoint,
                    grant_type="authorization_code",
                    code=code,
                    code_verifier=verifier,
                )
        except Exception:  # noqa: BLE001 - any failure is the same refusal, never echoed
            raise SignInFailed("oidc_exchange") from None
        id_token = token.get("id_token") if isinstance(token, Mapping) else None
        if not isinstance(id_token, str) or not id_token or len(id_token) > MAX_ID_TOKEN_CHARS:
            raise SignInFailed("oidc_no_id_token")
        return id_token

    async def verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        """The ID token's claims, if the provider signed them for us and this sign-in."""
        algorithms = list(self.endpoints.algorithms)
        try:
            try:
                token = jwt.decode(id_token, await self._key_set(), algorithms=algorithms)
            except InvalidKeyIdError:
                # A key we have not seen: the provider may have rotated; read the set again.
                token = jwt.decode(
                    id_token, await self._key_set(refresh=True), algorithms=algorithms
                )
            claims = dict(token.claims)
            JWTClaimsRegistry(
                leeway=self.leeway_seconds,
                iss={"essential": True, "values": list(self.issuers)},
                aud={"essential": True, "value": self.client_id},
                sub={"essential": True},
                exp={"essential": True},
                iat={"essential": True},
            ).validate(claims)
        except SignInFailed:
            raise
        except Exception:  # noqa: BLE001 - a bad token is a bad token, whatever is wrong
            raise SignInFailed("oidc_id_token") from None
        sent = claims.get("nonce")
        if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), nonce.encode()):
            raise SignInFailed("oidc_nonce")
        audience = claims.get("aud")
        several = isinstance(audience, list) and len(audience) > 1
        # OIDC Core 3.1.3.7: with several audiences azp must name us; present, it must anyway.
        if (several or "azp" in claims) and claims.get("azp") != self.client_id:
            raise SignInFailed("oidc_id_token")
        return claims

    async def _key_set(self, *, refresh: bool = False) -> KeySet:
        async with self._keys_lock:
            now = time.monotonic()
            stale = self._keys is None or now - self._keys_read_at > KEYS_TTL_SECONDS
            wanted = refresh and now - self._keys_read_at > KEYS_REFRESH_SECONDS
            if stale or wanted:
                self._keys = KeySet.import_key_set(await self._read_keys())
                self._keys_read_at = now
            assert self._keys is not None
            return self._keys

    async def _read_keys(self) -> Any:
        async with (
            httpx.AsyncClient(timeout=self.timeout_seconds, follow_redirects=False) as client,
            client.stream("GET", self.endpoints.jwks_uri) as response,
        ):
            if response.status_code != 200:
                raise SignInFailed("oidc_keys")
            content = b""
            async for chunk in response.aiter_bytes():
                content += chunk
                if len(content) > MAX_KEYS_BYTES:
                    raise SignInFailed("oidc_keys")
        return httpx.Response(200, content=content).json()


def flow_cookie_name(request: Request, public: str | None = None) -> str:
    return FLOW.named(request, public)


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return value if value and len(value) <= MAX_PARAM_CHARS else None


def routes(console: Console) -> list[Route]:
    services = console.services
    keys = services.keys

    def refuse(request: Request, status: int, message: str, code: str) -> Response:
        response = console.refuse(request, None, status, message, code=code)
        FLOW.clear(response, request, console.public)
        return response

    async def start(request: Request) -> Response:
        sign_in = services.sign_in
        if not isinstance(sign_in, OidcSignIn):
            return console.refuse(request, None, 404, NOT_SET_UP, code="oidc_off")
        if not same_origin(request, console.public):
            return console.refuse(request, None, 403, "cross-site request refused", code="origin")
        flow = {
            "state": secrets.token_urlsafe(32),
            "nonce": secrets.token_urlsafe(32),
            # RFC 7636 4.1: 43 to 128 characters; 64 random bytes give 86.
            "verifier": secrets.token_urlsafe(64),
        }
        response = RedirectResponse(await sign_in.authorization_url(flow), status_code=303)
        FLOW.set(response, request, keys.seal_flow(flow), FLOW_TTL_SECONDS, console.public)
        return response

    async def callback(request: Request) -> Response:
        sign_in = services.sign_in
        if not isinstance(sign_in, OidcSignIn):
            return console.refuse(request, None, 404, NOT_SET_UP, code="oidc_off")
        flow = keys.open_flow(
            request.cookies.get(flow_cookie_name(request, console.public)),
            fields=FLOW_FIELDS,
            max_age=FLOW_TTL_SECONDS,
        )
        state = _param(request, "state")
        if (
            flow is None
            or state is None
            or not hmac.compare_digest(state.encode(), flow["state"].encode())
        ):
            return refuse(request, 400, EXPIRED, "oidc_state")
        until = time.time() + FLOW_TTL_SECONDS + 60
        if not services.state.nonces.consume(STATE_PREFIX + flow["state"], until):
            return refuse(request, 400, REPLAYED, "oidc_replay")
        code = _param(request, "code")
        if "error" in request.query_params or code is None:
            return refuse(request, 403, DENIED, "oidc_denied")
        issuer = request.query_params.get("iss")
        if issuer is not None and issuer not in sign_in.issuers:
            # RFC 9207: the answer names another issuer (a mix-up): never exchange the code.
            return refuse(request, 400, UNUSABLE, "oidc_issuer")
        try:
            id_token = await sign_in.exchange(code, flow["verifier"])
            claims = await sign_in.verify(id_token, flow["nonce"])
        except SignInFailed as failed:
            return refuse(request, 403, UNUSABLE, failed.code)
        principal = sign_in.mapper.principal(claims)
        if principal is None:
            return refuse(request, 403, NO_ROLE, "oidc_no_role")
        response = start_session(
            console,
            request,
            subject=principal.subject,
            role=principal.role,
            via="oidc",
            landing=console.render(request, "oidc_done.html", None),
        )
        FLOW.clear(response, request, console.public)
        return response

    return [
        Route(f"{PREFIX}/oidc/start", start, methods=["POST"]),
        Route(CALLBACK_PATH, callback, methods=["GET"]),
    ]


__all__ = [
    "CALLBACK_PATH",
    "OidcSignIn",
    "ProviderEndpoints",
    "SignInFailed",
    "id_token_algorithms",
    "routes",
]
