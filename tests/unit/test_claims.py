"""Claims to principal (``policy/claims.py``) and the ``auth`` section's own checks."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from nexus_mcp.policy.auth_settings import AuthSettings, ClaimsMapping
from nexus_mcp.policy.claims import MAX_CLAIM_VALUES, ClaimsMapper, map_claims

SECRET = "s" * 32
MAPPING = ClaimsMapping.model_validate(
    {
        "subject": "email",
        "rules": [
            {"group": "nexus-admins", "role": "admin"},
            {"group": "engineering", "role": "editor", "profile": "coding"},
            {"email": "*@readers.example", "role": "viewer", "read_only": True},
            {"subject": "ops@example.com", "role": "evaluator", "vault_id": "v-ops"},
        ],
    }
)


def claims(**values: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"sub": "u-1", "email": "ada@example.com", "groups": ["engineering"]}
    base.update(values)
    return {k: v for k, v in base.items() if v is not None}


def test_the_first_matching_rule_gives_role_and_profile() -> None:
    principal = map_claims(MAPPING, claims(groups=["engineering", "nexus-admins"]))
    assert principal is not None
    assert (principal.subject, principal.role, principal.profile) == (
        "ada@example.com",
        "admin",
        None,
    )
    editor = map_claims(MAPPING, claims())
    assert editor is not None and (editor.role, editor.profile) == ("editor", "coding")
    assert editor.source == "token"


@pytest.mark.parametrize(
    "groups",
    [
        ["contractors"],
        [],
        None,
        "engineering-x",
        ["Engineering"],  # names are compared exactly
        [["engineering"]],  # a nested list is not a group name
        [{"name": "engineering"}],
        42,
        True,
    ],
)
def test_an_unknown_group_gets_nothing(groups: Any) -> None:
    assert map_claims(MAPPING, claims(groups=groups)) is None


def test_a_group_may_come_as_one_string_or_from_another_group_claim() -> None:
    assert map_claims(MAPPING, claims(groups="engineering")) is not None
    principal = map_claims(MAPPING, claims(groups=None, roles=["nexus-admins"]))
    assert principal is not None and principal.role == "admin"


def test_a_group_list_is_read_only_so_far() -> None:
    many = [f"g{i}" for i in range(MAX_CLAIM_VALUES)] + ["nexus-admins"]
    assert map_claims(MAPPING, claims(groups=many)) is None


@pytest.mark.parametrize(
    ("email", "verified", "matches"),
    [
        ("bo@readers.example", None, True),
        ("bo@READERS.example", None, True),
        ("bo@readers.example", True, True),
        ("bo@readers.example", False, False),  # unverified: names nobody
        ("bo@readers.example.evil", None, False),
        ("bo@evil-readers.example", None, False),
        ("readers.example@evil.test", None, False),
        ("bo@x@readers.example", None, True),  # the domain after the last @
    ],
)
def test_email_domain_rules(email: str, verified: bool | None, matches: bool) -> None:
    mapping_by_sub = MAPPING.model_copy(update={"subject": "sub"})
    principal = map_claims(mapping_by_sub, claims(email=email, email_verified=verified, groups=[]))
    assert (principal is not None) == matches
    if principal is not None:
        assert principal.read_only and principal.role == "viewer"


def test_a_subject_rule_and_its_vault() -> None:
    principal = map_claims(MAPPING, claims(email="ops@example.com", groups=[]))
    assert principal is not None
    assert (principal.role, principal.vault_id) == ("evaluator", "v-ops")


@pytest.mark.parametrize("subject", [None, "", "   ", 7, ["a"], {"a": 1}, "x" * 600])
def test_no_usable_subject_gets_nothing(subject: Any) -> None:
    assert map_claims(MAPPING, claims(email=subject)) is None


def test_scopes_come_from_the_token_only() -> None:
    principal = map_claims(MAPPING, claims(scope="files:read files:write"))
    assert principal is not None and principal.scopes == {"files:read", "files:write"}
    principal = map_claims(MAPPING, claims(scp=["a", "b", 3]))
    assert principal is not None and principal.scopes == {"a", "b"}
    principal = map_claims(MAPPING, claims())
    assert principal is not None and principal.scopes == frozenset()


def test_default_role_and_subject_prefix() -> None:
    mapping = MAPPING.model_copy(update={"default_role": "viewer", "subject_prefix": "okta:"})
    principal = map_claims(mapping, claims(groups=["contractors"]))
    assert principal is not None
    assert (principal.subject, principal.role) == ("okta:ada@example.com", "viewer")


def test_without_a_mapping_the_claims_name_the_fields() -> None:
    principal = map_claims(None, {"sub": "bot", "role": "editor", "scope": "a b"})
    assert principal is not None
    assert (principal.subject, principal.role, principal.scopes) == ("bot", "editor", {"a", "b"})


def test_a_token_is_mapped_once_until_it_expires() -> None:
    mapper = ClaimsMapper(MAPPING)
    first = mapper.principal(claims(), token="tok-1", expires_at=None)
    # The same token: the kept answer, even though these claims would map otherwise.
    again = mapper.principal(claims(groups=["nexus-admins"]), token="tok-1")
    assert again is first
    other = mapper.principal(claims(groups=["nexus-admins"]), token="tok-2")
    assert other is not None and other.role == "admin"
    # An expired token's answer is not kept.
    gone = mapper.principal(claims(), token="tok-3", expires_at=1.0)
    assert mapper.principal(claims(groups=[]), token="tok-3", expires_at=1.0) is None
    assert gone is not None


@pytest.mark.parametrize(
    ("auth", "words"),
    [
        ({"jwt_secret": SECRET, "oidc_proxy": {}}, "oidc_proxy"),
        ({"jwt_secret": SECRET, "jwks_url": "https://x/jwks"}, "choose one way"),
        ({"authorization_servers": ["https://idp.example"]}, "needs 'base_url'"),
        ({"base_url": "https://n.example/mcp", "jwt_secret": SECRET}, "no path"),
        ({"base_url": "ftp://n.example", "jwt_secret": SECRET}, "http"),
        ({"base_url": "https://u:p@n.example", "jwt_secret": SECRET}, "user name"),
        ({"authorization_servers": ["https://i#frag"], "base_url": "https://n"}, "fragment"),
        ({"jwt_secret": SECRET, "required_scopes": ['a"b']}, "scope"),
        ({"jwt_secret": SECRET, "tool_scopes": {"x": ["a b"]}}, "scope"),
        ({"jwt_secret": SECRET, "tool_scopes": {"x": []}}, "at least one"),
        ({"jwt_secret": SECRET, "claims": {"rules": [{"role": "admin"}]}}, "exactly one"),
        (
            {"jwt_secret": SECRET, "claims": {"rules": [{"group": "g", "role": "root"}]}},
            "one of",
        ),
        (
            {
                "jwt_secret": SECRET,
                "claims": {"rules": [{"group": "g", "email": "e", "role": "admin"}]},
            },
            "exactly one",
        ),
        ({"jwt_secret": SECRET, "claims": {"default_role": "superuser"}}, "one of"),
    ],
)
def test_incoherent_auth_sections_are_refused(auth: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        AuthSettings.model_validate(auth)
    assert words in str(caught.value)


def test_the_proxy_needs_a_long_signing_key_and_a_base_url() -> None:
    proxy = {"issuer": "https://idp.example", "client_id": "c", "signing_key": "short"}
    with pytest.raises(ValidationError, match="32 bytes"):
        AuthSettings.model_validate({"base_url": "https://n.example", "oidc_proxy": proxy})
    proxy["signing_key"] = "k" * 32
    with pytest.raises(ValidationError, match="base_url"):
        AuthSettings.model_validate({"oidc_proxy": proxy})
    auth = AuthSettings.model_validate(
        {"base_url": "https://n.example/", "oidc_proxy": proxy, "claims": {}}
    )
    assert auth.enabled and auth.resource_url("/mcp") == "https://n.example/mcp"


def test_the_audience_defaults_to_the_resource_url() -> None:
    assert AuthSettings(jwt_secret=SECRET).audiences("/mcp") == "nexus-mcp"
    auth = AuthSettings(jwt_secret=SECRET, base_url="https://n.example")
    assert auth.audiences("/mcp") == "https://n.example/mcp"
    both = AuthSettings(jwt_secret=SECRET, base_url="https://n.example", audience=("a", "b"))
    assert both.audiences("/mcp") == ["a", "b"]
