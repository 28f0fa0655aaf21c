"""The inbox: approval requests that wait, each with its preview; approve or deny.

The same store and rules as ``nexus-mcp approvals``: a decision is ``store.decide`` (once,
whichever replica or command comes first), an approver never approves their own agent's
request unless ``approvals.allow_self_approval`` is on, and every decision is audited as
``approval_decided``. The page updates itself: a small script asks ``inbox/state`` every
few seconds which requests wait and swaps in the list when that changed.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from nexus_mcp.console.pages import PREFIX, Console
from nexus_mcp.console.security import SECURITY_HEADERS, ConsoleUser
from nexus_mcp.policy.console import self_approval_refused
from nexus_mcp.stores.approval_requests import (
    ApprovalDecisionError,
    ApprovalRequest,
    well_formed_id,
)

MAX_LISTED = 200
MAX_REASON_CHARS = 500
APPROVAL_DECIDED = "approval_decided"
_WHY = {
    "unknown": "no such approval request",
    "expired": "this request expired before it was decided",
    "decided": "this request was decided already",
}


def routes(console: Console) -> list[Route]:
    store = console.services.state.approval_requests

    async def waiting() -> list[ApprovalRequest]:
        return await asyncio.to_thread(store.pending, limit=MAX_LISTED)

    def fingerprint(requests: list[ApprovalRequest]) -> str:
        return hashlib.sha256(" ".join(r.id for r in requests).encode()).hexdigest()[:16]

    async def inbox(request: Request) -> Response:
        user = await console.require(request, "read")
        if isinstance(user, Response):
            return user
        requests = await waiting()
        return console.render(
            request,
            "inbox.html",
            user,
            page="inbox",
            requests=requests,
            now=time.time(),
            state=fingerprint(requests),
        )

    async def listing(request: Request) -> Response:
        user = await console.require(request, "read")
        if isinstance(user, Response):
            return user
        requests = await waiting()
        return console.render(request, "inbox_list.html", user, requests=requests, now=time.time())

    async def state(request: Request) -> Response:
        user = await console.require(request, "read")
        if isinstance(user, Response):
            return user
        requests = await waiting()
        return JSONResponse(
            {"state": fingerprint(requests), "pending": len(requests)},
            headers=dict(SECURITY_HEADERS),
        )

    async def show(request: Request) -> Response:
        user = await console.require(request, "read")
        if isinstance(user, Response):
            return user
        found = await _get(request)
        if found is None:
            return console.refuse(request, user, 404, _WHY["unknown"], code="unknown_request")
        return console.render(
            request,
            "request.html",
            user,
            page="inbox",
            r=found,
            now=time.time(),
            own=found.subject == user.subject,
            allow_self=console.services.approval_settings.allow_self_approval,
        )

    async def decide(request: Request) -> Response:
        posted = await console.posted(request, "decide")
        if isinstance(posted, Response):
            return posted
        user, form = posted
        decision = form.get("decision")
        reason = (form.get("reason") or "").strip() or None
        if decision not in ("approve", "deny"):
            return console.refuse(request, user, 400, "choose approve or deny", code="decision")
        if reason is not None and len(reason) > MAX_REASON_CHARS:
            return console.refuse(
                request,
                user,
                400,
                f"a reason is at most {MAX_REASON_CHARS} characters",
                code="reason",
            )
        found = await _get(request)
        if found is None:
            return console.refuse(request, user, 404, _WHY["unknown"], code="unknown_request")
        approve = decision == "approve"
        if self_approval_refused(
            request_subject=found.subject,
            approver_subject=user.subject,
            approve=approve,
            allow_self_approval=console.services.approval_settings.allow_self_approval,
        ):
            return console.refuse(
                request,
                user,
                403,
                "you may not approve your own agent's request "
                "(approvals.allow_self_approval is off): ask another approver",
                code="self_approval",
            )
        try:
            decided = await asyncio.to_thread(
                store.decide, found.id, approve=approve, approver=user.subject, reason=reason
            )
        except ApprovalDecisionError as exc:
            return console.refuse(
                request,
                user,
                409,
                _WHY.get(exc.why, "this request cannot be decided"),
                code=f"request_{exc.why}",
            )
        _audit_decision(console, user, decided)
        return RedirectResponse(f"{PREFIX}/inbox?decided={decided.id}", status_code=303)

    async def _get(request: Request) -> ApprovalRequest | None:
        request_id = request.path_params.get("request_id")
        if not isinstance(request_id, str) or not well_formed_id(request_id):
            return None
        return await asyncio.to_thread(store.get, request_id)

    return [
        Route(f"{PREFIX}/inbox", inbox, methods=["GET"]),
        Route(f"{PREFIX}/inbox/list", listing, methods=["GET"]),
        Route(f"{PREFIX}/inbox/state", state, methods=["GET"]),
        Route(f"{PREFIX}/inbox/{{request_id}}", show, methods=["GET"]),
        Route(f"{PREFIX}/inbox/{{request_id}}", decide, methods=["POST"]),
    ]


def _audit_decision(console: Console, user: ConsoleUser, request: ApprovalRequest) -> None:
    console.audit(
        APPROVAL_DECIDED,
        user,
        tool=request.tool,
        tool_call_id=request.id,
        correlation_id=request.id,
        server_id=request.server_id,
        subject=request.log_subject,  # the call's story: the caller, decided by the approver
        role=request.role,
        outcome=request.status.upper(),
        reason=request.reason,
        approver=user.log_subject,
        args_digest=request.args_digest,
        facts={"approver_role": user.role},
    )


__all__ = ["routes"]
