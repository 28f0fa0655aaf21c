"""Waiting for an approver: a write refused for a pending request waits for its decision.

``approvals.wait_seconds`` above 0 lets a call the inbox (``middleware/inbox.py``) would
refuse ``APPROVAL_REQUIRED`` for a pending request wait for the decision instead, when the
client declared the elicitation capability on a handshake-era connection (protocol
2025-11-25 and earlier, stdio or stateful HTTP). The client is asked once, by
elicitation, whether to wait; the question names the request's id and where a person
decides it, never the arguments. On "wait" the request store is polled (off the event
loop, every half second and then less often) until:

- it is no longer pending: the approval layer judges the call again exactly as a retry
  (``Inbox.approval_for``): an approved request is taken once (the store's ``use`` is
  atomic, so of two waiting calls one runs; the other is refused ``APPROVAL_REQUIRED``
  naming a new request), a denied one refuses ``APPROVAL_INVALID`` (reason ``denied``),
  an expired one is followed by a new request the refusal names;
- ``wait_seconds`` passed: the usual ``APPROVAL_REQUIRED`` naming the request, so the
  agent may retry later.

"cancel", a declined question or an elicitation that fails is the usual refusal at once.

While waiting the call holds no lock (each poll is one short read, and one short write
renewing the call's idempotency claim, so a retry under its key keeps waiting for it) and
has spent nothing: the approval is taken only when the call goes on to run, so a client
that goes away mid-wait (its call cancelled) leaves the approved request for its retry. A
client that sent a progress token gets a progress notification at each poll, so it does
not time out.

On a 2026-07-28 connection (where a server cannot send the client a request of its own)
the question is the call's answer instead: an ``input_required`` result (SEP-2322) with
one elicitation input request (``WAIT_INPUT``) and the request's id as its
``request_state``, when the request's client capabilities include elicitation. The
client's retry carrying the answer "wait" for that same request then waits as above. The
answer only ever starts a wait: what runs is decided by the inbox, by the caller, tool
and exact arguments, never by the echoed state. The layers around approval never take the
question for the call's result (``is_question``): the idempotency layer frees the key
(the answering retry runs under it) and the audit records the leg as blocked,
``INPUT_REQUIRED``, never finished.
"""

from __future__ import annotations

import asyncio
from typing import Any

import mcp_types
from fastmcp.exceptions import FastMCPError
from fastmcp.tools.base import InputRequiredToolResult
from mcp.shared.exceptions import MCPError

from nexus_mcp.calls import ClaimHold
from nexus_mcp.stores.approval_requests import (
    EXPIRED,
    PENDING,
    ApprovalRequest,
    ApprovalRequestStore,
)

# The answers the client chooses between (an enum the client renders as choices).
WAIT, CANCEL = "wait", "cancel"
# The key of the one input request of a 2026-07-28 question.
WAIT_INPUT = "nexus_approval_wait"
_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"value": {"type": "string", "title": "Wait", "enum": [WAIT, CANCEL]}},
    "required": ["value"],
}
# How long the client may take to answer the question itself (the wait starts after).
ANSWER_SECONDS = 120.0
FIRST_POLL_SECONDS = 0.5
MAX_POLL_SECONDS = 5.0
POLL_GROWTH = 1.5


def wait_question(request_id: str) -> str:
    """What the client is asked: the request's id and how a person decides it, nothing else."""
    return (
        f"This write needs a person's approval: request {request_id} waits in the approvals "
        "inbox. An approver decides it in the console or with "
        f"`nexus-mcp approvals approve {request_id}`. Wait here for the decision, or cancel "
        "and call again later?"
    )


async def ask_to_wait(ctx: Any, request_id: str, hold: ClaimHold | None = None) -> bool:
    """True when the client answered "wait"; anything else (or no answer) is False.

    The call's idempotency claim is renewed while the person reads the question (``hold``,
    as in ``wait_for_decision``): an answer may take longer than the claim's lease.
    """
    keeper = asyncio.create_task(_keep(hold)) if hold is not None else None
    try:
        answer = await asyncio.wait_for(
            ctx.elicit(wait_question(request_id), response_type=[WAIT, CANCEL]),
            timeout=ANSWER_SECONDS,
        )
    except (MCPError, FastMCPError, TimeoutError, ValueError):
        # No usable answer (the client failed the request, never answered, or this
        # connection cannot elicit): the call is refused as it would have been.
        return False
    finally:
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)  # collected, not leaked
    return getattr(answer, "action", None) == "accept" and getattr(answer, "data", None) == WAIT


async def _keep(hold: ClaimHold) -> None:
    """Renew the claim every ``hold.every`` seconds until cancelled."""
    while True:
        await asyncio.sleep(hold.every)
        await asyncio.to_thread(hold.renew)


def wait_input(request_id: str) -> InputRequiredToolResult:
    """The 2026-07-28 question: an ``input_required`` result asking whether to wait."""
    params = mcp_types.ElicitRequestFormParams(
        message=wait_question(request_id), requested_schema=_ANSWER_SCHEMA
    )
    return InputRequiredToolResult(
        mcp_types.InputRequiredResult(
            input_requests={WAIT_INPUT: mcp_types.ElicitRequest(params=params)},
            request_state=request_id,
        )
    )


def answer_to_wait(ctx: Any, request_id: str) -> bool | None:
    """The client's answer to ``wait_input(request_id)`` on this retry: True for "wait",
    False for any other answer, None when this call carries none (or answers a question
    about another request: it is asked again)."""
    responses = ctx.input_responses
    if not responses or WAIT_INPUT not in responses or ctx.request_state != request_id:
        return None
    answer = responses[WAIT_INPUT]
    content = getattr(answer, "content", None)
    return (
        getattr(answer, "action", None) == "accept"
        and isinstance(content, dict)
        and content.get("value") == WAIT
    )


def is_question(result: object) -> bool:
    """True for an ``input_required`` leg: a question to the client, not the call's result."""
    return isinstance(result, InputRequiredToolResult)


async def wait_for_decision(
    store: ApprovalRequestStore,
    request_id: str,
    seconds: float,
    ctx: Any | None = None,
    hold: ClaimHold | None = None,
) -> str:
    """The request's status once it is no longer pending, or ``pending`` after ``seconds``.

    Nothing is taken here. ``hold`` (``CallState.hold_claim``) renews the call's
    idempotency claim at each poll (polls come at least as often as it asks), so a retry
    under the same key keeps waiting for this call rather than being refused as outcome
    unknown once the claim's lease (twice the longest tool timeout) has run out; when the
    claim is no longer the call's, the wait ends (``pending``: the usual refusal). ``ctx``
    (a FastMCP context) gets a progress notification per poll; FastMCP sends one only
    when the client gave a progress token.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + seconds
    longest = min(MAX_POLL_SECONDS, hold.every) if hold is not None else MAX_POLL_SECONDS
    delay = min(FIRST_POLL_SECONDS, longest)
    while True:
        held, found = await asyncio.to_thread(_poll, store, request_id, hold)
        if found is None:
            return EXPIRED  # purged a day past its expiry: nothing to take
        if not held:
            return PENDING
        if found.status != PENDING:
            return found.status
        now = loop.time()
        if now >= deadline:
            return PENDING
        if ctx is not None:
            await ctx.report_progress(
                progress=round(now - started, 1),
                total=float(seconds),
                message=f"waiting for an approver to decide request {request_id}",
            )
        await asyncio.sleep(min(delay, deadline - now))
        delay = min(delay * POLL_GROWTH, longest)


def _poll(
    store: ApprovalRequestStore, request_id: str, hold: ClaimHold | None
) -> tuple[bool, ApprovalRequest | None]:
    """One worker-thread hop: renew the claim, then read the request."""
    held = hold.renew() if hold is not None else True
    return held, store.get(request_id)


__all__ = [
    "CANCEL",
    "WAIT",
    "WAIT_INPUT",
    "answer_to_wait",
    "ask_to_wait",
    "is_question",
    "wait_for_decision",
    "wait_input",
    "wait_question",
]
