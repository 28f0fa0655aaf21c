"""The HTTP front door: FastMCP's auth providers, configured from ``auth``.

We write none of the OAuth protocol ourselves (house rule): FastMCP's verifiers check
tokens, ``RemoteAuthProvider`` serves RFC 9728 protected resource metadata and the
challenge, ``OIDCProxy`` is the authorization server in front of a provider without
dynamic registration (DCR, client ID metadata documents, PKCE, the consent page bound to
the browser, single-use codes). What this module adds is configuration made safe:

- the audience is this server's resource URL unless set otherwise (RFC 8707), and a token
  must name it: a token for another resource is refused here and never passed on (the
  gateway never forwards a caller's ``Authorization``: ``providers/upstream/``);
- the issuer is pinned to the configured authorization servers, and a discovered metadata
  document must name the issuer it was asked for (RFC 8414 section 3.3, the mix-up
  defence): a rogue document pointing at another issuer or key set stops start-up;
- the protected resource metadata is served at both well-known forms, the path-suffixed
  one (RFC 9728 section 3.1) and the root one clients fall back to, naming the
  authorization servers exactly as configured;
- required scopes are checked by FastMCP's middleware (403 ``insufficient_scope`` with the
  scope to ask for), not inside the verifier (which could only answer 401);
- the proxy's state (registered clients, transactions, codes, the provider's tokens) lives
  on the configured state backend, encrypted with a key derived from ``signing_key``:
  files in the data dir for one process, Redis (the shared backend's) so every replica
  finishes a sign-in another began.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from cryptography.fernet import Fernet
from fastmcp.server.auth import AccessToken, AuthProvider, RemoteAuthProvider, TokenVerifier
from fastmcp.server.auth.jwt_issuer import derive_jwt_key
from fastmcp.server.auth.oauth_proxy import OAuthProxy
from fastmcp.server.auth.oidc_proxy import OIDCProxy
from fastmcp.server.auth.providers.introspection import IntrospectionTokenVerifier
from key_value.aio.protocols import AsyncKeyValue
from key_value.aio.wrappers.encryption import FernetEncryptionWrapper
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from pydantic import AnyHttpUrl
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nexus_mcp.errors import ConfigError
from nexus_mcp.identity.bearer import BearerTokenVerifier
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.auth_settings import AuthSettings, is_loopback_url
from nexus_mcp.policy.claims import ClaimsMapper
from nexus_mcp.settings import Settings
from nexus_mcp.stores.locations import oauth_state_path

log = get_logger(__name__)

DISCOVERY_PATHS = ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server")
MAX_DISCOVERY_BYTES = 512 * 1024
ROOT_METADATA_PATH = "/.well-known/oauth-protected-resource"
STORAGE_SALT = "nexus-mcp-oauth-state"


@dataclass(frozen=True)
class FrontDoor:
    """What the HTTP server gets: the provider FastMCP runs, and the claims mapper."""

    provider: AuthProvider | None
    mapper: ClaimsMapper
    resource_url: str | None = None
    metadata_url: str | None = None


class ScopedVerifier(TokenVerifier):
    """A verifier whose required scopes FastMCP's middleware checks (403, not 401)."""

    def __init__(self, inner: TokenVerifier, required_scopes: list[str]) -> None:
        super().__init__(required_scopes=required_scopes)
        self.inner = inner

    async def verify_token(self, token: str) -> AccessToken | None:
        return await self.inner.verify_token(token)


class ResourceServer(RemoteAuthProvider):
    """``RemoteAuthProvider`` whose metadata names the authorization servers exactly as
    configured, at the path-suffixed and the root well-known paths.

    RFC 9728 section 3.1 puts it at ``/.well-known/oauth-protected-resource/mcp``; clients
    that lose the path (and the 2025-03-26 era's) ask ``/.well-known/oauth-protected-resource``.
    One resource per server, so both answer the same document. FastMCP serializes the
    servers as pydantic URLs, which turns an issuer ``https://idp.example`` into
    ``https://idp.example/``: another issuer identifier (RFC 8414 section 2), which a client
    that compares it with the provider's metadata (section 3.3) must reject.
    """

    def __init__(self, *, issuers: list[str], **options: Any) -> None:
        super().__init__(**options)
        self.issuers = issuers

    def get_routes(self, mcp_path: str | None = None) -> list[Route]:
        routes = super().get_routes(mcp_path)
        if self._resource_url is None:
            return routes
        document = {
            "resource": str(self._resource_url),
            "authorization_servers": self.issuers,
            "scopes_supported": self.scopes_supported,
            "bearer_methods_supported": ["header"],
            **({"resource_name": self.resource_name} if self.resource_name else {}),
        }

        async def metadata(_request: Request) -> Response:
            return JSONResponse(document, headers={"Cache-Control": "public, max-age=3600"})

        endpoint = cors_middleware(metadata, ["GET", "OPTIONS"])
        paths = [
            r.path
            for r in routes
            if isinstance(r, Route) and r.path.startswith(ROOT_METADATA_PATH + "/")
        ]
        others = [r for r in routes if not (isinstance(r, Route) and r.path in paths)]
        served = [*paths, *([ROOT_METADATA_PATH] if ROOT_METADATA_PATH not in paths else [])]
        return [
            *others,
            *(Route(p, endpoint=endpoint, methods=["GET", "OPTIONS"]) for p in served),
        ]


class FrontDoorProxy(OIDCProxy):
    """``OIDCProxy`` whose upstream tokens are checked by our verifier (exp, nbf, iat too)."""

    def __init__(self, *, leeway_seconds: int, **options: Any) -> None:
        self._leeway_seconds = leeway_seconds
        super().__init__(**options)

    def get_token_verifier(
        self,
        *,
        algorithm: str | None = None,
        audience: str | None = None,
        required_scopes: list[str] | None = None,
        timeout_seconds: int | None = None,
    ) -> TokenVerifier:
        del timeout_seconds
        return BearerTokenVerifier(
            jwks_uri=str(self.oidc_config.jwks_uri),
            issuer=str(self.oidc_config.issuer),
            algorithm=algorithm,
            audience=audience,
            required_scopes=required_scopes,
            leeway_seconds=self._leeway_seconds,
        )

    def get_routes(self, mcp_path: str | None = None) -> list[Route]:
        routes = super().get_routes(mcp_path)
        return [*routes, *_root_metadata_routes(routes)]


class PlainFrontDoorProxy(OAuthProxy):
    """``OAuthProxy`` for a provider without discovery, with the root metadata route too."""

    def get_routes(self, mcp_path: str | None = None) -> list[Route]:
        routes = super().get_routes(mcp_path)
        return [*routes, *_root_metadata_routes(routes)]


def _root_metadata_routes(routes: list[Route]) -> list[Route]:
    suffixed = [
        r for r in routes if isinstance(r, Route) and r.path.startswith(ROOT_METADATA_PATH + "/")
    ]
    if not suffixed or any(r.path == ROOT_METADATA_PATH for r in routes if isinstance(r, Route)):
        return []
    first = suffixed[0]
    return [Route(ROOT_METADATA_PATH, endpoint=first.endpoint, methods=["GET", "OPTIONS"])]


def _fetch(url: str, *, timeout: float) -> tuple[int, bytes | None]:
    """GET ``url`` within ``timeout`` in all (a drip-fed answer cannot hold start-up), and
    at most ``MAX_DISCOVERY_BYTES`` of it (None: more). Redirects are not followed."""
    deadline = time.monotonic() + timeout
    with httpx.stream("GET", url, timeout=timeout, follow_redirects=False) as response:
        content = b""
        for chunk in response.iter_bytes():
            content += chunk
            if len(content) > MAX_DISCOVERY_BYTES:
                return response.status_code, None
            if time.monotonic() > deadline:
                raise TimeoutError
        return response.status_code, content


def discover(issuer: str, *, timeout: float, dev: bool) -> dict[str, Any]:
    """The authorization server's metadata (OIDC discovery, then RFC 8414), checked.

    The document must name exactly the issuer asked for (RFC 8414 3.3); otherwise an
    attacker who controls the document could send token checks to a key set of its own.
    """
    base = issuer.rstrip("/")
    failures: list[str] = []
    for path in DISCOVERY_PATHS:
        url = base + path
        try:
            status, content = _fetch(url, timeout=timeout)
        except (httpx.HTTPError, TimeoutError) as exc:
            failures.append(type(exc).__name__)
            continue
        if status != 200 or content is None:
            failures.append(f"HTTP {status}" if content is not None else "too large")
            continue
        try:
            document = json.loads(content)
        except ValueError:
            failures.append("not JSON")
            continue
        if not isinstance(document, dict):
            failures.append("not a JSON object")
            continue
        if document.get("issuer") != issuer and document.get("issuer") != base:
            raise ConfigError(
                f"the authorization server metadata at {url} names another issuer: "
                "refusing it (RFC 8414 section 3.3)"
            )
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not jwks_uri:
            raise ConfigError(f"the authorization server metadata at {url} has no jwks_uri")
        if not dev and not jwks_uri.startswith("https://") and not is_loopback_url(jwks_uri):
            raise ConfigError(f"the authorization server at {issuer} publishes its keys over http")
        return document
    raise ConfigError(
        f"cannot read the authorization server metadata of {issuer} "
        f"({', '.join(failures)}): set 'auth.jwks_url' or check 'auth.authorization_servers'"
    )


def _token_verifier(settings: Settings, *, resource_path: str) -> TokenVerifier | None:
    auth = settings.auth
    audience = auth.audiences(resource_path)
    # Required scopes are checked by the provider (FastMCP's RequireAuthMiddleware answers
    # 403 insufficient_scope), not by the verifier (which could only answer 401).
    required = None
    require_exp = not auth.allow_tokens_without_exp
    issuer: str | list[str] | None = auth.issuer
    if issuer is None and auth.authorization_servers:
        # The tokens must come from the servers this resource names, and only those.
        issuer = list(auth.authorization_servers)
        issuer = issuer[0] if len(issuer) == 1 else issuer
    if auth.jwt_secret is not None:
        return BearerTokenVerifier(
            public_key=auth.jwt_secret.get_secret_value(),
            algorithm=auth.algorithm,
            audience=audience,
            issuer=issuer,
            required_scopes=required,
            leeway_seconds=auth.leeway_seconds,
            require_exp=require_exp,
        )
    if auth.introspection is not None:
        spec = auth.introspection
        return IntrospectionTokenVerifier(
            introspection_url=spec.url,
            client_id=spec.client_id,
            client_secret=spec.client_secret,
            client_auth_method=spec.client_auth_method,
            timeout_seconds=spec.timeout_seconds,
            required_scopes=required,
            audience=audience,
            cache_ttl_seconds=spec.cache_seconds or None,
        )
    jwks_url = auth.jwks_url
    if jwks_url is None and auth.authorization_servers:
        if len(auth.authorization_servers) > 1:
            raise ConfigError(
                "with several 'auth.authorization_servers', set 'auth.jwks_url' "
                "(the key set their tokens are signed with)"
            )
        document = discover(
            auth.authorization_servers[0],
            timeout=float(auth.discovery_timeout_seconds),
            dev=settings.is_dev,
        )
        jwks_url = str(document["jwks_uri"])
    if jwks_url is None:
        return None
    # HS* over a JWKS would verify with a public key as the HMAC secret (key confusion).
    algorithm = auth.algorithm if not auth.algorithm.upper().startswith("HS") else "RS256"
    return BearerTokenVerifier(
        jwks_uri=jwks_url,
        algorithm=algorithm,
        audience=audience,
        issuer=issuer,
        required_scopes=required,
        leeway_seconds=auth.leeway_seconds,
        require_exp=require_exp,
    )


def scopes_supported(auth: AuthSettings) -> list[str]:
    if auth.scopes_supported:
        return list(auth.scopes_supported)
    named = {*auth.required_scopes, *(s for v in auth.tool_scopes.values() for s in v)}
    return sorted(named)


def proxy_storage(settings: Settings, environ: Mapping[str, str], key: bytes) -> AsyncKeyValue:
    """Where the proxy keeps its state: the state backend's, encrypted (``STORAGE_SALT``)."""
    storage_key = derive_jwt_key(high_entropy_material=key.decode(), salt=STORAGE_SALT)
    fernet = Fernet(key=storage_key)
    if settings.state.backend == "shared":
        from key_value.aio.stores.redis import RedisStore
        from key_value.aio.wrappers.prefix_collections import PrefixCollectionsWrapper

        from nexus_mcp.stores.backends import resolve_url

        url = resolve_url(settings.state.redis_url, "state.redis_url", settings, environ)
        store: AsyncKeyValue = PrefixCollectionsWrapper(
            key_value=RedisStore(url=url), prefix=f"{settings.state.key_prefix}:oauth"
        )
    else:
        from key_value.aio.stores.filetree import (
            FileTreeStore,
            FileTreeV1CollectionSanitizationStrategy,
            FileTreeV1KeySanitizationStrategy,
        )

        folder = oauth_state_path(settings)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        store = FileTreeStore(
            data_directory=folder,
            key_sanitization_strategy=FileTreeV1KeySanitizationStrategy(folder),
            collection_sanitization_strategy=FileTreeV1CollectionSanitizationStrategy(folder),
        )
    # A record that does not decrypt (another key) is a miss: the client signs in again.
    return FernetEncryptionWrapper(key_value=store, fernet=fernet, raise_on_decryption_error=False)


def _check_public_url(settings: Settings) -> None:
    base = settings.auth.base_url
    if base is None or settings.is_dev:
        return
    if not base.startswith("https://") and not is_loopback_url(base):
        raise ConfigError(
            "invalid setting 'auth.base_url': prod needs https:// (tokens and codes travel "
            "to it), or a loopback address behind a TLS-terminating proxy"
        )


def _provider_urls(auth: AuthSettings) -> list[tuple[str, str | None]]:
    urls: list[tuple[str, str | None]] = [("auth.jwks_url", auth.jwks_url)]
    urls += [("auth.authorization_servers", s) for s in auth.authorization_servers]
    if auth.introspection is not None:
        urls.append(("auth.introspection.url", auth.introspection.url))
    spec = auth.oidc_proxy
    if spec is not None:
        urls += [
            (f"auth.oidc_proxy.{name}", getattr(spec, name))
            for name in ("issuer", "config_url", "authorization_endpoint", "token_endpoint")
        ]
        urls.append(("auth.oidc_proxy.jwks_url", spec.jwks_url))
    return urls


def _check_provider_urls(settings: Settings) -> None:
    """Prod reaches the provider over https only (loopback aside): its metadata names the
    key set, its key set and introspection answers decide which tokens pass, and the
    client secret travels to its token endpoint. Over plain http whoever is on the path
    decides all of that (a copied metadata document passes the issuer check)."""
    if settings.is_dev:
        return
    for name, url in _provider_urls(settings.auth):
        if url is not None and not url.startswith("https://") and not is_loopback_url(url):
            raise ConfigError(
                f"invalid setting '{name}': prod reaches the identity provider over "
                "https:// only (its keys and answers decide which tokens pass)"
            )


def _proxy(settings: Settings, environ: Mapping[str, str]) -> AuthProvider:
    auth = settings.auth
    spec = auth.oidc_proxy
    assert spec is not None and auth.base_url is not None
    signing_key = derive_jwt_key(
        high_entropy_material=spec.signing_key.get_secret_value(),
        salt="nexus-mcp-oauth-signing",
    )
    common: dict[str, Any] = {
        "base_url": auth.base_url,
        "redirect_path": spec.redirect_path,
        "allowed_client_redirect_uris": (
            list(spec.allowed_client_redirect_uris)
            if spec.allowed_client_redirect_uris is not None
            else None
        ),
        "valid_scopes": sorted({*spec.scopes, *scopes_supported(auth)}),
        "client_storage": proxy_storage(settings, environ, signing_key),
        "jwt_signing_key": signing_key,
        "require_authorization_consent": True if spec.consent == "always" else "remember",
        "forward_resource": spec.forward_resource,
        "fastmcp_access_token_expiry_seconds": spec.access_token_ttl_seconds,
    }
    secret = spec.client_secret.get_secret_value() if spec.client_secret is not None else None
    try:
        if not spec.discovers:
            # A plain OAuth 2 provider: FastMCP's OAuthProxy with the endpoints given.
            return PlainFrontDoorProxy(
                upstream_authorization_endpoint=str(spec.authorization_endpoint),
                upstream_token_endpoint=str(spec.token_endpoint),
                upstream_client_id=spec.client_id,
                upstream_client_secret=secret,
                token_verifier=BearerTokenVerifier(
                    jwks_uri=spec.jwks_url,
                    issuer=spec.issuer,
                    audience=spec.audience,
                    algorithm=spec.algorithm,
                    required_scopes=list(auth.required_scopes) or None,
                    leeway_seconds=auth.leeway_seconds,
                ),
                extra_authorize_params=dict(spec.extra_authorize_params) or None,
                **common,
            )
        provider = FrontDoorProxy(
            leeway_seconds=auth.leeway_seconds,
            config_url=spec.config_url or spec.issuer.rstrip("/") + DISCOVERY_PATHS[0],
            client_id=spec.client_id,
            client_secret=secret,
            audience=spec.audience,
            algorithm=spec.algorithm,
            required_scopes=list(auth.required_scopes) or None,
            verify_id_token=spec.verify_id_token,
            extra_authorize_params=dict(spec.extra_authorize_params) or None,
            timeout_seconds=spec.discovery_timeout_seconds,
            **common,
        )
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - discovery failed, or FastMCP refused it
        raise ConfigError(
            f"cannot set up 'auth.oidc_proxy' for {spec.issuer} ({type(exc).__name__}): "
            "check the issuer, its discovery document and the client id"
        ) from None
    issuer = str(provider.oidc_config.issuer).rstrip("/")
    if issuer != spec.issuer.rstrip("/"):
        raise ConfigError(
            "the provider's discovery document names another issuer than "
            "'auth.oidc_proxy.issuer': refusing it (RFC 8414 section 3.3)"
        )
    config = provider.oidc_config
    for url in (config.jwks_uri, config.token_endpoint):
        text = str(url) if url is not None else None
        if (
            not settings.is_dev
            and text is not None
            and not text.startswith("https://")
            and not is_loopback_url(text)
        ):
            raise ConfigError(
                f"the provider at {spec.issuer} publishes its keys or token endpoint over "
                "http: prod reaches the identity provider over https:// only"
            )
    return provider


def build_front_door(settings: Settings, environ: Mapping[str, str]) -> FrontDoor:
    """The auth provider for HTTP (None without token settings: dev only, or stdio)."""
    auth = settings.auth
    mapper = ClaimsMapper(auth.claims)
    if not auth.enabled:
        return FrontDoor(provider=None, mapper=mapper)
    _check_public_url(settings)
    _check_provider_urls(settings)
    resource = auth.resource_url(settings.http_path)
    metadata = str(build_resource_metadata_url(AnyHttpUrl(resource))) if resource else None
    if auth.oidc_proxy is not None:
        log.info(
            "sign_in",
            mode="front_door",
            resource=resource,
            provider=auth.oidc_proxy.issuer,
            metadata=metadata,
        )
        return FrontDoor(
            provider=_proxy(settings, environ),
            mapper=mapper,
            resource_url=resource,
            metadata_url=metadata,
        )
    verifier = _token_verifier(settings, resource_path=settings.http_path)
    if verifier is None:
        raise ConfigError("'auth' names no way to verify tokens")
    if auth.authorization_servers and auth.base_url is not None:
        provider: AuthProvider = ResourceServer(
            issuers=list(auth.authorization_servers),
            token_verifier=verifier,
            authorization_servers=[AnyHttpUrl(s) for s in auth.authorization_servers],
            base_url=auth.base_url,
            scopes_supported=scopes_supported(auth),
            resource_name=settings.server_name,
            # What the 401 and 403 challenges ask for: a client's first sign-in asks for
            # these and no more; a tool's own scopes come by step-up.
            challenge_scopes=list(auth.required_scopes),
        )
        provider.required_scopes = list(auth.required_scopes)
        log.info(
            "sign_in",
            mode="resource_server",
            resource=resource,
            authorization_servers=list(auth.authorization_servers),
            metadata=metadata,
            claims_mapping=auth.claims is not None,
        )
        return FrontDoor(provider, mapper, resource_url=resource, metadata_url=metadata)
    if auth.required_scopes:
        verifier = ScopedVerifier(verifier, list(auth.required_scopes))
    return FrontDoor(provider=verifier, mapper=mapper)


__all__ = [
    "FrontDoor",
    "FrontDoorProxy",
    "PlainFrontDoorProxy",
    "ResourceServer",
    "ScopedVerifier",
    "build_front_door",
    "discover",
    "proxy_storage",
    "scopes_supported",
]
