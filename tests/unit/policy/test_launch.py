"""Launch settings without a subject: prod refuses them, dev applies them only to narrow."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from nexus_mcp.cli import build_parser
from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.launch import (
    ENV_PREFIX,
    LAUNCH_FIELDS,
    SUBJECT,
    LaunchFields,
    narrow_principal,
    require_subject,
)
from nexus_mcp.policy.profiles import ToolProfileConfig, load_profiles, select_profile
from nexus_mcp.principal import ROLES, Principal, is_role_within
from nexus_mcp.settings import ENV_PREFIX as SETTINGS_ENV_PREFIX
from nexus_mcp.settings import Settings

PROFILES = load_profiles()  # the shipped file: minimal < coding < execution < full, search
DEV = Principal(subject="dev", role="admin", profile="full", source="dev-default")


def narrow(
    base: Principal = DEV, approver_roles: tuple[str, ...] = ("admin",), **given: Any
) -> Principal:
    return narrow_principal(
        base,
        LaunchFields.from_values(given),
        profiles=PROFILES,
        base_profile=seen_profile(base, PROFILES),
        approver_roles=approver_roles,
    )


def seen_profile(
    principal: Principal, profiles: ToolProfileConfig, assignment: str | None = None
) -> str | None:
    """The profile the namespace selects (access.GrantedTools.select, without a store)."""
    return select_profile(
        profiles,
        principal_profile=principal.profile,
        stored_assignment=assignment,
        role=principal.effective_role,
    ).name


def seen_tools(principal: Principal, assignment: str | None = None) -> frozenset[str]:
    name = seen_profile(principal, PROFILES, assignment)
    return PROFILES.profiles[name].tools if name is not None else frozenset()


def refused_setting(excinfo: pytest.ExceptionInfo[ConfigError]) -> str:
    """The setting a refusal names first (its environment variable)."""
    message = str(excinfo.value)
    assert "\n" not in message
    return message.split("(", 1)[1].split(" /", 1)[0]


@pytest.mark.parametrize(
    ("values", "given"),
    [
        ({}, ()),
        ({"read_only": False, "scopes": "", "role": "  ", "profile": None}, ()),
        ({"read_only": "false", "scopes": " , "}, ()),
        ({"read_only": "true"}, ("read_only",)),
        ({"scopes": "a, b"}, ("scopes",)),
        ({"subject": "alice"}, ()),
        (
            {
                "role": "viewer",
                "profile": "minimal",
                "vault_id": "v",
                "user_id": "u",
                "canister_user_id": "c",
                "read_only": True,
                "scopes": "a",
            },
            LAUNCH_FIELDS,
        ),
    ],
)
def test_only_settings_that_say_something_count_as_given(
    values: dict[str, Any], given: tuple[str, ...]
) -> None:
    assert LaunchFields.from_values(values).given == given


@pytest.mark.parametrize("name", LAUNCH_FIELDS)
def test_prod_refuses_every_launch_setting_without_a_subject_naming_both(name: str) -> None:
    value: Any = True if name == "read_only" else "x"
    with pytest.raises(ConfigError) as excinfo:
        require_subject(LaunchFields.from_values({name: value}))
    assert refused_setting(excinfo) == ENV_PREFIX + name.upper()
    assert "NEXUS_MCP_SUBJECT" in str(excinfo.value)


def test_prod_names_every_setting_that_needs_a_subject() -> None:
    with pytest.raises(ConfigError) as excinfo:
        require_subject(LaunchFields.from_values({"role": "viewer", "read_only": True}))
    assert "NEXUS_MCP_ROLE" in str(excinfo.value) and "NEXUS_MCP_READ_ONLY" in str(excinfo.value)


@pytest.mark.parametrize(
    "values", [{}, {"subject": "alice", "role": "admin"}, {"read_only": False, "scopes": ""}]
)
def test_prod_accepts_a_subject_or_nothing(values: dict[str, Any]) -> None:
    require_subject(LaunchFields.from_values(values))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"read_only": True}, ("admin", "full", True)),
        ({"role": "viewer"}, ("viewer", "minimal", False)),
        ({"role": "editor"}, ("editor", "coding", False)),
        ({"role": "evaluator"}, ("evaluator", "search", False)),
        ({"role": "admin"}, ("admin", "full", False)),
        ({"role": "superuser"}, ("viewer", "minimal", False)),
        ({"profile": "minimal"}, ("admin", "minimal", False)),
        ({"profile": "full"}, ("admin", "full", False)),
        ({"profile": "search", "role": "viewer"}, ("viewer", "search", False)),
        ({"role": "viewer", "read_only": True}, ("viewer", "minimal", True)),
    ],
)
def test_the_default_dev_principal_takes_each_narrowing(
    given: dict[str, Any], expected: tuple[str, str, bool]
) -> None:
    p = narrow(**given)
    assert (p.role, p.profile, p.read_only) == expected
    assert (p.subject, p.source) == ("dev", "dev-default")


NARROW_DEV = Principal(subject="dev", role="viewer", profile="minimal", source="dev-default")


@pytest.mark.parametrize(
    ("base", "given", "setting"),
    [
        (NARROW_DEV, {"role": "admin"}, "role"),
        (NARROW_DEV, {"role": "editor"}, "role"),
        (NARROW_DEV, {"role": "evaluator"}, "role"),
        (NARROW_DEV, {"profile": "full"}, "profile"),
        (NARROW_DEV, {"profile": "coding"}, "profile"),
        (NARROW_DEV, {"read_only": True, "profile": "full"}, "profile"),
        (NARROW_DEV, {"scopes": "admin"}, "scopes"),
        (dataclasses.replace(DEV, role="editor", profile="coding"), {"role": "evaluator"}, "role"),
        (dataclasses.replace(DEV, role="evaluator", profile="search"), {"role": "editor"}, "role"),
        # The role narrows, but its profile and the dev profile do not nest.
        (dataclasses.replace(DEV, profile="search"), {"role": "editor"}, "role"),
        (DEV, {"profile": "no-such-profile"}, "profile"),
        (dataclasses.replace(DEV, vault_id="v1"), {"vault_id": "v2"}, "vault_id"),
        (dataclasses.replace(DEV, user_id="u1"), {"user_id": "u2"}, "user_id"),
        (dataclasses.replace(DEV, user_id="u1"), {"canister_user_id": "c2"}, "canister_user_id"),
        (dataclasses.replace(DEV, scopes=frozenset({"a"})), {"scopes": "a b"}, "scopes"),
    ],
)
def test_a_setting_that_would_widen_the_dev_principal_stops_start_up_by_name(
    base: Principal, given: dict[str, Any], setting: str
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        narrow(base, **given)
    assert refused_setting(excinfo) == ENV_PREFIX + setting.upper()


def test_a_lower_role_never_makes_an_approver_of_a_principal_that_was_not_one() -> None:
    editor = dataclasses.replace(DEV, role="editor", profile="coding")
    with pytest.raises(ConfigError) as excinfo:
        narrow(editor, approver_roles=("viewer",), role="viewer")
    assert refused_setting(excinfo) == "NEXUS_MCP_ROLE"
    assert narrow(approver_roles=("admin", "viewer"), role="viewer").role == "viewer"


def test_the_narrower_dev_profile_stays_when_a_lower_role_would_bring_more_tools() -> None:
    admin_minimal = dataclasses.replace(DEV, profile="minimal")
    p = narrow(admin_minimal, role="editor")
    assert (p.role, p.profile) == ("editor", "minimal")


def test_a_narrowed_role_pins_the_profile_so_an_assignment_cannot_widen_it_later() -> None:
    # dev_principal names no profile and its subject is assigned "minimal": the role
    # "editor" alone would select "coding", so the narrowing pins "minimal".
    unnamed = dataclasses.replace(DEV, profile=None)
    base_profile = seen_profile(unnamed, PROFILES, assignment="minimal")
    p = narrow_principal(
        unnamed,
        LaunchFields.from_values({"role": "editor"}),
        profiles=PROFILES,
        base_profile=base_profile,
        approver_roles=("admin",),
    )
    assert (p.role, p.profile) == ("editor", "minimal")


def test_a_dev_principal_that_sees_nothing_still_sees_nothing_after_a_role() -> None:
    ghost = dataclasses.replace(DEV, profile="removed-profile")
    assert narrow(ghost, role="viewer").profile == "removed-profile"
    with pytest.raises(ConfigError):
        narrow(ghost, profile="minimal")


def test_scopes_and_data_selectors_narrow_or_select() -> None:
    scoped = dataclasses.replace(DEV, scopes=frozenset({"a", "b"}), vault_id="v1")
    p = narrow(scoped, scopes="a", vault_id="v1", user_id="u1")
    assert (p.scopes, p.vault_id, p.user_id, p.canister_user) == (
        frozenset({"a"}),
        "v1",
        "u1",
        "u1",
    )
    assert narrow(vault_id="other").vault_id == "other"  # the default dev principal pins none


ROLE_CHOICES = (*ROLES, "superuser", None)
PROFILE_CHOICES = (*PROFILES.profiles, None)


def test_no_combination_of_role_and_profile_ever_widens_any_dev_principal() -> None:
    """Every base role and profile against every launch role and profile: narrower or refused."""
    refused = 0
    for base_role, base_prof, role, prof, read_only in itertools.product(
        ROLES, PROFILE_CHOICES, ROLE_CHOICES, PROFILE_CHOICES, (False, True)
    ):
        base = Principal(subject="dev", role=base_role, profile=base_prof, source="dev-default")
        given: dict[str, Any] = {"role": role, "profile": prof, "read_only": read_only}
        try:
            p = narrow(base, **given)
        except ConfigError:
            refused += 1
            continue
        case = (base_role, base_prof, given)
        assert seen_tools(p) <= seen_tools(base), case
        assert is_role_within(p.role, base.role), case
        assert p.read_only >= base.read_only and p.read_only >= read_only, case
        assert (p.subject, p.scopes, p.vault_id) == (base.subject, base.scopes, base.vault_id)
    combinations = len(ROLES) * len(PROFILE_CHOICES) * len(ROLE_CHOICES) * len(PROFILE_CHOICES) * 2
    assert 0 < refused < combinations  # both outcomes are exercised


@pytest.mark.parametrize("name", (SUBJECT, *LAUNCH_FIELDS))
def test_every_launch_setting_is_spelled_as_refusals_name_it(name: str) -> None:
    """The variable and flag a refusal names are the ones that set the setting."""
    assert ENV_PREFIX == SETTINGS_ENV_PREFIX and name in Settings.model_fields
    flag = "--" + name.replace("_", "-")
    argv = ["serve", flag] if name == "read_only" else ["serve", flag, "x"]
    assert getattr(build_parser().parse_args(argv), name) in (True, "x")
