"""ApprovalMiddleware: flow, write policy, then approval (chain step 6).

The flow policy (``middleware/flow.py``) judges every call of an egress tool first: after
private and untrusted reads in the session it is refused (``FLOW_DENIED``) or held for an
approver, read or write alike, in the approvals inbox only (the approver reads which
calls tainted the session; a token minted out of band says nothing of that); and every
labelled call that ran taints the session.

Deny by default: a workspace without a write policy accepts no writes. When the policy
requires approval, the call needs a valid, unspent approval token bound to this caller,
this tool and these exact arguments (or, where the operator chose elicitation and the
client can answer, an explicit confirmation). The nonce is spent only after every other
check passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Container, Mapping
from typing import Any, Protocol

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import InputRequiredToolResult

from nexus_mcp.calls import ARG_APPROVAL_TOKEN, META_APPROVAL_TOKEN, CallState, current_call
from nexus_mcp.connector import chained_call
from nexus_mcp.enforcement import RegistryEnforcer, plumbing_value
from nexus_mcp.errors import ApprovalRequiredError, WritePolicyDeniedError
from nexus_mcp.identity.resolver import MODERN_PROTOCOL
from nexus_mcp.middleware.flow import FlowGuard
from nexus_mcp.middleware.inbox import Inbox
from nexus_mcp.middleware.waiting import (
    answer_to_wait,
    ask_to_wait,
    wait_for_decision,
    wait_input,
)
from nexus_mcp.policy.approvals import (
    ApprovalClaims,
    ApprovalKeys,
    ApprovalSettings,
    approval_jti_digest,
    decide_approval_mode,
    spend_approval,
    verify_approval_token,
)
from nexus_mcp.policy.flow import FLOW_RULE, FlowHold, hold_text
from nexus_mcp.policy.write_policy import (
    SUBTREE_OPERATIONS,
    TOOL_OPERATIONS,
    WriteDecision,
    WritePolicy,
    WritePolicyConfig,
    check_write,
    measure_write,
)
from nexus_mcp.principal import Principal
from nexus_mcp.stores.approval_requests import PENDING
from nexus_mcp.stores.nonces import NonceStore
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.paths import target_paths
from nexus_mcp.workspace.replay import LexicalPaths


class WriteGate(Protocol):
    """A toolset's own write policy (``repos/writes.RepoWrites``), asked for its tools.

    ``decide`` judges the call before any approval is looked at (and may keep what it
    measured on the call's state for the tool); ``check_approver`` runs once the approval
    is verified and before it is spent (``None``: no approval was needed or given).
    """

    async def decide(self, state: CallState) -> WriteDecision: ...

    async def check_approver(self, state: CallState, approver: str | None) -> None: ...

    def describe(self, state: CallState) -> str: ...


class ApprovalMiddleware(Middleware):
    def __init__(
        self,
        policies: WritePolicyConfig,
        workspace: Workspace | LexicalPaths,
        *,
        keys: ApprovalKeys | None,
        approval_settings: ApprovalSettings,
        nonce_store: NonceStore,
        stateless_http: bool,
        connector_tools: Container[str] = frozenset(),
        enforcer: RegistryEnforcer | None = None,
        elicit_profiles: frozenset[str] = frozenset(),
        profile_of: Callable[[Principal], str | None] | None = None,
        upstream_policy: Callable[[str, str], WriteDecision] | None = None,
        write_gates: Mapping[str, WriteGate] | None = None,
        inbox: Inbox | None = None,
        flow: FlowGuard | None = None,
    ) -> None:
        # The flow policy (middleware/flow.py); None: no flow labels are tracked.
        self.flow = flow
        # Approval requests a person decides on (middleware/inbox.py); None: tokens only.
        self.inbox = inbox
        # Tools whose toolset decides its own writes (tool name -> its gate).
        self.write_gates = write_gates if write_gates is not None else {}
        # Write policy for tools of upstream servers: (server_id, tool) -> decision.
        self.upstream_policy = upstream_policy
        self.connector_tools = connector_tools
        self.enforcer = enforcer
        self.elicit_profiles = elicit_profiles
        self.profile_of = profile_of
        self.policies = policies
        self.workspace = workspace
        self.keys = keys
        self.approval_settings = approval_settings
        self.nonce_store = nonce_store
        self.stateless_http = stateless_http

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = chained_call(str(context.message.name))
        if self.enforcer is not None:
            self.enforcer.ensure_classified(state)  # the write policy never depends on layer 5
        flow = self.flow
        if flow is None:
            return await self._judged(context, call_next, state, None)
        # On the tool really called (classification resolved an upstream tool's route).
        labels = flow.labels_of(state)
        hold = flow.judge(state, labels)
        try:
            return await self._judged(context, call_next, state, hold)
        finally:
            # The tool ran (whatever its outcome): what it touched taints the session.
            flow.record(state, labels)

    async def on_read_resource(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        await self.check_resource_access(context)
        return await self._tainting(context, call_next, FlowGuard.resource_labels)

    async def on_get_prompt(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        return await self._tainting(context, call_next, FlowGuard.prompt_labels)

    async def _tainting(
        self,
        context: MiddlewareContext[Any],
        call_next: CallNext[Any, Any],
        labels_of: Callable[[FlowGuard, CallState], frozenset[str]],
    ) -> Any:
        """A resources/read or prompts/get: never judged, but once past the grants (it
        reached the resource or the upstream's prompt) it taints the session."""
        flow, state = self.flow, current_call()
        if flow is None or state is None:
            return await call_next(context)
        try:
            return await call_next(context)
        finally:
            if state.executed:
                flow.record(state, labels_of(flow, state))

    async def _judged(
        self,
        context: MiddlewareContext[Any],
        call_next: CallNext[Any, Any],
        state: CallState,
        hold: FlowHold | None,
    ) -> Any:
        if state.tool_class != "write" and hold is None:
            return await call_next(context)
        gate = self.write_gates.get(state.tool_name) if state.server_id is None else None
        if state.tool_class != "write":
            # An egress read the flow policy holds: approved in the inbox only.
            assert hold is not None
            state.policy_rule = FLOW_RULE
            question = await self._check_token(state, None, context, hold)
            return question if question is not None else await call_next(context)
        try:
            if state.server_id is not None:
                decision = self._decide_upstream(state)
            elif gate is not None:
                if self.enforcer is not None:
                    # The content a gate measures with git is held to the registry's size
                    # limits and expected hashes first (chain step 7 checks them again).
                    classification = self.enforcer.ensure_classified(state)
                    self.enforcer.check_write(state, classification, state.arguments)
                decision = await gate.decide(state)
            else:
                policy = self.policies.policy_for_workspace()
                # Path resolution and a folder's walk are file-system work: off the loop.
                decision = await asyncio.to_thread(self._decide, policy, state)
        except WritePolicyDeniedError as exc:
            state.policy_decision, state.policy_rule = "denied", str(exc.facts.get("rule"))
            raise
        state.policy_decision, state.policy_rule = "allowed", decision.rule
        if hold is not None:
            # Held by the flow policy: one approval from the inbox, where the approver reads
            # both reasons, covers the write policy's approval too.
            question = await self._check_token(state, gate, context, hold)
            if question is not None:
                return question
        elif decision.requires_approval:
            mode = decide_approval_mode(
                self._approval_mode(decision.approval_mode, state),
                can_elicit=self._can_elicit(context),
            )
            if mode == "token":
                question = await self._check_token(state, gate, context)
                if question is not None:
                    return question  # 2026-07-28: asked whether to wait (never a result)
            elif mode == "elicit":
                if gate is not None and state.principal is not None:
                    # The caller is the approver: a write it could not approve is refused
                    # before a human is asked to approve it.
                    await self._check_approver(gate, state, state.principal.subject)
                await self._confirm(context, state)
            else:
                raise ApprovalRequiredError(reason="elicitation_unavailable")
        if gate is not None:
            approver = state.approval.get("approver") if state.approval else None
            await self._check_approver(gate, state, approver if isinstance(approver, str) else None)
        return await call_next(context)

    @staticmethod
    async def _check_approver(gate: WriteGate, state: CallState, approver: str | None) -> None:
        try:
            await gate.check_approver(state, approver)
        except WritePolicyDeniedError as exc:
            state.policy_decision, state.policy_rule = "denied", str(exc.facts.get("rule"))
            raise

    def _decide_upstream(self, state: CallState) -> WriteDecision:
        """An upstream's own write policy: deny by default (``policy/upstreams.py``)."""
        if self.upstream_policy is None or state.upstream_tool is None:
            raise WritePolicyDeniedError(rule="upstream_no_policy")
        decision = self.upstream_policy(str(state.server_id), state.upstream_tool)
        if not decision.allowed:
            raise WritePolicyDeniedError(rule=decision.rule)
        return decision

    def _decide(self, policy: WritePolicy | None, state: CallState) -> Any:
        operation = TOOL_OPERATIONS.get(state.tool_name)
        if operation is None:
            raise WritePolicyDeniedError(rule="unknown_operation")
        named = target_paths(operation, state.arguments)
        # Decided on the real paths the write would touch (links followed), not on the
        # names the caller wrote; the workspace decides again when it acts.
        paths = self.workspace.touched_paths(named)
        size_bytes, changed_lines = measure_write(operation, state.arguments)
        decision = check_write(
            policy,
            operation=operation,
            paths=paths,
            size_bytes=size_bytes,
            changed_lines=changed_lines,
        )
        if operation in SUBTREE_OPERATIONS:
            # A folder moved or removed as a whole must not carry a protected entry with
            # it (a nested .git/, say), which patterns on the folder's own path cannot see.
            moved_to = named[1] if operation == "rename" and len(named) == 2 else None
            workspace = self.workspace
            if isinstance(workspace, Workspace):
                workspace.check_subtree(operation, workspace.named(named[0]), moved_to=moved_to)
        return decision

    async def _check_token(
        self,
        state: CallState,
        gate: WriteGate | None = None,
        context: MiddlewareContext[Any] | None = None,
        hold: FlowHold | None = None,
    ) -> InputRequiredToolResult | None:
        principal = state.principal
        token = plumbing_value(state, ARG_APPROVAL_TOKEN, META_APPROVAL_TOKEN)
        if hold is not None and (self.inbox is None or principal is None):
            raise ApprovalRequiredError(reason="flow_needs_inbox")
        # A flow hold is approved in the inbox only, where the approver reads why: a token
        # minted out of band (perhaps before the session was tainted) never says why.
        if (not token or hold is not None) and self.inbox is not None and principal is not None:
            # No token: the inbox opens a request for a person, or holds its approval.
            describe = gate.describe(state) if gate is not None else None
            held: dict[str, str] = {}
            if hold is not None:
                # The approver reads why; a request opened before the session was tainted
                # (another binding) does not cover this call.
                describe = hold_text(hold) + (f"\n\n{describe}" if describe else "")
                held = {"binding": FLOW_RULE, "action": "this egress call"}
            try:
                claims = await self.inbox.approval_for(state, principal, describe, **held)
            except ApprovalRequiredError as refusal:
                waited = await self._wait(context, state, refusal)
                if waited is False:
                    raise
                if waited is not True:
                    return waited
                # Decided while the call waited: taken (or refused) exactly as a retry.
                claims = await self.inbox.approval_for(state, principal, describe, **held)
            self._take(state, claims)
            return None
        if self.keys is None or principal is None:
            raise ApprovalRequiredError(reason="no_approval_keys")
        if not token:
            raise ApprovalRequiredError()
        claims = verify_approval_token(
            self.keys,
            self.approval_settings,
            token,
            subject=principal.subject,
            tool=state.tool_name,
            arguments=state.arguments,
        )
        self._take(state, claims)
        state.approval = {
            "approver": claims.sub,
            "host_id": claims.host_id,
            "jti_digest": approval_jti_digest(claims),
        }
        return None

    async def _wait(
        self,
        context: MiddlewareContext[Any] | None,
        state: CallState,
        refusal: ApprovalRequiredError,
    ) -> InputRequiredToolResult | bool:
        """Whether the refused call waits for its pending request (``middleware/waiting.py``).

        True once the request was decided (or expired) while the client waited: the call
        is then judged again, exactly as a retry would be. False: refuse as usual. On a
        2026-07-28 connection without an answer yet: the question to return instead.
        """
        request_id = refusal.facts.get("approval_request_id")
        seconds = self.approval_settings.wait_seconds
        if context is None or self.inbox is None or seconds <= 0:
            return False
        ctx = context.fastmcp_context
        if ctx is None or not isinstance(request_id, str):
            return False
        if _protocol(context) == MODERN_PROTOCOL:
            if not _declares_elicitation(context):
                return False
            answer = answer_to_wait(ctx, request_id)
            if answer is None:
                return wait_input(request_id)
            if not answer:
                return False
        elif not self._can_elicit(context) or not await ask_to_wait(
            ctx, request_id, state.hold_claim
        ):
            return False
        status = await wait_for_decision(
            self.inbox.store, request_id, seconds, ctx, hold=state.hold_claim
        )
        return status != PENDING

    def _take(self, state: CallState, claims: ApprovalClaims) -> None:
        if state.tool_name in self.connector_tools:
            # Spent by the connector when the tool is about to run (DESIGN.md step 9), so
            # a refusal by documents or limits does not burn the approval.
            state.pending_approval = claims
        else:
            spend_approval(claims, self.nonce_store)

    def _approval_mode(self, policy_mode: str, state: CallState) -> str:
        """The policy's mode, or elicitation for callers of a profile the operator chose."""
        principal = state.principal
        if (
            self.elicit_profiles
            and principal is not None
            and self.profile_of is not None
            and self.profile_of(principal) in self.elicit_profiles
        ):
            return "elicit"
        return policy_mode

    def _can_elicit(self, context: MiddlewareContext[Any]) -> bool:
        """The client can answer ``ctx.elicit``: a handshake-era, stateful connection whose
        client declared the elicitation capability."""
        if self.stateless_http or _protocol(context) in (None, MODERN_PROTOCOL):
            return False
        return _declares_elicitation(context)

    async def _confirm(self, context: MiddlewareContext[Any], state: CallState) -> None:
        ctx = context.fastmcp_context
        assert ctx is not None
        gate = self.write_gates.get(state.tool_name) if state.server_id is None else None
        if state.server_id is not None:
            question = f"Approve a call of {state.tool_name} (upstream {state.server_id})?"
        elif gate is not None:
            question = gate.describe(state)
        else:
            operation = TOOL_OPERATIONS.get(state.tool_name, "write")
            paths = ", ".join(target_paths(operation, state.arguments))
            question = f"Approve {operation} of {paths} by {state.tool_name}?"
        answer = await asyncio.wait_for(
            ctx.elicit(
                question,
                response_type=["approve", "deny"],
            ),
            timeout=120,
        )
        if (
            getattr(answer, "action", None) != "accept"
            or getattr(answer, "data", None) != "approve"
        ):
            raise ApprovalRequiredError(reason="declined")
        principal = state.principal
        state.approval = {
            "approver": principal.subject if principal else None,
            "host_id": "elicitation",
        }


def _protocol(context: MiddlewareContext[Any]) -> str | None:
    """The call's protocol version ("" when unknown); None outside a client request."""
    ctx = context.fastmcp_context
    request = ctx.request_context if ctx is not None else None
    if request is None:
        return None
    return str(getattr(request, "protocol_version", None) or "")


def _declares_elicitation(context: MiddlewareContext[Any]) -> bool:
    """The client declared the elicitation capability (per request on 2026-07-28)."""
    ctx = context.fastmcp_context
    request = ctx.request_context if ctx is not None else None
    try:
        capabilities = request.session.client_params.capabilities  # type: ignore[union-attr]
    except AttributeError:
        return False
    return getattr(capabilities, "elicitation", None) is not None


__all__ = ["ApprovalMiddleware", "WriteGate"]
