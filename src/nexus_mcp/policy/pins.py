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

A lock file is read entry by entry (``load_pins``), never all-or-nothing, so a hostile
or damaged entry cannot take the server down: an entry that breaks the contract (a name
outside MCP's tool-name rule, a digest that is not 64 lowercase hex digits, a duplicate
name, an unknown field) is dropped and reported by its position, never by its text; a
tool whose own entry is bad is quarantined. A file that cannot be used at all (not
readable, not JSON, not the contract, another upstream's ``server_id``) quarantines
every tool of that upstream, and of that upstream only (``PinFile.unusable``): native
tools and the other upstreams are served as ever.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from nexus_mcp.policy.hashing import sha256_hex, to_canonical_json

PINS_SCHEMA = "tool_pins"
PINS_SCHEMA_ID = "nexus.mcp.tool_pins"
PINS_SCHEMA_VERSION = "v1"
LOCK_SUFFIX = ".lock.json"
DEFINITION_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
# The contract's rules (tool_pins.schema.json), checked entry by entry.
PIN_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
PIN_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
PIN_SERVER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_PIN_ENTRIES = 10_000
MAX_LOCK_FILE_BYTES = 16 * 1024 * 1024


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
    # What could not be used, by position only (module docstring): the whole file
    # (``unusable``: a reason), or entries (``rejected``: position, reason); ``broken``:
    # the valid tool names whose own entry was bad (those tools are quarantined).
    unusable: str | None = None
    rejected: tuple[tuple[int, str], ...] = ()
    broken: frozenset[str] = frozenset()

    def quarantines(self, tool_name: str) -> bool:
        """The lock file cannot vouch for this tool: the file, or its entry, is bad."""
        return self.unusable is not None or tool_name in self.broken

    def problems(self) -> list[str]:
        """What was not used, for logs and ``upstream check`` (positions, no text)."""
        if self.unusable is not None:
            return [f"lock file unusable: {self.unusable}"]
        return [f"lock entry #{position}: {reason}" for position, reason in self.rejected]

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
        return PinFile(self.server_id, merged, stamps, self.path, broken=self.broken - set(digests))

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
    """The upstream's lock file; a missing file is an empty one (every tool unpinned).

    Never raises for what the file holds (module docstring): what cannot be used is in
    ``unusable``, ``rejected`` and ``broken``.
    """
    path = lock_path(registry_dir, server_id)
    if not path.exists():
        return PinFile(server_id, {}, {}, path)
    document, why = _read_lock(path)
    if why is None:
        why = _top_level_problem(document, server_id)
    if why is not None:
        return PinFile(server_id, {}, {}, path, unusable=why)
    return _entries(server_id, path, document["tools"])


class _Pairs(dict[str, Any]):
    """A JSON object that remembers the keys it was given more than once."""

    duplicates: frozenset[str] = frozenset()


def _pairs(pairs: list[tuple[str, Any]]) -> _Pairs:
    result = _Pairs(pairs)
    if len(result) != len(pairs):
        counted: dict[str, int] = {}
        for key, _value in pairs:
            counted[key] = counted.get(key, 0) + 1
        result.duplicates = frozenset(k for k, n in counted.items() if n > 1)
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _read_lock(path: Path) -> tuple[Any, str | None]:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_LOCK_FILE_BYTES + 1)
    except OSError as exc:
        return None, f"cannot be read ({type(exc).__name__})"
    if len(raw) > MAX_LOCK_FILE_BYTES:
        return None, f"larger than {MAX_LOCK_FILE_BYTES} bytes"
    try:
        text = raw.decode("utf-8")
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_refuse_constant), None
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except (ValueError, RecursionError):
        return None, "not JSON"


def _top_level_problem(document: Any, server_id: str) -> str | None:
    if not isinstance(document, dict):
        return "not a JSON object"
    if document.duplicates if isinstance(document, _Pairs) else False:
        return "a top-level key is given twice"
    expected = {"schema_id", "schema_version", "server_id", "tools"}
    if set(document) != expected:
        return "not the tool_pins contract (its keys differ)"
    if (document["schema_id"], document["schema_version"]) != (PINS_SCHEMA_ID, PINS_SCHEMA_VERSION):
        return "not the tool_pins v1 contract"
    found = document["server_id"]
    if not isinstance(found, str) or not PIN_SERVER_ID_RE.fullmatch(found) or found != server_id:
        return "server_id differs from the file name"
    tools = document["tools"]
    if not isinstance(tools, dict):
        return "tools is not an object"
    if len(tools) > MAX_PIN_ENTRIES:
        return f"more than {MAX_PIN_ENTRIES} entries"
    return None


def _entries(server_id: str, path: Path, tools: dict[str, Any]) -> PinFile:
    digests: dict[str, str] = {}
    stamps: dict[str, str] = {}
    rejected: list[tuple[int, str]] = []
    broken: set[str] = set()
    duplicates = tools.duplicates if isinstance(tools, _Pairs) else frozenset()
    for position, (name, entry) in enumerate(tools.items()):
        why = _entry_problem(name, entry, duplicates)
        if why is None:
            digests[name] = entry["sha256"]
            if "pinned_at" in entry:
                stamps[name] = entry["pinned_at"]
            continue
        rejected.append((position, why))
        if PIN_NAME_RE.fullmatch(name):
            broken.add(name)  # a tool of that name is quarantined, not left unpinned
    return PinFile(server_id, digests, stamps, path, None, tuple(rejected), frozenset(broken))


def _entry_problem(name: str, entry: Any, duplicates: frozenset[str]) -> str | None:
    if not PIN_NAME_RE.fullmatch(name):
        return "its name does not follow MCP's tool-name rule"
    if name in duplicates:
        return "its name is given more than once"
    if not isinstance(entry, dict) or not set(entry) <= {"sha256", "pinned_at"}:
        return "not an object of sha256 and pinned_at"
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not PIN_DIGEST_RE.fullmatch(digest):
        return "sha256 is not 64 lowercase hex digits"
    stamp = entry.get("pinned_at")
    if stamp is not None and (not isinstance(stamp, str) or not _is_datetime(stamp)):
        return "pinned_at is not a date-time"
    return None


def _is_datetime(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return len(text) <= 64


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
