"""Approval requests in Redis, shared by every replica (issue 26, shared backend).

Keys (``{prefix}:approval:...``):

- ``req:{id}``: a hash with the request's fields (absent field: ``None``); expires one
  day after the request does.
- ``key:{sha256(subject, tool, server_id, args_digest)}``: the id of the latest request
  for that key (never the subject itself in a key name); same lifetime.
- ``pending``: a sorted set of ids by creation time (pending ones; ``pending()`` skips the
  expired).
- ``expiry``: a sorted set of every id by expiry time, for ``purge``.

Every change is one Lua script, so a check and the write it allows run as one step on
the server: of concurrent ``decide``/``use`` calls on any replicas exactly one wins, and
concurrent ``open`` calls for one key store one request. Expiry is judged by the calling
replica's clock (passed to the script), like the SQLite store; key lifetimes are relative
(``EX``) so Redis's own clock does not matter. Any Redis failure is
``UnavailableError(store="approvals")``; nothing is approved or spent on an error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import redis

from nexus_mcp.errors import UnavailableError
from nexus_mcp.stores.approval_requests import (
    APPROVED,
    DENIED,
    FIELDS,
    KEEP_AFTER_EXPIRY_SECONDS,
    PENDING,
    PURGE_BATCH,
    ApprovalDecisionError,
    ApprovalRequest,
    Clock,
    as_read,
    from_mapping,
    request_key,
    validate_decision,
    validate_limit,
    validate_new,
    well_formed_id,
)
from nexus_mcp.stores.redis_state import call_store, require_prefix

APPROVALS = "approvals"

# purge(prefix, cutoff, limit): delete up to ``limit`` requests that expired at or before
# ``cutoff`` (their hash, their key pointer if it still names them, their index entries).
_PURGE_LUA = """
local function purge(prefix, cutoff, limit)
  local base = prefix .. ':approval:'
  local ids = redis.call('ZRANGEBYSCORE', base .. 'expiry', '-inf', cutoff, 'LIMIT', 0, limit)
  for _, id in ipairs(ids) do
    local req = base .. 'req:' .. id
    local key = redis.call('HGET', req, 'key_sha256')
    if key and redis.call('GET', base .. 'key:' .. key) == id then
      redis.call('DEL', base .. 'key:' .. key)
    end
    redis.call('DEL', req)
    redis.call('ZREM', base .. 'expiry', id)
    redis.call('ZREM', base .. 'pending', id)
  end
  return #ids
end
"""

# KEYS: key pointer, new request hash, pending, expiry.
# ARGV: prefix, now, ttl seconds, cutoff, purge batch, id, created_at, expires_at, then
# field/value pairs of the new request. Answers {1, hash} (stored) or {0, hash} (found)
# or {-1} (the id is taken).
_OPEN_SCRIPT = (
    _PURGE_LUA
    + """
purge(ARGV[1], ARGV[4], tonumber(ARGV[5]))
local now = tonumber(ARGV[2])
local current = redis.call('GET', KEYS[1])
if current then
  local req = ARGV[1] .. ':approval:req:' .. current
  local f = redis.call('HMGET', req, 'status', 'expires_at')
  if f[1] and (f[1] == 'pending' or f[1] == 'approved' or f[1] == 'denied')
     and tonumber(f[2]) > now then
    return {0, redis.call('HGETALL', req)}
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then return {-1} end
local fv = {}
for i = 9, #ARGV do fv[#fv + 1] = ARGV[i] end
redis.call('HSET', KEYS[2], unpack(fv))
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[6], 'EX', ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[6])
redis.call('ZADD', KEYS[4], ARGV[8], ARGV[6])
return {1, redis.call('HGETALL', KEYS[2])}
"""
)

# KEYS: request hash, pending. ARGV: id, now, approve (1/0), approver, reason ('' = none).
# Answers {'ok', hash} or {reason why not}.
_DECIDE_SCRIPT = """
local f = redis.call('HMGET', KEYS[1], 'status', 'expires_at')
if not f[1] then return {'unknown'} end
if f[1] ~= 'pending' then return {'decided'} end
if tonumber(f[2]) <= tonumber(ARGV[2]) then return {'expired'} end
local status = 'denied'
if ARGV[3] == '1' then status = 'approved' end
redis.call('HSET', KEYS[1], 'status', status, 'decided_by', ARGV[4], 'decided_at', ARGV[2])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'reason', ARGV[5]) end
redis.call('ZREM', KEYS[2], ARGV[1])
return {'ok', redis.call('HGETALL', KEYS[1])}
"""

# KEYS: request hash. ARGV: now. Answers {'ok', hash} or {reason why not}.
_USE_SCRIPT = """
local f = redis.call('HMGET', KEYS[1], 'status', 'expires_at')
if not f[1] then return {'unknown'} end
local expired = tonumber(f[2]) <= tonumber(ARGV[1])
if f[1] == 'approved' then
  if expired then return {'expired'} end
  redis.call('HSET', KEYS[1], 'status', 'used')
  return {'ok', redis.call('HGETALL', KEYS[1])}
end
if f[1] == 'used' then return {'decided'} end
if f[1] == 'pending' and expired then return {'expired'} end
return {'not_approved'}
"""

_PURGE_SCRIPT = _PURGE_LUA + "return purge(ARGV[1], ARGV[2], tonumber(ARGV[3]))\n"


class RedisApprovalRequestStore:
    """``ApprovalRequestStore`` on Redis (module docstring)."""

    def __init__(
        self, client: redis.Redis, prefix: str = "nexus-mcp", *, clock: Clock = time.time
    ) -> None:
        require_prefix(prefix)
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._open = client.register_script(_OPEN_SCRIPT)
        self._decide = client.register_script(_DECIDE_SCRIPT)
        self._use = client.register_script(_USE_SCRIPT)
        self._purge = client.register_script(_PURGE_SCRIPT)

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, "approval", *parts))

    def open(self, request: ApprovalRequest) -> ApprovalRequest:
        validate_new(request)
        key = request_key(request.subject, request.tool, request.server_id, request.args_digest)
        now = self._clock()
        ttl = max(1, math.ceil(request.expires_at + KEEP_AFTER_EXPIRY_SECONDS - now))
        pairs: list[str] = ["key_sha256", key]
        for name in FIELDS:
            value = getattr(request, name)
            if value is not None:
                pairs += [name, repr(float(value)) if isinstance(value, float | int) else value]
        keys = [
            self._key("key", key),
            self._key("req", request.id),
            self._key("pending"),
            self._key("expiry"),
        ]
        args: list[str | int | float] = [
            self._prefix,
            repr(now),
            ttl,
            repr(now - KEEP_AFTER_EXPIRY_SECONDS),
            PURGE_BATCH,
            request.id,
            repr(float(request.created_at)),
            repr(float(request.expires_at)),
            *pairs,
        ]
        answer = call_store(APPROVALS, "open", lambda: self._open(keys=keys, args=args))
        if not isinstance(answer, list) or not answer:
            raise UnavailableError(store=APPROVALS, error="UnexpectedReply")
        if answer[0] == -1:
            raise ValueError("approval request: id already used")
        return _request(answer[1])

    def get(self, request_id: str) -> ApprovalRequest | None:
        if not well_formed_id(request_id):
            return None
        found = call_store(
            APPROVALS, "get", lambda: self._client.hgetall(self._key("req", request_id))
        )
        return as_read(_request_from_hash(found), self._clock()) if found else None

    def find(
        self, subject: str, tool: str, server_id: str | None, args_digest: str
    ) -> ApprovalRequest | None:
        pointer = self._key("key", request_key(subject, tool, server_id, args_digest))
        request_id = call_store(APPROVALS, "find", lambda: self._client.get(pointer))
        if request_id is None:
            return None
        found = self.get(request_id.decode() if isinstance(request_id, bytes) else request_id)
        now = self._clock()
        if found is None or found.status not in (PENDING, APPROVED, DENIED):
            return None
        return found if now < found.expires_at else None

    def pending(self, *, limit: int = 100) -> list[ApprovalRequest]:
        validate_limit(limit)
        now = self._clock()
        found: list[ApprovalRequest] = []
        start = 0
        batch = max(limit, 100)
        while len(found) < limit:
            ids = call_store(APPROVALS, "pending", self._page(start, batch))
            if not ids:
                break
            hashes = call_store(APPROVALS, "pending", self._fetch(ids))
            for values in hashes:
                if values:
                    request = _request_from_hash(values)
                    if request.status == PENDING and now < request.expires_at:
                        found.append(request)
            start += batch
        return found[:limit]

    def _page(self, start: int, count: int) -> Callable[[], list[Any]]:
        return lambda: list(self._client.zrange(self._key("pending"), start, start + count - 1))

    def _fetch(self, ids: list[Any]) -> Callable[[], list[Any]]:
        def fetch() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for request_id in ids:
                pipe.hgetall(self._key("req", _text(request_id)))
            return list(pipe.execute())

        return fetch

    def decide(
        self,
        request_id: str,
        *,
        approve: bool,
        approver: str,
        reason: str | None = None,
        now: float | None = None,
    ) -> ApprovalRequest:
        validate_decision(approver, reason)
        if not well_formed_id(request_id):
            raise ApprovalDecisionError("unknown")
        moment = self._clock() if now is None else now
        keys = [self._key("req", request_id), self._key("pending")]
        args = [request_id, repr(float(moment)), "1" if approve else "0", approver, reason or ""]
        answer = call_store(APPROVALS, "decide", lambda: self._decide(keys=keys, args=args))
        return _outcome(answer)

    def use(self, request_id: str, *, now: float | None = None) -> ApprovalRequest:
        if not well_formed_id(request_id):
            raise ApprovalDecisionError("unknown")
        moment = self._clock() if now is None else now
        keys = [self._key("req", request_id)]
        answer = call_store(
            APPROVALS, "use", lambda: self._use(keys=keys, args=[repr(float(moment))])
        )
        return _outcome(answer)

    def purge(self, now: float | None = None) -> int:
        cutoff = repr((self._clock() if now is None else now) - KEEP_AFTER_EXPIRY_SECONDS)
        total = 0
        while True:
            count = call_store(
                APPROVALS,
                "purge",
                lambda: self._purge(args=[self._prefix, cutoff, 1000]),
            )
            if not isinstance(count, int):
                raise UnavailableError(store=APPROVALS, error="UnexpectedReply")
            total += count
            if count < 1000:
                return total

    def close(self) -> None:
        # The client is the state backend's (closed with it).
        return None


def _text(value: Any) -> Any:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _request(flat: Any) -> ApprovalRequest:
    if not isinstance(flat, list) or len(flat) % 2:
        raise UnavailableError(store=APPROVALS, error="UnexpectedReply")
    return from_mapping({_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)})


def _request_from_hash(values: dict[Any, Any]) -> ApprovalRequest:
    return from_mapping({_text(k): _text(v) for k, v in values.items()})


def _outcome(answer: Any) -> ApprovalRequest:
    if not isinstance(answer, list) or not answer:
        raise UnavailableError(store=APPROVALS, error="UnexpectedReply")
    status = _text(answer[0])
    if status != "ok":
        raise ApprovalDecisionError(status)
    return _request(answer[1])


__all__ = ["APPROVALS", "RedisApprovalRequestStore"]
