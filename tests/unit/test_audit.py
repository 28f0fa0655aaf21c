"""The JSONL audit sink and its verifier."""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nexus_mcp.audit import (
    AuditEvent,
    JsonlAuditSink,
    check_audit_record,
    encode_record,
    read_audit_file,
    utc_timestamp,
)


def event(kind: str = "tool_call_finished", **extra: object) -> AuditEvent:
    return AuditEvent(
        event=kind,
        tool_call_id="t",
        correlation_id="c",
        tool="nexus_read_file",
        outcome="OK",
        **extra,
    )  # type: ignore[arg-type]


def test_jsonl_sink_appends_and_flushes_each_event(tmp_path: Path) -> None:
    path = tmp_path / "a" / "audit.jsonl"
    sink = JsonlAuditSink(path)
    sink.emit(event())
    assert len(path.read_text().splitlines()) == 1  # visible before close: flushed per event
    sink.emit(event(duration_ms=1.5))
    sink.close()
    again = JsonlAuditSink(path)
    again.emit(event())
    again.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 3 and records[1]["duration_ms"] == 1.5
    assert all(check_audit_record(r) is None for r in records)
    assert "reason" not in records[0]  # unset fields are omitted


def test_verify_reports_each_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    good = json.dumps(event().to_record())
    path.write_text("\n".join([good, "{not json", json.dumps({"v": 1}), good]) + "\n")
    problems = [(n, p) for n, _, p in read_audit_file(path) if p]
    assert problems == [(2, "not valid JSON"), (3, "missing field 'event'")]


def test_timestamps_are_iso_8601_utc_with_microseconds() -> None:
    before = datetime.now(UTC)
    stamps = [utc_timestamp() for _ in range(2000)]
    after = datetime.now(UTC)
    for stamp in (stamps[0], stamps[-1]):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", stamp)
        parsed = datetime.fromisoformat(stamp)
        assert parsed.tzinfo is not None and before <= parsed <= after
    assert stamps == sorted(stamps)


def test_lines_are_valid_json_even_for_text_without_a_utf8_form(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(path)
    sink.emit(event(args={"path": "a\ud800b", "note": "é"}))
    sink.emit(event(duration_ms=float("nan")))
    sink.close()
    first, second = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert first["args"] == {"path": "a\ud800b", "note": "é"}
    assert second["duration_ms"] is None  # never the non-JSON NaN token
    assert encode_record({"a": 1}).endswith(b"\n")


def test_the_audit_file_is_private_to_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    JsonlAuditSink(path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0


def test_a_closed_sink_refuses_to_write(tmp_path: Path) -> None:
    sink = JsonlAuditSink(tmp_path / "audit.jsonl")
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(ValueError):
        sink.emit(event())
