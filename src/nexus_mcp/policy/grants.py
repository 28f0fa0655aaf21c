"""Tool grants: turn profiles and per-tool grants into ReBAC tuples, and tuples back into tools.

A tool is the object ``/tools/<name>`` in the tuple store; a resource source (``notes``,
an upstream server id) ``/resources/<source>`` and an exposed prompt ``/prompts/<name>``,
granted the same way (a profile's ``resources`` and ``prompts``, or directly). Each kind
is read under its own prefix, so the tools' lookup reads no resource or prompt tuple.

Two relations keep the two kinds of grant apart, so revoking or replacing a profile never
removes a tool that an operator granted directly:

- ``viewer``: written for every tool of the subject's profile (seed 004's relation);
- ``direct_viewer``: a per-tool grant on top of the profile (``grant_tool``).

A subject sees the union of both (``visible_tools``). ``revoke_tool`` removes only a
direct grant; a tool that also comes from the profile stays visible until the profile
changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import NamedTuple

from nexus_mcp.errors import InvalidInputError, NotFoundError
from nexus_mcp.policy.profiles import (
    PROMPT_NAME_RE,
    RESOURCE_SOURCE_RE,
    TOOL_NAME_RE,
    ToolProfile,
    ToolProfileConfig,
)
from nexus_mcp.policy.tuples import (
    PROMPTS_PREFIX,
    RESOURCES_PREFIX,
    TOOLS_PREFIX,
    RelationTuple,
    TupleStore,
)

PROFILE_RELATION = "viewer"
DIRECT_RELATION = "direct_viewer"


class GrantSource(StrEnum):
    PROFILE = "profile"
    DIRECT = "direct"


class ToolGrant(NamedTuple):
    """One visible tool and every way it is granted (for inspection, not the hot path)."""

    tool: str
    sources: frozenset[GrantSource]


def to_tool_object(tool: str) -> str:
    """The ReBAC object for a tool name; refuses names that could escape the prefix."""
    if not TOOL_NAME_RE.fullmatch(tool):
        raise InvalidInputError(field="tool")
    return TOOLS_PREFIX + tool


def to_tool_name(obj: str) -> str:
    return obj.removeprefix(TOOLS_PREFIX)


def to_resource_object(source: str) -> str:
    """The ReBAC object for a resource source (``notes`` or an upstream server id)."""
    if not RESOURCE_SOURCE_RE.fullmatch(source):
        raise InvalidInputError(field="resource")
    return RESOURCES_PREFIX + source


def to_prompt_object(prompt: str) -> str:
    """The ReBAC object for an exposed prompt name."""
    if not PROMPT_NAME_RE.fullmatch(prompt):
        raise InvalidInputError(field="prompt")
    return PROMPTS_PREFIX + prompt


# Every kind of object a profile grants: its prefix, and how a profile names its objects.
GRANTED_PREFIXES = (TOOLS_PREFIX, RESOURCES_PREFIX, PROMPTS_PREFIX)


def grant_tools_for_profile(
    store: TupleStore, subject: str, profile: ToolProfile, zone: str
) -> int:
    """Write one ``viewer`` tuple per profile tool, resource source and prompt, in one
    batch; returns the revision."""
    return store.write(sorted(_profile_objects(subject, profile)), zone)


def revoke_tools_for_profile(
    store: TupleStore, subject: str, profile: ToolProfile, zone: str
) -> int:
    """Remove the profile's ``viewer`` tuples (tools, resources, prompts) in one batch;
    direct grants stay."""
    return store.delete(sorted(_profile_objects(subject, profile)), zone)


def revoke_profile_grants(store: TupleStore, subject: str, zone: str) -> int:
    """Remove every ``viewer`` tuple the subject has (tools, resource sources, prompts),
    whichever profile wrote it."""
    current = _profile_granted(store, subject, zone)
    return store.delete([RelationTuple(subject, PROFILE_RELATION, o) for o in current], zone)


def grant_tool(store: TupleStore, subject: str, tool: str, zone: str) -> int:
    """Grant one tool directly, on top of whatever profile the subject has."""
    return store.write([RelationTuple(subject, DIRECT_RELATION, to_tool_object(tool))], zone)


def revoke_tool(store: TupleStore, subject: str, tool: str, zone: str) -> int:
    """Remove a direct grant of one tool; the profile's grant of the same tool stays."""
    return store.delete([RelationTuple(subject, DIRECT_RELATION, to_tool_object(tool))], zone)


def grant_resource(store: TupleStore, subject: str, source: str, zone: str) -> int:
    """Grant one resource source directly (every resource and template it exposes)."""
    return store.write([RelationTuple(subject, DIRECT_RELATION, to_resource_object(source))], zone)


def revoke_resource(store: TupleStore, subject: str, source: str, zone: str) -> int:
    """Remove a direct grant of one resource source; the profile's grant stays."""
    return store.delete([RelationTuple(subject, DIRECT_RELATION, to_resource_object(source))], zone)


def grant_prompt(store: TupleStore, subject: str, prompt: str, zone: str) -> int:
    """Grant one exposed prompt directly."""
    return store.write([RelationTuple(subject, DIRECT_RELATION, to_prompt_object(prompt))], zone)


def revoke_prompt(store: TupleStore, subject: str, prompt: str, zone: str) -> int:
    """Remove a direct grant of one prompt; the profile's grant stays."""
    return store.delete([RelationTuple(subject, DIRECT_RELATION, to_prompt_object(prompt))], zone)


def assign_profile(
    store: TupleStore, config: ToolProfileConfig, subject: str, profile_name: str, zone: str
) -> int:
    """Make ``profile_name`` the subject's profile: replace its profile grants and record it.

    The grant swap is one transaction; recording the assignment is a second one, so a crash
    in between leaves correct grants and the old assignment, which the next
    ``ensure_principal_grants`` for the selected profile repairs.
    """
    profile = _require_profile(config, profile_name)
    _sync_profile_grants(store, subject, profile, zone)
    return store.set_assignment(subject, profile.name, zone)


def ensure_principal_grants(
    store: TupleStore, config: ToolProfileConfig, subject: str, profile_name: str, zone: str
) -> bool:
    """Bring the subject's profile grants to exactly ``profile_name``'s tools; True if it wrote.

    Idempotent and read-mostly: one indexed read, and a write only when the stored grants
    differ (first appearance, or the selected profile or the profile file changed). It does
    not touch the stored assignment: that is the operator's choice, while a principal's
    profile is per session and simply takes precedence while present.
    """
    profile = _require_profile(config, profile_name)
    return _sync_profile_grants(store, subject, profile, zone) is not None


def visible_tools(store: TupleStore, subject: str, zone: str) -> frozenset[str]:
    """Tool names the subject may see: profile grants and direct grants together."""
    objects = store.list_objects(subject, PROFILE_RELATION, zone, TOOLS_PREFIX)
    objects += store.list_objects(subject, DIRECT_RELATION, zone, TOOLS_PREFIX)
    return frozenset(to_tool_name(o) for o in objects)


def visible_resource_sources(store: TupleStore, subject: str, zone: str) -> frozenset[str]:
    """Resource sources the subject may read: profile and direct grants together."""
    return _visible(store, subject, zone, RESOURCES_PREFIX)


def visible_prompts(store: TupleStore, subject: str, zone: str) -> frozenset[str]:
    """Prompt names the subject may see and get: profile and direct grants together."""
    return _visible(store, subject, zone, PROMPTS_PREFIX)


def _visible(store: TupleStore, subject: str, zone: str, prefix: str) -> frozenset[str]:
    objects = store.list_objects(subject, PROFILE_RELATION, zone, prefix)
    objects += store.list_objects(subject, DIRECT_RELATION, zone, prefix)
    return frozenset(o.removeprefix(prefix) for o in objects)


def list_tool_grants(store: TupleStore, subject: str, zone: str) -> list[ToolGrant]:
    """Every stored tool grant of the subject with its sources, sorted by tool name."""
    sources: dict[str, set[GrantSource]] = {}
    for relation, source in (
        (PROFILE_RELATION, GrantSource.PROFILE),
        (DIRECT_RELATION, GrantSource.DIRECT),
    ):
        for obj in store.list_objects(subject, relation, zone, TOOLS_PREFIX):
            sources.setdefault(to_tool_name(obj), set()).add(source)
    return [ToolGrant(tool, frozenset(sources[tool])) for tool in sorted(sources)]


def _require_profile(config: ToolProfileConfig, name: str) -> ToolProfile:
    profile = config.profiles.get(name)
    if profile is None:
        raise NotFoundError(kind="profile")
    return profile


def _profile_objects(subject: str, profile: ToolProfile) -> set[RelationTuple]:
    return {RelationTuple(subject, PROFILE_RELATION, o) for o in _objects_of(profile)}


def _objects_of(profile: ToolProfile) -> frozenset[str]:
    """Every object the profile grants: its tools, resource sources and prompts."""
    objects: Iterable[str] = (
        *(to_tool_object(t) for t in profile.tools),
        *(to_resource_object(r) for r in profile.resources),
        *(to_prompt_object(p) for p in profile.prompts),
    )
    return frozenset(objects)


def _profile_granted(store: TupleStore, subject: str, zone: str) -> list[str]:
    """Every object the subject's ``viewer`` tuples name, of every granted kind."""
    return [
        obj
        for prefix in GRANTED_PREFIXES
        for obj in store.list_objects(subject, PROFILE_RELATION, zone, prefix)
    ]


def _sync_profile_grants(
    store: TupleStore, subject: str, profile: ToolProfile, zone: str
) -> int | None:
    """Replace the subject's ``viewer`` tuples with the profile's; None when already equal."""
    current = frozenset(_profile_granted(store, subject, zone))
    target = _objects_of(profile)
    if current == target:
        return None
    return store.update(
        zone,
        write=[RelationTuple(subject, PROFILE_RELATION, o) for o in sorted(target - current)],
        delete=[RelationTuple(subject, PROFILE_RELATION, o) for o in sorted(current - target)],
    )


__all__ = [
    "DIRECT_RELATION",
    "GRANTED_PREFIXES",
    "PROFILE_RELATION",
    "PROMPTS_PREFIX",
    "RESOURCES_PREFIX",
    "TOOLS_PREFIX",
    "GrantSource",
    "ToolGrant",
    "assign_profile",
    "ensure_principal_grants",
    "grant_prompt",
    "grant_resource",
    "grant_tool",
    "grant_tools_for_profile",
    "list_tool_grants",
    "revoke_profile_grants",
    "revoke_prompt",
    "revoke_resource",
    "revoke_tool",
    "revoke_tools_for_profile",
    "to_prompt_object",
    "to_resource_object",
    "to_tool_name",
    "to_tool_object",
    "visible_prompts",
    "visible_resource_sources",
    "visible_tools",
]
