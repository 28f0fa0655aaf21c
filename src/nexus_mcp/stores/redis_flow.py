"""Session taint on Redis, shared by every replica (``stores/flow_taint.py`` has the rules).

Fail closed: any Redis failure is ``UnavailableError(store="flow")`` (``call_store``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from nexus_mcp.errors import UnavailableError
from nexus_mcp.policy.flow import DEFAULT_TAINT_TTL_SECONDS, LABELS, Taint, TaintSource
from nexus_mcp.stores.flow_taint import FLOW_STORE, text_of
from nexus_mcp.stores.redis_state import call_store, key_digest, require_prefix

_SEPARATOR = "\x1f"  # never in a subject or a session key's text


class RedisTaintStore:
    """``TaintStore`` on Redis, shared by every replica.

    One hash per session: field = label, value = ``<tool_call_id> <tool>`` of the first
    call that touched it. ``HSETNX`` per label and ``PEXPIRE`` run in one transaction (one
    round trip); ``HSETNX``'s answers are which labels were new, exactly once across
    replicas. The key holds only a digest of the subject and session key.
    """

    def __init__(
        self, client: Any, prefix: str, ttl_seconds: float = DEFAULT_TAINT_TTL_SECONDS
    ) -> None:
        require_prefix(prefix)
        self._client = client
        self._prefix = prefix
        self._ttl_ms = max(1, math.ceil(ttl_seconds * 1000))

    def key(self, subject: str, session_key: str) -> str:
        return f"{self._prefix}:taint:{key_digest(subject + _SEPARATOR + session_key)}"

    def taint(self, subject: str, session_key: str) -> Taint:
        key = self.key(subject, session_key)
        raw = call_store(FLOW_STORE, "taint", lambda: self._client.hgetall(key))
        if not isinstance(raw, dict):
            raise UnavailableError(store=FLOW_STORE, error="UnexpectedReply")
        found: dict[str, TaintSource] = {}
        for label, value in raw.items():
            name = text_of(label)
            if name in LABELS:
                call_id, _, tool = text_of(value).partition(" ")
                found[name] = TaintSource(call_id, tool)
        return found

    def add(
        self, subject: str, session_key: str, labels: Iterable[str], source: TaintSource
    ) -> frozenset[str]:
        wanted = [label for label in LABELS if label in set(labels)]
        key = self.key(subject, session_key)
        value = f"{source.tool_call_id} {source.tool}"

        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=True)
            for label in wanted:
                pipe.hsetnx(key, label, value)
            pipe.pexpire(key, self._ttl_ms)
            return list(pipe.execute())

        answers = call_store(FLOW_STORE, "add", run)
        return frozenset(
            label for label, stored in zip(wanted, answers, strict=False) if stored == 1
        )


__all__ = ["RedisTaintStore"]
