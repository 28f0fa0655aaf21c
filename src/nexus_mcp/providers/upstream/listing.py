"""An upstream's ``tools/list``, fetched within bounds and screened definition by definition.

The listing is the upstream's to write, so nothing in it is trusted to be small, finite or
well formed (seed 002: an upstream is an untrusted provider):

- **Bounded** (``fetch_listing``). Pages are fetched one by one (FastMCP's ``list_tools``
  follows ``nextCursor`` for up to 250 pages, ours stops at the caps): at most
  ``MAX_LIST_PAGES`` pages, ``MAX_TOOLS_PER_UPSTREAM`` definitions and
  ``MAX_LISTING_BYTES`` of canonical definitions; a cursor seen before (a cycle) or longer
  than ``MAX_CURSOR_CHARS`` ends it too. The listing is cut where a cap is reached: the
  definitions before the cut are decided as usual, those after it are never exposed, and
  the cut is logged and audited (``upstream_listing_cut``) with its reason. Each
  message is bounded as well: an HTTP response (``sessions.py``), a stdio line
  (``stdio.py``).
- **Screened** (``screen``). A definition that breaks MCP's tool-name rule, whose name
  another definition of the same listing also uses (both are skipped: which one the
  upstream runs is its choice), whose ``inputSchema`` (or ``outputSchema``) is not a JSON
  Schema object, or that is oversized, is never pinned nor exposed. It is reported by its
  position in the listing and the sha256 of its canonical definition, never by its name
  (a hostile name is not echoed into logs, audit or terminals).

A page the MCP SDK cannot parse at all (a field of the wrong type) fails the listing: the
upstream is down, as for any malformed answer; native tools and other upstreams are not
affected.

No FastMCP import: the client is passed in (anything with ``list_tools_mcp(cursor=)``); a
page is fetched and validated by ``tool_pages.py``, with the event loop given turns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nexus_mcp.policy.hashing import sha256_hex, to_canonical_json
from nexus_mcp.policy.pins import canonical_definition
from nexus_mcp.policy.upstreams import TOOL_NAME_RE
from nexus_mcp.providers.upstream.pacing import Pacer
from nexus_mcp.providers.upstream.tool_pages import list_page

MAX_TOOLS_PER_UPSTREAM = 1000  # definitions per listing; the rest are cut
MAX_LIST_PAGES = 100
MAX_LISTING_BYTES = 8 * 1024 * 1024  # canonical definitions, summed over the listing
MAX_CURSOR_CHARS = 4096
MAX_DESCRIPTION_CHARS = 32 * 1024
MAX_DEFINITION_BYTES = 256 * 1024  # one canonical definition, schemas included

CutReason = Literal["pages", "tools", "bytes", "cursor_cycle", "cursor_size"]


@dataclass(frozen=True)
class InvalidDefinition:
    """A definition that is skipped: where it was, what it hashes to, and why."""

    position: int
    sha256: str
    reason: str

    def as_record(self) -> dict[str, Any]:
        return {"position": self.position, "sha256": self.sha256, "reason": self.reason}


@dataclass
class Listing:
    """What one bounded listing brought: the wire definitions in order, and the cut."""

    wire: list[dict[str, Any]] = field(default_factory=list)
    tools: list[Any] = field(default_factory=list)  # the SDK's objects of ``wire``
    canonical: list[bytes] = field(default_factory=list)  # each one's pinned bytes, made once
    pages: int = 0
    size: int = 0  # bytes of canonical definitions
    cut: CutReason | None = None


async def fetch_listing(client: Any) -> Listing:
    """Every page of ``tools/list`` until the upstream ends it or a cap is reached."""
    listing = Listing()
    cursor: str | None = None
    cursors: set[str] = set()
    while True:
        if listing.pages >= MAX_LIST_PAGES:
            listing.cut = "pages"
            return listing
        page = await list_page(client, cursor)  # the loop free while it is validated
        listing.pages += 1
        # A page is the upstream's to size: dumped and measured a definition at a time,
        # paced (``pacing.py``: a worker thread would hold the GIL the loop needs).
        if not await _take(listing, page.tools):
            return listing
        cursor = page.next_cursor
        if cursor is None:
            return listing
        if len(listing.wire) >= MAX_TOOLS_PER_UPSTREAM:
            listing.cut = "tools"  # more are announced: not fetched
            return listing
        if len(cursor) > MAX_CURSOR_CHARS:
            listing.cut = "cursor_size"
            return listing
        if cursor in cursors:
            listing.cut = "cursor_cycle"
            return listing
        cursors.add(cursor)


async def _take(listing: Listing, tools: list[Any]) -> bool:
    """Add a page's definitions up to the caps, paced; False when the listing is cut
    here."""
    pacer = Pacer()
    for tool in tools:
        await pacer.step()
        if len(listing.wire) >= MAX_TOOLS_PER_UPSTREAM:
            listing.cut = "tools"
            return False
        wire = tool.model_dump(mode="json", by_alias=True, exclude_none=False)
        canonical = canonical_definition(wire)
        size = len(canonical)
        if listing.size + size > MAX_LISTING_BYTES:
            listing.cut = "bytes"
            return False
        listing.size += size
        listing.wire.append(wire)
        listing.tools.append(tool)
        listing.canonical.append(canonical)
    return True


def screen(
    wire: list[dict[str, Any]], canonical: list[bytes] | None = None
) -> tuple[dict[str, dict[str, Any]], list[InvalidDefinition]]:
    """The valid definitions by name, and the skipped ones (module docstring);
    ``canonical``: each definition's canonical bytes, when the fetch already made them."""
    counts: dict[Any, int] = {}
    for definition in wire:
        name = definition.get("name")
        if isinstance(name, str):
            counts[name] = counts.get(name, 0) + 1
    valid: dict[str, dict[str, Any]] = {}
    invalid: list[InvalidDefinition] = []
    for position, definition in enumerate(wire):
        body = canonical[position] if canonical is not None else None
        reason = definition_problem(definition, counts, body)
        if reason is None:
            valid[definition["name"]] = definition
        else:
            digest = sha256_hex(body if body is not None else canonical_definition(definition))
            invalid.append(InvalidDefinition(position, digest, reason))
    return valid, invalid


def definition_problem(
    definition: Mapping[str, Any], counts: Mapping[Any, int], canonical: bytes | None = None
) -> str | None:
    """Why a definition cannot be pinned nor exposed; None when it can (``canonical``: its
    canonical bytes, when already made)."""
    name = definition.get("name")
    if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
        return "name_rule"
    if counts.get(name, 0) > 1:
        return "duplicate_name"
    for key in ("title", "description"):
        value = definition.get(key)
        if value is not None and not isinstance(value, str):
            return f"{key}_type"
    if not _is_object_schema(definition.get("inputSchema")):
        return "input_schema"
    output = definition.get("outputSchema")
    if output is not None and not _is_object_schema(output):
        return "output_schema"
    if len(str(definition.get("description") or "")) > MAX_DESCRIPTION_CHARS:
        return "description_size"
    if canonical is None:
        canonical = canonical_definition(definition)
    if len(canonical) > MAX_DEFINITION_BYTES:
        return "definition_size"
    return None


def _is_object_schema(schema: Any) -> bool:
    """A tool's schema: a JSON object of ``type: object`` whose ``properties`` (if any)
    is an object of objects and whose ``required`` (if any) is a list of strings."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return False
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(value, dict | bool) for value in properties.values()
    ):
        return False
    required = schema.get("required", [])
    return isinstance(required, list) and all(isinstance(item, str) for item in required)


def listing_digest(invalid: list[InvalidDefinition]) -> str:
    """One digest of what was skipped (to audit a change of it once, not every listing)."""
    return sha256_hex(to_canonical_json([i.as_record() for i in invalid]))


__all__ = [
    "MAX_DEFINITION_BYTES",
    "MAX_DESCRIPTION_CHARS",
    "MAX_LISTING_BYTES",
    "MAX_LIST_PAGES",
    "MAX_TOOLS_PER_UPSTREAM",
    "InvalidDefinition",
    "Listing",
    "fetch_listing",
    "listing_digest",
    "screen",
]
