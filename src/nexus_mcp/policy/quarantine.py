"""Quarantine evidence for upstream tools: every definition digest any session showed.

An upstream tool is exposed only while every digest seen for it equals its pin
(``policy/pins.py``): an upstream that shows one principal, or one replica, another
definition is quarantined for everyone. ``SeenDigests`` is where that evidence lives:

- ``MemorySeenDigests`` (the embedded backend): process memory, one server process;
- ``RedisSeenDigests`` (the shared backend, ``stores/redis_quarantine.py``): one Redis set
  per (server, tool, pin), so a digest seen by any replica counts on every replica.

The evidence is kept per pin: a digest is recorded under the pin in force when it was
seen, so a new pin (an operator reviewed and accepted the new definition) starts clean,
while the evidence against an unchanged pin stays until the pin changes (no expiry). At
most ``SEEN_PER_TOOL`` digests are kept per (server, tool, pin): past that the tool is
quarantined anyway (all but one differ from the pin), so more would say nothing new.

Evidence against a pin (a digest that differs from it) must outlive the process: a
definition shown once and then reverted stays quarantined after a restart until an
operator re-pins the tool (``nexus-mcp upstream pin``). On the embedded backend that is
a ``PersistedEvidence`` (``stores/sqlite_quarantine.py``: a small SQLite file in the data
directory), read at start-up; on the shared backend the Redis sets never expire.

A store that cannot answer raises ``UnavailableError(store="upstream_quarantine")``; the
gateway then refuses that tool's calls (fail closed), never forwards them unverified.
No FastMCP here, and no driver: the protocol and the in-process store only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

SEEN_PER_TOOL = 16
STORE_UPSTREAM_QUARANTINE = "upstream_quarantine"
UNPINNED = "unpinned"  # the pin part of the key of a tool without a pin
DEFAULT_MAX_KEYS = 100_000  # (server, tool, pin) triples kept in memory (see _evict)

# One observation: the digest a session showed, and the pin in force (None: unpinned).
Observation = tuple[str, str | None]
# One piece of persisted evidence: (tool, pin, a digest seen under it that differs).
Proof = tuple[str, str, str]


@runtime_checkable
class SeenDigests(Protocol):
    """The digests seen for each upstream tool, under each of its pins."""

    def add(self, server_id: str, tool: str, digest: str, *, pinned: str | None) -> None:
        """Record ``digest`` as seen for ``tool`` under the pin ``pinned`` (bounded)."""
        ...

    def get(self, server_id: str, tool: str, *, pinned: str | None) -> frozenset[str]:
        """Every digest recorded for ``tool`` under the pin ``pinned``."""
        ...

    def observe(self, server_id: str, seen: Mapping[str, Observation]) -> dict[str, frozenset[str]]:
        """``add`` each tool's (digest, pin), then ``get`` each: what a tools/list does
        (the shared store does it in one round trip)."""
        ...


@runtime_checkable
class PersistedEvidence(Protocol):
    """Evidence against pins kept across restarts (embedded backend); every method may
    raise (the caller fails closed: it keeps the evidence in memory and says so)."""

    def load(self, server_id: str) -> list[Proof]:
        """Every (tool, pin, digest) kept for ``server_id``."""
        ...

    def record(self, server_id: str, proofs: frozenset[Proof]) -> None:
        """Keep these (idempotent)."""
        ...

    def clear(self, server_id: str, tools: frozenset[str]) -> None:
        """Forget every proof against any pin of these tools (an operator re-pinned)."""
        ...


def proofs_in(seen: Mapping[str, Observation]) -> frozenset[Proof]:
    """The observations that prove a change: a pinned tool seen with another digest."""
    return frozenset(
        (tool, pinned, digest)
        for tool, (digest, pinned) in seen.items()
        if pinned is not None and digest != pinned
    )


class MemorySeenDigests:
    """``SeenDigests`` in process memory (thread-safe): the embedded backend's evidence,
    and the gateway's own copy of what it saw or read while the shared store is down."""

    def __init__(self, *, cap: int = SEEN_PER_TOOL, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.cap = cap
        self.max_keys = max_keys
        self._sets: OrderedDict[tuple[str, str, str], set[str]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, server_id: str, tool: str, digest: str, *, pinned: str | None) -> None:
        with self._lock:
            self._add(server_id, tool, digest, pinned)

    def get(self, server_id: str, tool: str, *, pinned: str | None) -> frozenset[str]:
        with self._lock:
            return frozenset(self._sets.get((server_id, tool, pinned or UNPINNED), ()))

    def observe(self, server_id: str, seen: Mapping[str, Observation]) -> dict[str, frozenset[str]]:
        with self._lock:
            return {
                tool: frozenset(self._add(server_id, tool, digest, pinned))
                for tool, (digest, pinned) in seen.items()
            }

    def merge(
        self, server_id: str, tool: str, digests: frozenset[str], *, pinned: str | None
    ) -> None:
        """Keep a copy of evidence read from elsewhere (bounded like any other)."""
        with self._lock:
            for digest in sorted(digests):
                self._add(server_id, tool, digest, pinned)

    def forget(self, server_id: str, tool: str) -> None:
        """Drop every digest kept for ``tool`` under any pin (it was re-pinned)."""
        with self._lock:
            for key in [k for k in self._sets if k[0] == server_id and k[1] == tool]:
                del self._sets[key]

    def entries(self, server_id: str) -> list[tuple[str, str | None, frozenset[str]]]:
        """Every (tool, pin, digests) kept for ``server_id``."""
        with self._lock:
            return [
                (tool, None if pin == UNPINNED else pin, frozenset(digests))
                for (sid, tool, pin), digests in self._sets.items()
                if sid == server_id
            ]

    def _add(self, server_id: str, tool: str, digest: str, pinned: str | None) -> set[str]:
        key = (server_id, tool, pinned or UNPINNED)
        found = self._sets.get(key)
        if found is None:
            if len(self._sets) >= self.max_keys:
                self._evict()
            found = self._sets[key] = set()
        if len(found) < self.cap:
            found.add(digest)
        return found

    def _evict(self) -> None:
        """Forget the oldest key that proves nothing: one whose digests all equal its pin,
        or of an unpinned tool. Evidence against a pin is never dropped (an upstream
        flooding new tool names must not wash away its own quarantine); there are at most
        as many such keys as pins ever configured."""
        for key, digests in self._sets.items():
            pin = key[2]
            if pin == UNPINNED or all(d == pin for d in digests):
                del self._sets[key]
                return

    def __len__(self) -> int:
        with self._lock:
            return len(self._sets)


__all__ = [
    "SEEN_PER_TOOL",
    "STORE_UPSTREAM_QUARANTINE",
    "UNPINNED",
    "MemorySeenDigests",
    "Observation",
    "PersistedEvidence",
    "Proof",
    "SeenDigests",
    "proofs_in",
]
