"""Upstream quarantine evidence in Redis, shared by every replica (issue 15).

``RedisSeenDigests`` is ``policy/quarantine.py``'s ``SeenDigests`` on Redis: one set per
(upstream server, tool, pin) holding the definition digests any replica's sessions showed
for that tool while that pin was in force::

    {prefix}:upstream:{sha256(server_id)}:{sha256(tool)}:{pinned_sha256 or 'unpinned'}:seen

A replica that lists a tool adds the digest it saw (a Lua script: ``SADD`` only while the
set holds fewer than ``SEEN_PER_TOOL`` members, then ``SMEMBERS``), so a digest one
replica saw quarantines the tool on all of them; before forwarding a call, a replica reads
the set (one ``SMEMBERS``). The keys never expire (no TTL): the evidence outlives every
replica's restart, as long as Redis keeps its data (run it with persistence: RDB or
AOF), until an operator re-pins the tool (``nexus-mcp upstream pin`` deletes the tool's
keys, ``clear``) or the pin changes (a new pin is a new key; the old one is left for the
operator to inspect; it holds only digests).

Fail closed: any Redis failure is ``UnavailableError(store="upstream_quarantine")``; the
gateway refuses the tool's calls until the store answers again. The error says which
store, never its address or the driver's text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from nexus_mcp.errors import UnavailableError
from nexus_mcp.policy.quarantine import (
    SEEN_PER_TOOL,
    STORE_UPSTREAM_QUARANTINE,
    UNPINNED,
    Observation,
)
from nexus_mcp.stores.redis_state import call_store, key_digest, require_prefix

T = TypeVar("T")

# KEYS[1]: the set; ARGV[1]: the digest; ARGV[2]: the cap. Returns the set's members.
_OBSERVE_SCRIPT = """
local key = KEYS[1]
local digest = ARGV[1]
if redis.call('SISMEMBER', key, digest) == 0
    and redis.call('SCARD', key) < tonumber(ARGV[2]) then
  redis.call('SADD', key, digest)
end
return redis.call('SMEMBERS', key)
"""


def _call(call: Callable[[], T]) -> T:
    return call_store(STORE_UPSTREAM_QUARANTINE, "seen", call)


def _members(reply: Any) -> frozenset[str]:
    if not isinstance(reply, Iterable) or isinstance(reply, str | bytes):
        raise UnavailableError(store=STORE_UPSTREAM_QUARANTINE, error="UnexpectedReply")
    return frozenset(m.decode("ascii") if isinstance(m, bytes) else str(m) for m in reply)


class RedisSeenDigests:
    """``SeenDigests`` on Redis (module docstring). ``client``: a ``redis.Redis`` (the
    shared backend's, ``stores/redis_state.redis_client``); ``prefix``: ``state.key_prefix``."""

    def __init__(self, client: Any, prefix: str, *, cap: int = SEEN_PER_TOOL) -> None:
        require_prefix(prefix)
        self.client = client
        self.prefix = prefix
        self.cap = cap
        self._observe = client.register_script(_OBSERVE_SCRIPT)

    def key(self, server_id: str, tool: str, pinned: str | None) -> str:
        server, name = key_digest(server_id), key_digest(tool)
        return f"{self.prefix}:upstream:{server}:{name}:{pinned or UNPINNED}:seen"

    def add(self, server_id: str, tool: str, digest: str, *, pinned: str | None) -> None:
        key = self.key(server_id, tool, pinned)
        _call(lambda: self._observe(keys=[key], args=[digest, self.cap]))

    def get(self, server_id: str, tool: str, *, pinned: str | None) -> frozenset[str]:
        key = self.key(server_id, tool, pinned)
        return _members(_call(lambda: self.client.smembers(key)))

    def clear(self, server_id: str, tool: str, pins: Iterable[str | None]) -> None:
        """Forget the evidence against these pins of ``tool`` (an operator re-pinned it:
        ``nexus-mcp upstream pin``)."""
        keys = sorted({self.key(server_id, tool, pinned) for pinned in pins})
        if keys:
            _call(lambda: self.client.delete(*keys))

    def observe(self, server_id: str, seen: Mapping[str, Observation]) -> dict[str, frozenset[str]]:
        if not seen:
            return {}
        tools = list(seen)

        def run() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for tool in tools:
                digest, pinned = seen[tool]
                key = self.key(server_id, tool, pinned)
                self._observe(keys=[key], args=[digest, self.cap], client=pipe)
            return list(pipe.execute())

        replies = _call(run)
        if len(replies) != len(tools):
            raise UnavailableError(store=STORE_UPSTREAM_QUARANTINE, error="UnexpectedReply")
        return {tool: _members(reply) for tool, reply in zip(tools, replies, strict=True)}


__all__ = ["RedisSeenDigests"]
