"""Tool-definition pinning: the "rug pull" defence for upstream MCP servers.

An upstream can change what a tool *says* it does (its description is read by the
caller's model: a prompt-injection channel) or what it takes, after a team reviewed it.
So every upstream tool is pinned: a lock file beside the upstream's registry
(``<registry_dir>/<server_id>.lock.json``, contract ``tool_pins.schema.json``) holds the
sha256 of each tool's canonical definition. A listed tool whose digest differs from its
pin, or that has no pin, is quarantined: hidden and refused like an unknown tool.

The canonical definition is the JSON object of the tool's ``name``, ``title``,
``description``, ``inputSchema``, ``outputSchema`` and ``annotations`` (absent fields as
``null``), written as canonical JSON (DESIGN.md: sorted keys, compact separators, UTF-8).
No FastMCP here: callers pass the MCP wire form of a tool (camelCase keys).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.hashing import sha256_hex, to_canonical_json
from nexus_mcp.policy.registry import find_contract_errors, read_registry_file

PINS_SCHEMA = "tool_pins"
PINS_SCHEMA_ID = "nexus.mcp.tool_pins"
PINS_SCHEMA_VERSION = "v1"
LOCK_SUFFIX = ".lock.json"
DEFINITION_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")


def canonical_definition(tool: Mapping[str, Any]) -> bytes:
    """The bytes a tool definition is pinned by (module docstring)."""
    return to_canonical_json({name: tool.get(name) for name in DEFINITION_FIELDS})


def definition_digest(tool: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_definition(tool))


def lock_path(registry_dir: Path, server_id: str) -> Path:
    return registry_dir / f"{server_id}{LOCK_SUFFIX}"


class PinState(StrEnum):
    PINNED = "pinned"  # digest equals the pin
    CHANGED = "changed"  # digest differs from the pin: tool_definition_changed
    UNPINNED = "unpinned"  # no pin for the tool: tool_unpinned


@dataclass(frozen=True)
class PinFile:
    """One upstream's pins: tool name -> sha256 of its canonical definition."""

    server_id: str
    digests: Mapping[str, str] = field(default_factory=dict)
    pinned_at: Mapping[str, str] = field(default_factory=dict)
    path: Path | None = None

    def state_of(self, tool_name: str, digest: str) -> PinState:
        pinned = self.digests.get(tool_name)
        if pinned is None:
            return PinState.UNPINNED
        return PinState.PINNED if pinned == digest else PinState.CHANGED

    def with_pins(self, digests: Mapping[str, str], *, renew: bool = False) -> PinFile:
        """These pins set. ``renew``: each named tool is stamped anew even when its digest
        is unchanged (an operator re-pinned it after review: a running server forgets the
        quarantine evidence against a pin whose stamp changed)."""
        now = datetime.now(UTC).isoformat(timespec="microseconds")
        merged = dict(self.digests)
        stamps = dict(self.pinned_at)
        for name, digest in digests.items():
            if renew or merged.get(name) != digest:
                stamps[name] = now
            merged[name] = digest
        return PinFile(self.server_id, merged, stamps, self.path)

    def to_document(self) -> dict[str, Any]:
        tools = {}
        for name in sorted(self.digests):
            entry: dict[str, str] = {"sha256": self.digests[name]}
            if name in self.pinned_at:
                entry["pinned_at"] = self.pinned_at[name]
            tools[name] = entry
        return {
            "schema_id": PINS_SCHEMA_ID,
            "schema_version": PINS_SCHEMA_VERSION,
            "server_id": self.server_id,
            "tools": tools,
        }


def renewed_pins(before: PinFile, after: PinFile) -> frozenset[str]:
    """The tools whose pin (digest or stamp) differs between two versions of a lock file."""
    names = set(before.digests) | set(after.digests)
    return frozenset(
        name
        for name in names
        if (before.digests.get(name), before.pinned_at.get(name))
        != (after.digests.get(name), after.pinned_at.get(name))
    )


def load_pins(registry_dir: Path, server_id: str) -> PinFile:
    """The upstream's lock file; a missing file is an empty one (every tool unpinned)."""
    path = lock_path(registry_dir, server_id)
    if not path.exists():
        return PinFile(server_id, {}, {}, path)
    _raw, document = read_registry_file(path)
    errors = find_contract_errors(PINS_SCHEMA, document)
    if errors:
        listing = "\n  ".join(errors)
        raise ConfigError(f"pin file {path} is invalid ({len(errors)} errors):\n  {listing}")
    if document["server_id"] != server_id:
        raise ConfigError(f"pin file {path}: server_id differs from the file name")
    tools = document["tools"]
    return PinFile(
        server_id,
        {name: entry["sha256"] for name, entry in tools.items()},
        {name: entry["pinned_at"] for name, entry in tools.items() if "pinned_at" in entry},
        path,
    )


def write_pins(pins: PinFile) -> Path:
    """Write the lock file atomically (temp file, fsync, rename), stable key order."""
    if pins.path is None:  # pragma: no cover - load_pins always sets it
        raise ValueError("pin file has no path")
    text = json.dumps(pins.to_document(), indent=2, sort_keys=False) + "\n"
    directory = pins.path.parent
    fd, temp = tempfile.mkstemp(prefix=".pins-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, pins.path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return pins.path


__all__ = [
    "DEFINITION_FIELDS",
    "LOCK_SUFFIX",
    "PINS_SCHEMA",
    "PinFile",
    "PinState",
    "canonical_definition",
    "definition_digest",
    "load_pins",
    "lock_path",
    "renewed_pins",
    "write_pins",
]
