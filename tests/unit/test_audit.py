"""The JSONL audit sink and its verifier."""

from __future__ import annotations

import json
from pathlib import Path

from nexus_mcp.audit import AuditEvent, JsonlAuditSink, check_audit_record, read_audit_file


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
