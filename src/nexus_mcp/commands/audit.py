"""``nexus-mcp audit``: read the JSONL audit trail (``tail``) and check it (``verify``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.errors import ConfigError, NexusError

if TYPE_CHECKING:
    from nexus_mcp.settings import Settings

# What a command reads (settings, the audit log, its chain) is imported by the function
# that reads it: `nexus-mcp audit --help` builds its parser without them.

TAIL_COLUMNS = ("ts", "event", "tool", "subject", "outcome", "duration_ms", "correlation_id")
EXIT_CONFIG = 2


def _audit_file(args: argparse.Namespace) -> Path:
    """--file, else the server's own: NEXUS_MCP_AUDIT_FILE, else <data dir>/audit.jsonl."""
    if args.file is not None:
        return Path(args.file)
    from nexus_mcp.stores.locations import load_state_settings

    return load_state_settings(args.data_dir).audit_path


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """The audit lines; a file that cannot be read is one line naming where to look."""
    from nexus_mcp.observability.audit import read_audit_file

    try:
        yield from read_audit_file(path)
    except OSError as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: OSError) -> ConfigError:
    from nexus_mcp.stores.locations import AUDIT_FILE_SETTING, DATA_DIR_SETTING

    reason = (exc.strerror or type(exc).__name__).lower()
    return ConfigError(
        f"audit file {path} cannot be read ({reason}): check --file, "
        f"{AUDIT_FILE_SETTING} or {DATA_DIR_SETTING}"
    )


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("audit", help="show or verify the audit trail")
    sub = parser.add_subparsers(dest="audit_command", required=True)
    tail = sub.add_parser("tail", help="show the most recent events as a table")
    _add_location_flags(tail)
    tail.add_argument("-n", "--lines", type=int, default=20, help="how many events (default 20)")
    tail.set_defaults(func=run_tail)
    verify = sub.add_parser(
        "verify",
        help="check that every line is a well-formed event and the hash chain is intact",
    )
    _add_location_flags(verify)
    verify.add_argument(
        "--config", type=Path, default=None,
        help="the server's configuration [NEXUS_MCP_CONFIG]: with state.backend shared, each "
        "log's head anchored in PostgreSQL must be a record of its chain",
    )  # fmt: skip
    verify.add_argument(
        "--replica", default=None,
        help="the replica whose anchored heads to check (default: state.instance_id, "
        "else this host's name)",
    )  # fmt: skip
    verify.add_argument(
        "files", nargs="*", type=Path, metavar="FILE",
        help="audit logs to verify (each with its rotated segments and heads file)",
    )  # fmt: skip
    verify.set_defaults(func=run_verify)


def _add_location_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", type=Path, default=None, help="audit file [NEXUS_MCP_AUDIT_FILE]")
    parser.add_argument(
        "--data-dir", type=Path, default=None,
        help="the server's state folder (default: the per-user data directory, as serve) "
        "[NEXUS_MCP_DATA_DIR]",
    )  # fmt: skip


def format_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    cells = [[str(row.get(col, "")) for col in columns] for row in rows]
    widths = [max([len(col), *(len(r[i]) for r in cells)]) for i, col in enumerate(columns)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells)
    return "\n".join(lines)


def run_tail(args: argparse.Namespace) -> int:
    try:
        path = _audit_file(args)
        if not _exists(path):
            sys.stderr.write(f"no audit file at {path}\n")
            return 1
        recent: deque[dict[str, Any]] = deque(maxlen=max(1, args.lines))
        for _, record, _ in _records(path):
            if record is not None:
                recent.append(record)
    except ConfigError as exc:
        sys.stderr.write(f"nexus-mcp: {exc}\n")
        return EXIT_CONFIG
    sys.stdout.write(format_table(list(recent), TAIL_COLUMNS) + "\n")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Each log: every line well-formed, then the chain (and its anchored head, on the
    shared backend); exit 1 at any problem."""
    try:
        settings = _shared_settings(args)
        if settings is not None and args.file is None and not args.files:
            args.file = settings.audit_path
        paths = list(args.files) or [_audit_file(args)]
        anchors = _anchored_heads(args, settings, [p.name for p in paths])
        failed = False
        for path in paths:
            failed = _verify_one(path, len(paths) > 1, anchors) or failed
    except ConfigError as exc:
        sys.stderr.write(f"nexus-mcp: {exc}\n")
        return EXIT_CONFIG
    except NexusError as exc:  # the shared store did not answer
        sys.stderr.write(f"nexus-mcp: {exc.message} ({exc.code})\n")
        return EXIT_CONFIG
    return 1 if failed else 0


def _shared_settings(args: argparse.Namespace) -> Settings | None:
    """The server's settings when a configuration is given and its state backend is
    shared (heads anchored in PostgreSQL to compare with); else None."""
    config = args.config or (
        Path(os.environ["NEXUS_MCP_CONFIG"]) if os.environ.get("NEXUS_MCP_CONFIG") else None
    )
    if config is None:
        return None
    from nexus_mcp.settings import load_settings

    settings = load_settings(config, {"data_dir": args.data_dir}, flags={"data_dir": "--data-dir"})
    return settings if settings.state.backend == "shared" else None


def _anchored_heads(
    args: argparse.Namespace, settings: Settings | None, names: list[str]
) -> dict[str, str | None] | None:
    """The head anchored for each log name under the replica, read once; None without a
    shared backend."""
    if settings is None:
        return None
    from nexus_mcp.stores.backends import audit_replica, open_postgres
    from nexus_mcp.stores.postgres_audit import PostgresAuditHeads

    replica = args.replica or audit_replica(settings)
    pool = open_postgres(settings, os.environ)
    try:
        heads = PostgresAuditHeads(pool, settings.state.key_prefix)
        found = {name: heads.head(replica, name) for name in dict.fromkeys(names)}
    finally:
        pool.close()
    return {name: head[0] if head is not None else None for name, head in found.items()}


def _verify_one(path: Path, named: bool, anchors: dict[str, str | None] | None = None) -> bool:
    """Report one log; True when it has a problem. Lines are named, never their content."""
    from nexus_mcp.observability.audit_chain import verify_chain

    if not _exists(path):
        sys.stderr.write(f"no audit file at {path}\n")
        return True
    prefix = f"{path}: " if named else ""
    total, problems = 0, 0
    for number, _, problem in _records(path):
        total += 1
        if problem is not None:
            problems += 1
            sys.stdout.write(f"{prefix}line {number}: {problem}\n")
    anchored = anchors.get(path.name) if anchors is not None else None
    try:
        chain = verify_chain(path, anchored)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    sys.stdout.write(f"{prefix}{total} events, {problems} problems\n")
    if chain.problem is not None:
        sys.stdout.write(f"{prefix}chain broken at {chain.problem}\n")
        return True
    legacy = f" ({chain.unchained} written before the chain, unchecked)" if chain.unchained else ""
    sys.stdout.write(
        f"{prefix}chain intact: {chain.records} records in {chain.segments} segments{legacy}\n"
    )
    if chain.anchored:
        sys.stdout.write(f"{prefix}anchored head found in the chain\n")
    elif anchors is not None:
        sys.stdout.write(f"{prefix}no head anchored for this log yet\n")
    return problems > 0


def _exists(path: Path) -> bool:
    # Path.exists lets PermissionError through (a folder on the way that cannot be entered).
    try:
        return path.exists()
    except OSError as exc:
        raise _unreadable(path, exc) from None


__all__ = ["add_parser", "format_table", "run_tail", "run_verify"]
