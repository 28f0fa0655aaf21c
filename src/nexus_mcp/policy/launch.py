"""Launch settings without a subject: they may only narrow the dev principal, never widen it.

Launch settings (``subject``, ``role``, ``profile``, ``read_only``, ``scopes``, ``vault_id``,
``user_id``, ``canister_user_id``; from flags, the environment or the YAML file) name the
principal of a stdio or in-process server. With a subject they describe a whole principal.
Without one they are never dropped:

- prod: start-up is refused (``require_subject``); nothing says whom they would describe.
- dev: they narrow the dev principal (``narrow_principal``) field by field, or start-up is
  refused naming the first setting that would widen it:

  ================  ====================================================================
  read_only         true makes it read-only (false takes nothing away: it is not "given")
  role              replaces the dev role when it is the same or ranks below it
                    (``principal.ROLE_RANKS``; an unknown role counts as viewer), and never
                    makes an approver of a principal that was not one
  profile           replaces the dev profile when its tools are a subset of the tools the
                    dev principal sees by profile; a name not in the profile file is refused
  role, no profile  the role's own profile applies when it is such a subset; when the dev
                    profile is the narrower one, that stays; when they do not nest, refused
                    (name a profile as well)
  scopes            replace the dev scopes when they are a subset of them (scopes reveal
                    tools whose contract requires them, so a new scope would widen)
  vault_id,         select data, not privilege: applied where the dev principal has none;
  user_id,          a value other than the one ``dev_principal`` pins is refused (it would
  canister_user_id  move the principal to data it was pinned away from)
  ================  ====================================================================

Plain policy: no FastMCP; the composition root passes the loaded profiles and the profile
the dev principal sees now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.profiles import ToolProfileConfig
from nexus_mcp.principal import (
    Principal,
    is_role_within,
    parse_bool,
    parse_scopes,
    to_effective_role,
)

ENV_PREFIX = "NEXUS_MCP_"
SUBJECT = "subject"
# Every launch setting but the subject, in the order messages name them.
LAUNCH_FIELDS = (
    "role",
    "profile",
    "read_only",
    "scopes",
    "vault_id",
    "user_id",
    "canister_user_id",
)
# Fields that select whose data is read rather than what may be done.
DATA_FIELDS = ("vault_id", "user_id", "canister_user_id")


def describe_setting(name: str) -> str:
    """A launch setting as an operator can spell it: settings key, variable and flag."""
    return f"'{name}' ({ENV_PREFIX}{name.upper()} / --{name.replace('_', '-')})"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


@dataclass(frozen=True)
class LaunchFields:
    """The launch settings that say something, normalized.

    Blank text, ``read_only`` false and no scopes are "not given": they could only restate
    a default, so they neither need a subject nor narrow anything.
    """

    subject: str | None = None
    role: str | None = None
    profile: str | None = None
    read_only: bool = False
    scopes: frozenset[str] = frozenset()
    vault_id: str | None = None
    user_id: str | None = None
    canister_user_id: str | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> LaunchFields:
        return cls(
            subject=_text(values.get("subject")),
            role=_text(values.get("role")),
            profile=_text(values.get("profile")),
            read_only=parse_bool(values.get("read_only"), name="read_only"),
            scopes=parse_scopes(values.get("scopes")),
            vault_id=_text(values.get("vault_id")),
            user_id=_text(values.get("user_id")),
            canister_user_id=_text(values.get("canister_user_id")),
        )

    @property
    def given(self) -> tuple[str, ...]:
        """The names of the fields other than the subject that say something."""
        return tuple(name for name in LAUNCH_FIELDS if getattr(self, name))


def require_subject(fields: LaunchFields) -> None:
    """prod: launch settings without a subject stop start-up, naming what is missing."""
    if fields.subject is not None or not fields.given:
        return
    named = ", ".join(describe_setting(name) for name in fields.given)
    noun, verb, them = (
        ("setting", "needs", "it") if len(fields.given) == 1 else ("settings", "need", "them")
    )
    raise ConfigError(
        f"launch {noun} {named} {verb} a subject in prod mode: "
        f"set {describe_setting(SUBJECT)}, or remove {them}"
    )


def narrow_principal(
    base: Principal,
    fields: LaunchFields,
    *,
    profiles: ToolProfileConfig,
    base_profile: str | None,
    approver_roles: Collection[str] = (),
) -> Principal:
    """The dev principal ``base`` narrowed by launch fields given without a subject.

    ``base_profile`` is the profile ``base`` sees now (its own, its subject's assignment's
    or its role's, as the namespace selects it; None: no profile tools at all). Raises
    ``ConfigError`` naming the first setting that would widen ``base``.
    """
    changes: dict[str, Any] = {}
    if fields.read_only:
        changes["read_only"] = True
    base_tools = _tools(profiles, base_profile)
    if fields.role is not None:
        role = to_effective_role(fields.role)
        _check_role(base, role, approver_roles)
        changes["role"] = role
    if fields.profile is not None:
        if fields.profile not in profiles.profiles:
            raise ConfigError(
                f"launch setting {describe_setting('profile')} names a profile that is not "
                f"defined: {fields.profile!r}"
            )
        if not _tools(profiles, fields.profile) <= base_tools:
            raise _widening(
                "profile",
                f"profile {fields.profile!r} has tools that {_seen(base_profile)} lacks",
            )
        changes["profile"] = fields.profile
    elif fields.role is not None:
        # The role's own profile is what a caller of that role sees; pin the narrower of
        # it and the dev principal's so a later assignment cannot move either way.
        changes["profile"] = _profile_for_role(changes["role"], base, base_profile, profiles)
    if fields.scopes:
        extra = fields.scopes - base.scopes
        if extra:
            raise _widening("scopes", f"it does not hold {sorted(extra)}")
        changes["scopes"] = fields.scopes
    for name in DATA_FIELDS:
        value = getattr(fields, name)
        if value is None:
            continue
        # canister_user_id falls back to user_id, so a pinned user_id pins it too.
        pinned = base.canister_user if name == "canister_user_id" else getattr(base, name)
        if pinned is not None and pinned != value:
            raise _widening(name, f"it is pinned to another {name} by dev_principal")
        changes[name] = value
    return dataclasses.replace(base, **changes)


def _check_role(base: Principal, role: str, approver_roles: Collection[str]) -> None:
    if not is_role_within(role, base.effective_role):
        raise _widening("role", f"{role!r} is not within its role {base.effective_role!r}")
    if role in approver_roles and base.effective_role not in approver_roles:
        raise _widening("role", f"{role!r} may approve writes and {base.effective_role!r} may not")


def _profile_for_role(
    role: str, base: Principal, base_profile: str | None, profiles: ToolProfileConfig
) -> str | None:
    role_profile = profiles.profile_for_role(role)
    role_tools, base_tools = _tools(profiles, role_profile), _tools(profiles, base_profile)
    if role_tools <= base_tools:
        return role_profile
    if base_tools <= role_tools:
        return base_profile if base_profile is not None else base.profile
    raise _widening(
        "role",
        f"the profile of role {role!r}, {role_profile!r}, and {_seen(base_profile)} do not "
        f"nest; set {describe_setting('profile')} as well",
    )


def _tools(profiles: ToolProfileConfig, name: str | None) -> frozenset[str]:
    profile = profiles.profiles.get(name) if name is not None else None
    return profile.tools if profile is not None else frozenset()


def _seen(base_profile: str | None) -> str:
    return f"its profile {base_profile!r}" if base_profile is not None else "its empty profile"


def _widening(name: str, why: str) -> ConfigError:
    return ConfigError(
        f"launch setting {describe_setting(name)} would widen the dev principal ({why}); "
        f"without {describe_setting(SUBJECT)} launch settings can only narrow it"
    )


__all__ = [
    "DATA_FIELDS",
    "ENV_PREFIX",
    "LAUNCH_FIELDS",
    "SUBJECT",
    "LaunchFields",
    "describe_setting",
    "narrow_principal",
    "require_subject",
]
