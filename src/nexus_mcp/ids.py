"""Identifiers: RFC 9562 UUIDv7 for tool calls, effects and correlation ids.

Python 3.11 has no ``uuid.uuid7``; this is the standard layout (48-bit Unix milliseconds,
version 7, 12 random bits, RFC variant, 62 random bits) with a per-process monotonic
guard so ids minted in the same millisecond still sort in creation order.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

_UUID7_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

_lock = threading.Lock()
_last_ms = 0
_last_seq = 0


def uuid7() -> uuid.UUID:
    """A new UUIDv7, strictly increasing within this process."""
    global _last_ms, _last_seq
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            # Same (or a backwards) millisecond: keep the last timestamp, bump the counter.
            now_ms = _last_ms
            _last_seq = (_last_seq + 1) & 0xFFF
            if _last_seq == 0:
                now_ms += 1
        else:
            _last_seq = int.from_bytes(os.urandom(2), "big") & 0x7FF
        _last_ms = now_ms
        seq = _last_seq
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (now_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= seq << 64
    value |= 0b10 << 62
    value |= rand_b
    return uuid.UUID(int=value)


def new_id() -> str:
    """A new UUIDv7 as its canonical lowercase string."""
    return str(uuid7())


def is_uuid7(value: str) -> bool:
    """True for a canonical lowercase UUIDv7 string."""
    return bool(_UUID7_RE.match(value))


__all__ = ["is_uuid7", "new_id", "uuid7"]
