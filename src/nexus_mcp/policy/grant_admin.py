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
from typing import NamedTuple

from nexus_mcp.errors import InvalidInputError, NotFoundError
from nexus_mcp.policy.grants import (
    PROFILE_RELATION,
    assign_profile,
    revoke_profile_grants,
    revoke_tool,
    to_tool_object,
)
from nexus_mcp.policy.profiles import PROFILE_NAME_RE, ToolProfileConfig
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


def require_subject(subject: str) -> str:
    if not valid_subject(subject):
        raise InvalidInputError(field="subject")
    return subject


__all__ = [
    "MAX_PROFILE_CHARS",
    "MAX_SUBJECT_CHARS",
    "UNKNOWN_PROFILE",
    "DirectRevoked",
    "assign",
    "known_profile",
    "require_subject",
    "revoke_direct",
    "revoke_profile",
    "valid_subject",
]
