"""The tool registry: load, validate, digest and pin the manifest that classifies tools.

Each registry file (``schemas/mcp/registries/<server>.json``) is validated against the
``talos.mcp.tool_registry`` v1 contract, digested (sha256 of the exact file bytes), given
the seed's size defaults, and frozen into value objects. A file that is invalid, or whose
version or digest differs from the pin in settings, stops start-up with a ``ConfigError``
naming the file and listing every problem (registry parity, seed 000 invariant 4).

The gateway middleware and the ``@nexus_tool`` connector hold the same ``RegistrySet``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.contract_check import Check, ContractValidator, compile_contract

ToolClass = Literal["read", "write"]
ContentEncoding = Literal["utf8", "base64"]

MIB = 1024 * 1024
DEFAULT_MAX_READ_BYTES = 10 * MIB
DEFAULT_MAX_WRITE_BYTES = 5 * MIB
DEFAULT_MAX_BATCH_BYTES = 50 * MIB

REGISTRY_SCHEMA = "tool_registry"
TOOL_CALL_SCHEMA = "tool_call"
TOOL_EFFECT_SCHEMA = "tool_effect"

# Where the lead's build copies the contracts inside the installed package; the source
# tree is the fallback for a checkout.
_PACKAGE_DATA = Path(__file__).resolve().parents[1] / "data"
_REPO_SCHEMAS = Path(__file__).resolve().parents[3] / "schemas" / "mcp"

# Server-tool risks from seed 002; admin is a write for classification purposes.
_RISK_TO_CLASS: Mapping[str, ToolClass] = {"read": "read", "write": "write", "admin": "write"}


@dataclass(frozen=True, slots=True)
class DocumentSpec:
    """Where a document operation's content lies, how it is encoded, and its limits."""

    content_encoding: ContentEncoding
    write_content_pointers: tuple[str, ...]
    read_content_pointers: tuple[str, ...]
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES
    max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES


@dataclass(frozen=True, slots=True)
class ToolEntry:
    tool_name: str
    tool_class: ToolClass
    is_document_op: bool
    document_spec: DocumentSpec | None


@dataclass(frozen=True)
class ToolRegistry:
    """One server's validated registry file."""

    server_id: str
    server_version: str
    digest: str
    path: Path
    entries: tuple[ToolEntry, ...]
    _index: Mapping[str, ToolEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {entry.tool_name: entry for entry in self.entries}
        object.__setattr__(self, "_index", MappingProxyType(index))

    def lookup(self, tool_name: str) -> ToolEntry | None:
        return self._index.get(tool_name)


@dataclass(frozen=True)
class RegistrySet:
    """Every loaded registry by server id: the one object policy and connector share."""

    registries: Mapping[str, ToolRegistry]

    def __post_init__(self) -> None:
        object.__setattr__(self, "registries", MappingProxyType(dict(self.registries)))

    def get(self, server_id: str) -> ToolRegistry | None:
        return self.registries.get(server_id)

    def lookup(self, server_id: str, tool_name: str) -> ToolEntry | None:
        registry = self.registries.get(server_id)
        return registry.lookup(tool_name) if registry is not None else None

    def tool_names(self, server_ids: Iterable[str]) -> dict[str, frozenset[str]]:
        """Each of ``server_ids`` that has a registry: the tool names it lists."""
        return {
            sid: frozenset(entry.tool_name for entry in reg.entries)
            for sid in server_ids
            if (reg := self.registries.get(sid)) is not None
        }

    def summary(self) -> dict[str, dict[str, str]]:
        """``{server_id: {"server_version", "digest"}}`` for /readyz and audit events."""
        return {
            server_id: {"server_version": reg.server_version, "digest": reg.digest}
            for server_id, reg in sorted(self.registries.items())
        }


@dataclass(frozen=True, slots=True)
class RiskMismatch:
    """A registered tool whose declared risk disagrees with the registry (None: unclassified)."""

    tool_name: str
    declared_risk: str
    registry_class: ToolClass | None


def schema_path(name: str = REGISTRY_SCHEMA) -> Path:
    """The contract ``<name>.schema.json``: package data first, then the source tree."""
    filename = f"{name}.schema.json"
    packaged = _PACKAGE_DATA / "schemas" / filename
    return packaged if packaged.is_file() else _REPO_SCHEMAS / filename


def default_registry_dir() -> Path:
    """The shipped registries: package data first, then ``<repo>/schemas/mcp/registries``."""
    packaged = _PACKAGE_DATA / "registries"
    return packaged if packaged.is_dir() else _REPO_SCHEMAS / "registries"


@cache
def _validator(name: str) -> Draft202012Validator:
    path = schema_path(name)
    try:
        schema = json.loads(path.read_bytes())
        Draft202012Validator.check_schema(schema)
    except (OSError, ValueError, SchemaError) as exc:
        raise ConfigError(f"contract schema {path} cannot be used: {type(exc).__name__}") from exc
    # Patterns read as ECMA regexes, as the contracts mean them (contract_check.ecma_regex).
    return ContractValidator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


@cache
def _inlined_schema(name: str) -> dict[str, Any]:
    """Contract ``name`` (checked by ``_validator``) with its local ``#/$defs/...``
    references written in place: nothing left to resolve while validating."""
    _validator(name)  # the schema as shipped must be valid itself
    schema = json.loads(schema_path(name).read_bytes())
    inlined: dict[str, Any] = _inline_local_refs(schema, schema.get("$defs", {}), depth=0)
    return inlined


@cache
def contract_validator(name: str) -> Draft202012Validator:
    """jsonschema's validator of contract ``<name>.schema.json``, built once: the
    authority that says why a document fails (``best_match``)."""
    schema = _inlined_schema(name)
    # Patterns read as ECMA regexes, as the contracts mean them (contract_check.ecma_regex).
    return ContractValidator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


@cache
def contract_check(name: str) -> Check:
    """Whether a document satisfies contract ``name``, for a per-call hot path.

    The schema compiled to plain checks (``contract_check.compile_contract``: a few us
    for a ``tool_call`` record where jsonschema takes 130 to 280); a schema outside that
    subset is answered by jsonschema.
    """
    compiled = compile_contract(_inlined_schema(name))
    return compiled if compiled is not None else contract_validator(name).is_valid


_MAX_REF_DEPTH = 16  # the contracts nest $defs a level or two; a cycle stops here


def _inline_local_refs(node: Any, defs: dict[str, Any], *, depth: int) -> Any:
    if depth > _MAX_REF_DEPTH:
        raise ConfigError("contract schema references nest too deeply (a cycle?)")
    if isinstance(node, list):
        return [_inline_local_refs(item, defs, depth=depth) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: _inline_local_refs(value, defs, depth=depth)
        for key, value in node.items()
        if key not in ("$ref", "$defs")
    }
    ref = node.get("$ref")
    if isinstance(ref, str):
        if not ref.startswith("#/$defs/") or ref[8:] not in defs:
            raise ConfigError(f"contract schema reference {ref!r} is not a local definition")
        target = _inline_local_refs(defs[ref[8:]], defs, depth=depth + 1)
        # Siblings of a $ref apply as well as it (2020-12): merged when no keyword is on
        # both sides, else kept apart under allOf.
        out = {**target, **out} if not set(target) & set(out) else {**out, "allOf": [target]}
    return out


def find_contract_errors(name: str, document: Any) -> list[str]:
    """Every violation of contract ``name`` as ``"<json path>: <message>"``, sorted by path."""
    errors = sorted(_validator(name).iter_errors(document), key=_path_order)
    return [f"{error.json_path}: {error.message}" for error in errors]


def find_registry_errors(document: Any) -> list[str]:
    """Schema violations plus the rules JSON Schema cannot state (unique tool names)."""
    # "name\n" is refused by the schema's own patterns, read as ECMA regexes
    # (contract_check.ecma_regex), where Python's ``$`` alone would let it through.
    errors = find_contract_errors(REGISTRY_SCHEMA, document)
    tools = document.get("tools") if isinstance(document, dict) else None
    if isinstance(tools, list):
        seen: set[str] = set()
        for position, tool in enumerate(tools):
            name = tool.get("tool_name") if isinstance(tool, dict) else None
            if not isinstance(name, str):
                continue
            if name in seen:
                errors.append(f"$.tools[{position}].tool_name: duplicate tool name {name!r}")
            seen.add(name)
    return errors


def read_registry_file(path: Path) -> tuple[bytes, Any]:
    """The exact bytes and the parsed JSON; duplicate keys and NaN are refused."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"registry {path}: cannot be read ({type(exc).__name__})") from exc
    try:
        document = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_refuse_duplicate_keys,
            parse_constant=_refuse_constant,
        )
    except UnicodeDecodeError as exc:
        raise ConfigError(f"registry {path}: not UTF-8 (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"registry {path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    except ValueError as exc:
        raise ConfigError(f"registry {path}: {exc}") from exc
    return raw, document


def compute_digest(path: Path) -> str:
    """sha256 of the exact file bytes, lowercase hex: the value settings pin."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise ConfigError(f"registry {path}: cannot be read ({type(exc).__name__})") from exc


def load_registry(path: Path) -> ToolRegistry:
    """Validate one file (all errors at once) and freeze it, with size defaults applied."""
    raw, document = read_registry_file(path)
    errors = find_registry_errors(document)
    if errors:
        listing = "\n  ".join(errors)
        raise ConfigError(f"registry {path} is invalid ({_count(len(errors))}):\n  {listing}")
    entries = tuple(_to_entry(tool) for tool in document["tools"])
    return ToolRegistry(
        server_id=document["server_id"],
        server_version=document["server_version"],
        digest=hashlib.sha256(raw).hexdigest(),
        path=path,
        entries=entries,
    )


def load_registry_set(
    paths: Iterable[Path],
    *,
    pins: Mapping[str, tuple[str | None, str | None]] | None = None,
) -> RegistrySet:
    """Load every file once, refuse duplicate server ids and any pin that differs.

    ``pins`` maps server_id to ``(server_version, digest)``; ``None`` in either place
    leaves that part unpinned. A pinned server without a registry file is refused too.
    """
    registries: dict[str, ToolRegistry] = {}
    for path in sorted(paths):
        registry = load_registry(path)
        earlier = registries.get(registry.server_id)
        if earlier is not None:
            raise ConfigError(
                f"registry {path}: server_id {registry.server_id!r} is also in {earlier.path}"
            )
        registries[registry.server_id] = registry
    _check_pins(registries, pins or {})
    return RegistrySet(registries)


def list_registry_files(directory: Path) -> list[Path]:
    """The ``*.json`` registry files of a directory, sorted; an empty or missing dir refuses."""
    if not directory.is_dir():
        raise ConfigError(f"registry directory {directory} does not exist")
    # ``<server_id>.lock.json`` beside a registry is its upstream's pin file (pins.py).
    files = sorted(
        p for p in directory.glob("*.json") if p.is_file() and not p.name.endswith(".lock.json")
    )
    if not files:
        raise ConfigError(f"registry directory {directory} holds no *.json registry")
    return files


def load_registry_dir(
    directory: Path,
    *,
    pins: Mapping[str, tuple[str | None, str | None]] | None = None,
    upstream_directory: Path | None = None,
) -> RegistrySet:
    """The registries of ``directory`` and, when it is another folder, those of
    ``upstream_directory`` (upstream servers' registries; it may hold none yet)."""
    files = list_registry_files(directory)
    if upstream_directory is not None and upstream_directory.resolve() != directory.resolve():
        if not upstream_directory.is_dir():
            raise ConfigError(f"registry directory {upstream_directory} does not exist")
        files += sorted(
            p
            for p in upstream_directory.glob("*.json")
            if p.is_file() and not p.name.endswith(".lock.json")
        )
    return load_registry_set(files, pins=pins)


def upstream_registry_dir(directory: Path | None, upstream_directory: Path | None) -> Path:
    """Where upstream registries and their pin files live: the upstream directory when
    set, else the registry directory, else the shipped one."""
    return upstream_directory or directory or default_registry_dir()


def check_risk_parity(
    registry_set: RegistrySet, *, server_id: str, declared_risks: Mapping[str, str]
) -> list[RiskMismatch]:
    """Registered tools whose declared risk (read/write/admin) disagrees with the registry.

    Admin counts as write; an unknown risk word and an unclassified tool are mismatches.
    The caller decides whether a mismatch refuses start-up (prod) or warns (dev).
    """
    mismatches: list[RiskMismatch] = []
    for tool_name, risk in sorted(declared_risks.items()):
        entry = registry_set.lookup(server_id, tool_name)
        registry_class = entry.tool_class if entry is not None else None
        if registry_class is None or _RISK_TO_CLASS.get(risk) != registry_class:
            mismatches.append(RiskMismatch(tool_name, risk, registry_class))
    return mismatches


def _check_pins(
    registries: Mapping[str, ToolRegistry], pins: Mapping[str, tuple[str | None, str | None]]
) -> None:
    problems: list[str] = []
    for server_id, (version, digest) in sorted(pins.items()):
        registry = registries.get(server_id)
        if registry is None:
            problems.append(f"server {server_id!r} is pinned but no registry file declares it")
            continue
        if version is not None and version != registry.server_version:
            problems.append(
                f"registry {registry.path}: server_version {registry.server_version!r} "
                f"differs from the pinned {version!r}"
            )
        if digest is not None and digest.strip().lower() != registry.digest:
            problems.append(
                f"registry {registry.path}: digest {registry.digest} differs from the pinned "
                f"{digest.strip().lower()}"
            )
    if problems:
        raise ConfigError("registry parity check failed:\n  " + "\n  ".join(problems))


def _to_entry(tool: Mapping[str, Any]) -> ToolEntry:
    raw_spec = tool.get("document_spec")
    spec = None
    if raw_spec is not None:
        spec = DocumentSpec(
            content_encoding=cast(ContentEncoding, raw_spec["content_encoding"]),
            write_content_pointers=tuple(raw_spec.get("write_content_pointers", ())),
            read_content_pointers=tuple(raw_spec.get("read_content_pointers", ())),
            max_read_bytes=raw_spec.get("max_read_bytes", DEFAULT_MAX_READ_BYTES),
            max_write_bytes=raw_spec.get("max_write_bytes", DEFAULT_MAX_WRITE_BYTES),
            max_batch_bytes=raw_spec.get("max_batch_bytes", DEFAULT_MAX_BATCH_BYTES),
        )
    return ToolEntry(
        tool_name=tool["tool_name"],
        tool_class=cast(ToolClass, tool["tool_class"]),
        is_document_op=bool(tool["is_document_op"]),
        document_spec=spec,
    )


def _path_order(error: ValidationError) -> list[tuple[int, int | str]]:
    # Array indices sort numerically before keys, so "$.tools[10]" follows "$.tools[2]".
    return [(0, part) if isinstance(part, int) else (1, str(part)) for part in error.path]


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate JSON key {key!r}")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _count(errors: int) -> str:
    return f"{errors} error" if errors == 1 else f"{errors} errors"


__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_READ_BYTES",
    "DEFAULT_MAX_WRITE_BYTES",
    "REGISTRY_SCHEMA",
    "TOOL_CALL_SCHEMA",
    "TOOL_EFFECT_SCHEMA",
    "ContentEncoding",
    "DocumentSpec",
    "RegistrySet",
    "RiskMismatch",
    "ToolClass",
    "ToolEntry",
    "ToolRegistry",
    "check_risk_parity",
    "compute_digest",
    "contract_check",
    "contract_validator",
    "default_registry_dir",
    "find_contract_errors",
    "find_registry_errors",
    "list_registry_files",
    "load_registry",
    "load_registry_dir",
    "load_registry_set",
    "read_registry_file",
    "schema_path",
    "upstream_registry_dir",
]
