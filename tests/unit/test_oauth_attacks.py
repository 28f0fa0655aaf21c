"""Attacks on the claims mapping (``policy/claims.py``) that found defects.

- With ``subject: email`` (the documented mapping for providers whose ``sub`` is opaque)
  the subject came from the email claim even when the provider said it was unverified:
  anyone who could set an unverified address (a multi-tenant provider, a self-service
  profile) took over that address's subject rules, direct grants and profile assignment.
- ``email_verified`` sent as the string ``"false"`` (some providers and userinfo bridges
  do) counted as verified.
- A group list longer than the part read (``MAX_CLAIM_VALUES``) lost its tail, so padding
  one's own groups pushed a restrictive rule's group out of sight and a later, wider rule
  matched instead: an over-long list now gets nothing (fail closed).
- The front door's state folder (``<data_dir>/oauth``) was not among the server state the
  file tools never reach, so serving the data dir itself put the proxy's records (client
  registrations, transactions, codes, upstream tokens: encrypted, but deletable) in reach.
- ``is_loopback_url`` took any host name starting with ``127.`` for loopback, so prod
  accepted ``http://127.attacker.example`` as the public address (tokens and codes over
  plain http) and as the provider's key set URL.
- Email rules compared with ``str.lower``, which maps the KELVIN SIGN onto ``k``: a
  verified address at a look-alike (IDN) domain matched another domain's rule.
- Prod took plain-http provider URLs (``authorization_servers``, ``jwks_url``, the
  introspection URL, the front door's issuer, config URL and endpoints): whoever is on
  the path names the key set or answers introspection. Only a discovered ``jwks_uri``
  was checked, from a document that itself could come over http.
- Signing in at a provider (``authorization_servers``, ``oidc_proxy``) without
  ``auth.claims`` made every user the provider knows a viewer (no ``role`` claim: the
  fallback role); now start-up asks for the mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from nexus_mcp.errors import ConfigError, InvalidPathError
from nexus_mcp.identity.oauth import build_front_door, proxy_storage
from nexus_mcp.policy.auth_settings import AuthSettings, ClaimsMapping, is_loopback_url
from nexus_mcp.policy.claims import MAX_CLAIM_VALUES, ClaimsMapper, map_claims
from nexus_mcp.settings import Settings
from nexus_mcp.stores.locations import server_state_paths
from nexus_mcp.workspace.files import Workspace

BY_EMAIL = ClaimsMapping.model_validate(
    {
        "subject": "email",
        "rules": [
            {"subject": "ops@example.com", "role": "admin", "vault_id": "v-ops"},
            {"group": "engineering", "role": "editor"},
        ],
    }
)


@pytest.mark.parametrize("verified", [False, "false", "FALSE"])
def test_an_unverified_email_is_never_the_subject(verified: Any) -> None:
    forged = {"sub": "u-9", "email": "ops@example.com", "email_verified": verified}
    assert map_claims(BY_EMAIL, forged) is None
    # Not through a group rule either: the subject would still be the address.
    assert map_claims(BY_EMAIL, {**forged, "groups": ["engineering"]}) is None
    assert ClaimsMapper(BY_EMAIL).principal(forged, token="t-" + str(verified)) is None


def test_a_verified_or_silent_email_is_the_subject() -> None:
    for verified in (True, "true", None):
        claims = {"sub": "u-1", "email": "ops@example.com", "email_verified": verified}
        principal = map_claims(BY_EMAIL, {k: v for k, v in claims.items() if v is not None})
        assert principal is not None
        assert (principal.subject, principal.role) == ("ops@example.com", "admin")


@pytest.mark.parametrize("verified", ["false", "False", "no", 0])
def test_an_email_rule_needs_a_verified_email_whatever_the_claim_type(verified: Any) -> None:
    mapping = ClaimsMapping.model_validate(
        {"rules": [{"email": "*@corp.example", "role": "editor"}]}
    )
    claims = {"sub": "u-2", "email": "eve@corp.example", "email_verified": verified}
    assert map_claims(mapping, claims) is None


def test_padding_the_group_list_cannot_hide_a_restrictive_rule() -> None:
    mapping = ClaimsMapping.model_validate(
        {
            "rules": [
                {"group": "contractors", "role": "viewer", "read_only": True},
                {"email": "*@corp.example", "role": "editor"},
            ]
        }
    )
    claims = {"sub": "u-3", "email": "c@corp.example", "email_verified": True}
    honest = map_claims(mapping, {**claims, "groups": ["contractors"]})
    assert honest is not None and honest.read_only
    padded = [f"g{i}" for i in range(MAX_CLAIM_VALUES)] + ["contractors"]
    principal = map_claims(mapping, {**claims, "groups": padded})
    assert principal is None or (principal.read_only and principal.role == "viewer")


async def test_the_front_doors_state_is_out_of_the_file_tools_reach(tmp_path: Path) -> None:
    """Served folder == data dir (accepted in prod): the proxy's records were in reach."""
    settings = Settings(mode="prod", transport="http", workspace=tmp_path, data_dir=tmp_path)
    store = proxy_storage(settings, {}, b"k" * 43 + b"=")
    await store.put(collection="clients", key="c-1", value={"client_id": "c-1"})
    written = [p for p in (tmp_path / "oauth").rglob("*") if p.is_file()]
    assert written
    workspace = Workspace(tmp_path, hidden=server_state_paths(settings, tmp_path))
    for path in [tmp_path / "oauth", *written]:
        with pytest.raises(InvalidPathError):
            workspace.resolve(str(path.relative_to(tmp_path)), must_exist=True)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.attacker.example",
        "http://127.0.0.1.nip.io:8000",
        "http://127-0-0-1.attacker.example",
        "http://localhost.attacker.example",
    ],
)
def test_a_host_name_that_only_starts_like_loopback_is_not_loopback(
    tmp_path: Path, url: str
) -> None:
    assert not is_loopback_url(url)
    # So prod refuses it as the public address, as any other http:// one.
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=tmp_path,
        data_dir=tmp_path / "data",
        auth={"jwt_secret": "s" * 32, "base_url": url},
    )
    with pytest.raises(ConfigError, match=r"auth\.base_url"):
        build_front_door(settings, {})


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://127.1.2.3", "http://localhost:1", "http://[::1]:9"]
)
def test_loopback_addresses_are_loopback(url: str) -> None:
    assert is_loopback_url(url)


@pytest.mark.parametrize(
    "auth",
    [
        {"base_url": "https://n.example", "authorization_servers": ["https://idp.example"]},
        {
            "base_url": "https://n.example",
            "oidc_proxy": {
                "issuer": "https://idp.example",
                "client_id": "c",
                "signing_key": "k" * 32,
            },
        },
    ],
)
def test_signing_in_at_a_provider_needs_a_claims_mapping(auth: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="needs 'claims'"):
        AuthSettings.model_validate(auth)
    # Letting every user of the provider in is a choice made in words.
    assert AuthSettings.model_validate({**auth, "claims": {"default_role": "viewer"}}).enabled


@pytest.mark.parametrize(
    ("rule", "email"),
    [
        ("karen@corp.example", "\u212aaren@corp.example"),  # KELVIN SIGN lowers to "k"
        ("*@kpmg.example", "bob@\u212apmg.example"),  # an IDN domain anyone may register
    ],
)
def test_an_email_rule_folds_ascii_case_only(rule: str, email: str) -> None:
    """``str.lower`` maps some non-ASCII letters onto ASCII ones: a verified address at a
    look-alike domain (or mailbox) matched another's rule."""
    mapping = ClaimsMapping.model_validate({"rules": [{"email": rule, "role": "admin"}]})
    claims = {"sub": "u-4", "email": email, "email_verified": True}
    assert map_claims(mapping, claims) is None
    # ASCII case still folds (RFC 5321 domains are case-insensitive).
    ascii_email = "KAREN@CORP.EXAMPLE" if "karen" in rule else "bob@KPMG.example"
    assert map_claims(mapping, {**claims, "email": ascii_email}) is not None


def _prod_auth(tmp_path: Path, **auth: Any) -> Settings:
    return Settings(
        mode="prod",
        transport="http",
        workspace=tmp_path,
        data_dir=tmp_path / "data",
        auth={"claims": {"default_role": "viewer"}, **auth},
    )


PROXY = {"client_id": "c", "signing_key": "k" * 32}


@pytest.mark.parametrize(
    "auth",
    [
        # The metadata document over plain http: whoever is on the path names the key set
        # (the issuer check passes, the copy names the issuer it was asked for).
        {"base_url": "https://n.example", "authorization_servers": ["http://idp.invalid"]},
        {
            "base_url": "https://n.example",
            "authorization_servers": ["https://idp.invalid"],
            "jwks_url": "http://keys.invalid/jwks",
        },
        {"jwks_url": "http://keys.invalid/jwks"},
        {
            "introspection": {
                "url": "http://idp.invalid/introspect",
                "client_id": "c",
                "client_secret": "client-secret",
            }
        },
        {"base_url": "https://n.example", "oidc_proxy": {"issuer": "http://idp.invalid", **PROXY}},
        {
            "base_url": "https://n.example",
            "oidc_proxy": {
                "issuer": "https://idp.invalid",
                "config_url": "http://idp.invalid/.well-known/openid-configuration",
                **PROXY,
            },
        },
        {
            "base_url": "https://n.example",
            "oidc_proxy": {
                "issuer": "https://idp.invalid",
                "authorization_endpoint": "https://idp.invalid/authorize",
                "token_endpoint": "http://idp.invalid/token",
                "jwks_url": "https://idp.invalid/jwks",
                **PROXY,
            },
        },
    ],
)
def test_prod_reaches_the_provider_over_https_only(tmp_path: Path, auth: dict[str, Any]) -> None:
    """Keys, metadata, introspection answers and the client secret travel these URLs: over
    plain http anyone on the path forges tokens' acceptance. Refused before any request."""
    with pytest.raises(ConfigError, match="https://"):
        build_front_door(_prod_auth(tmp_path, **auth), {})
