"""Approval requests: what an approver is shown, and the approval an approved request is.

A write that needs approval and carries none opens a request (``stores/approval_requests.py``)
instead of only refusing: the approver reads a bounded, redacted preview of what would
change and approves or denies; the caller's retry with the same arguments then runs once.
Pure decisions: the preview is built here from what the caller sent and what the target
holds now (read by the caller of these functions), never from anything else.

- A file write or edit shows a unified diff of the file, cut at ``MAX_PREVIEW_BYTES``.
- Every bound is in UTF-8 bytes, the unit the store checks (a preview of CJK or emoji text
  cut by characters could be four times the store's limit), and a lone surrogate (a file
  name's undecodable byte) is shown as U+FFFD, since it has no UTF-8 form to store.
- Any other call shows its arguments as JSON: values of the tool's ``secret_args`` are
  replaced by ``[redacted]`` and long strings are cut.
- An approved request is an approval for exactly that call: ``claims_for`` gives it the
  form of a verified approval token (``jti`` the request's own, so the nonce store spends
  it once across replicas), bound to the caller, the tool and the arguments' digest.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Mapping
from typing import Any

from nexus_mcp.policy.approvals import APPROVAL_TOKEN_VERSION, ApprovalClaims

# In UTF-8 bytes, each with room for the cut note under the store's own limits
# (stores/approval_requests.py: preview 64 KiB, target 1 KiB).
MAX_PREVIEW_BYTES = 32 * 1024
MAX_VALUE_BYTES = 2000
MAX_TARGET_BYTES = 900
REDACTED = "[redacted]"
INBOX_HOST_ID = "inbox"
REQUEST_JTI_PREFIX = "request:"


def storable(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD: what UTF-8 can hold."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes plus a short note of what was cut."""
    data = storable(text).encode()
    if len(data) <= limit:
        return data.decode()
    kept = data[:limit].decode("utf-8", "ignore")  # never half a character
    return kept + f"\n… ({len(data) - len(kept.encode())} more bytes not shown)"


def diff_preview(path: str, old: str | None, new: str | None) -> str:
    """A unified diff of one file (``None``: the file does not exist before, or after)."""
    before = [] if old is None else old.splitlines(keepends=True)
    after = [] if new is None else new.splitlines(keepends=True)
    lines = difflib.unified_diff(
        before,
        after,
        fromfile="/dev/null" if old is None else f"a/{path}",
        tofile="/dev/null" if new is None else f"b/{path}",
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return _cut(text or f"(no change to {path})\n", MAX_PREVIEW_BYTES)


def arguments_preview(arguments: Mapping[str, Any], secret_args: Collection[str]) -> str:
    """The call's arguments as JSON, secrets redacted and long values cut."""

    def shown(name: str, value: Any) -> Any:
        if name in secret_args:
            return REDACTED
        if isinstance(value, str):
            return _cut(value, MAX_VALUE_BYTES)
        return value

    visible = {
        name: shown(name, value)
        for name, value in sorted(arguments.items())
        if name not in ("approval_token", "idempotency_key")
    }
    try:
        text = json.dumps(visible, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = "(arguments that have no JSON form)"
    return _cut(text, MAX_PREVIEW_BYTES)


def target_text(targets: Collection[str]) -> str | None:
    """What the call touches, as one bounded line (paths, a repository ref...)."""
    if not targets:
        return None
    return _cut(", ".join(targets), MAX_TARGET_BYTES)


def span_text(seconds: float) -> str:
    """A request's age or time left as an approver reads it (``90s``, ``12m``, ``3h``)."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def claims_for(
    *,
    request_id: str,
    approver: str,
    subject: str,
    tool: str,
    args_digest: str,
    issued_at: float,
    expires_at: float,
) -> ApprovalClaims:
    """An approved request as the approval it is: for this caller, tool and arguments, once."""
    return ApprovalClaims(
        ver=APPROVAL_TOKEN_VERSION,
        iss="nexus-mcp-inbox",
        aud="nexus-mcp-inbox",
        sub=approver,
        iat=int(issued_at),
        nbf=int(issued_at),
        exp=int(expires_at),
        jti=REQUEST_JTI_PREFIX + request_id,
        tool=tool,
        args_sha256=args_digest,
        subject=subject,
        host_id=INBOX_HOST_ID,
    )


__all__ = [
    "INBOX_HOST_ID",
    "MAX_PREVIEW_BYTES",
    "REDACTED",
    "arguments_preview",
    "claims_for",
    "diff_preview",
    "span_text",
    "target_text",
]
