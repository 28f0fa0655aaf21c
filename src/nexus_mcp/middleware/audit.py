"""AuditMiddleware: one ``tool_call_finished`` or ``tool_call_blocked`` event per call.

It sits inside the envelope, so it sees typed refusals before they are translated, and
records the real reason of a hidden-tool refusal that the client only sees as
"Unknown tool". ``tool_call_started`` is built by the connector at the moment the tool
function really starts (see ``AuditTrail.started``): a blocked call never started.

Audit durability follows consequence. Two invariants hold for every call: no side effect
starts before its intent (``tool_call_started``) is written, and no result leaves the
server before its record is written. So a write-class call's started event is written
before the tool runs; a read-class call's started and finished events are written
together, in one write, after the tool returns (or fails, times out or is cancelled) and
before the result goes back up the chain. Both events keep every field, and the started
event its own time.

A ``resources/read`` or ``prompts/get`` is one ``resource_read_*`` or ``prompt_get_*``
event, written before its answer leaves: ``_blocked`` when it never reached a resource or
prompt (hidden, unknown, the grants store down), else ``_finished`` with its outcome. It
names the resource's source and the sha256 of its URI, or the prompt (a name only once it
is known to be a real prompt) and a digest of its arguments; never a URI or an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastmcp.exceptions import DisabledError as FastMCPDisabledError
from fastmcp.exceptions import NotFoundError as FastMCPNotFoundError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.calls import PLUMBING_ARGS, PROMPT_GET, CallState, current_call
from nexus_mcp.connector import chained_call
from nexus_mcp.contracts import ToolContract
from nexus_mcp.envelope import request_refusal, safe_facts, to_wire_error
from nexus_mcp.errors import Code, NexusError
from nexus_mcp.middleware.waiting import is_question
from nexus_mcp.observability.audit import (
    AUDIT_SCHEMA_VERSION,
    OUTCOME_OK,
    PROMPT_GET_BLOCKED,
    PROMPT_GET_FINISHED,
    RESOURCE_READ_BLOCKED,
    RESOURCE_READ_FINISHED,
    TOOL_CALL_BLOCKED,
    TOOL_CALL_FINISHED,
    TOOL_CALL_STARTED,
    AuditEvent,
    AuditLog,
    utc_timestamp,
)
from nexus_mcp.observability.telemetry import CallSpan, CallTelemetry
from nexus_mcp.policy.hashing import fingerprint_arguments

OUTCOME_UNKNOWN_TOOL = "UNKNOWN_TOOL"
OUTCOME_TOOL_ERROR = "TOOL_ERROR"
OUTCOME_INPUT_REQUIRED = "INPUT_REQUIRED"  # a question to the client, not a result
OUTCOME_UNKNOWN_RESOURCE = "UNKNOWN_RESOURCE"
OUTCOME_UNKNOWN_PROMPT = "UNKNOWN_PROMPT"
# What a prompt the caller named is recorded as until it is known to be a real prompt.
UNREGISTERED_PROMPT = "(unregistered)"
MAX_LOGGED_VALUE_CHARS = 256
_INPUT_CODES = frozenset({Code.INVALID_INPUT, Code.INVALID_PATH})
_APPROVAL_FIELDS = (
    ("approver", "approver"),
    ("host_id", "host_id"),
    ("jti_digest", "approval_jti_digest"),
)


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
        event = self._event(TOOL_CALL_STARTED, state, outcome=None)
        if state.audit_finishes and _is_read_class(contract, state):
            # Nothing to announce before a read runs: it changes nothing. Its intent goes
            # out with its finished event, before the result leaves (``finished``).
            state.started_event = event
        else:
            self.log.emit(event)

    def finished(self, state: CallState, *, outcome: str, error: NexusError | None = None) -> None:
        # A replay answered from the idempotency record finished (with the recorded result)
        # without running the tool again; it was not blocked.
        finished = state.executed or state.idempotency_outcome == "replayed"
        kind = TOOL_CALL_FINISHED if finished else TOOL_CALL_BLOCKED
        event = self._event(kind, state, outcome=outcome, error=error)
        started, state.started_event = state.started_event, None
        if started is None:
            self.log.emit(event)
        else:
            self.log.emit_many((started, event))  # one write: both lines or neither

    def _event(
        self, kind: str, state: CallState, *, outcome: str | None, error: NexusError | None = None
    ) -> AuditEvent:
        # The record is built directly, with only the fields that are set: twice per call.
        contract = self.contracts.get(state.tool_name)
        record: dict[str, Any] = {
            "v": AUDIT_SCHEMA_VERSION,
            "event": kind,
            "tool_call_id": state.tool_call_id,
            "correlation_id": state.correlation_id,
            "tool": state.tool_name if contract is not None else "(unregistered)",
        }
        if state.server_id is not None:
            record["server_id"] = state.server_id
            record["upstream_tool"] = state.upstream_tool
        principal = state.principal
        if principal is not None:
            record["subject"] = principal.log_subject
            record["role"] = principal.effective_role
        if contract is not None:
            record["risk"] = contract.risk
        if state.tool_class is not None:
            record["tool_class"] = state.tool_class
        if outcome is not None:
            record["outcome"] = outcome
        if state.block_reason is not None:
            record["reason"] = state.block_reason
        if kind != TOOL_CALL_STARTED:
            record["duration_ms"] = state.elapsed_ms
        record["args_digest"] = self._args_digest(state)
        # The started event is written before the tool has judged its arguments (a path
        # it will refuse, say), so it carries only their digest; the finished event names
        # the loggable ones unless they were refused.
        logged = None if kind == TOOL_CALL_STARTED else self._loggable_args(contract, state, error)
        if logged is not None:
            record["args"] = logged
        if state.session_key is not None:
            record["session"] = state.session_key
        record["transport"] = state.transport or "memory"
        registry = self.registry_info()
        if registry is not None:
            record["registry"] = registry
        effect_id = state.effect.get("effect_id") if state.effect is not None else None
        if effect_id is not None:
            record["effect_id"] = effect_id
        check = state.document_check
        if check is not None:
            record["document_hashes"] = check.hash_dicts()
            record["batch_total_bytes"] = check.batch_total_bytes
        if contract is not None and state.executed:
            record["side_effects"] = contract.risk != "read"
        if state.target_ref is not None:
            record["target_ref"] = state.target_ref
        approval = state.approval
        if approval:
            for key, name in _APPROVAL_FIELDS:
                if approval.get(key) is not None:
                    record[name] = approval[key]
        if state.policy_decision is not None:
            record["policy_decision"] = state.policy_decision
        if state.policy_rule is not None:
            record["policy_rule"] = state.policy_rule
        if state.idempotency_outcome is not None:
            record["idempotency"] = state.idempotency_outcome
        facts = safe_facts(error)
        if facts is not None:
            record["facts"] = facts
        if state.output_scan is not None and kind != TOOL_CALL_STARTED:
            record["output_scan"] = state.output_scan
        record["ts"] = utc_timestamp()
        return AuditEvent.from_record(record)

    def request_finished(
        self, state: CallState, *, blocked: bool, outcome: str, error: NexusError | None = None
    ) -> None:
        """The one event of a resources/read or prompts/get (``state.tool_name`` says which)."""
        prompt = state.tool_name == PROMPT_GET
        if prompt:
            kind = PROMPT_GET_BLOCKED if blocked else PROMPT_GET_FINISHED
        else:
            kind = RESOURCE_READ_BLOCKED if blocked else RESOURCE_READ_FINISHED
        record: dict[str, Any] = {
            "v": AUDIT_SCHEMA_VERSION,
            "event": kind,
            "tool_call_id": state.tool_call_id,
            "correlation_id": state.correlation_id,
            "tool": state.tool_name,
        }
        if prompt:
            record["prompt"] = state.prompt or UNREGISTERED_PROMPT
        else:
            if state.resource_source is not None:
                record["resource_source"] = state.resource_source
            if state.uri_sha256 is not None:
                record["uri_sha256"] = state.uri_sha256
        principal = state.principal
        if principal is not None:
            record["subject"] = principal.log_subject
            record["role"] = principal.effective_role
        record["outcome"] = outcome
        if state.block_reason is not None:
            record["reason"] = state.block_reason
        record["duration_ms"] = state.elapsed_ms
        if prompt:
            record["args_digest"] = self._args_digest(state)
        if state.session_key is not None:
            record["session"] = state.session_key
        record["transport"] = state.transport or "memory"
        facts = safe_facts(error)
        if facts is not None:
            record["facts"] = facts
        if state.output_scan is not None:
            record["output_scan"] = state.output_scan
        record["ts"] = utc_timestamp()
        self.log.emit(AuditEvent.from_record(record))

    @staticmethod
    def _args_digest(state: CallState) -> str:
        # Computed once per call: the started and finished events carry the same digest.
        if state.args_digest is None:
            state.args_digest = fingerprint_arguments(state.arguments, exclude=PLUMBING_ARGS)
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


def _is_read_class(contract: ToolContract, state: CallState) -> bool:
    """Every view of the call agrees it only reads: the tool's declared risk, the registry
    class the connector has just computed, and the gateway's class when that layer ran."""
    if contract.risk != "read" or state.tool_class != "read":
        return False
    return getattr(state.classification, "tool_class", "read") == "read"


class AuditMiddleware(Middleware):
    """Writes each call's end record; also where the call's telemetry (its span and
    metrics, ``observability/telemetry.CallTelemetry``) learns the outcome, when it is on."""

    def __init__(self, trail: AuditTrail, telemetry: CallTelemetry | None = None) -> None:
        self.trail = trail
        self.telemetry = telemetry

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = chained_call(str(context.message.name), identified=False)
        # Every way out below writes the call's end record, so a read's start may wait.
        state.audit_finishes = True
        # The telemetry record is entered by hand, not in a ``with`` of its own frame:
        # every resumption of a suspended call travels through this one (middleware/chain.py).
        record = self.telemetry.call(state) if self.telemetry is not None else None
        if record is not None:
            record.__enter__()
        try:
            result = await call_next(context)
        except FastMCPNotFoundError:
            state.block_reason = state.block_reason or "unknown_tool"
            self._finished(state, record, state.block_outcome or OUTCOME_UNKNOWN_TOOL)
            raise
        except BaseException as exc:
            if isinstance(exc, Exception):
                error = to_wire_error(exc, correlation_id=state.correlation_id)
            else:  # cancellation: record it, then let it propagate untouched
                error = NexusError("cancelled")
            self._finished(state, record, str(error.code), error)
            raise
        else:
            # An upstream tool's own error answer (``isError``) is its result, not a
            # refusal; the audit still tells it from a success.
            is_error = getattr(result, "is_error", False) is True
            if is_question(result):
                # A 2026-07-28 question to the client: the call did not run (blocked).
                self._finished(state, record, OUTCOME_INPUT_REQUIRED)
            else:
                self._finished(state, record, OUTCOME_TOOL_ERROR if is_error else OUTCOME_OK)
            return result
        finally:
            if record is not None:
                record.__exit__(None, None, None)

    async def on_read_resource(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        return await self._request(context, call_next, OUTCOME_UNKNOWN_RESOURCE)

    async def on_get_prompt(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        return await self._request(context, call_next, OUTCOME_UNKNOWN_PROMPT)

    async def _request(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any], unknown: str
    ) -> Any:
        state = current_call()
        if state is None:  # the envelope opens one for every read and get
            return await call_next(context)
        try:
            result = await call_next(context)
        except (FastMCPNotFoundError, FastMCPDisabledError):
            reason = "unknown_prompt" if unknown == OUTCOME_UNKNOWN_PROMPT else "unknown_resource"
            state.block_reason = state.block_reason or reason
            self.trail.request_finished(state, blocked=True, outcome=unknown)
            raise
        except BaseException as exc:
            if isinstance(exc, Exception):
                error = request_refusal(exc, correlation_id=state.correlation_id)
            else:  # cancellation: record it, then let it propagate untouched
                error = NexusError("cancelled")
            # Refused before any resource or prompt was reached (the grants store down):
            # blocked; a failure of the read or render itself: finished, with its code.
            blocked = not state.executed
            self.trail.request_finished(
                state, blocked=blocked, outcome=str(error.code), error=error
            )
            raise
        self.trail.request_finished(state, blocked=False, outcome=OUTCOME_OK)
        return result

    def _finished(
        self,
        state: CallState,
        record: CallSpan | None,
        outcome: str,
        error: NexusError | None = None,
    ) -> None:
        self.trail.finished(state, outcome=outcome, error=error)
        if record is not None:
            record.finish(outcome)


__all__ = [
    "OUTCOME_INPUT_REQUIRED",
    "OUTCOME_TOOL_ERROR",
    "OUTCOME_UNKNOWN_PROMPT",
    "OUTCOME_UNKNOWN_RESOURCE",
    "OUTCOME_UNKNOWN_TOOL",
    "AuditMiddleware",
    "AuditTrail",
    "safe_facts",
]
