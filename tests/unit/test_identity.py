"""Who a request speaks for, per transport and mode."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.identity.resolver import IdentityResolver, build_identity, session_key
from nexus_mcp.policy.launch import LAUNCH_FIELDS
from nexus_mcp.policy.profiles import load_profiles, select_profile
from nexus_mcp.principal import Principal, principal_from_claims, to_log_subject
from nexus_mcp.settings import Settings

PROFILES = load_profiles()


def profile_of(principal: Principal) -> str | None:
    """The namespace's selection for a subject with no stored assignment."""
    return select_profile(
        PROFILES,
        principal_profile=principal.profile,
        stored_assignment=None,
        role=principal.effective_role,
    ).name


def resolver(**values: Any) -> IdentityResolver:
    return build_identity(Settings(**values), profiles=PROFILES, profile_of=profile_of)


def test_stdio_uses_the_launch_principal() -> None:
    p = resolver(subject="alice", role="editor", vault_id="v1").resolve(
        transport="stdio", token_claims=None, token_subject=None
    )
    assert p is not None and (p.subject, p.role, p.vault_id, p.source) == (
        "alice",
        "editor",
        "v1",
        "env",
    )


def test_prod_without_identity_has_no_principal() -> None:
    r = resolver(mode="prod")
    assert r.resolve(transport="stdio", token_claims=None, token_subject=None) is None
    assert r.resolve(transport=None, token_claims=None, token_subject=None) is None


def test_dev_falls_back_to_the_configured_default_principal() -> None:
    p = resolver(mode="dev").resolve(transport=None, token_claims=None, token_subject=None)
    assert p is not None and (p.subject, p.role, p.profile, p.source) == (
        "dev",
        "admin",
        "full",
        "dev-default",
    )


def test_http_uses_only_verified_claims_never_the_launch_environment() -> None:
    r = resolver(mode="prod", subject="env-admin", role="admin", auth={"jwt_secret": "x" * 32})
    p = r.resolve(
        transport="streamable-http",
        token_claims={"sub": "carol", "role": "viewer", "vault_id": "v9"},
        token_subject="carol",
    )
    assert p is not None and (p.subject, p.role, p.vault_id, p.source) == (
        "carol",
        "viewer",
        "v9",
        "token",
    )
    assert r.resolve(transport="streamable-http", token_claims=None, token_subject=None) is None


@pytest.mark.parametrize(
    ("role", "effective"), [("admin", "admin"), ("superuser", "viewer"), ("", "viewer")]
)
def test_unknown_roles_get_no_more_than_viewer(role: str, effective: str) -> None:
    p = principal_from_claims({"sub": "x", "role": role})
    assert p is not None and p.effective_role == effective


def test_claims_map_scopes_and_read_only() -> None:
    p = principal_from_claims(
        {"sub": "x", "scope": "a b", "read_only": True, "canister_user_id": "c1", "user_id": "u1"}
    )
    assert (
        p is not None
        and p.scopes == frozenset({"a", "b"})
        and p.read_only
        and p.canister_user == "c1"
    )


def test_secret_looking_subjects_are_hashed_for_logs() -> None:
    assert to_log_subject("alice") == "alice"
    hashed = to_log_subject("sk-live-0123456789abcdef")
    assert hashed.startswith("sha256:") and "0123456789" not in hashed


def test_session_key_uses_the_session_only_in_the_handshake_era() -> None:
    alice = Principal(subject="alice")
    assert session_key(alice, session_id="s1", protocol="2025-11-25") == "session:alice:s1"
    assert session_key(alice, session_id="s1", protocol="2026-07-28") == "principal:alice"
    # Stateless HTTP issues no session: a client-chosen id keys nothing.
    assert (
        session_key(alice, session_id="s1", protocol="2025-11-25", stateless=True)
        == "principal:alice"
    )


GIVEN = {
    "role": "viewer",
    "profile": "minimal",
    "read_only": True,
    "scopes": "notes:read",
    "vault_id": "v1",
    "user_id": "u1",
    "canister_user_id": "c1",
}


@pytest.mark.parametrize("name", LAUNCH_FIELDS)
def test_a_prod_stdio_server_refuses_a_launch_setting_without_a_subject(name: str) -> None:
    with pytest.raises(ConfigError, match="NEXUS_MCP_SUBJECT"):
        resolver(mode="prod", **{name: GIVEN[name]})


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"read_only": True}, ("dev", "admin", "full", True)),
        ({"profile": "minimal"}, ("dev", "admin", "minimal", False)),
        ({"role": "viewer"}, ("dev", "viewer", "minimal", False)),
    ],
)
def test_dev_launch_settings_without_a_subject_narrow_the_dev_principal(
    given: dict[str, Any], expected: tuple[str, str, str, bool]
) -> None:
    r = resolver(mode="dev", **given)
    p = r.resolve(transport="stdio", token_claims=None, token_subject=None)
    assert p is not None and (p.subject, p.role, p.profile, p.read_only) == expected
    assert r.narrowed_by == tuple(given)
    # The same narrowed principal serves unverified HTTP callers (dev without a verifier).
    assert r.resolve(transport="streamable-http", token_claims=None, token_subject=None) == p
    assert r.ignored == ()


def test_dev_launch_settings_refuse_to_widen_a_dev_principal_configured_narrower() -> None:
    narrow = {"role": "viewer", "profile": "minimal"}
    with pytest.raises(ConfigError, match="NEXUS_MCP_ROLE"):
        resolver(mode="dev", dev_principal=narrow, role="admin")
    with pytest.raises(ConfigError, match="NEXUS_MCP_PROFILE"):
        resolver(mode="dev", dev_principal=narrow, profile="full")


def test_a_subject_makes_the_launch_settings_a_principal_and_leaves_the_dev_default_alone() -> None:
    r = resolver(mode="dev", subject="alice", role="viewer", read_only=True)
    assert r.launch is not None and (r.launch.subject, r.launch.read_only) == ("alice", True)
    assert r.dev_default is not None and r.dev_default.read_only is False
    assert r.narrowed_by == ()


@pytest.mark.parametrize("mode", ["dev", "prod"])
def test_on_http_with_tokens_launch_settings_are_reported_as_not_applying(mode: str) -> None:
    auth = {"jwt_secret": "s" * 32}
    r = resolver(mode=mode, transport="http", auth=auth, read_only=True, role="viewer")
    assert r.ignored == ("role", "read_only")
    assert r.describe("http") == {"transport": "http", "source": "token", "tokens_decide": True}
    assert r.resolve(transport="streamable-http", token_claims=None, token_subject=None) is None
    with_subject = resolver(mode="prod", transport="http", auth=auth, subject="svc", role="admin")
    assert with_subject.ignored == ("subject", "role")


def test_a_launch_principal_on_dev_http_without_tokens_is_reported_as_not_applying() -> None:
    r = resolver(mode="dev", transport="http", subject="alice")
    assert r.ignored == ("subject",)
    assert r.describe("http")["source"] == "dev-default"


def test_the_start_up_description_names_the_principal_and_hashes_secret_looking_subjects() -> None:
    secret = "sk-live-0123456789abcdef0123"
    described = resolver(mode="prod", subject=secret, role="editor", read_only=True).describe(
        "stdio"
    )
    assert described == {
        "transport": "stdio",
        "source": "env",
        "subject": to_log_subject(secret),
        "role": "editor",
        "profile": None,
        "read_only": True,
        "scopes": [],
    }
    assert secret not in repr(described)
    assert resolver(mode="prod").describe("stdio") == {
        "transport": "stdio",
        "source": "none",
        "subject": None,
    }
    narrowed = resolver(mode="dev", read_only=True).describe("stdio")
    assert (narrowed["source"], narrowed["narrowed_by"]) == ("dev-default", ["read_only"])
