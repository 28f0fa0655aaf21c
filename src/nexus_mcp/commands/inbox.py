"""``nexus-mcp approvals pending | show ID | approve ID | deny ID``: the inbox from a shell.

An agent's write that needs approval waits as a request (``middleware/inbox.py``) on the
state backend the server uses: the SQLite file in its data dir, or the shared Redis. These
commands read and decide it there, with the same settings ``serve`` reads (``--config``,
the environment, ``--data-dir``):

- ``pending`` lists what waits, oldest first: id, age, time left, tool, caller, target;
- ``show ID`` prints one request with its preview (the diff of the file it would write,
  or its arguments with secrets redacted), every character a terminal could act on
  escaped;
- ``approve ID`` approves it for that one call: the caller's retry with the same
  arguments runs once; ``deny ID --reason TEXT`` refuses it.

The approver is the person running the command (``--approver``, default ``local:`` and the
OS user name). A request of the approver's own subject is refused unless
``approvals.allow_self_approval`` is on. Every decision is written to the audit log.

Exit codes: 0 done, 1 refused (unknown, expired or already decided; self-approval),
2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.approval_requests import span_text
from nexus_mcp.policy.definition_diff import escape, safe_line

if TYPE_CHECKING:
    from nexus_mcp.settings import Settings
    from nexus_mcp.stores.approval_requests import ApprovalRequest, ApprovalRequestStore

# What a decision reads and writes (the settings, the state backend, the audit) is
# imported by the command that runs: `approvals --help` loads none of it (issue 29).

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
MAX_REASON_CHARS = 500
APPROVAL_DECIDED = "approval_decided"


def add_inbox_commands(actions: Any) -> None:
    """``pending``, ``show``, ``approve`` and ``deny`` under ``nexus-mcp approvals``."""
    pending = actions.add_parser("pending", help="list the approval requests that wait")
    _add_state_flags(pending)
    pending.add_argument("--json", action="store_true", help="one JSON object per line")
    pending.set_defaults(func=run_pending)
    show = actions.add_parser("show", help="one approval request with its preview")
    show.add_argument("request_id", help="the id the refusal named")
    _add_state_flags(show)
    show.set_defaults(func=run_show)
    for name, helptext in (("approve", "approve one request"), ("deny", "deny one request")):
        decide = actions.add_parser(name, help=helptext)
        decide.add_argument("request_id", help="the id the refusal named")
        _add_state_flags(decide)
        decide.add_argument("--approver", default=None, help="who decides (default: local:USER)")
        decide.add_argument("--reason", default=None, help="why (shown to operators)")
        decide.set_defaults(func=run_decide, approve=name == "approve")


def _add_state_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="the server's nexus.yaml")
    parser.add_argument("--data-dir", type=Path, default=None, help="the server's data dir")


def _open(args: argparse.Namespace) -> tuple[Settings, ApprovalRequestStore, Any]:
    from nexus_mcp.settings import load_settings
    from nexus_mcp.stores.backends import open_state

    config = args.config or os.environ.get("NEXUS_MCP_CONFIG")
    settings = load_settings(
        Path(config) if config else None,
        {"data_dir": args.data_dir},
        flags={"data_dir": "--data-dir"},
    )
    state = open_state(settings, os.environ)
    return settings, state.approval_requests, state


def run_pending(args: argparse.Namespace) -> int:
    try:
        _, store, state = _open(args)
    except ConfigError as exc:
        return _usage(str(exc))
    try:
        requests = store.pending(limit=1000)
    finally:
        state.close()
    now = time.time()
    if args.json:
        for request in requests:
            print(json.dumps(_summary(request, now), sort_keys=True))
        return EXIT_OK
    if not requests:
        print("no approval request waits")
        return EXIT_OK
    for request in requests:
        row = _summary(request, now)
        print(
            f"{row['id']}  {span_text(row['age_seconds'])} ago"
            f"  {span_text(row['expires_in_seconds'])} left"
            f"  {safe_line(request.tool, 80)}  by {safe_line(request.log_subject, 80)}"
            f" ({request.role})  {safe_line(request.target or '-', 120)}"
        )
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    try:
        _, store, state = _open(args)
    except ConfigError as exc:
        return _usage(str(exc))
    try:
        request = store.get(args.request_id[:64])
    finally:
        state.close()
    if request is None:
        print("error: no such approval request", file=sys.stderr)
        return EXIT_REFUSED
    now = time.time()
    lines = [
        f"request   {request.id}",
        f"status    {request.status}",
        f"tool      {safe_line(request.tool, 200)}"
        + (f" (upstream {safe_line(request.server_id, 80)})" if request.server_id else ""),
        f"caller    {safe_line(request.log_subject, 200)} ({request.role})",
        f"target    {safe_line(request.target or '-', 1000)}",
        f"rule      {safe_line(request.policy_rule or '-', 200)}",
        f"arguments sha256:{request.args_digest}",
        f"opened    {span_text(now - request.created_at)} ago, expires in "
        f"{span_text(request.expires_at - now)}",
    ]
    if request.decided_by is not None:
        lines.append(f"decided   by {safe_line(request.decided_by, 200)}")
    if request.reason:
        lines.append(f"reason    {safe_line(request.reason, MAX_REASON_CHARS)}")
    lines.append("")
    lines.extend(escape(line) for line in request.preview.splitlines())
    print("\n".join(lines))
    return EXIT_OK


def run_decide(args: argparse.Namespace) -> int:
    from nexus_mcp.policy.approvals import load_approval_settings
    from nexus_mcp.policy.console import self_approval_refused
    from nexus_mcp.settings import config_sections
    from nexus_mcp.stores.approval_requests import ApprovalDecisionError

    approver = args.approver or f"local:{getpass.getuser()}"
    if not approver.strip() or len(approver) > 256:
        return _usage("--approver should be 1 to 256 characters")
    reason = args.reason
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        return _usage(f"--reason should be at most {MAX_REASON_CHARS} characters")
    try:
        settings, store, state = _open(args)
        sections = config_sections(Path(args.config)) if args.config else {}
        approval_settings = load_approval_settings(os.environ, sections)
    except ConfigError as exc:
        return _usage(str(exc))
    try:
        request = store.get(args.request_id[:64])
        if request is None:
            print("error: no such approval request", file=sys.stderr)
            return EXIT_REFUSED
        if self_approval_refused(
            request_subject=request.subject,
            approver_subject=approver,
            approve=args.approve,
            allow_self_approval=approval_settings.allow_self_approval,
        ):
            print(
                "error: an approver may not approve their own request "
                "(approvals.allow_self_approval is off)",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        try:
            decided = store.decide(
                request.id, approve=args.approve, approver=approver, reason=reason
            )
        except ApprovalDecisionError as exc:
            print(f"error: the request cannot be decided ({exc.why})", file=sys.stderr)
            return EXIT_REFUSED
    finally:
        state.close()
    _audit(settings, decided, approver)
    verb = "approved" if args.approve else "denied"
    print(
        f"{verb} {decided.id}: the caller's retry with the same arguments "
        + ("runs once" if args.approve else "is refused")
    )
    return EXIT_OK


def _audit(settings: Settings, request: ApprovalRequest, approver: str) -> None:
    from nexus_mcp.observability.audit import AuditEvent, JsonlAuditSink

    sink = JsonlAuditSink(settings.audit_path, max_bytes=settings.audit_max_bytes)
    try:
        sink.emit(
            AuditEvent(
                event=APPROVAL_DECIDED,
                tool_call_id=request.id,
                correlation_id=request.id,
                tool=request.tool,
                server_id=request.server_id,
                subject=request.log_subject,
                role=request.role,
                outcome=request.status.upper(),
                reason=request.reason[:MAX_REASON_CHARS] if request.reason else None,
                approver=approver,
                host_id="nexus-mcp-cli",
                args_digest=request.args_digest,
                transport="cli",
            )
        )
    finally:
        sink.close()


def _summary(request: ApprovalRequest, now: float) -> dict[str, Any]:
    return {
        "id": request.id,
        "tool": request.tool,
        "server_id": request.server_id,
        "caller": request.log_subject,
        "role": request.role,
        "target": request.target,
        "age_seconds": max(0, int(now - request.created_at)),
        "expires_in_seconds": max(0, int(request.expires_at - now)),
    }


def _usage(message: str) -> int:
    print(f"nexus-mcp: {message}", file=sys.stderr)
    return EXIT_USAGE


__all__ = ["add_inbox_commands", "run_decide", "run_pending", "run_show"]
