"""Normative hashing (seed 000, DESIGN.md): exact bytes, lowercase hex sha256.

- A string is hashed as its exact UTF-8 bytes; no newline or Unicode normalization.
- Any other JSON value is hashed as canonical JSON: sorted keys, compact separators,
  UTF-8, non-ASCII kept as is.

Some numbers a client can send have no canonical JSON: Python's JSON reader (and so the
MCP SDK's, on stdio and HTTP) accepts ``NaN``, ``Infinity`` and ``-Infinity``, and reads
``1e999`` as infinity, none of which JSON has; and an integer longer than Python's
integer-to-text limit (``sys.get_int_max_str_digits()``, 4,300 digits) cannot be written
back. ``first_unrepresentable`` finds them, so the chain refuses such a call as
``INVALID_INPUT`` before anything is derived from it, and ``fingerprint_arguments`` still
gives the audit record of the refused call a digest.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

CONTENT_HASH_ALG = "sha256"
PROBLEM_UNREPRESENTABLE = "number_not_representable"
# An integer of at most (limit - 1) * log2(10) bits has fewer digits than the limit, so it
# is writable without trying; only a longer one is written out to find out.
_BITS_PER_DIGIT = math.log2(10)
# The preimage of a fingerprint that canonical JSON could not write starts with a byte no
# canonical JSON object starts with, so it never equals the digest of other arguments.
_FINGERPRINT_FALLBACK_PREFIX = b"\x00unrepresentable:"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def to_canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, ``(",", ":")`` separators, UTF-8."""
    # surrogatepass: a lone surrogate (valid in a JSON string, invalid in UTF-8) still gets
    # a deterministic preimage, so digests of hostile arguments never fail.
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8", errors="surrogatepass")


def is_representable(number: int | float) -> bool:
    """Whether canonical JSON can write ``number`` (finite, and not too long as text)."""
    if isinstance(number, float):
        return math.isfinite(number)
    limit = sys.get_int_max_str_digits()
    if limit == 0 or number.bit_length() <= (limit - 1) * _BITS_PER_DIGIT:
        return True
    try:
        return len(str(number)) > 0
    except ValueError:
        return False


def first_unrepresentable(arguments: Mapping[str, Any]) -> str | None:
    """The first argument whose value holds, at any depth, a number canonical JSON cannot
    write (see the module docstring), or ``None``. Iterative: depth costs no stack."""
    for name, value in arguments.items():
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, float | int) and not isinstance(item, bool):
                if not is_representable(item):
                    return name
            elif isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list | tuple):
                stack.extend(item)
    return None


def digest_arguments(arguments: dict[str, Any], *, exclude: frozenset[str] = frozenset()) -> str:
    """sha256 of the canonical JSON of call arguments, leaving out ``exclude`` keys.

    What binds arguments (idempotency records, approval tokens) uses this; arguments with
    no canonical JSON raise ``ValueError``, which those callers refuse as typed errors.
    """
    kept = {k: v for k, v in arguments.items() if k not in exclude}
    return sha256_hex(to_canonical_json(kept))


def fingerprint_arguments(
    arguments: dict[str, Any], *, exclude: frozenset[str] = frozenset()
) -> str:
    """``digest_arguments`` for the audit record: defined for anything a client can send.

    A call whose arguments have no canonical JSON is refused, but its refusal is recorded
    too; its fingerprint hashes the same structure with those numbers written as text.
    """
    kept = {k: v for k, v in arguments.items() if k not in exclude}
    try:
        return sha256_hex(to_canonical_json(kept))
    except ValueError:
        preimage = to_canonical_json(_as_text_numbers(kept))
        return sha256_hex(_FINGERPRINT_FALLBACK_PREFIX + preimage)


def _as_text_numbers(value: Any) -> Any:
    # Only reached for a refused call; the depth is what the JSON reader allowed.
    if isinstance(value, dict):
        return {k: _as_text_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_text_numbers(v) for v in value]
    if (
        isinstance(value, float | int)
        and not isinstance(value, bool)
        and not is_representable(value)
    ):
        return repr(value) if isinstance(value, float) else f"int:{value:x}"
    return value


__all__ = [
    "CONTENT_HASH_ALG",
    "PROBLEM_UNREPRESENTABLE",
    "digest_arguments",
    "fingerprint_arguments",
    "first_unrepresentable",
    "is_representable",
    "sha256_hex",
    "to_canonical_json",
]
