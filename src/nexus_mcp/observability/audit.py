"""The audit trail: typed events about every tool call and the sinks that keep them.

Events are ``tool_call_started``, ``tool_call_finished`` and ``tool_call_blocked``, and
for resources and prompts ``resource_read_finished``/``_blocked`` and
``prompt_get_finished``/``_blocked``. They
carry digests of arguments, never values (unless a tool's contract allows a field),
and never bearer tokens, secrets or note bodies. Sinks: an append-only JSONL file written
through on every ``emit`` (one event, or a call's started and finished events together),
and an in-memory sink that tests use as their double (structlog.testing-style).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from nexus_mcp.ids import new_id
from nexus_mcp.json_text import compact_json
from nexus_mcp.observability.audit_anchor import HeadAnchor
from nexus_mcp.observability.audit_chain import ChainedJsonlWriter

TOOL_CALL_STARTED = "tool_call_started"
TOOL_CALL_FINISHED = "tool_call_finished"
TOOL_CALL_BLOCKED = "tool_call_blocked"
# A resources/read or prompts/get: ``tool`` is "(resource)" or "(prompt)"; the record names
# the resource's source and the sha256 of its URI, or the prompt, never the URI or arguments.
RESOURCE_READ_FINISHED = "resource_read_finished"
RESOURCE_READ_BLOCKED = "resource_read_blocked"
PROMPT_GET_FINISHED = "prompt_get_finished"
PROMPT_GET_BLOCKED = "prompt_get_blocked"
AUDIT_SCHEMA_VERSION = 1

OUTCOME_OK = "OK"

_second_prefix: tuple[int, str] = (-1, "")


def utc_timestamp() -> str:
    """Now as ISO 8601 UTC with microseconds, e.g. ``2026-11-22T04:37:04.506844+00:00``.

    Same text as ``datetime.now(UTC).isoformat(timespec="microseconds")`` at a quarter
    of the cost: the date-and-seconds prefix is formatted once per second.
    """
    global _second_prefix
    now_us = time.time_ns() // 1000
    seconds, micros = divmod(now_us, 1_000_000)
    cached_second, prefix = _second_prefix
    if cached_second != seconds:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _second_prefix = (seconds, prefix)
    return f"{prefix}.{micros:06d}+00:00"


# Every field an audit record may carry, in the order they are written (after "v").
AUDIT_FIELDS = (
    "event",
    "tool_call_id",
    "correlation_id",
    "tool",
    "server_id",
    "upstream_tool",
    "resource_source",
    "uri_sha256",
    "prompt",
    "subject",
    "role",
    "risk",
    "tool_class",
    "outcome",
    "reason",
    "duration_ms",
    "args_digest",
    "args",
    "session",
    "transport",
    "registry",
    "effect_id",
    "document_hashes",
    "batch_total_bytes",
    "side_effects",
    "target_ref",
    "approver",
    "host_id",
    "approval_jti_digest",
    "policy_decision",
    "policy_rule",
    "idempotency",
    "facts",
    "output_scan",
    "pinned_sha256",
    "seen_sha256",
    "ts",
)
_FIELD_SET = frozenset(AUDIT_FIELDS)
_REQUIRED_FIELDS = ("event", "tool_call_id", "correlation_id", "tool")


def _plain(value: Any) -> Any:
    """Nested values as JSON-ready dicts and lists."""
    if isinstance(value, tuple | list):
        return [dict(item) if isinstance(item, Mapping) else item for item in value]
    if isinstance(value, Mapping) and type(value) is not dict:
        return dict(value)
    return value


class AuditEvent:
    """One audit record: its JSON object, with each field readable as an attribute.

    The record is the event: the chain builds the dict once (two per call), sinks write
    it as is, and unset fields are simply absent (read as ``None``). Events are never
    changed after they are built.
    """

    __slots__ = ("_record",)

    def __init__(self, **fields: Any) -> None:
        unknown = fields.keys() - _FIELD_SET
        missing = [name for name in _REQUIRED_FIELDS if fields.get(name) is None]
        if unknown or missing:
            raise TypeError(f"bad audit fields: unknown {sorted(unknown)}, missing {missing}")
        record: dict[str, Any] = {"v": AUDIT_SCHEMA_VERSION}
        for name in AUDIT_FIELDS:
            value = fields.get(name)
            if value is not None:
                record[name] = _plain(value)
        record.setdefault("ts", utc_timestamp())
        self._record = record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> AuditEvent:
        """Wrap a record the chain built itself (``v`` first, only set fields, plain JSON)."""
        event = cls.__new__(cls)
        event._record = record
        return event

    @property
    def record(self) -> Mapping[str, Any]:
        """The record itself, for sinks: read it, never change it."""
        return self._record

    def to_record(self) -> dict[str, Any]:
        return dict(self._record)

    def __getattr__(self, name: str) -> Any:
        if name in _FIELD_SET:
            return self._record.get(name)
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AuditEvent) and other._record == self._record

    def __hash__(self) -> int:
        return hash((self._record.get("tool_call_id"), self._record.get("event")))

    def __repr__(self) -> str:
        return f"AuditEvent({self._record!r})"


class AuditSink(Protocol):
    """Where audit events go. ``emit`` must not raise for a well-formed event.

    ``emit_many`` keeps several events together: a read-class call's started and finished
    events are written as one unit once the tool has returned (``middleware/audit.py``).
    """

    def emit(self, event: AuditEvent) -> None: ...

    def emit_many(self, events: Sequence[AuditEvent]) -> None: ...

    def close(self) -> None: ...


class MemoryAuditSink:
    """Keeps events in memory; the test double for the audit trail."""

    def __init__(self) -> None:
        self._events: list[AuditEvent] = []
        self._lock = threading.Lock()

    def emit(self, event: AuditEvent) -> None:
        with self._lock:
            self._events.append(event)

    def emit_many(self, events: Sequence[AuditEvent]) -> None:
        with self._lock:
            self._events.extend(events)

    def close(self) -> None:
        return None

    @property
    def events(self) -> list[AuditEvent]:
        with self._lock:
            return list(self._events)

    def records(self) -> list[dict[str, Any]]:
        return [e.to_record() for e in self.events]

    def clear(self) -> None:
        with self._lock:
            self._events.clear()


def encode_record(record: Mapping[str, Any]) -> bytes:
    """One JSONL line (with its newline) for an audit record; this runs twice per call."""
    return compact_json(record) + b"\n"


class JsonlAuditSink:
    """Appends one JSON object per line; events are written out before ``emit`` returns.

    Each line carries the hash chain (``prev_sha256``, ``sha256``) and the head of the
    file is stored beside it (``audit_chain.py``), so ``nexus-mcp audit verify`` finds an
    edited, removed, reordered or inserted line. The file is opened ``O_APPEND`` and
    unbuffered: every ``emit`` (and every ``emit_many``, whose lines go together) is one
    ``write`` of whole lines under an exclusive lock shared by every process writing the
    file, so lines are never interleaved, earlier lines are never rewritten and the chain
    stays one sequence. ``fsync=True`` also forces them to disk. ``max_bytes`` rotates the
    file into numbered segments (``audit.jsonl.1``, ...) that keep the chain.
    """

    def __init__(self, path: Path, *, fsync: bool = False, max_bytes: int | None = None) -> None:
        self.path = path
        self._writer = ChainedJsonlWriter(path, fsync=fsync, max_bytes=max_bytes)
        self._anchor: HeadAnchor | None = None

    def emit(self, event: AuditEvent) -> None:
        self._writer.write([event.record])

    def emit_many(self, events: Sequence[AuditEvent]) -> None:
        self._writer.write([event.record for event in events])

    def anchor_with(self, anchor: HeadAnchor) -> None:
        """Copy each new head of the file to ``anchor`` (closed with this sink)."""
        self._anchor = anchor
        self._writer.on_head = anchor.note

    def close(self) -> None:
        self._writer.close()
        if self._anchor is not None:
            self._anchor.close()


def caller_event(event: str, tool: str, principal: Any, **fields: Any) -> AuditEvent:
    """A record of what a caller did outside a tool call (a resource subscription, a listen
    stream): an id of its own, and the caller's subject and role (``principal`` may be
    None: no caller)."""
    call_id = new_id()
    return AuditEvent(
        event=event,
        tool_call_id=call_id,
        correlation_id=call_id,
        tool=tool,
        subject=principal.log_subject if principal is not None else None,
        role=principal.effective_role if principal is not None else None,
        **fields,
    )


class AuditLog:
    """Fans events out to every sink; the chain's audit middleware owns one."""

    def __init__(self, sinks: Iterable[AuditSink]) -> None:
        self.sinks = tuple(sinks)

    def emit(self, event: AuditEvent) -> None:
        for sink in self.sinks:
            sink.emit(event)

    def emit_many(self, events: Sequence[AuditEvent]) -> None:
        for sink in self.sinks:
            sink.emit_many(events)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def read_audit_file(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """Yield ``(line_number, record, problem)`` for each line of a JSONL audit file."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.rstrip("\n")
            if not text:
                yield number, None, "empty line"
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                yield number, None, "not valid JSON"
                continue
            yield number, record, check_audit_record(record)


_REQUIRED = ("v", "event", "tool_call_id", "correlation_id", "tool", "ts")
_KINDS = frozenset(
    {
        TOOL_CALL_STARTED,
        TOOL_CALL_FINISHED,
        TOOL_CALL_BLOCKED,
        RESOURCE_READ_FINISHED,
        RESOURCE_READ_BLOCKED,
        PROMPT_GET_FINISHED,
        PROMPT_GET_BLOCKED,
    }
)


_EVENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def check_audit_record(record: Any) -> str | None:
    """The first problem with one audit record, or None when it is well-formed."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for key in _REQUIRED:
        if key not in record:
            return f"missing field '{key}'"
    event = record["event"]
    # Calls, reads and gets are the kinds every record of ``_KINDS`` is; the console, the
    # inbox, pins, subscriptions and listen streams add their own (``approval_decided``,
    # ``resource_subscribed``, ...), each a plain snake_case name.
    if not isinstance(event, str) or _EVENT_NAME.fullmatch(event) is None:
        return "not an event name"
    if event in _KINDS and event != TOOL_CALL_STARTED and not record.get("outcome"):
        return "missing field 'outcome'"
    try:
        datetime.fromisoformat(str(record["ts"]))
    except ValueError:
        return "timestamp is not ISO 8601"
    for key in _CHAIN_FIELDS:  # written by the file sink (audit_chain.py), else absent
        if key in record and not _is_sha256(record[key]):
            return f"field '{key}' is not a sha256"
    return None


_CHAIN_FIELDS = ("prev_sha256", "sha256")
_HEX = frozenset("0123456789abcdef")


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


__all__ = [
    "AUDIT_FIELDS",
    "OUTCOME_OK",
    "PROMPT_GET_BLOCKED",
    "PROMPT_GET_FINISHED",
    "RESOURCE_READ_BLOCKED",
    "RESOURCE_READ_FINISHED",
    "TOOL_CALL_BLOCKED",
    "TOOL_CALL_FINISHED",
    "TOOL_CALL_STARTED",
    "AuditEvent",
    "AuditLog",
    "AuditSink",
    "JsonlAuditSink",
    "MemoryAuditSink",
    "caller_event",
    "check_audit_record",
    "encode_record",
    "read_audit_file",
    "utc_timestamp",
]
