"""The audit trail: typed events about every tool call and the sinks that keep them.

Events are ``tool_call_started``, ``tool_call_finished`` and ``tool_call_blocked``. They
carry digests of arguments, never values (unless a tool's contract allows a field),
and never bearer tokens, secrets or note bodies. Sinks: an append-only JSONL file flushed
per event, and an in-memory sink that tests use as their double (structlog.testing-style).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

TOOL_CALL_STARTED = "tool_call_started"
TOOL_CALL_FINISHED = "tool_call_finished"
TOOL_CALL_BLOCKED = "tool_call_blocked"
AUDIT_SCHEMA_VERSION = 1

OUTCOME_OK = "OK"


@dataclass(frozen=True)
class AuditEvent:
    """One audit record. Optional fields are omitted from the JSON when unset."""

    event: str
    tool_call_id: str
    correlation_id: str
    tool: str
    subject: str | None = None
    role: str | None = None
    risk: str | None = None
    tool_class: str | None = None
    outcome: str | None = None
    reason: str | None = None
    duration_ms: float | None = None
    args_digest: str | None = None
    args: Mapping[str, Any] | None = None
    session: str | None = None
    transport: str | None = None
    registry: Mapping[str, Any] | None = None
    effect_id: str | None = None
    document_hashes: tuple[Mapping[str, Any], ...] | None = None
    batch_total_bytes: int | None = None
    side_effects: bool | None = None
    target_ref: str | None = None
    approver: str | None = None
    host_id: str | None = None
    approval_jti_digest: str | None = None
    policy_decision: str | None = None
    policy_rule: str | None = None
    idempotency: str | None = None
    facts: Mapping[str, Any] | None = None
    ts: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="microseconds"))

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"v": AUDIT_SCHEMA_VERSION}
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if value is None:
                continue
            kind = type(value)
            if kind is tuple:
                value = [dict(item) for item in value]
            elif kind not in _PLAIN and isinstance(value, Mapping):
                value = dict(value)
            record[name] = value
        return record


# Audit records are written twice per call on the hot path; resolve field names once.
_FIELD_NAMES = tuple(AuditEvent.__dataclass_fields__)
_PLAIN = frozenset({str, int, float, bool})


class AuditSink(Protocol):
    """Where audit events go. ``emit`` must not raise for a well-formed event."""

    def emit(self, event: AuditEvent) -> None: ...

    def close(self) -> None: ...


class MemoryAuditSink:
    """Keeps events in memory; the test double for the audit trail."""

    def __init__(self) -> None:
        self._events: list[AuditEvent] = []
        self._lock = threading.Lock()

    def emit(self, event: AuditEvent) -> None:
        with self._lock:
            self._events.append(event)

    def close(self) -> None:
        return None

    @property
    def events(self) -> list[AuditEvent]:
        with self._lock:
            return list(self._events)

    def records(self) -> list[dict[str, Any]]:
        return [e.to_record() for e in self.events]

    def of_kind(self, kind: str) -> list[AuditEvent]:
        return [e for e in self.events if e.event == kind]

    def clear(self) -> None:
        with self._lock:
            self._events.clear()


class JsonlAuditSink:
    """Appends one JSON object per line; each event is flushed before ``emit`` returns."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self._fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        # Append mode: the OS places every write at the end, so lines from this process are
        # never interleaved mid-line and earlier lines are never rewritten.
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def emit(self, event: AuditEvent) -> None:
        line = json.dumps(event.to_record(), sort_keys=True, separators=(",", ":"), default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


class AuditLog:
    """Fans events out to every sink; the chain's audit middleware owns one."""

    def __init__(self, sinks: Iterable[AuditSink]) -> None:
        self.sinks = tuple(sinks)

    def emit(self, event: AuditEvent) -> None:
        for sink in self.sinks:
            sink.emit(event)

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
_KINDS = frozenset({TOOL_CALL_STARTED, TOOL_CALL_FINISHED, TOOL_CALL_BLOCKED})


def check_audit_record(record: Any) -> str | None:
    """The first problem with one audit record, or None when it is well-formed."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for key in _REQUIRED:
        if key not in record:
            return f"missing field '{key}'"
    if record["event"] not in _KINDS:
        return "unknown event kind"
    if record["event"] != TOOL_CALL_STARTED and not record.get("outcome"):
        return "missing field 'outcome'"
    try:
        datetime.fromisoformat(str(record["ts"]))
    except ValueError:
        return "timestamp is not ISO 8601"
    return None


__all__ = [
    "OUTCOME_OK",
    "TOOL_CALL_BLOCKED",
    "TOOL_CALL_FINISHED",
    "TOOL_CALL_STARTED",
    "AuditEvent",
    "AuditLog",
    "AuditSink",
    "JsonlAuditSink",
    "MemoryAuditSink",
    "check_audit_record",
    "read_audit_file",
]
