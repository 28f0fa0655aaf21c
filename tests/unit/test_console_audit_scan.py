"""The console's audit scan reads a bounded window of the real file, newest first, and
says when the file holds more than it read."""

from __future__ import annotations

import json
from pathlib import Path

from nexus_mcp.console.audit import matches, scan


def write(path: Path, count: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for n in range(count):
            record = {"event": "tool_call_finished", "correlation_id": f"c-{n}", "outcome": "OK"}
            handle.write(json.dumps(record) + "\n")
        handle.write("{broken\n")


def test_a_small_file_is_read_whole_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 5)
    found = scan(path)
    assert [r["correlation_id"] for r in found.records] == [f"c-{n}" for n in range(4, -1, -1)]
    assert (found.capped, found.missing) == (False, False)


def test_the_line_cap_keeps_the_newest_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 50)
    found = scan(path, max_lines=10)
    assert found.capped
    assert [r["correlation_id"] for r in found.records][:2] == ["c-49", "c-48"]
    assert len(found.records) < 10


def test_the_byte_cap_drops_the_cut_line_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 50)
    found = scan(path, max_bytes=200)
    assert found.capped and found.records
    assert found.records[0]["correlation_id"] == "c-49"
    assert all(set(r) == {"event", "correlation_id", "outcome"} for r in found.records)


def test_no_file_is_said_as_such(tmp_path: Path) -> None:
    found = scan(tmp_path / "none.jsonl")
    assert found.missing and found.records == []


def test_time_bounds_compare_in_the_records_format() -> None:
    record = {"ts": "2026-01-01T10:00:00.000000+00:00", "subject": "a"}
    assert matches(record, {"since_ts": "2026-01-01T09:59:59.000000+00:00"})
    assert not matches(record, {"until_ts": "2026-01-01T09:59:59.000000+00:00"})
    assert not matches(record, {"subject": "b"})


def rotated_log(tmp_path: Path, count: int, max_bytes: int) -> Path:
    from nexus_mcp.observability.audit import AuditEvent, JsonlAuditSink

    path = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(path, max_bytes=max_bytes)
    for n in range(count):
        sink.emit(AuditEvent(event="tool_call_finished", tool_call_id=f"i-{n}",
                             correlation_id=f"c-{n}", tool="t", outcome="OK"))  # fmt: skip
    sink.close()
    return path


def test_rotated_segments_are_searched_newest_first(tmp_path: Path) -> None:
    path = rotated_log(tmp_path, 40, max_bytes=2000)
    assert path.with_name("audit.jsonl.2").exists()  # rotated at least twice
    found = scan(path)
    assert [r["correlation_id"] for r in found.records] == [f"c-{n}" for n in range(39, -1, -1)]
    assert (found.capped, found.missing) == (False, False)
    # The bounds hold across segments: the newest are kept, and the page says so.
    bounded = scan(path, max_bytes=3000)
    ids = [r["correlation_id"] for r in bounded.records]
    assert bounded.capped and ids == [f"c-{n}" for n in range(39, 39 - len(ids), -1)]


def test_a_heads_file_naming_other_files_is_not_followed(tmp_path: Path) -> None:
    path = rotated_log(tmp_path, 10, max_bytes=2000)
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(json.dumps({"event": "x", "correlation_id": "OUTSIDE"}) + "\n")
    heads = json.loads(path.with_name("audit.jsonl.heads").read_text())
    heads["segments"] += [{"file": "../elsewhere.jsonl"}, {"file": "elsewhere.jsonl"}]
    path.with_name("audit.jsonl.heads").write_text(json.dumps(heads))
    found = scan(path)
    assert "OUTSIDE" not in {r.get("correlation_id") for r in found.records}
    assert len(found.records) == 10
