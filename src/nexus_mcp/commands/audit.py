"""``nexus-mcp audit``: read the JSONL audit trail (``tail``) and check it (``verify``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any

from nexus_mcp.audit import read_audit_file

TAIL_COLUMNS = ("ts", "event", "tool", "subject", "outcome", "duration_ms", "correlation_id")


def _default_audit_file() -> Path:
    if os.environ.get("NEXUS_MCP_AUDIT_FILE"):
        return Path(os.environ["NEXUS_MCP_AUDIT_FILE"])
    return Path(os.environ.get("NEXUS_MCP_DATA_DIR", ".nexus-data")) / "audit.jsonl"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("audit", help="show or verify the audit trail")
    sub = parser.add_subparsers(dest="audit_command", required=True)
    tail = sub.add_parser("tail", help="show the most recent events as a table")
    tail.add_argument("--file", type=Path, default=None, help="audit file [NEXUS_MCP_AUDIT_FILE]")
    tail.add_argument("-n", "--lines", type=int, default=20, help="how many events (default 20)")
    tail.set_defaults(func=run_tail)
    verify = sub.add_parser("verify", help="check that every line is a well-formed event")
    verify.add_argument("--file", type=Path, default=None, help="audit file [NEXUS_MCP_AUDIT_FILE]")
    verify.set_defaults(func=run_verify)


def format_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    cells = [[str(row.get(col, "")) for col in columns] for row in rows]
    widths = [max([len(col), *(len(r[i]) for r in cells)]) for i, col in enumerate(columns)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells)
    return "\n".join(lines)


def run_tail(args: argparse.Namespace) -> int:
    path = args.file or _default_audit_file()
    if not path.exists():
        sys.stderr.write(f"no audit file at {path}\n")
        return 1
    recent: deque[dict[str, Any]] = deque(maxlen=max(1, args.lines))
    for _, record, _ in read_audit_file(path):
        if record is not None:
            recent.append(record)
    sys.stdout.write(format_table(list(recent), TAIL_COLUMNS) + "\n")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    path = args.file or _default_audit_file()
    if not path.exists():
        sys.stderr.write(f"no audit file at {path}\n")
        return 1
    total, problems = 0, 0
    for number, _, problem in read_audit_file(path):
        total += 1
        if problem is not None:
            problems += 1
            sys.stdout.write(f"line {number}: {problem}\n")
    sys.stdout.write(f"{total} events, {problems} problems\n")
    return 1 if problems else 0


__all__ = ["add_parser", "format_table", "run_tail", "run_verify"]
