"""Tool profiles: load the YAML profile file, resolve inheritance, and pick a caller's profile.

A profile is a named set of tool names that may extend one parent profile. Inheritance is
resolved eagerly at load time, so every ``ToolProfile`` holds its full tool set and nothing
downstream walks chains. A profile grants resources and prompts as it grants tools, under
two more keys inherited the same way: ``resources`` (resource sources: ``notes`` for the
native note resources, or an upstream server id for that upstream's resources and
templates) and ``prompts`` (exposed prompt names, under MCP's tool-name rule). The file
also maps roles to profiles. Profiles are policy; the grants store (``stores/grants.py``)
is enforcement.

Which profile applies to a caller (``select_profile``), first match wins:

1. the profile its principal names (token claim or launch environment); a name that is
   not in the file fails closed: the caller sees no tools;
2. the profile assigned to its subject in the grants store (same fail-closed rule for an
   assignment whose profile was since removed from the file);
3. the profile of its role; a role outside ``ROLES`` gets the viewer's profile.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import structlog
import yaml

from nexus_mcp.errors import ConfigError
from nexus_mcp.principal import ROLE_FALLBACK, ROLES

PROFILES_FILENAME = "tool_profiles.yaml"
DEFAULT_PROFILE = "minimal"
# MCP's tool-name rule; it also keeps a name safe to embed in a "/tools/<name>" object.
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
PROFILE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# A resource source: "notes" or an upstream server id (policy/upstreams.SERVER_ID_RE); it
# is also safe to embed in a "/resources/<source>" object.
RESOURCE_SOURCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Exposed prompt names follow the tool-name rule ("<prefix><name>" for an upstream's).
PROMPT_NAME_RE = TOOL_NAME_RE

_TOP_LEVEL_KEYS = frozenset({"profiles", "default_profile", "roles"})
_PROFILE_KEYS = frozenset({"tools", "resources", "prompts", "extends", "description"})

logger = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ToolProfile:
    """A resolved profile: ``tools``, ``resources`` and ``prompts`` already include every
    ancestor's."""

    name: str
    tools: frozenset[str]
    extends: str | None = None
    description: str = ""
    resources: frozenset[str] = frozenset()
    prompts: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ToolProfileConfig:
    """Every resolved profile, the default profile, the role mapping and load warnings."""

    profiles: Mapping[str, ToolProfile]
    default_profile: str = DEFAULT_PROFILE
    role_profiles: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    warnings: tuple[str, ...] = ()

    def profile_for_role(self, role: str) -> str:
        """The profile a role gets by default; unknown roles get the viewer's."""
        effective = role if role in ROLES else ROLE_FALLBACK
        return self.role_profiles.get(effective, self.default_profile)


class ProfileSource(StrEnum):
    """Why a profile was selected; the two ``UNKNOWN_*`` sources mean no tools."""

    PRINCIPAL = "principal"
    ASSIGNMENT = "assignment"
    ROLE = "role"
    UNKNOWN_PRINCIPAL_PROFILE = "unknown_principal_profile"
    UNKNOWN_ASSIGNED_PROFILE = "unknown_assigned_profile"


class ProfileSelection(NamedTuple):
    """The profile that applies to a caller; ``name`` is None when it must see nothing."""

    name: str | None
    source: ProfileSource

    @property
    def is_denied(self) -> bool:
        return self.name is None


def select_profile(
    config: ToolProfileConfig,
    *,
    principal_profile: str | None,
    stored_assignment: str | None,
    role: str,
) -> ProfileSelection:
    """Pick the caller's profile: principal's, else stored assignment, else role default."""
    if principal_profile is not None:
        if principal_profile in config.profiles:
            return ProfileSelection(principal_profile, ProfileSource.PRINCIPAL)
        return ProfileSelection(None, ProfileSource.UNKNOWN_PRINCIPAL_PROFILE)
    if stored_assignment is not None:
        if stored_assignment in config.profiles:
            return ProfileSelection(stored_assignment, ProfileSource.ASSIGNMENT)
        return ProfileSelection(None, ProfileSource.UNKNOWN_ASSIGNED_PROFILE)
    return ProfileSelection(config.profile_for_role(role), ProfileSource.ROLE)


def default_profiles_path() -> Path:
    """Packaged ``nexus_mcp/data/tool_profiles.yaml`` if present, else the repo's config/."""
    packaged = resources.files("nexus_mcp").joinpath("data", PROFILES_FILENAME)
    if packaged.is_file():
        return Path(str(packaged))
    # src/nexus_mcp/policy/profiles.py -> repository root is three levels above the package.
    return Path(__file__).resolve().parents[3] / "config" / PROFILES_FILENAME


def load_profiles(
    path: Path | str | None = None,
    known_tools: Iterable[str] | None = None,
    *,
    known_resources: Iterable[str] | None = None,
    known_prompts: Iterable[str] | None = None,
) -> ToolProfileConfig:
    """Read, validate and resolve a profile file; every problem is a ``ConfigError``.

    Tool names not in ``known_tools`` (when given) are warnings, never errors: a profile
    may name tools of optional servers. Resource sources not in ``known_resources`` and
    prompt names not in ``known_prompts`` (when given) likewise.
    """
    source = Path(path) if path is not None else default_profiles_path()
    document = _read_document(source)
    raw_profiles = _parse_profiles(document.get("profiles"), source)
    profiles = _resolve_inheritance(raw_profiles, source)

    default_profile = document.get("default_profile", DEFAULT_PROFILE)
    if not isinstance(default_profile, str) or default_profile not in profiles:
        raise ConfigError(f"{source}: default_profile must name a profile defined in the file")
    role_profiles = _parse_roles(document.get("roles"), profiles, default_profile, source)
    warnings = (
        _collect_unknown(raw_profiles, "tools", "tool", known_tools, source)
        + _collect_unknown(raw_profiles, "resources", "resource source", known_resources, source)
        + _collect_unknown(raw_profiles, "prompts", "prompt", known_prompts, source)
    )
    return ToolProfileConfig(
        profiles=MappingProxyType(profiles),
        default_profile=default_profile,
        role_profiles=MappingProxyType(role_profiles),
        warnings=warnings,
    )


class _RawProfile(NamedTuple):
    tools: tuple[str, ...]
    extends: str | None
    description: str
    resources: tuple[str, ...] = ()
    prompts: tuple[str, ...] = ()


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: a profile defined twice is a mistake."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            line = key_node.start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key on line {line}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def _read_document(source: Path) -> dict[str, Any]:
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: tool profiles file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read tool profiles ({type(exc).__name__})") from None
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: invalid YAML{where}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: top level must be a mapping with a 'profiles' key")
    unknown = sorted(str(key) for key in document if key not in _TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {unknown}")
    return document


def _parse_profiles(value: object, source: Path) -> dict[str, _RawProfile]:
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{source}: 'profiles' must be a non-empty mapping of name to profile")
    parsed: dict[str, _RawProfile] = {}
    for name, body in value.items():
        if not isinstance(name, str) or not PROFILE_NAME_RE.fullmatch(name):
            raise ConfigError(f"{source}: profile names must match {PROFILE_NAME_RE.pattern}")
        parsed[name] = _parse_profile(name, body, source)
    return parsed


def _parse_profile(name: str, body: object, source: Path) -> _RawProfile:
    where = f"{source}: profile '{name}'"
    if not isinstance(body, dict):
        raise ConfigError(
            f"{where} must be a mapping with 'tools', 'resources', 'prompts', 'extends', "
            "'description'"
        )
    unknown = sorted(str(key) for key in body if key not in _PROFILE_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}")
    tools = _name_list(body, "tools", "tool", TOOL_NAME_RE, where)
    resources = _name_list(body, "resources", "resource source", RESOURCE_SOURCE_RE, where)
    prompts = _name_list(body, "prompts", "prompt", PROMPT_NAME_RE, where)
    extends = body.get("extends")
    if extends is not None and not isinstance(extends, str):
        raise ConfigError(f"{where}: 'extends' must be a profile name")
    description = body.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise ConfigError(f"{where}: 'description' must be a string")
    return _RawProfile(tools, extends, description, resources, prompts)


def _name_list(
    body: Mapping[str, Any], key: str, what: str, rule: re.Pattern[str], where: str
) -> tuple[str, ...]:
    """A profile's list under ``key``: absent or null is empty; every entry matches ``rule``."""
    names = body.get(key)
    if names is None:
        return ()
    if not isinstance(names, list):
        raise ConfigError(f"{where}: '{key}' must be a list of {what} names")
    for name in names:
        if not isinstance(name, str) or not rule.fullmatch(name):
            raise ConfigError(f"{where}: every {what} must be a name matching {rule.pattern}")
    return tuple(names)


def _resolve_inheritance(raw: Mapping[str, _RawProfile], source: Path) -> dict[str, ToolProfile]:
    """Flatten every ``extends`` chain; iterative, so chain depth is not bounded by recursion."""
    resolved: dict[str, ToolProfile] = {}
    for start in raw:
        chain: list[str] = []
        current: str | None = start
        # Walk up until an already-resolved profile or a root; a repeat is a cycle.
        while current is not None and current not in resolved:
            if current in chain:
                cycle = " -> ".join([*chain[chain.index(current) :], current])
                raise ConfigError(
                    f"{source}: profile '{current}' has an inheritance cycle: {cycle}"
                )
            if current not in raw:
                raise ConfigError(
                    f"{source}: profile '{chain[-1]}' extends unknown profile '{current}'"
                )
            chain.append(current)
            current = raw[current].extends
        parent = resolved[current] if current is not None else None
        for name in reversed(chain):
            body = raw[name]
            profile = ToolProfile(
                name,
                frozenset(body.tools) | (parent.tools if parent else frozenset()),
                body.extends,
                body.description,
                resources=frozenset(body.resources) | (parent.resources if parent else frozenset()),
                prompts=frozenset(body.prompts) | (parent.prompts if parent else frozenset()),
            )
            resolved[name] = parent = profile
    return {name: resolved[name] for name in raw}


def _parse_roles(
    value: object, profiles: Mapping[str, ToolProfile], default_profile: str, source: Path
) -> dict[str, str]:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: 'roles' must be a mapping of role to profile name")
    mapping = dict.fromkeys(ROLES, default_profile)
    for role, profile in value.items():
        if role not in ROLES:
            raise ConfigError(f"{source}: 'roles' names an unknown role; known roles are {ROLES}")
        if not isinstance(profile, str) or profile not in profiles:
            raise ConfigError(f"{source}: role '{role}' maps to a profile not defined in the file")
        mapping[role] = profile
    return mapping


_UNKNOWN_EVENTS = {
    "tools": "tool_profile_unknown_tool",
    "resources": "tool_profile_unknown_resource_source",
    "prompts": "tool_profile_unknown_prompt",
}


def _collect_unknown(
    raw: Mapping[str, _RawProfile],
    key: str,
    what: str,
    known_names: Iterable[str] | None,
    source: Path,
) -> tuple[str, ...]:
    """One warning per name under ``key`` that is not in ``known_names`` (when given)."""
    if known_names is None:
        return ()
    known = frozenset(known_names)
    event = _UNKNOWN_EVENTS[key]
    field_name = {"tools": "tool", "resources": "source", "prompts": "prompt"}[key]
    warnings: list[str] = []
    for name, body in raw.items():
        # Only the declaring profile reports a name, so a child does not repeat its parent's.
        for unknown in sorted(set(getattr(body, key)) - known):
            warnings.append(f"{source}: profile '{name}' names unknown {what} '{unknown}'")
            logger.warning(event, file=str(source), profile=name, **{field_name: unknown})
    return tuple(warnings)


__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES_FILENAME",
    "PROMPT_NAME_RE",
    "RESOURCE_SOURCE_RE",
    "TOOL_NAME_RE",
    "ProfileSelection",
    "ProfileSource",
    "ToolProfile",
    "ToolProfileConfig",
    "default_profiles_path",
    "load_profiles",
    "select_profile",
]
