"""Identifiers: RFC 9562 UUIDv7 for tool calls, effects and correlation ids.

Python 3.11 has no ``uuid.uuid7``; this is the standard layout (48-bit Unix milliseconds,
version 7, 12 random bits, RFC variant, 62 random bits) with a per-process monotonic
guard so ids minted in the same millisecond still sort in creation order.

Ids are minted on every tool call, so ``new_id`` formats the string directly from the
integer instead of going through ``uuid.UUID`` (3x cheaper; benchmarks/bench_chain.py).
"""

from __future__ import annotations

import os
import re
import threading
import time

_UUID7_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

_lock = threading.Lock()
_last_ms = 0
_last_seq = 0
_MS_MASK = (1 << 48) - 1
_RAND_B_MASK = (1 << 62) - 1
_VERSION_AND_VARIANT = (0x7 << 76) | (0b10 << 62)


def uuid7_int() -> int:
    """A new UUIDv7 as a 128-bit integer, strictly increasing within this process."""
    global _last_ms, _last_seq
    random = int.from_bytes(os.urandom(10), "big")  # one syscall for both random fields
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            # Same (or a backwards) millisecond: keep the last timestamp, bump the counter.
            now_ms = _last_ms
            _last_seq = (_last_seq + 1) & 0xFFF
            if _last_seq == 0:
                now_ms += 1
        else:
            _last_seq = (random >> 64) & 0x7FF
        _last_ms = now_ms
        seq = _last_seq
    timestamp = (now_ms & _MS_MASK) << 80
    return timestamp | (seq << 64) | (random & _RAND_B_MASK) | _VERSION_AND_VARIANT


def new_id() -> str:
    """A new UUIDv7 as its canonical lowercase string."""
    h = f"{uuid7_int():032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_uuid7(value: str) -> bool:
    """True for a canonical lowercase UUIDv7 string."""
    return bool(_UUID7_RE.fullmatch(value))


__all__ = ["is_uuid7", "new_id", "uuid7_int"]
