"""Document enforcement: extract content at registry pointers, decode, limit, hash, compare.

Before a write document op runs, ``check_write_documents`` reads each
``write_content_pointers`` location of the arguments; after a read document op returns,
``check_read_documents`` does the same on the result with ``read_content_pointers``.

Normative preimage (seed 000 invariant 3, DESIGN.md "Tool calls on the wire"):

- ``utf8``: the exact UTF-8 bytes of the string, no newline or Unicode normalization;
  a JSON value that is not a string is hashed as canonical JSON.
- ``base64``: the strictly decoded bytes (padding required, no whitespace, no URL-safe
  alphabet, nothing after the padding); a value that is not a string is refused.

Limits are checked on exact decoded sizes, before the big allocation wherever the size is
known in advance (ASCII strings, base64 lengths). The batch limit counts every item of
one call. Hashes are lowercase hex sha256.

Expected hashes are compared by exact lowercase string. An expected hash for a pointer the
spec does not declare (or for a tool without a write spec) is ``DOC_HASH_MISMATCH``: the
caller expects content the call will not write, so the call is not what it thinks.
"""

from __future__ import annotations

import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nexus_mcp.errors import (
    DocEncodingInvalidError,
    DocHashMismatchError,
    DocPointerInvalidError,
    DocSizeExceededError,
    InvalidInputError,
)
from nexus_mcp.ids import new_id
from nexus_mcp.policy.digests import digest_base64, digest_utf8
from nexus_mcp.policy.hashing import CONTENT_HASH_ALG, to_canonical_json
from nexus_mcp.policy.registry import ContentEncoding, DocumentSpec, ToolClass

META_EXPECTED_HASHES = "nexus.mcp/expected_document_hashes"
MAX_EXPECTED_HASHES = 64  # the contracts' maxItems
MAX_POINTER_LENGTH = 1024

MAX_READ_LIMIT_NAME = "max_read_bytes"
MAX_WRITE_LIMIT_NAME = "max_write_bytes"
MAX_BATCH_LIMIT_NAME = "max_batch_bytes"

_HASH_RE = re.compile(r"[0-9a-f]{64}")
_POINTER_RE = re.compile(r"(/([^~/]|~[01])*)*")
_ARRAY_INDEX_RE = re.compile(r"0|[1-9][0-9]*")
_BAD_ESCAPE_RE = re.compile(r"~(?![01])")


@dataclass(frozen=True, slots=True)
class DocumentHash:
    pointer: str
    hash: str
    size_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"pointer": self.pointer, "hash": self.hash, "size_bytes": self.size_bytes}


@dataclass(frozen=True, slots=True)
class DocumentCheck:
    """Per-item hashes in spec order and the call's total decoded bytes."""

    hashes: tuple[DocumentHash, ...]
    batch_total_bytes: int

    def hash_dicts(self) -> list[dict[str, Any]]:
        """The hashes as written in tool effects and audit records."""
        return [h.to_dict() for h in self.hashes]


EMPTY_CHECK = DocumentCheck(hashes=(), batch_total_bytes=0)


def check_write_documents(
    spec: DocumentSpec | None,
    arguments: Mapping[str, Any],
    expected_hashes: Mapping[str, str] | None = None,
) -> DocumentCheck:
    """Pre-exec: measure and hash the write content of ``arguments``; refuse before the tool runs.

    Pass ``spec=None`` for a tool that is not a write document op: the call passes unless
    the caller sent expected hashes, which nothing could honour.
    """
    expected = expected_hashes or {}
    if spec is None:
        if expected:
            raise DocHashMismatchError(reason="no_document_spec")
        return EMPTY_CHECK
    if not expected.keys() <= set(spec.write_content_pointers):
        raise DocHashMismatchError(reason="pointer_not_in_spec")
    check = _measure(
        arguments,
        spec.write_content_pointers,
        spec.content_encoding,
        item_limit=(MAX_WRITE_LIMIT_NAME, spec.max_write_bytes),
        batch_limit=spec.max_batch_bytes,
    )
    for item in check.hashes:
        wanted = expected.get(item.pointer)
        if wanted is not None and wanted != item.hash:
            raise DocHashMismatchError(pointer=item.pointer)
    return check


def check_read_documents(spec: DocumentSpec | None, result: Any) -> DocumentCheck:
    """Post-exec: measure and hash the read content of a tool's structured result."""
    if spec is None:
        return EMPTY_CHECK
    return _measure(
        result,
        spec.read_content_pointers,
        spec.content_encoding,
        item_limit=(MAX_READ_LIMIT_NAME, spec.max_read_bytes),
        batch_limit=spec.max_batch_bytes,
    )


def resolve_pointer(document: Any, pointer: str) -> Any:
    """RFC 6901 evaluation; anything that does not resolve is ``DOC_CONTENT_POINTER_INVALID``.

    Array tokens must be canonical indices (no leading zeros, no ``-``, in range).
    """
    if pointer == "":
        return document
    if not pointer.startswith("/") or _BAD_ESCAPE_RE.search(pointer):
        raise DocPointerInvalidError(pointer=pointer)
    current = document
    for raw_token in pointer[1:].split("/"):
        token = raw_token.replace("~1", "/").replace("~0", "~")
        if isinstance(current, Mapping):
            if token not in current:
                raise DocPointerInvalidError(pointer=pointer)
            current = current[token]
        elif isinstance(current, Sequence) and not isinstance(current, str | bytes):
            if not _ARRAY_INDEX_RE.fullmatch(token) or int(token) >= len(current):
                raise DocPointerInvalidError(pointer=pointer)
            current = current[int(token)]
        else:
            raise DocPointerInvalidError(pointer=pointer)
    return current


def parse_expected_hashes(meta_value: object) -> dict[str, str]:
    """``_meta["nexus.mcp/expected_document_hashes"]`` -> ``{pointer: hash}``.

    The wire form is the tool_call contract's: a list of ``{"pointer", "hash"}`` objects,
    hashes lowercase hex sha256, pointers RFC 6901, each pointer at most once.
    """
    if meta_value is None:
        return {}
    if not isinstance(meta_value, list) or len(meta_value) > MAX_EXPECTED_HASHES:
        raise InvalidInputError(field=META_EXPECTED_HASHES)
    parsed: dict[str, str] = {}
    for item in meta_value:
        if not isinstance(item, dict) or item.keys() != {"pointer", "hash"}:
            raise InvalidInputError(field=META_EXPECTED_HASHES)
        pointer, digest = item["pointer"], item["hash"]
        if not (
            isinstance(pointer, str)
            and isinstance(digest, str)
            and len(pointer) <= MAX_POINTER_LENGTH
            and _POINTER_RE.fullmatch(pointer)
            and _HASH_RE.fullmatch(digest)
            and pointer not in parsed
        ):
            raise InvalidInputError(field=META_EXPECTED_HASHES)
        parsed[pointer] = digest
    return parsed


def build_tool_effect(
    check: DocumentCheck | None,
    *,
    tool_call_id: str,
    server_id: str,
    tool_name: str,
    tool_class: ToolClass,
    effect_id: str | None = None,
    target_ref: str | None = None,
) -> dict[str, Any]:
    """The tool_effect record (tool_effect.schema.json) for a finished call."""
    check = check or EMPTY_CHECK
    effect = {
        "effect_id": effect_id or new_id(),
        "tool_call_id": tool_call_id,
        "server_id": server_id,
        "tool_name": tool_name,
        "tool_class": tool_class,
        "document_hashes": check.hash_dicts(),
        "batch_total_bytes": check.batch_total_bytes,
        "content_hash_alg": CONTENT_HASH_ALG,
    }
    if target_ref is not None:
        effect["target_ref"] = target_ref
    return effect


def build_tool_call(
    *,
    server_id: str,
    tool_name: str,
    args_digest: str,
    tool_call_id: str | None = None,
    declared_class: str | None = None,
    idempotency_key: str | None = None,
    expected_hashes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The tool_call record (tool_call.schema.json); optional fields only when present."""
    record: dict[str, Any] = {
        "tool_call_id": tool_call_id or new_id(),
        "server_id": server_id,
        "tool_name": tool_name,
        "args_digest": args_digest,
    }
    if declared_class is not None:
        record["tool_class"] = declared_class
    if idempotency_key is not None:
        record["idempotency_key"] = idempotency_key
    record["expected_document_hashes"] = [
        {"pointer": pointer, "hash": digest} for pointer, digest in (expected_hashes or {}).items()
    ]
    record["content_hash_alg"] = CONTENT_HASH_ALG
    return record


def _measure(
    document: Any,
    pointers: Sequence[str],
    encoding: ContentEncoding,
    *,
    item_limit: tuple[str, int],
    batch_limit: int,
) -> DocumentCheck:
    hashes: list[DocumentHash] = []
    total = 0
    for pointer in pointers:
        value = resolve_pointer(document, pointer)
        budget = _Budget(pointer, item_limit[0], item_limit[1], batch_limit, total)
        measure = _measure_base64 if encoding == "base64" else _measure_utf8
        size, digest = measure(value, budget)
        total += size
        hashes.append(DocumentHash(pointer, digest, size))
    return DocumentCheck(tuple(hashes), total)


@dataclass(frozen=True, slots=True)
class _Budget:
    pointer: str
    item_name: str
    item_limit: int
    batch_limit: int
    spent: int

    @property
    def room(self) -> int:
        """The most bytes this item may have within both limits."""
        return min(self.item_limit, self.batch_limit - self.spent)

    def check(self, size: int) -> None:
        if size > self.room:
            raise self.refusal(size)

    def refusal(self, size: int) -> DocSizeExceededError:
        if size > self.item_limit:
            return DocSizeExceededError(
                limit_name=self.item_name,
                limit_bytes=self.item_limit,
                actual_bytes=size,
                pointer=self.pointer,
            )
        return DocSizeExceededError(
            limit_name=MAX_BATCH_LIMIT_NAME,
            limit_bytes=self.batch_limit,
            actual_bytes=self.spent + size,
            pointer=self.pointer,
        )


def _measure_utf8(value: Any, budget: _Budget) -> tuple[int, str]:
    if not isinstance(value, str):
        try:
            data = to_canonical_json(value)
        except (TypeError, ValueError) as exc:
            raise DocEncodingInvalidError(encoding="utf8", pointer=budget.pointer) from exc
        budget.check(len(data))
        return len(data), hashlib.sha256(data).hexdigest()
    if value.isascii():
        # ASCII length is the byte length: refuse before encoding anything.
        budget.check(len(value))
    try:
        # A text over the room is still encoded to its end (not hashed): the refusal
        # names its exact UTF-8 size, and a lone surrogate anywhere is refused first.
        size, digest = digest_utf8(value, budget.room)
    except UnicodeEncodeError as exc:  # lone surrogates from a JSON "\ud800" escape
        raise DocEncodingInvalidError(encoding="utf8", pointer=budget.pointer) from exc
    if digest is None:
        raise budget.refusal(size)
    return size, digest


def _measure_base64(value: Any, budget: _Budget) -> tuple[int, str]:
    if not isinstance(value, str) or len(value) % 4 or not value.isascii():
        raise DocEncodingInvalidError(encoding="base64", pointer=budget.pointer)
    padding = 2 if value.endswith("==") else 1 if value.endswith("=") else 0
    budget.check(len(value) // 4 * 3 - padding)
    try:
        # pybase64 (SIMD) decodes ~30x faster than binascii; validate=True keeps the same
        # strictness (alphabet, padding), which the unit tests pin case by case.
        size, digest = digest_base64(value)
    except (binascii.Error, ValueError) as exc:
        raise DocEncodingInvalidError(encoding="base64", pointer=budget.pointer) from exc
    budget.check(size)
    return size, digest


__all__ = [
    "EMPTY_CHECK",
    "MAX_BATCH_LIMIT_NAME",
    "MAX_EXPECTED_HASHES",
    "MAX_READ_LIMIT_NAME",
    "MAX_WRITE_LIMIT_NAME",
    "META_EXPECTED_HASHES",
    "DocumentCheck",
    "DocumentHash",
    "build_tool_call",
    "build_tool_effect",
    "check_read_documents",
    "check_write_documents",
    "parse_expected_hashes",
    "resolve_pointer",
]
