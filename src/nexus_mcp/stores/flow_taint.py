"""Session taint for the flow policy (``policy/flow.py``): which labels a session touched.

A session's taint is keyed by the pair (principal subject, session key): the session key
is the MCP session where the protocol has one and the principal where it has none
(``identity/resolver.session_key``), and the subject is part of the key again here, so
no caller can see, inherit or clear another principal's taint, even by sending the same
session id. Per label the store keeps the call that first touched it (its
``tool_call_id`` and tool name: what the approver is shown, never content).

Taint is forgotten ``taint_ttl_seconds`` after the session's last labelled call; it
survives a reconnect of the same session (same key) within that time.

Backends: ``MemoryTaintStore`` here (embedded: one server process; bounded to ``maxsize``
sessions, least recently tainted first) and ``RedisTaintStore`` (shared: every replica
sees one taint; ``stores/redis_flow.py``).
Fail closed: a Redis failure is ``UnavailableError(store="flow")``; the caller refuses
the call rather than deciding on a taint it could not read or record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from nexus_mcp.policy.budgets import IdleExpiringMap
from nexus_mcp.policy.flow import (
    DEFAULT_TAINT_TTL_SECONDS,
    Taint,
    TaintSource,
)

FLOW_STORE = "flow"
DEFAULT_TAINTED_SESSIONS = 100_000


class TaintStore(Protocol):
    """Which flow labels a session touched, and the call that first touched each."""

    def taint(self, subject: str, session_key: str) -> Taint:
        """The session's taint (empty when it touched nothing, or was forgotten)."""
        ...

    def add(
        self, subject: str, session_key: str, labels: Iterable[str], source: TaintSource
    ) -> frozenset[str]:
        """Record that ``source`` touched ``labels``; the labels that are new to the
        session (the taint change the audit records). Renews the session's TTL."""
        ...


class MemoryTaintStore:
    """``TaintStore`` in process memory (thread-safe; one lock, never awaits)."""

    def __init__(
        self,
        ttl_seconds: float = DEFAULT_TAINT_TTL_SECONDS,
        *,
        maxsize: int = DEFAULT_TAINTED_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: IdleExpiringMap[tuple[str, str], dict[str, TaintSource]] = IdleExpiringMap(
            maxsize, ttl_seconds
        )

    def taint(self, subject: str, session_key: str) -> Taint:
        with self._lock:
            found = self._sessions.get((subject, session_key), self._clock())
            return dict(found) if found else {}

    def add(
        self, subject: str, session_key: str, labels: Iterable[str], source: TaintSource
    ) -> frozenset[str]:
        key = (subject, session_key)
        with self._lock:
            now = self._clock()
            held = dict(self._sessions.get(key, now) or {})
            new = frozenset(label for label in labels if label not in held)
            for label in new:
                held[label] = source
            self._sessions.set(key, held, now)  # renews the TTL
            return new


def text_of(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


__all__ = [
    "DEFAULT_TAINTED_SESSIONS",
    "FLOW_STORE",
    "MemoryTaintStore",
    "TaintStore",
    "text_of",
]
