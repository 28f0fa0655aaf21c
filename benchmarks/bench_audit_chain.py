"""The tamper-evident audit file's cost per record, beside the unchained append it replaced.

    python benchmarks/bench_audit_chain.py [--rounds N] [--records N]

Both sides write the same realistic ``tool_call_finished`` record to a real file in a
temporary folder, alternating round by round so drift hits both:

- baseline: the unchained sink as it was (one ``O_APPEND`` ``write`` of the compact line);
- nexus-mcp: ``JsonlAuditSink`` (flock on the heads file, SHA-256 of the line with the
  previous hash, the line, the stored head), per ``emit`` and per ``emit_many`` pair (a
  read-class call's two records), and ``audit verify``'s chain check per record.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from nexus_mcp.observability.audit import AuditEvent, JsonlAuditSink, encode_record
from nexus_mcp.observability.audit_chain import verify_chain
from results import Row, progress, report

NAME = "bench_audit_chain"


def record() -> AuditEvent:
    return AuditEvent(
        event="tool_call_finished", tool_call_id="01JD9Z4R6W8K2M5N7P3Q1S0T9V",
        correlation_id="c-8f1e2d", tool="nexus_read_file", subject="agent@example.org",
        role="developer", risk="read", tool_class="read", outcome="OK", duration_ms=1.234,
        args_digest="a" * 64, session="s-1", transport="stdio", registry="r" * 16,
        effect_id="e-1", side_effects=False, host_id="bench-host",
    )  # type: ignore[arg-type]  # fmt: skip


def unchained(path: Path) -> tuple[Callable[[AuditEvent], None], Callable[[], None]]:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def emit(event: AuditEvent) -> None:
        os.write(fd, encode_record(event.record))

    return emit, lambda: os.close(fd)


def chained(path: Path) -> tuple[Callable[[AuditEvent], None], Callable[[], None]]:
    sink = JsonlAuditSink(path)
    return sink.emit, sink.close


def chained_pairs(path: Path) -> tuple[Callable[[AuditEvent], None], Callable[[], None]]:
    sink = JsonlAuditSink(path)
    return (lambda event: sink.emit_many([event, event])), sink.close


def per_record(
    folder: Path, opener: Callable[[Path], tuple[Callable[[AuditEvent], None], Callable[[], None]]],
    records: int, per_emit: int = 1,
) -> float:  # fmt: skip
    path = folder / f"{opener.__name__}-{time.perf_counter_ns()}.jsonl"
    emit, close = opener(path)
    event = record()
    start = time.perf_counter()
    for _ in range(records // per_emit):
        emit(event)
    elapsed = time.perf_counter() - start
    close()
    return elapsed / records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--records", type=int, default=4000)
    args = parser.parse_args()
    base, ours, pairs, verify = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for number in range(args.rounds):
            progress(NAME, f"round {number + 1}/{args.rounds}: {args.records} records each")
            base.append(per_record(folder, unchained, args.records))
            ours.append(per_record(folder, chained, args.records))
            pairs.append(per_record(folder, chained_pairs, args.records, per_emit=2))
            log = folder / "verify.jsonl"
            for leftover in folder.glob("verify.jsonl*"):
                leftover.unlink()
            sink = JsonlAuditSink(log)
            for _ in range(args.records):
                sink.emit(record())
            sink.close()
            start = time.perf_counter()
            verify_chain(log)
            verify.append((time.perf_counter() - start) / args.records)
    baseline = statistics.median(base) * 1e6
    rows = [
        Row(measure="audit record, chained emit", baseline="unchained O_APPEND write",
            baseline_value=baseline, value=statistics.median(ours) * 1e6, unit="µs"),
        Row(measure="audit record, chained emit_many pair", baseline="unchained O_APPEND write",
            baseline_value=baseline, value=statistics.median(pairs) * 1e6, unit="µs"),
        Row(measure="audit verify, chain check per record", baseline="unchained O_APPEND write",
            baseline_value=baseline, value=statistics.median(verify) * 1e6, unit="µs"),
    ]  # fmt: skip
    report(NAME, rows)


if __name__ == "__main__":
    main()
