"""The flow policy as the approval layer (chain step 6) asks it: judge, then record taint.

``FlowGuard.judge`` runs before a call, on the tool really called (an upstream tool by
its server and its own name, as the classification layer resolved it): a call of an
egress tool after private and untrusted reads in the session is refused
(``FLOW_DENIED``) or returned as a ``FlowHold`` the approval layer sends to an approver.

``FlowGuard.record`` runs after the call, whatever its outcome, when the tool really ran
(``CallState.executed``): a tool that ran touched what its labels say, even if it then
failed or timed out (conservative: an error result may still carry what it read). A call
refused before it ran touches nothing. Each label new to the session is one audit event
(``flow_taint_changed``: the labels added, the call and tool that added them).

A resources/read that reached the resource taints the same way (``resource_labels``), and
so does a prompts/get of an upstream's prompt (``prompt_labels``); neither is judged.
Taint is keyed by (principal subject, session key): ``stores/flow_taint.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from nexus_mcp.calls import PROMPT_GET, RESOURCE_READ, CallState
from nexus_mcp.errors import FlowDeniedError
from nexus_mcp.observability.audit import AuditEvent, AuditLog
from nexus_mcp.policy.flow import (
    EGRESS,
    FLOW_RULE,
    LABELS,
    NO_LABELS,
    POLICY_DENY,
    READS_PRIVATE,
    WILDCARD,
    FlowConfig,
    FlowHold,
    TaintSource,
    decide_flow,
    labels_for,
)
from nexus_mcp.policy.resources import NOTES_SOURCE
from nexus_mcp.stores.flow_taint import TaintStore

FLOW_TAINT_CHANGED = "flow_taint_changed"


class FlowGuard:
    """The flow policy and the session taint store, for one server."""

    def __init__(
        self,
        config: FlowConfig,
        store: TaintStore,
        audit: AuditLog,
        *,
        prompt_server: Callable[[str], str | None] = lambda name: None,
    ) -> None:
        self.config = config
        self.store = store
        self.audit = audit
        # The upstream server a prompt (by its exposed name) comes from, or None.
        self.prompt_server = prompt_server

    def labels_of(self, state: CallState) -> frozenset[str]:
        """The labels of the tool this call really reaches."""
        if not self.config.enabled:
            return NO_LABELS
        if state.server_id is not None and state.upstream_tool is not None:
            return labels_for(self.config, server_id=state.server_id, tool=state.upstream_tool)
        return labels_for(self.config, server_id=None, tool=state.tool_name)

    def resource_labels(self, state: CallState) -> frozenset[str]:
        """What a resources/read touches: a note resource is a private read; an upstream's
        resource carries its server's labels (``server/*``, else all three in prod). A read
        is never judged as egress here (it sends nothing the caller chose but its URI)."""
        source = state.resource_source
        if not self.config.enabled or source is None:
            return NO_LABELS
        if source == NOTES_SOURCE:
            return frozenset({READS_PRIVATE})
        return labels_for(self.config, server_id=source, tool=WILDCARD) - {EGRESS}

    def prompt_labels(self, state: CallState) -> frozenset[str]:
        """What a prompts/get touches: an upstream's prompt carries its server's labels
        (``server/*``, else all three in prod) without egress, as its resources do; its
        messages are the upstream's text, rendered with the caller's arguments."""
        if not self.config.enabled or state.prompt is None:
            return NO_LABELS
        server = self.prompt_server(state.prompt)
        if server is None:
            return NO_LABELS
        return labels_for(self.config, server_id=server, tool=WILDCARD) - {EGRESS}

    def judge(self, state: CallState, labels: frozenset[str]) -> FlowHold | None:
        """Refuse (deny), hold (approve) or pass an egress call; others always pass."""
        if EGRESS not in labels:
            return None
        subject, session = _key(state)
        hold = decide_flow(self.config, labels, self.store.taint(subject, session))
        if hold is None:
            return None
        if hold.action == POLICY_DENY:
            state.policy_decision, state.policy_rule = "denied", FLOW_RULE
            raise FlowDeniedError(rule=FLOW_RULE)
        return hold

    def record(self, state: CallState, labels: frozenset[str]) -> None:
        """The call ran: add its labels to the session's taint, auditing what is new."""
        if not labels or not state.executed:
            return
        subject, session = _key(state)
        if state.resource_source is not None:
            tool = f"{state.resource_source}/{RESOURCE_READ}"
        elif state.prompt is not None:
            tool = f"{self.prompt_server(state.prompt)}/{PROMPT_GET}"
        elif state.server_id is not None and state.upstream_tool is not None:
            tool = f"{state.server_id}/{state.upstream_tool}"
        else:
            tool = state.tool_name
        added = self.store.add(subject, session, labels, TaintSource(state.tool_call_id, tool))
        if not added:
            return
        principal = state.principal
        self.audit.emit(
            AuditEvent(
                event=FLOW_TAINT_CHANGED,
                tool_call_id=state.tool_call_id,
                correlation_id=state.correlation_id,
                tool=state.tool_name,
                server_id=state.server_id,
                upstream_tool=state.upstream_tool,
                resource_source=state.resource_source,
                uri_sha256=state.uri_sha256,
                prompt=state.prompt,
                subject=principal.log_subject if principal is not None else None,
                role=principal.effective_role if principal is not None else None,
                session=state.session_key,
                transport=state.transport,
                facts={
                    "labels_added": [label for label in LABELS if label in added],
                    "labels": [label for label in LABELS if label in labels],
                },
            )
        )


def _key(state: CallState) -> tuple[str, str]:
    principal = state.principal
    assert principal is not None  # chained_call refuses a call without one
    return principal.subject, state.session_key or f"principal:{principal.log_subject}"


__all__ = ["FLOW_TAINT_CHANGED", "FlowGuard"]
