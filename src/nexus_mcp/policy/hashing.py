"""Normative hashing (seed 000, DESIGN.md): exact bytes, lowercase hex sha256.

- A string is hashed as its exact UTF-8 bytes; no newline or Unicode normalization.
- Any other JSON value is hashed as canonical JSON: sorted keys, compact separators,
  UTF-8, non-ASCII kept as is.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

CONTENT_HASH_ALG = "sha256"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def to_canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, ``(",", ":")`` separators, UTF-8."""
    # surrogatepass: a lone surrogate (valid in a JSON string, invalid in UTF-8) still gets
    # a deterministic preimage, so digests of hostile arguments never fail.
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8", errors="surrogatepass")


def to_preimage(value: Any) -> bytes:
    """The bytes a JSON value is hashed as: a string's UTF-8, anything else canonical JSON."""
    if isinstance(value, str):
        return value.encode("utf-8")
    return to_canonical_json(value)


def digest_arguments(arguments: dict[str, Any], *, exclude: frozenset[str] = frozenset()) -> str:
    """sha256 of the canonical JSON of call arguments, leaving out ``exclude`` keys."""
    kept = {k: v for k, v in arguments.items() if k not in exclude}
    return sha256_hex(to_canonical_json(kept))


__all__ = [
    "CONTENT_HASH_ALG",
    "digest_arguments",
    "sha256_hex",
    "to_canonical_json",
    "to_preimage",
]
