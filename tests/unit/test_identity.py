"""Who a request speaks for, per transport and mode."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_mcp.identity import IdentityResolver, session_key
from nexus_mcp.principal import Principal, principal_from_claims, to_log_subject
from nexus_mcp.settings import Settings


def resolver(**values: Any) -> IdentityResolver:
    return IdentityResolver(Settings(**values))


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
    assert session_key(alice, session_id="s1", protocol="2025-11-25") == "session:s1"
    assert session_key(alice, session_id="s1", protocol="2026-07-28") == "principal:alice"
