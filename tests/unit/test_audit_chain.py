"""The tamper-evident audit file: every tampering is caught at its first position.

Real files in tmp_path written by the real sink, checked by the real ``nexus-mcp audit
verify`` (``cli.main``). Verify names the file and line, never a record's content.
"""

from __future__ import annotations

import json
import multiprocessing
from itertools import pairwise
from pathlib import Path

import pytest

from nexus_mcp.cli import main
from nexus_mcp.observability.audit import AuditEvent, JsonlAuditSink, check_audit_record
from nexus_mcp.observability.audit_chain import GENESIS, chain_line, heads_path

CANARY = "CANARY-SECRET-TEXT"


def event(n: int) -> AuditEvent:
    return AuditEvent(
        event="tool_call_finished",
        tool_call_id=f"call-{n}",
        correlation_id="c",
        tool="nexus_read_file",
        outcome="OK",
        reason=CANARY,
    )  # type: ignore[arg-type]


def write_log(path: Path, count: int, *, max_bytes: int | None = None) -> None:
    sink = JsonlAuditSink(path, max_bytes=max_bytes)
    for n in range(count):
        sink.emit(event(n))
    sink.close()


def verify(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["audit", "verify", *map(str, paths)])
    out = capsys.readouterr().out
    assert CANARY not in out  # never a record's content
    return code, out


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    write_log(path, 6)
    return path


def test_an_intact_log_verifies_and_every_record_is_chained(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [json.loads(line) for line in lines_of(log)]
    assert records[0]["prev_sha256"] == GENESIS
    assert all(b["prev_sha256"] == a["sha256"] for a, b in pairwise(records))
    assert all(check_audit_record(r) is None for r in records)
    code, out = verify(capsys, log)
    assert code == 0 and "chain intact: 6 records in 1 segments" in out


def test_one_edited_byte_is_caught_at_its_line(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = lines_of(log)
    lines[3] = lines[3].replace(b"call-3", b"call-X")
    log.write_bytes(b"".join(lines))
    code, out = verify(capsys, log)
    assert code == 1 and "chain broken at audit.jsonl:4: record does not match its hash" in out


def test_a_deleted_line_is_caught_at_the_line_after_the_gap(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = lines_of(log)
    del lines[2]
    log.write_bytes(b"".join(lines))
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:3: chain broken" in out


def test_two_swapped_lines_are_caught_at_the_first(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = lines_of(log)
    lines[1], lines[2] = lines[2], lines[1]
    log.write_bytes(b"".join(lines))
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:2: chain broken" in out


def test_a_forged_line_with_its_own_hash_recomputed_is_caught(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = lines_of(log)
    forged, _ = chain_line(event(99).to_record(), GENESIS)  # a valid hash, a wrong prev
    lines.insert(4, forged)
    log.write_bytes(b"".join(lines))
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:5: chain broken" in out
    # Chained to the right prev, the record after it is what breaks.
    lines = lines_of(log)
    prev = json.loads(lines[3])["sha256"]
    forged, _ = chain_line(event(99).to_record(), prev)
    lines[4] = forged
    log.write_bytes(b"".join(lines))
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:6: chain broken" in out


def test_a_truncated_tail_is_caught_against_the_stored_head(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = lines_of(log)
    log.write_bytes(b"".join(lines[:4]))
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:5: the last record is not the stored head" in out
    log.write_bytes(b"")  # emptied entirely
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:1: the last record is not the stored head" in out


def test_a_removed_heads_file_is_caught(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heads_path(log).unlink()
    code, out = verify(capsys, log)
    assert code == 1 and "heads file is missing" in out


def test_an_empty_log_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"")
    code, out = verify(capsys, path)
    assert code == 0 and "chain intact: 0 records" in out
    JsonlAuditSink(path).close()  # opened by a server that wrote nothing
    code, out = verify(capsys, path)
    assert code == 0


def test_a_partial_last_line_is_reported_as_a_cut_write_and_writing_resumes(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with log.open("ab") as handle:
        handle.write(b'{"v":1,"event":"tool_call_fin')  # a crash mid-write
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:7: incomplete last line" in out
    # The next writer keeps the torn line on its own and chains past it.
    write_log(log, 1)
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:7: not a JSON record (torn or inserted)" in out
    lines = lines_of(log)
    assert json.loads(lines[7])["prev_sha256"] == json.loads(lines[5])["sha256"]


def test_appended_garbage_is_caught(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with log.open("ab") as handle:
        handle.write(b"garbage\n")
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:7: not a JSON record" in out


def rotated(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    write_log(path, 5, max_bytes=1200)
    write_log(path, 5, max_bytes=1200)  # a second process life keeps the chain
    return path


def test_an_intact_log_across_rotations_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rotated(tmp_path)
    segments = sorted(p.name for p in tmp_path.glob("audit.jsonl.[0-9]*"))
    assert len(segments) >= 2
    last_of_first = json.loads(lines_of(tmp_path / "audit.jsonl.1")[-1])["sha256"]
    assert json.loads(lines_of(tmp_path / "audit.jsonl.2")[0])["prev_sha256"] == last_of_first
    code, out = verify(capsys, path)
    assert code == 0 and f"chain intact: 10 records in {len(segments) + 1} segments" in out


def test_a_removed_rotated_segment_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rotated(tmp_path)
    (tmp_path / "audit.jsonl.2").unlink()
    code, out = verify(capsys, path)
    assert code == 1 and "audit.jsonl.2: segment is missing" in out
    # With the heads file edited to forget it, the next segment's first line breaks.
    heads = json.loads(heads_path(path).read_bytes())
    heads["segments"] = [s for s in heads["segments"] if s["file"] != "audit.jsonl.2"]
    heads_path(path).write_text(json.dumps(heads))
    code, out = verify(capsys, path)
    assert code == 1 and "audit.jsonl.3:1: chain broken" in out


def test_a_truncated_rotated_segment_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rotated(tmp_path)
    first = tmp_path / "audit.jsonl.1"
    lines = lines_of(first)
    first.write_bytes(b"".join(lines[:-1]))
    code, out = verify(capsys, path)
    assert (
        code == 1 and f"audit.jsonl.1:{len(lines)}: the last record is not the stored head" in out
    )


def test_a_damaged_heads_file_is_reported(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heads_path(log).write_bytes(b"{not json")
    code, out = verify(capsys, log)
    assert code == 1 and "heads file is damaged" in out


def _writer(path: str, start: int) -> None:
    sink = JsonlAuditSink(Path(path), max_bytes=4000)
    for n in range(start, start + 40):
        sink.emit(event(n))
        sink.emit_many([event(n), event(n)])
    sink.close()


def test_several_processes_writing_one_file_keep_one_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_writer, args=(str(path), k * 100)) for k in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    code, out = verify(capsys, path)
    assert code == 0 and "chain intact: 360 records" in out


def test_records_written_before_the_chain_are_counted_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(json.dumps(event(0).to_record()) + "\n")  # a log from an older version
    write_log(path, 2)
    code, out = verify(capsys, path)
    assert code == 0 and "2 records in 1 segments (1 written before the chain" in out


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "audit.jsonl.x", "other.jsonl.1", 7])
def test_a_heads_file_naming_a_foreign_segment_is_damaged(
    log: Path, capsys: pytest.CaptureFixture[str], name: object
) -> None:
    heads = json.loads(heads_path(log).read_bytes())
    heads["segments"] = [{"file": name, "last_sha256": GENESIS}]
    heads_path(log).write_text(json.dumps(heads))
    code, out = verify(capsys, log)
    assert code == 1 and "heads file is damaged" in out


def test_a_deleted_live_log_is_recreated_and_caught(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = JsonlAuditSink(log)
    sink.emit(event(7))
    log.unlink()
    sink.emit(event(8))  # never raises: a new file starts
    sink.close()
    code, out = verify(capsys, log)
    assert code == 1 and "audit.jsonl:1: chain broken" in out


def test_events_beyond_calls_verify_and_a_malformed_kind_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console, the inbox, pins, subscriptions and listen streams audit kinds of their
    own: a real log mixes them with calls, and verify takes them; a kind that is not a
    plain name is a problem at its line."""
    path = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(path)
    for kind in ("approval_decided", "resource_subscribed", "listen_opened", "tool_quarantined"):
        sink.emit(AuditEvent(event=kind, tool_call_id="i", correlation_id="i", tool="(x)"))
    sink.emit(event(1))
    sink.emit(AuditEvent(event="Bad Kind!", tool_call_id="i", correlation_id="i", tool="(x)"))
    sink.close()
    code, out = verify(capsys, path)
    assert code == 1
    assert out.splitlines()[0] == "line 6: not an event name"
    assert "6 events, 1 problems" in out


def test_an_anchor_store_that_is_down_never_holds_up_the_log_and_is_retried(
    tmp_path: Path,
) -> None:
    from nexus_mcp.observability.audit_anchor import HeadAnchor

    anchored: list[str] = []
    down = True

    def store(head: str) -> None:
        if down:
            raise ConnectionError("the database is down")
        anchored.append(head)

    path = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(path)
    anchor = HeadAnchor(store, interval=3600)  # flushed by hand below
    sink.anchor_with(anchor)
    sink.emit(event(1))
    assert not anchor.flush()  # down: nothing anchored, the record is written anyway
    assert anchor.failures == 1 and len(lines_of(path)) == 1
    down = False
    sink.emit(event(2))
    sink.close()  # the last head is anchored at close
    last = json.loads(lines_of(path)[-1])["sha256"]
    assert anchored == [last]
