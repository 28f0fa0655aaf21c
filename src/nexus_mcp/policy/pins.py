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

Beside the lock file, ``pinned-definitions/<server_id>.json`` (contract
``pinned_definitions.schema.json``) keeps the definition each pin was made from, so that
``upstream check`` and ``upstream pin`` can show what changed. Only the operator's
commands read it; ``serve`` never does, and the lock file's format is the one every
version reads (an older server refuses unknown keys in it, so the definitions are not put
there). The digest stays authoritative: a kept definition is used only when it hashes to
the digest the lock file pins (``PinnedDefinitions.for_pin``); one that does not is
reported by position and not shown. A pin without a kept definition (an older lock file)
works as before; its change is shown without a diff.
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

from nexus_mcp.policy.catalog import Kind, key_ok
from nexus_mcp.policy.hashing import sha256_hex, to_canonical_json

PINS_SCHEMA = "tool_pins"
PINS_SCHEMA_ID = "nexus.mcp.tool_pins"
PINS_SCHEMA_VERSION = "v1"
# v2: v1 and the prompts, resource templates and resources of ``policy/catalog.py``. A
# lock file with no such pin is still written as v1 (any version reads it); one with them
# is v2, which a version that knows only v1 refuses as a whole (its tools quarantined:
# fail closed, never a pin half read).
PINS_SCHEMA_VERSION_ITEMS = "v2"
ITEM_KINDS = tuple(kind.value for kind in Kind)
LOCK_SUFFIX = ".lock.json"
DEFINITION_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
# The contract's rules (tool_pins.schema.json), checked entry by entry.
PIN_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
PIN_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
PIN_SERVER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_PIN_ENTRIES = 10_000
MAX_LOCK_FILE_BYTES = 16 * 1024 * 1024
DEFINITIONS_SCHEMA_ID = "nexus.mcp.pinned_definitions"
DEFINITIONS_DIR = "pinned-definitions"
# Every field of a canonical definition but its name (the name is the entry's key).
KEPT_FIELDS = tuple(f for f in DEFINITION_FIELDS if f != "name")
# A listing is at most 8 MiB of canonical definitions (listing.py); indented, more.
MAX_DEFINITIONS_FILE_BYTES = 64 * 1024 * 1024


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
    # Prompts, resource templates and resources (``policy/catalog.py``): kind -> key ->
    # digest, and stamps alike; ``broken_items``: (kind, key) whose own entry was bad.
    items: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    item_stamps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    broken_items: frozenset[tuple[str, str]] = frozenset()

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

    def item_pin(self, kind: Kind, key: str) -> str | None:
        return self.items.get(kind.value, {}).get(key)

    def item_stamp(self, kind: Kind, key: str) -> str | None:
        return self.item_stamps.get(kind.value, {}).get(key)

    def quarantines_item(self, kind: Kind, key: str) -> bool:
        return self.unusable is not None or (kind.value, key) in self.broken_items

    def item_state(self, kind: Kind, key: str, digest: str) -> PinState:
        pinned = self.item_pin(kind, key)
        if pinned is None:
            return PinState.UNPINNED
        return PinState.PINNED if pinned == digest else PinState.CHANGED

    def with_item_pins(
        self, kind: Kind, digests: Mapping[str, str], *, renew: bool = False
    ) -> PinFile:
        """These pins of one kind set (``with_pins``'s rules)."""
        now = datetime.now(UTC).isoformat(timespec="microseconds")
        merged = {k: dict(v) for k, v in self.items.items()}
        stamps = {k: dict(v) for k, v in self.item_stamps.items()}
        pins = merged.setdefault(kind.value, {})
        kept = stamps.setdefault(kind.value, {})
        for key, digest in digests.items():
            if renew or pins.get(key) != digest:
                kept[key] = now
            pins[key] = digest
        broken = frozenset(b for b in self.broken_items if not (b[0] == kind and b[1] in digests))
        return PinFile(
            self.server_id,
            self.digests,
            self.pinned_at,
            self.path,
            broken=self.broken,
            items=merged,
            item_stamps=stamps,
            broken_items=broken,
        )

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
        return PinFile(
            self.server_id,
            merged,
            stamps,
            self.path,
            broken=self.broken - set(digests),
            items=self.items,
            item_stamps=self.item_stamps,
            broken_items=self.broken_items,
        )

    def to_document(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "schema_id": PINS_SCHEMA_ID,
            "schema_version": PINS_SCHEMA_VERSION,
            "server_id": self.server_id,
            "tools": _entries_of(self.digests, self.pinned_at),
        }
        kinds = [kind for kind in ITEM_KINDS if self.items.get(kind)]
        if kinds:
            document["schema_version"] = PINS_SCHEMA_VERSION_ITEMS
            for kind in kinds:
                document[kind] = _entries_of(self.items[kind], self.item_stamps.get(kind, {}))
        return document


def _entries_of(digests: Mapping[str, str], stamps: Mapping[str, str]) -> dict[str, Any]:
    entries = {}
    for name in sorted(digests):
        entry: dict[str, str] = {"sha256": digests[name]}
        if name in stamps:
            entry["pinned_at"] = stamps[name]
        entries[name] = entry
    return entries


def renewed_items(before: PinFile, after: PinFile) -> frozenset[tuple[str, str]]:
    """The (kind, key) whose pin (digest or stamp) differs between two lock files."""
    changed: set[tuple[str, str]] = set()
    for kind in ITEM_KINDS:
        old, new = before.items.get(kind, {}), after.items.get(kind, {})
        old_at, new_at = before.item_stamps.get(kind, {}), after.item_stamps.get(kind, {})
        for key in set(old) | set(new):
            if (old.get(key), old_at.get(key)) != (new.get(key), new_at.get(key)):
                changed.add((kind, key))
    return frozenset(changed)


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
    pins = _entries(server_id, path, document["tools"])
    return _item_entries(pins, document)


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


def _read_lock(path: Path, limit: int = MAX_LOCK_FILE_BYTES) -> tuple[Any, str | None]:
    try:
        with path.open("rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        return None, f"cannot be read ({type(exc).__name__})"
    if len(raw) > limit:
        return None, f"larger than {limit} bytes"
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
    version = document.get("schema_version")
    keys = set(document)
    if version == PINS_SCHEMA_VERSION_ITEMS:
        keys -= set(ITEM_KINDS)
    if keys != expected:
        return "not the tool_pins contract (its keys differ)"
    if document["schema_id"] != PINS_SCHEMA_ID or version not in (
        PINS_SCHEMA_VERSION,
        PINS_SCHEMA_VERSION_ITEMS,
    ):
        return "not the tool_pins v1 or v2 contract"
    found = document["server_id"]
    if not isinstance(found, str) or not PIN_SERVER_ID_RE.fullmatch(found) or found != server_id:
        return "server_id differs from the file name"
    tools = document["tools"]
    if not isinstance(tools, dict):
        return "tools is not an object"
    if len(tools) > MAX_PIN_ENTRIES:
        return f"more than {MAX_PIN_ENTRIES} entries"
    for kind in ITEM_KINDS:
        items = document.get(kind, {})
        if not isinstance(items, dict):
            return f"{kind} is not an object"
        if len(items) > MAX_PIN_ENTRIES:
            return f"more than {MAX_PIN_ENTRIES} {kind} entries"
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


def _item_entries(pins: PinFile, document: Mapping[str, Any]) -> PinFile:
    """The v2 sections (prompts, resource templates, resources), entry by entry: a bad
    entry is dropped and reported by its kind and position; its item is quarantined."""
    items: dict[str, dict[str, str]] = {}
    stamps: dict[str, dict[str, str]] = {}
    rejected = list(pins.rejected)
    broken: set[tuple[str, str]] = set()
    for kind in Kind:
        section = document.get(kind.value, {})
        duplicates = section.duplicates if isinstance(section, _Pairs) else frozenset()
        for position, (key, entry) in enumerate(section.items()):
            why = _entry_problem(key, entry, duplicates, kind=kind)
            if why is None:
                items.setdefault(kind.value, {})[key] = entry["sha256"]
                if "pinned_at" in entry:
                    stamps.setdefault(kind.value, {})[key] = entry["pinned_at"]
                continue
            rejected.append((position, f"{kind.value}: {why}"))
            if key_ok(kind, key):
                broken.add((kind.value, key))
    return PinFile(
        pins.server_id,
        pins.digests,
        pins.pinned_at,
        pins.path,
        None,
        tuple(rejected),
        pins.broken,
        items,
        stamps,
        frozenset(broken),
    )


def _entry_problem(
    name: str, entry: Any, duplicates: frozenset[str], *, kind: Kind | None = None
) -> str | None:
    if kind is None and not PIN_NAME_RE.fullmatch(name):
        return "its name does not follow MCP's tool-name rule"
    if kind is not None and not key_ok(kind, name):
        return "its key does not follow its kind's rule"
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
    _write_atomically(pins.path, text)
    return pins.path


def _write_atomically(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(prefix=".pins-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def definitions_path(registry_dir: Path, server_id: str) -> Path:
    """Where the definitions of an upstream's pins are kept (module docstring): a folder
    of its own, so that no registry loader (``*.json`` of the folder) reads the file and
    no server id's lock file can have its name."""
    return registry_dir / DEFINITIONS_DIR / f"{server_id}.json"


def kept_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a definition: its pinned fields but the name."""
    return {name: tool.get(name) for name in KEPT_FIELDS}


@dataclass(frozen=True)
class PinnedDefinitions:
    """The definitions kept beside an upstream's pins: tool name -> (sha256, definition
    with its name). ``rejected``: the positions of entries that could not be used."""

    server_id: str
    entries: Mapping[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    unusable: str | None = None
    rejected: tuple[tuple[int, str], ...] = ()

    def for_pin(self, tool_name: str, digest: str | None) -> dict[str, Any] | None:
        """The definition pinned by ``digest``, when one is kept (else None)."""
        found = self.entries.get(tool_name)
        if found is None or digest is None or found[0] != digest:
            return None
        return found[1]

    def problems(self) -> list[str]:
        if self.unusable is not None:
            return [f"pinned definitions not used: {self.unusable}"]
        return [f"pinned definition #{p}: {why}; not shown" for p, why in self.rejected]


def load_pinned_definitions(registry_dir: Path, server_id: str) -> PinnedDefinitions:
    """The kept definitions; a missing file keeps none. Never raises for what the file
    holds: an entry whose definition does not hash to its digest is dropped (by position)."""
    path = definitions_path(registry_dir, server_id)
    if not path.exists():
        return PinnedDefinitions(server_id)
    document, why = _read_lock(path, MAX_DEFINITIONS_FILE_BYTES)
    if why is None:
        why = _definitions_problem(document, server_id)
    if why is not None:
        return PinnedDefinitions(server_id, unusable=why)
    entries: dict[str, tuple[str, dict[str, Any]]] = {}
    rejected: list[tuple[int, str]] = []
    duplicates = document["tools"].duplicates if isinstance(document["tools"], _Pairs) else ()
    for position, (name, entry) in enumerate(document["tools"].items()):
        why = _kept_entry_problem(name, entry, duplicates)
        if why is None:
            definition = {"name": name, **entry["definition"]}
            entries[name] = (entry["sha256"], definition)
        else:
            rejected.append((position, why))
    return PinnedDefinitions(server_id, entries, None, tuple(rejected))


def _definitions_problem(document: Any, server_id: str) -> str | None:
    if not isinstance(document, dict) or set(document) != {
        "schema_id",
        "schema_version",
        "server_id",
        "tools",
    }:
        return "not the pinned_definitions contract"
    if (document["schema_id"], document["schema_version"]) != (
        DEFINITIONS_SCHEMA_ID,
        PINS_SCHEMA_VERSION,
    ):
        return "not the pinned_definitions v1 contract"
    if document["server_id"] != server_id:
        return "server_id differs from the file name"
    if not isinstance(document["tools"], dict) or len(document["tools"]) > MAX_PIN_ENTRIES:
        return "tools is not an object of at most 10000 entries"
    return None


def _kept_entry_problem(name: str, entry: Any, duplicates: Any) -> str | None:
    if not PIN_NAME_RE.fullmatch(name) or name in duplicates:
        return "its name is not a tool name given once"
    if not isinstance(entry, dict) or set(entry) != {"sha256", "definition"}:
        return "not an object of sha256 and definition"
    definition = entry["definition"]
    if not isinstance(definition, dict) or not set(definition) <= set(KEPT_FIELDS):
        return "definition is not an object of the pinned fields"
    if not isinstance(entry["sha256"], str) or not PIN_DIGEST_RE.fullmatch(entry["sha256"]):
        return "sha256 is not 64 lowercase hex digits"
    if definition_digest({"name": name, **definition}) != entry["sha256"]:
        return "its definition does not hash to its sha256"
    return None


def write_pinned_definitions(
    registry_dir: Path,
    pins: PinFile,
    definitions: Mapping[str, Mapping[str, Any]],
) -> Path:
    """Keep ``definitions`` (tool name -> wire definition) beside ``pins``, with the
    definitions already kept for the other pins (those still pinned by the same digest);
    atomically, like the lock file. A definition is kept only under its own digest."""
    before = load_pinned_definitions(registry_dir, pins.server_id)
    tools: dict[str, dict[str, Any]] = {}
    for name in sorted(pins.digests):
        digest = pins.digests[name]
        given = definitions.get(name)
        if given is not None and definition_digest({**given, "name": name}) == digest:
            kept = kept_definition(given)
        else:
            found = before.for_pin(name, digest)
            if found is None:
                continue
            kept = kept_definition(found)
        tools[name] = {"sha256": digest, "definition": kept}
    document = {
        "schema_id": DEFINITIONS_SCHEMA_ID,
        "schema_version": PINS_SCHEMA_VERSION,
        "server_id": pins.server_id,
        "tools": tools,
    }
    path = definitions_path(registry_dir, pins.server_id)
    path.parent.mkdir(exist_ok=True)
    _write_atomically(path, json.dumps(document, indent=2, ensure_ascii=True) + "\n")
    return path


__all__ = [
    "DEFINITION_FIELDS",
    "LOCK_SUFFIX",
    "PINS_SCHEMA",
    "PinFile",
    "PinState",
    "PinnedDefinitions",
    "canonical_definition",
    "definition_digest",
    "definitions_path",
    "kept_definition",
    "load_pinned_definitions",
    "load_pins",
    "lock_path",
    "renewed_pins",
    "write_pinned_definitions",
    "write_pins",
]
