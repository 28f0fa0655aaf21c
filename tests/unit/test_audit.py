"""The JSONL audit sink and its verifier."""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from nexus_mcp.calls import CallState
from nexus_mcp.contracts import ToolContract
from nexus_mcp.middleware.audit import AuditTrail
from nexus_mcp.observability.audit import (
    OUTCOME_OK,
    TOOL_CALL_STARTED,
    AuditEvent,
    AuditLog,
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


# -- audit durability follows consequence (issue 11) -------------------------------------


class CountingWrite:
    """``os.write`` as it is, counting the calls made on one file descriptor."""

    def __init__(self) -> None:
        self.real = os.write
        self.fds: list[int] = []

    def __call__(self, fd: int, data: bytes) -> int:
        self.fds.append(fd)
        return self.real(fd, data)


def test_emit_many_appends_every_event_in_order_with_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(path)
    writes = CountingWrite()
    monkeypatch.setattr(os, "write", writes)
    started = AuditEvent(event=TOOL_CALL_STARTED, tool_call_id="t", correlation_id="c", tool="x")
    sink.emit_many([started, event(duration_ms=2.0)])
    monkeypatch.undo()
    sink.close()
    assert len(writes.fds) == 1
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["event"] for r in records] == [TOOL_CALL_STARTED, "tool_call_finished"]
    assert all(check_audit_record(r) is None for r in records)


def contract(risk: str) -> ToolContract:
    return ToolContract(name="tool_x", description="x", risk=risk, toolset="t")  # type: ignore[arg-type]


def call_state(tool_class: str | None, *, audit_finishes: bool = True) -> CallState:
    state = CallState(tool_name="tool_x", arguments={"path": "a.txt"}, meta={}, transport=None)
    state.tool_class = tool_class
    state.audit_finishes = audit_finishes
    state.executed = True
    return state


def trail_on(path: Path, risk: str) -> AuditTrail:
    return AuditTrail(AuditLog([JsonlAuditSink(path)]), {"tool_x": contract(risk)})


def test_a_read_class_start_waits_for_its_finish_and_both_leave_in_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.jsonl"
    trail = trail_on(path, "read")
    state = call_state("read")
    trail.started(contract("read"), state)
    assert path.read_text() == ""  # a read changes nothing: its start need not lead it
    writes = CountingWrite()
    monkeypatch.setattr(os, "write", writes)
    trail.finished(state, outcome=OUTCOME_OK)
    monkeypatch.undo()
    trail.log.close()
    assert len(writes.fds) == 1  # both lines or neither
    started, finished = [json.loads(line) for line in path.read_text().splitlines()]
    assert (started["event"], finished["event"]) == (TOOL_CALL_STARTED, "tool_call_finished")
    assert started["tool_call_id"] == finished["tool_call_id"] == state.tool_call_id
    assert "outcome" not in started and "duration_ms" not in started
    assert started["args_digest"] == finished["args_digest"]
    assert started["ts"] <= finished["ts"]  # the started event keeps the time it started
    assert finished["outcome"] == OUTCOME_OK and "duration_ms" in finished
    assert state.started_event is None


@pytest.mark.parametrize(
    ("risk", "tool_class", "gateway_class"),
    [
        ("write", "write", None),
        ("admin", "write", None),
        ("read", "write", None),  # the registry says write: the declared risk is not enough
        ("read", None, None),  # no registry class at all: not known to be a read
        ("read", "read", "write"),  # the gateway disagrees: the safer view wins
        ("write", "read", None),  # declared a write: its intent leads it
    ],
)
def test_anything_not_known_to_only_read_is_on_record_before_it_runs(
    tmp_path: Path, risk: str, tool_class: str | None, gateway_class: str | None
) -> None:
    path = tmp_path / "audit.jsonl"
    trail = trail_on(path, risk)
    state = call_state(tool_class)
    if gateway_class is not None:
        state.classification = SimpleNamespace(tool_class=gateway_class)
    trail.started(contract(risk), state)
    (started,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert started["event"] == TOOL_CALL_STARTED
    trail.finished(state, outcome=OUTCOME_OK)
    trail.log.close()
    assert len(path.read_text().splitlines()) == 2


def test_without_the_audit_layer_to_finish_it_a_read_start_is_written_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    trail = trail_on(path, "read")
    trail.started(contract("read"), call_state("read", audit_finishes=False))
    trail.log.close()
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == [
        TOOL_CALL_STARTED
    ]
