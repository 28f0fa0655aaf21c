"""The approvals inbox, as the approval layer sees it: open a request, or take its approval.

A write that needs approval and carries no token (``middleware/approval.py``) comes here:

- an approved request for this caller, tool and exact arguments is taken, once (the
  store's ``use`` is atomic, and the approval's nonce is the request's own id, which the
  shared nonce store spends once across replicas): the call runs;
- a denied one refuses the call (``APPROVAL_INVALID``, reason ``denied``);
- otherwise a request is opened (or the pending one found) and the call is refused
  ``APPROVAL_REQUIRED`` naming the request's id, in the message and in the result's
  ``_meta`` (``nexus.mcp/approval_request_id``), never the arguments.

The preview the approver reads is built here from the arguments and what the target holds
now (``policy/approval_requests.py``): a diff for a file write, the redacted arguments
otherwise. Reads of the workspace go through its confinement like any tool's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from nexus_mcp.calls import CallState
from nexus_mcp.contracts import ToolContract
from nexus_mcp.errors import ApprovalInvalidError, ApprovalRequiredError, NexusError
from nexus_mcp.ids import new_id
from nexus_mcp.policy.approval_requests import (
    INBOX_HOST_ID,
    MAX_PREVIEW_BYTES,
    arguments_preview,
    claims_for,
    diff_preview,
    target_text,
)
from nexus_mcp.policy.approvals import (
    ApprovalClaims,
    ApprovalSettings,
    approval_jti_digest,
    digest_approved_arguments,
)
from nexus_mcp.policy.write_policy import TOOL_OPERATIONS
from nexus_mcp.principal import Principal
from nexus_mcp.stores.approval_requests import (
    APPROVED,
    DENIED,
    PENDING,
    ApprovalDecisionError,
    ApprovalRequest,
    ApprovalRequestStore,
)
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.paths import target_paths
from nexus_mcp.workspace.replay import LexicalPaths

MAX_READ_FOR_PREVIEW = 4 * MAX_PREVIEW_BYTES
MAX_PENDING_PER_CALLER = 20
MAX_PENDING_SCAN = 1000
UNREADABLE = object()


class Inbox:
    """Approval requests for the approval layer (``ApprovalMiddleware``)."""

    def __init__(
        self,
        store: ApprovalRequestStore,
        settings: ApprovalSettings,
        workspace: Workspace | LexicalPaths,
        *,
        secret_args: Callable[[str], Collection[str]] = lambda _tool: (),
    ) -> None:
        self.store = store
        self.settings = settings
        self.workspace = workspace
        self.secret_args = secret_args

    async def approval_for(
        self,
        state: CallState,
        principal: Principal,
        describe: str | None = None,
        *,
        binding: str | None = None,
        action: str = "this write",
    ) -> ApprovalClaims:
        """The approval of an approved request for this exact call, or a refusal.

        ``binding`` names why the call is held when that is more than the write policy (the
        flow policy's ``flow_egress``): it is part of the request's digest, so a request
        opened, and shown to an approver, without that reason never covers the call."""
        digest = digest_approved_arguments(state.arguments)
        if binding is not None:
            digest = digest_approved_arguments({"binding": binding, "arguments_sha256": digest})
        key = (principal.subject, state.tool_name, state.server_id, digest)
        found = await asyncio.to_thread(self.store.find, *key)
        if found is not None and found.status == APPROVED:
            try:
                used = await asyncio.to_thread(self.store.use, found.id)
            except ApprovalDecisionError:
                found = None  # another call took it first, or it just expired
            else:
                claims = claims_for(
                    request_id=used.id,
                    approver=used.decided_by or "(unknown)",
                    subject=principal.subject,
                    tool=state.tool_name,
                    args_digest=digest,
                    issued_at=used.decided_at or time.time(),
                    expires_at=used.expires_at,
                )
                state.approval = {
                    "approver": used.decided_by,
                    "host_id": INBOX_HOST_ID,
                    "jti_digest": approval_jti_digest(claims),
                }
                return claims
        if found is not None and found.status == DENIED:
            raise ApprovalInvalidError(
                message=f"an approver denied this call (approval request {found.id})",
                reason="denied",
                approval_request_id=found.id,
            )
        if found is None or found.status != PENDING:
            waiting = await asyncio.to_thread(self.store.pending, limit=MAX_PENDING_SCAN)
            if sum(r.subject == principal.subject for r in waiting) >= MAX_PENDING_PER_CALLER:
                # One caller cannot flood the inbox: its earlier requests wait first.
                raise ApprovalRequiredError(
                    message=(
                        f"{action} requires approval, and {MAX_PENDING_PER_CALLER} requests "
                        "of this caller already wait in the approvals inbox: ask an approver "
                        "to decide them first"
                    ),
                    reason="inbox_full",
                )
            found = await asyncio.to_thread(self._open, state, principal, digest, describe)
        # A held flow (``binding``) is approved in the inbox only: no token is offered.
        token_way = (
            ""
            if binding is not None
            else ", or pass an approval_token minted for this tool and these exact arguments"
        )
        raise ApprovalRequiredError(
            message=(
                f"{action} requires approval: request {found.id} waits in the approvals "
                f"inbox (nexus-mcp approvals show {found.id}); call again with the same "
                f"arguments once it is approved{token_way}"
            ),
            approval_request_id=found.id,
        )

    def _open(
        self, state: CallState, principal: Principal, digest: str, describe: str | None
    ) -> ApprovalRequest:
        now = time.time()
        target, preview = self._preview(state, describe)
        return self.store.open(
            ApprovalRequest(
                id=new_id(),
                created_at=now,
                expires_at=now + self.settings.request_ttl_seconds,
                tool=state.tool_name,
                server_id=state.server_id,
                subject=principal.subject,
                log_subject=principal.log_subject,
                role=principal.effective_role,
                args_digest=digest,
                target=target,
                preview=preview,
                policy_rule=state.policy_rule,
                status=PENDING,
            )
        )

    def _preview(self, state: CallState, describe: str | None) -> tuple[str | None, str]:
        # What the call is held for beyond its content (a gate's summary, the flow policy's
        # reason) comes first; it is our own bounded text, never the caller's.
        head = f"{describe}\n\n" if describe else ""
        target, preview = self._content_preview(state)
        return target, head + preview

    def _content_preview(self, state: CallState) -> tuple[str | None, str]:
        arguments = state.arguments
        secrets = self.secret_args(state.tool_name)
        operation = TOOL_OPERATIONS.get(state.tool_name) if state.server_id is None else None
        if operation is None:
            return None, arguments_preview(arguments, secrets)
        try:
            named = target_paths(operation, arguments)
        except (KeyError, TypeError, ValueError):
            named = []
        target = target_text(named)
        if operation in ("write", "edit", "delete") and named:
            old = self._current_text(named[0])
            if old is UNREADABLE:
                note = (
                    f"{operation} {target}: the file exists but is not shown (larger than "
                    f"{MAX_READ_FOR_PREVIEW} bytes, or not UTF-8 text)\n\n"
                )
                return target, note + arguments_preview(arguments, secrets)
            new: str | None
            if operation == "write":
                content = arguments.get("content")
                new = content if isinstance(content, str) and "content" not in secrets else None
                if new is None:
                    return target, arguments_preview(arguments, secrets)
            elif operation == "edit":
                new = _edited(old, arguments)
                if new is None:
                    return target, arguments_preview(arguments, secrets)
            else:
                new = None
            return target, diff_preview(named[0], old, new)
        return target, f"{operation} {target}\n"

    def _current_text(self, raw: str) -> Any:
        """The file's text now; None when there is no such file; ``UNREADABLE`` otherwise."""
        workspace = self.workspace
        if not isinstance(workspace, Workspace):
            return None
        try:
            target = workspace.resolve(raw, must_exist=True)
        except (NexusError, OSError):
            return None
        try:
            return workspace.read_bytes(target, limit=MAX_READ_FOR_PREVIEW).decode("utf-8")
        except (NexusError, OSError, UnicodeDecodeError):
            return UNREADABLE


def secret_args_of(contracts: Mapping[str, ToolContract], tool: str) -> Collection[str]:
    """The arguments of ``tool`` its contract says never to show (none for unknown tools)."""
    contract = contracts.get(tool)
    return contract.data_handling.secret_args if contract is not None else ()


def _edited(old: str | None, arguments: dict[str, object]) -> str | None:
    old_text, new_text = arguments.get("old_text"), arguments.get("new_text")
    if old is None or not isinstance(old_text, str) or not isinstance(new_text, str):
        return None
    if not old_text or old_text not in old:
        return None
    return old.replace(old_text, new_text)


__all__ = ["Inbox", "secret_args_of"]
