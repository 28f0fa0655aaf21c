"""Which list-changed notifications one caller is owed: pure decisions, no transport.

A connected caller is told ``notifications/<kind>/list_changed`` when, and only when, the
set of items of that kind *it* may see changed since it was last told (or since it
connected): the tools, prompts, and resources with resource templates that exist, as the
namespace filters them for its grants (``middleware/namespace.py``). What it may see is
kept as a fingerprint (the sha256 of the sorted names), never as the names themselves,
and a notification carries nothing: a caller learns only that its own list changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nexus_mcp.policy.resources import resource_source

TOOLS = "tools"
PROMPTS = "prompts"
RESOURCES = "resources"
KINDS = (TOOLS, PROMPTS, RESOURCES)
# The notification each kind's change is told with (no params, ever).
LIST_CHANGED_METHODS: Mapping[str, str] = {
    TOOLS: "notifications/tools/list_changed",
    PROMPTS: "notifications/prompts/list_changed",
    RESOURCES: "notifications/resources/list_changed",
}

Fingerprints = Mapping[str, str]


@dataclass(frozen=True)
class Existing:
    """What the server lists now, before any caller's grants: names, URIs, templates."""

    tools: frozenset[str] = frozenset()
    prompts: frozenset[str] = frozenset()
    resources: frozenset[str] = frozenset()
    templates: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Granted:
    """What one caller's grants let it see, as the namespace asks them."""

    tools: frozenset[str]
    prompts: frozenset[str]
    sources: frozenset[str]


def fingerprint(names: Iterable[str]) -> str:
    """The sha256 of the sorted distinct names, each length-prefixed (so no two sets of
    names share one, whatever characters the names hold)."""
    digest = hashlib.sha256()
    for name in sorted(set(names)):
        data = name.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def visible_fingerprints(existing: Existing, granted: Granted) -> dict[str, str]:
    """Each kind's fingerprint of what this caller would be listed now: the items that
    exist and are granted (resources and templates by their source, as the namespace)."""
    resources = [
        f"r:{uri}" for uri in existing.resources if resource_source(uri) in granted.sources
    ] + [f"t:{uri}" for uri in existing.templates if resource_source(uri) in granted.sources]
    return {
        TOOLS: fingerprint(existing.tools & granted.tools),
        PROMPTS: fingerprint(existing.prompts & granted.prompts),
        RESOURCES: fingerprint(resources),
    }


def changed_kinds(before: Fingerprints | None, after: Fingerprints) -> tuple[str, ...]:
    """The kinds whose visible set differs (in ``KINDS`` order); none without a before."""
    if before is None:
        return ()
    return tuple(kind for kind in KINDS if before.get(kind) != after.get(kind))


__all__ = [
    "KINDS",
    "LIST_CHANGED_METHODS",
    "PROMPTS",
    "RESOURCES",
    "TOOLS",
    "Existing",
    "Fingerprints",
    "Granted",
    "changed_kinds",
    "fingerprint",
    "visible_fingerprints",
]
