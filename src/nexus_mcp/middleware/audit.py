"""AuditMiddleware: one ``tool_call_finished`` or ``tool_call_blocked`` event per call.

It sits inside the envelope, so it sees typed refusals before they are translated, and
records the real reason of a hidden-tool refusal that the client only sees as
"Unknown tool". ``tool_call_started`` is emitted by the connector at the moment the tool
function really starts (see ``AuditTrail.started``): a blocked call never started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastmcp.exceptions import NotFoundError as FastMCPNotFoundError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.audit import (
    OUTCOME_OK,
    TOOL_CALL_BLOCKED,
    TOOL_CALL_FINISHED,
    TOOL_CALL_STARTED,
    AuditEvent,
    AuditLog,
)
from nexus_mcp.calls import PLUMBING_ARGS, CallState, current_call
from nexus_mcp.decorator import ToolContract
from nexus_mcp.errors import Code, NexusError
from nexus_mcp.middleware.envelope import to_wire_error
from nexus_mcp.policy.hashing import digest_arguments

OUTCOME_UNKNOWN_TOOL = "UNKNOWN_TOOL"
MAX_LOGGED_VALUE_CHARS = 256
_INPUT_CODES = frozenset({Code.INVALID_INPUT, Code.INVALID_PATH})
_NO_APPROVAL: Mapping[str, Any] = {}


class AuditTrail:
    """Builds audit events from the call state; shared by the middleware and the connector."""

    def __init__(
        self,
        log: AuditLog,
        contracts: Mapping[str, ToolContract],
        registry_info: Callable[[], Mapping[str, Any] | None] = lambda: None,
    ) -> None:
        self.log = log
        self.contracts = contracts
        self.registry_info = registry_info

    def started(self, contract: ToolContract, state: CallState) -> None:
        self.log.emit(self._event(TOOL_CALL_STARTED, state, outcome=None))

    def finished(self, state: CallState, *, outcome: str, error: NexusError | None = None) -> None:
        # A replay answered from the idempotency record finished (with the recorded result)
        # without running the tool again; it was not blocked.
        finished = state.executed or state.idempotency_outcome == "replayed"
        kind = TOOL_CALL_FINISHED if finished else TOOL_CALL_BLOCKED
        self.log.emit(self._event(kind, state, outcome=outcome, error=error))

    def _event(
        self, kind: str, state: CallState, *, outcome: str | None, error: NexusError | None = None
    ) -> AuditEvent:
        contract = self.contracts.get(state.tool_name)
        principal = state.principal
        check = state.document_check
        approval = state.approval or _NO_APPROVAL
        effect = state.effect
        started = kind == TOOL_CALL_STARTED
        return AuditEvent(
            event=kind,
            tool_call_id=state.tool_call_id,
            correlation_id=state.correlation_id,
            tool=state.tool_name if contract is not None else "(unregistered)",
            subject=principal.log_subject if principal is not None else None,
            role=principal.effective_role if principal is not None else None,
            risk=contract.risk if contract is not None else None,
            tool_class=state.tool_class,
            outcome=outcome,
            reason=state.block_reason,
            duration_ms=None if started else state.elapsed_ms,
            args_digest=self._args_digest(state),
            args=self._loggable_args(contract, state, error),
            session=state.session_key,
            transport=state.transport or "memory",
            registry=self.registry_info(),
            effect_id=effect.get("effect_id") if effect is not None else None,
            document_hashes=check.hash_dicts() if check is not None else None,
            batch_total_bytes=check.batch_total_bytes if check is not None else None,
            side_effects=(contract.risk != "read")
            if contract is not None and state.executed
            else None,
            approver=approval.get("approver"),
            host_id=approval.get("host_id"),
            approval_jti_digest=approval.get("jti_digest"),
            policy_decision=state.policy_decision,
            policy_rule=state.policy_rule,
            idempotency=state.idempotency_outcome,
            facts=_safe_facts(error) if error is not None else None,
        )

    @staticmethod
    def _args_digest(state: CallState) -> str:
        # Computed once per call: the started and finished events carry the same digest.
        if state.args_digest is None:
            state.args_digest = digest_arguments(state.arguments, exclude=PLUMBING_ARGS)
        return state.args_digest

    @staticmethod
    def _loggable_args(
        contract: ToolContract | None, state: CallState, error: NexusError | None
    ) -> dict[str, Any] | None:
        # A refused input may be hostile; keep only its digest.
        if contract is None or (error is not None and error.code in _INPUT_CODES):
            return None
        allowed = contract.data_handling.loggable_args
        if not allowed:
            return None
        out: dict[str, Any] = {}
        for name in sorted(allowed & state.arguments.keys()):
            value = state.arguments[name]
            if isinstance(value, str):
                value = value[:MAX_LOGGED_VALUE_CHARS]
            elif not isinstance(value, bool | int | float) and value is not None:
                continue
            out[name] = value
        return out or None


def _safe_facts(error: NexusError | None) -> dict[str, Any] | None:
    if error is None or not error.facts:
        return None
    return {k: v for k, v in error.facts.items() if isinstance(v, str | int | float | bool)}


class AuditMiddleware(Middleware):
    def __init__(self, trail: AuditTrail) -> None:
        self.trail = trail

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = current_call()
        if state is None:  # pragma: no cover - the envelope always opens one
            return await call_next(context)
        try:
            result = await call_next(context)
        except FastMCPNotFoundError:
            state.block_reason = state.block_reason or "unknown_tool"
            self.trail.finished(state, outcome=OUTCOME_UNKNOWN_TOOL)
            raise
        except BaseException as exc:
            if isinstance(exc, Exception):
                error = to_wire_error(exc, correlation_id=state.correlation_id)
            else:  # cancellation: record it, then let it propagate untouched
                error = NexusError("cancelled")
            self.trail.finished(state, outcome=str(error.code), error=error)
            raise
        self.trail.finished(state, outcome=OUTCOME_OK)
        return result


__all__ = ["OUTCOME_UNKNOWN_TOOL", "AuditMiddleware", "AuditTrail"]
