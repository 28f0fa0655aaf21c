"""The ``auth`` section of ``nexus.yaml``: how HTTP callers prove who they are.

Three ways to verify a bearer token, from the simplest (DESIGN.md, "Identity"):

- a shared secret (``jwt_secret``, HS256) or a JWKS (``jwks_url``) for scripts;
- the team's identity provider as the authorization server (``base_url`` and
  ``authorization_servers``): this server is an OAuth 2.1 resource server (RFC 9728
  metadata, the ``WWW-Authenticate`` challenge, tokens bound to its resource URL), and the
  JWKS is discovered from the provider when ``jwks_url`` is not given; opaque tokens are
  checked by RFC 7662 introspection (``introspection``);
- the front door (``oidc_proxy``) for providers without dynamic client registration
  (Entra, Okta, Google ...): this server registers MCP clients itself and signs them in at
  the provider with one pre-registered client id (FastMCP's ``OIDCProxy``).

``claims`` turns a verified token's claims into the principal; ``tool_scopes`` makes tools
require scopes. Pydantic models only: the providers are built in ``identity/oauth.py``.
"""

from __future__ import annotations

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictStr,
    field_validator,
    model_validator,
)

from nexus_mcp.principal import ROLES

DEFAULT_TOKEN_LEEWAY_SECONDS = 30
MAX_TOKEN_LEEWAY_SECONDS = 300  # RFC 7519: "usually no more than a few minutes"
LEGACY_AUDIENCE = "nexus-mcp"
MIN_SECRET_BYTES = 32
# A scope is an RFC 6749 scope-token: visible ASCII without space, quote or backslash. It
# goes into a WWW-Authenticate header, so nothing else may reach it.
_SCOPE_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F)) - {'"', "\\"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _secret_long_enough(value: SecretStr | None) -> SecretStr | None:
    if value is not None and len(value.get_secret_value().encode("utf-8")) < MIN_SECRET_BYTES:
        raise ValueError(f"must be at least {MIN_SECRET_BYTES} bytes")
    return value


def is_scope_token(value: str) -> bool:
    return bool(value) and all(c in _SCOPE_CHARS for c in value)


def _check_scopes(values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        if not is_scope_token(value):
            raise ValueError("a scope is visible ASCII without spaces, quotes or backslashes")
    return values


def check_http_url(value: str, *, path_allowed: bool = True) -> str:
    """An absolute http(s) URL without user info or fragment (RFC 8414/9728 identifiers)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ValueError("should be an http:// or https:// URL") from None
    del port
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("should be an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("should not carry a user name or password")
    if parts.fragment or "#" in value:
        raise ValueError("should not have a fragment")
    if not path_allowed and parts.path not in ("", "/"):
        raise ValueError("should have no path (the MCP path is 'http_path')")
    if parts.query:
        raise ValueError("should not have a query")
    return value


def is_loopback_url(value: str) -> bool:
    """``localhost`` or a loopback IP address (127.0.0.0/8, ::1); a host *name* that only
    starts like one (``127.attacker.example``) resolves wherever its owner wants."""
    host = urlsplit(value).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class IntrospectionSettings(_Section):
    """RFC 7662 introspection for opaque tokens (FastMCP's ``IntrospectionTokenVerifier``)."""

    url: StrictStr
    client_id: StrictStr = Field(min_length=1)
    client_secret: SecretStr
    client_auth_method: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    # 0: every request asks the provider (a revoked token stops at once).
    cache_seconds: int = Field(default=0, ge=0, le=3600)
    timeout_seconds: int = Field(default=10, ge=1, le=60)

    _url = field_validator("url")(check_http_url)


class OIDCProxySettings(_Section):
    """The front door for providers without dynamic client registration (``OIDCProxy``)."""

    # The provider's issuer; its discovery document is <issuer>/.well-known/openid-configuration
    # unless ``config_url`` names another.
    issuer: StrictStr
    config_url: StrictStr | None = None
    # A provider without OIDC discovery (a plain OAuth 2 server): its endpoints and the key
    # set its access tokens are signed with, instead of the discovery document.
    authorization_endpoint: StrictStr | None = None
    token_endpoint: StrictStr | None = None
    jwks_url: StrictStr | None = None
    client_id: StrictStr = Field(min_length=1)
    client_secret: SecretStr | None = None
    # Signs the tokens this server gives MCP clients and encrypts the provider's tokens it
    # keeps: 32+ bytes, the same on every replica.
    signing_key: SecretStr
    # The audience of the provider's access tokens (an API identifier); with
    # ``verify_id_token`` the ID token is checked instead (its audience is client_id).
    audience: StrictStr | None = None
    verify_id_token: bool = False
    algorithm: StrictStr | None = None
    # Scopes asked of the provider when a client asks for none.
    scopes: tuple[StrictStr, ...] = ("openid",)
    # Where MCP clients may be sent back to (patterns such as "http://127.0.0.1:*"); unset:
    # the redirect URIs each client registered, loopback ports free (FastMCP's default).
    allowed_client_redirect_uris: tuple[StrictStr, ...] | None = None
    # always: a consent page bound to the browser before every sign-in (CVE-2026-27124);
    # remember: once per client and redirect URI in the same browser.
    consent: Literal["always", "remember"] = "always"
    redirect_path: StrictStr = "/auth/callback"
    # RFC 8707: pass the client's resource on to the provider (some providers refuse it).
    forward_resource: bool = True
    extra_authorize_params: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    # Lifetime of the tokens this server gives MCP clients; unset: the provider's.
    access_token_ttl_seconds: int | None = Field(default=None, ge=60, le=86_400)
    discovery_timeout_seconds: int = Field(default=10, ge=1, le=60)

    _secret = field_validator("signing_key")(_secret_long_enough)
    _urls = field_validator(
        "issuer", "config_url", "authorization_endpoint", "token_endpoint", "jwks_url"
    )(check_http_url)

    @model_validator(mode="after")
    def _endpoints_together(self) -> OIDCProxySettings:
        given = [
            n
            for n in ("authorization_endpoint", "token_endpoint", "jwks_url")
            if getattr(self, n) is not None
        ]
        if given and len(given) != 3:
            raise ValueError(
                "without discovery give all of authorization_endpoint, token_endpoint and jwks_url"
            )
        if given and (self.config_url is not None or self.verify_id_token):
            raise ValueError(
                "explicit endpoints replace discovery: leave config_url and verify_id_token out"
            )
        return self

    @property
    def discovers(self) -> bool:
        return self.authorization_endpoint is None

    _scopes = field_validator("scopes")(_check_scopes)

    @field_validator("redirect_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/") or value.startswith("//") or "?" in value or "#" in value:
            raise ValueError("should be a path starting with '/'")
        return value


class ClaimRule(_Section):
    """One rule of the claims mapping: when the token matches, the caller gets this role."""

    # Exactly one condition: a group (in any of the group claims), an email (exact, or
    # "*@example.com" for a domain) or a subject.
    group: StrictStr | None = None
    email: StrictStr | None = None
    subject: StrictStr | None = None
    role: StrictStr
    profile: StrictStr | None = None
    read_only: bool = False
    vault_id: StrictStr | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value not in ROLES:
            raise ValueError(f"should be one of {', '.join(ROLES)}")
        return value

    @model_validator(mode="after")
    def _one_condition(self) -> ClaimRule:
        given = [n for n in ("group", "email", "subject") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("a rule needs exactly one of 'group', 'email' or 'subject'")
        return self


class ClaimsMapping(_Section):
    """How verified token claims become the principal (``policy/claims.py``)."""

    subject: StrictStr = "sub"  # the claim naming the caller: sub, email, oid, ...
    groups: tuple[StrictStr, ...] = ("groups", "roles")  # claims holding group names
    email: StrictStr = "email"
    scopes: tuple[StrictStr, ...] = ("scope", "scp")
    # First match wins. No match: the caller gets nothing (never viewer by accident),
    # unless ``default_role`` says otherwise.
    rules: tuple[ClaimRule, ...] = ()
    default_role: StrictStr | None = None
    default_profile: StrictStr | None = None
    # Subjects from different providers must not meet: "google:" + sub.
    subject_prefix: StrictStr = ""

    @field_validator("default_role")
    @classmethod
    def _known_default(cls, value: str | None) -> str | None:
        if value is not None and value not in ROLES:
            raise ValueError(f"should be one of {', '.join(ROLES)}")
        return value


class AuthSettings(_Section):
    """Bearer-token verification on HTTP (FastMCP's verifiers and OAuth providers)."""

    jwt_secret: SecretStr | None = Field(default=None, description="HS256 shared secret")
    jwks_url: str | None = Field(default=None, description="JWKS URL for asymmetric tokens")
    algorithm: str = "HS256"
    # The audiences a token must name one of. Unset: the resource URL when ``base_url``
    # is set (RFC 8707: a token for another resource is refused), else "nexus-mcp".
    audience: str | tuple[str, ...] | None = None
    issuer: str | None = None
    # RFC 7519 4.1.5/4.1.6: how far an issuer's clock may run ahead before a token whose
    # nbf or iat lies in the future is refused. exp itself is never extended.
    leeway_seconds: int = Field(
        default=DEFAULT_TOKEN_LEEWAY_SECONDS, ge=0, le=MAX_TOKEN_LEEWAY_SECONDS
    )
    # Off: a token without exp would be valid forever once leaked.
    allow_tokens_without_exp: bool = False
    # The public address clients reach this server at (scheme, host, port, no path): the
    # protected resource is base_url + http_path (RFC 9728).
    base_url: str | None = None
    authorization_servers: tuple[str, ...] = ()
    scopes_supported: tuple[str, ...] = ()
    # Scopes every request needs (the challenge asks for them).
    required_scopes: tuple[str, ...] = ()
    # Tool name (or fnmatch pattern) -> scopes a call needs beyond what its profile grants.
    tool_scopes: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # Start-up reads the authorization server's metadata within this long, in all.
    discovery_timeout_seconds: int = Field(default=10, ge=1, le=60)
    introspection: IntrospectionSettings | None = None
    oidc_proxy: OIDCProxySettings | None = None
    claims: ClaimsMapping | None = None

    _secret = field_validator("jwt_secret")(_secret_long_enough)
    _scopes = field_validator("scopes_supported", "required_scopes")(_check_scopes)

    @field_validator("base_url")
    @classmethod
    def _base(cls, value: str | None) -> str | None:
        return None if value is None else check_http_url(value, path_allowed=False).rstrip("/")

    @field_validator("authorization_servers")
    @classmethod
    def _servers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_http_url(v) for v in value)

    @field_validator("tool_scopes")
    @classmethod
    def _tool_scopes(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for pattern, scopes in value.items():
            if not pattern:
                raise ValueError("a tool name or pattern cannot be empty")
            if not scopes:
                raise ValueError("each tool needs at least one scope")
            _check_scopes(scopes)
        return value

    @model_validator(mode="after")
    def _coherent(self) -> AuthSettings:
        ways = [
            n for n in ("jwt_secret", "introspection", "oidc_proxy") if getattr(self, n) is not None
        ]
        if len(ways) > 1:
            raise ValueError(f"choose one way to verify tokens, not {' and '.join(ways)}")
        if self.jwt_secret is not None and self.jwks_url is not None:
            raise ValueError("choose one way to verify tokens, not jwt_secret and jwks_url")
        if self.oidc_proxy is not None and self.base_url is None:
            raise ValueError("'oidc_proxy' needs 'base_url' (where the provider sends users back)")
        if self.authorization_servers and self.base_url is None:
            raise ValueError("'authorization_servers' needs 'base_url' (the protected resource)")
        if self.oidc_proxy is not None and self.authorization_servers:
            raise ValueError(
                "with 'oidc_proxy' this server is the authorization server: "
                "leave 'authorization_servers' out"
            )
        if (self.authorization_servers or self.oidc_proxy is not None) and self.claims is None:
            # The provider signs in everyone it knows, and its tokens carry no role of
            # ours: without a mapping each of them would be a viewer by accident.
            raise ValueError(
                "signing in at an identity provider needs 'claims' (its rules say who gets "
                "which role; 'default_role' lets every user of the provider in)"
            )
        if self.introspection is not None and self.jwks_url is not None:
            raise ValueError("choose one way to verify tokens, not introspection and jwks_url")
        return self

    @property
    def enabled(self) -> bool:
        return (
            self.jwt_secret is not None
            or self.jwks_url is not None
            or self.introspection is not None
            or self.oidc_proxy is not None
            or bool(self.authorization_servers)
        )

    def resource_url(self, http_path: str) -> str | None:
        """The protected resource (RFC 9728 ``resource``): the MCP endpoint's public URL."""
        if self.base_url is None:
            return None
        return self.base_url + "/" + http_path.lstrip("/")

    def audiences(self, http_path: str) -> str | list[str]:
        if self.audience is not None:
            return self.audience if isinstance(self.audience, str) else list(self.audience)
        return self.resource_url(http_path) or LEGACY_AUDIENCE


__all__ = [
    "DEFAULT_TOKEN_LEEWAY_SECONDS",
    "LEGACY_AUDIENCE",
    "MAX_TOKEN_LEEWAY_SECONDS",
    "AuthSettings",
    "ClaimRule",
    "ClaimsMapping",
    "IntrospectionSettings",
    "OIDCProxySettings",
    "check_http_url",
    "is_loopback_url",
    "is_scope_token",
]
