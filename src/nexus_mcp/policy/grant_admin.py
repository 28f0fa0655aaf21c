"""Assigning and revoking grants as an operator does: the one core the ``nexus-mcp
profiles`` command and the console's Access page share, on the same ``TupleStore``.

``assign`` makes a profile a subject's own (its ``viewer`` grants replaced, the assignment
recorded); ``revoke_profile`` removes both, so the subject falls back to its principal's or
its role's profile; ``revoke_direct`` removes one direct grant and says whether the tool
stays visible through the profile. Subject and profile names are checked here, with bounded
lengths, and refusals name the rule, never the value given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, NamedTuple

from nexus_mcp.errors import InvalidInputError, NotFoundError
from nexus_mcp.policy.grants import (
    PROFILE_RELATION,
    assign_profile,
    grant_prompt,
    grant_resource,
    revoke_profile_grants,
    revoke_prompt,
    revoke_resource,
    revoke_tool,
    to_prompt_object,
    to_resource_object,
    to_tool_object,
)
from nexus_mcp.policy.profiles import PROFILE_NAME_RE, ToolProfileConfig
from nexus_mcp.policy.resources import NOTES_SOURCE
from nexus_mcp.policy.tuples import TupleStore

UNKNOWN_PROFILE = "unknown profile; see 'nexus-mcp profiles list'"
MAX_SUBJECT_CHARS = 256
MAX_PROFILE_CHARS = 64  # PROFILE_NAME_RE
# A subject as tokens carry it ('sub'): printable, no spaces or controls.
_SUBJECT_RE = re.compile(rf"[\x21-\x7e]{{1,{MAX_SUBJECT_CHARS}}}")


class DirectRevoked(NamedTuple):
    revision: int
    # The tool stays visible: the subject's profile grants it too.
    still_from_profile: bool


def valid_subject(subject: str) -> bool:
    """A subject an operator may name: 1-256 printable ASCII characters, no spaces."""
    return bool(_SUBJECT_RE.fullmatch(subject))


def known_profile(config: ToolProfileConfig, name: str) -> bool:
    return bool(PROFILE_NAME_RE.fullmatch(name)) and name in config.profiles


def assign(
    store: TupleStore, config: ToolProfileConfig, subject: str, profile: str, zone: str
) -> int:
    """Make ``profile`` the subject's own; the store's new revision."""
    if not known_profile(config, profile):
        raise NotFoundError(UNKNOWN_PROFILE, kind="profile")
    return assign_profile(store, config, subject, profile, zone)


def revoke_profile(store: TupleStore, subject: str, zone: str) -> int:
    """Remove the subject's profile grants and its assignment; the new revision."""
    revoke_profile_grants(store, subject, zone)
    return store.clear_assignment(subject, zone)


def revoke_direct(store: TupleStore, subject: str, tool: str, zone: str) -> DirectRevoked:
    """Remove one direct grant (an invalid tool name is ``INVALID_INPUT``)."""
    revision = revoke_tool(store, subject, tool, zone)
    return DirectRevoked(
        revision, store.check(subject, PROFILE_RELATION, to_tool_object(tool), zone)
    )


# A direct grant of something other than a tool: a resource source or an exposed prompt.
ItemKind = Literal["resource", "prompt"]
ITEM_KINDS: tuple[ItemKind, ...] = ("resource", "prompt")


def item_object(kind: ItemKind, name: str) -> str:
    """The ReBAC object of a resource source or prompt; ``INVALID_INPUT`` (naming the
    field, never the value) for a name that cannot be one."""
    return to_prompt_object(name) if kind == "prompt" else to_resource_object(name)


def known_item(
    config: ToolProfileConfig,
    kind: ItemKind,
    name: str,
    *,
    upstream_ids: Iterable[str] = (),
    prompt_prefixes: Iterable[str] = (),
) -> bool:
    """Whether a profile names it, or it is a source or prompt of what is configured: the
    note resources (``notes``), an upstream's id (its resources), an upstream's name
    prefix (its prompts)."""
    if kind == "prompt":
        named = {p for profile in config.profiles.values() for p in profile.prompts}
        return name in named or any(name.startswith(prefix) for prefix in prompt_prefixes)
    named = {s for profile in config.profiles.values() for s in profile.resources}
    return name == NOTES_SOURCE or name in named or name in set(upstream_ids)


def grant_item(store: TupleStore, subject: str, kind: ItemKind, name: str, zone: str) -> int:
    """Grant one resource source or prompt directly; the new revision."""
    grant = grant_prompt if kind == "prompt" else grant_resource
    return grant(store, subject, name, zone)


def revoke_item(
    store: TupleStore, subject: str, kind: ItemKind, name: str, zone: str
) -> DirectRevoked:
    """Remove one direct grant of a resource source or prompt, and say whether the
    subject's profile still grants it."""
    revoke = revoke_prompt if kind == "prompt" else revoke_resource
    revision = revoke(store, subject, name, zone)
    return DirectRevoked(
        revision, store.check(subject, PROFILE_RELATION, item_object(kind, name), zone)
    )


def require_subject(subject: str) -> str:
    if not valid_subject(subject):
        raise InvalidInputError(field="subject")
    return subject


__all__ = [
    "ITEM_KINDS",
    "MAX_PROFILE_CHARS",
    "MAX_SUBJECT_CHARS",
    "UNKNOWN_PROFILE",
    "DirectRevoked",
    "ItemKind",
    "assign",
    "grant_item",
    "item_object",
    "known_item",
    "known_profile",
    "require_subject",
    "revoke_direct",
    "revoke_item",
    "revoke_profile",
    "valid_subject",
]
