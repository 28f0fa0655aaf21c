"""ClassificationMiddleware: manifest-first class, read-only and declared-class rules,
and the idempotency of writes (DESIGN.md chain step 5).

A write with a key that already succeeded for the same arguments gets the recorded result
without running again; the same key with other arguments is refused; concurrent calls
with one key wait for the first. The replay is decided here, before approval and
documents, because a retry must not need a fresh approval for a write that already
happened (the approval token it carries was consumed by the first run).

The record's scope names the call's target (``policy/targets.ToolTargets``): a write whose tool
has no known target is refused before any record is claimed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import ToolResult
from mcp_types import ContentBlock, TextContent
from pydantic import BaseModel, TypeAdapter, ValidationError

from nexus_mcp.calls import (
    ARG_IDEMPOTENCY_KEY,
    META_IDEMPOTENCY_KEY,
    META_REPLAYED,
    META_TOOL_EFFECT,
    PLUMBING_ARGS,
    CallState,
    ClaimHold,
)
from nexus_mcp.connector import chained_call
from nexus_mcp.enforcement import RegistryEnforcer, plumbing_value
from nexus_mcp.envelope import invalid_input_from, refusal_of
from nexus_mcp.errors import (
    FACT_OUTCOME_UNKNOWN,
    Code,
    InvalidInputError,
    NexusError,
    UnavailableError,
)
from nexus_mcp.middleware.waiting import is_question
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.hashing import (
    PROBLEM_UNREPRESENTABLE,
    digest_arguments,
    first_unrepresentable,
)
from nexus_mcp.policy.targets import ToolTargets
from nexus_mcp.stores.idempotency import (
    Claim,
    ClaimStatus,
    IdempotencyScope,
    IdempotencyStore,
    to_refusal,
)

log = get_logger(__name__)

HOLD_PARTS = 4  # a waiting call renews its claim four times per lease
_UNKNOWN_OUTCOME_CODES = frozenset({Code.TOOL_TIMEOUT, Code.INTERNAL_ERROR})


class ClassificationMiddleware(Middleware):
    def __init__(
        self,
        enforcer: RegistryEnforcer,
        store: IdempotencyStore,
        *,
        targets: ToolTargets,
        wait_seconds: float,
        argument_models: Mapping[str, type[BaseModel]],
        argument_checks: Mapping[str, Callable[[Mapping[str, Any]], None]] | None = None,
    ) -> None:
        # Tools without an arguments model (an upstream's) check their arguments here.
        self.argument_checks = argument_checks if argument_checks is not None else {}
        self.enforcer = enforcer
        self.store = store
        self.targets = targets
        self.wait_seconds = wait_seconds
        self.argument_models = argument_models

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = chained_call(str(context.message.name))
        model = self.argument_models.get(state.tool_name)
        refuse_unrepresentable(state.arguments, model)
        if model is not None:
            # Seed 000 gateway rule 1: validate the call before deriving anything from it.
            # The very arguments object FastMCP will hand the tool is validated, so the
            # tool's own run can use this result instead of validating it a second time.
            arguments = context.message.arguments or {}
            try:
                validated = model.model_validate(arguments)
            except ValidationError as exc:
                raise invalid_input_from(exc, model.model_fields) from None
            state.validated_arguments = (arguments, validated.__dict__)
        else:
            check = self.argument_checks.get(state.tool_name)
            if check is not None:
                arguments = context.message.arguments or {}
                check(arguments)
                # The connector sees this very object and need not check it again.
                state.validated_arguments = (arguments, arguments)
        classification = self.enforcer.classify_into(state)
        if classification.tool_class != "write":
            return await call_next(context)
        return await self._run_once(state, context, call_next)

    async def _run_once(
        self, state: CallState, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        digest = digest_arguments(state.arguments, exclude=PLUMBING_ARGS)
        # The audit's fingerprint of these (representable) arguments is this same digest.
        state.args_digest = digest
        # The target identity may look at the file system: one worker hop for it and the claim.
        scope, claim = await asyncio.to_thread(self._begin, state, digest)
        if claim.status is ClaimStatus.IN_PROGRESS:
            claim = await self.store.wait(scope, digest, self.wait_seconds)
        if claim.status is ClaimStatus.REPLAY:
            state.idempotency_outcome = "replayed"
            return replay_result(claim)
        refusal = to_refusal(claim)
        if refusal is not None:
            state.idempotency_outcome = str(claim.status)
            raise refusal
        state.idempotency_outcome = "executed"
        # Renewed well within the lease by a call that waits for an approver before running.
        state.hold_claim = ClaimHold(
            functools.partial(self.store.renew, claim), self.store.lease_seconds / HOLD_PARTS
        )
        try:
            result = await call_next(context)
        except BaseException as exc:
            await asyncio.to_thread(self._release, claim, state, exc)
            raise
        if is_question(result):
            # A 2026-07-28 question to the client (whether to wait for an approver): not
            # the call's result. Nothing ran; the key is freed for the retry that answers.
            await asyncio.to_thread(self.store.abandon, claim)
            state.idempotency_outcome = "abandoned"
            return result
        try:
            await asyncio.to_thread(
                self.store.complete, claim, json.dumps(to_record(result), separators=(",", ":"))
            )
        except UnavailableError:
            # The tool acted; only its record could not be stored (the shared store went
            # away in between). The caller gets what the tool did, never a refusal saying
            # nothing was done. The claim stays pending, so a retry under this key waits,
            # then is refused as outcome unknown when the lease ends: it never runs again.
            log.warning("idempotency_record_unavailable", tool=state.tool_name)
        return result

    def _begin(self, state: CallState, digest: str) -> tuple[IdempotencyScope, Claim]:
        principal = state.principal
        key = plumbing_value(state, ARG_IDEMPOTENCY_KEY, META_IDEMPOTENCY_KEY)
        assert principal is not None and key is not None  # classify refused otherwise
        scope = IdempotencyScope(
            principal.subject,
            self.enforcer.server_id,
            state.tool_name,
            key,
            target=self.targets.target_of(state.tool_name, principal, state.arguments),
        )
        return scope, self.store.begin(scope, digest)

    def _release(self, claim: Claim, state: CallState, exc: BaseException) -> None:
        # A refusal, or a failure before the tool ran, changed nothing: free the key. If the
        # tool started and then failed or timed out, it may have acted: never run it again
        # under this key (mark the outcome unknown) and never record success.
        try:
            if not state.executed or _is_refusal(exc):
                self.store.abandon(claim)
                state.idempotency_outcome = "abandoned"
            else:
                self.store.mark_unknown(claim)
                state.idempotency_outcome = "outcome_unknown"
        except UnavailableError:
            # The call's own outcome is what the caller must see; the claim stays pending
            # and expires into outcome unknown (a retry under this key never runs again).
            log.warning("idempotency_release_unavailable", tool=state.tool_name)
            state.idempotency_outcome = "outcome_unknown"


def refuse_unrepresentable(arguments: Mapping[str, Any], model: type[BaseModel] | None) -> None:
    """``INVALID_INPUT`` for a number JSON has no text for (``NaN``, ``Infinity``, an integer
    past Python's digit limit), before anything is derived from the arguments: nothing
    downstream (validation, idempotency and approval digests, document hashes) meets one.

    Names the argument only when the tool declares it (the caller chose any other name:
    a tool with an arguments model answers it as the unexpected argument it is).
    """
    name = first_unrepresentable(arguments)
    if name is not None:
        if model is not None and name not in model.model_fields:
            raise InvalidInputError.unexpected([name], tuple(model.model_fields))
        raise InvalidInputError(field=name if model else None, problem=PROBLEM_UNREPRESENTABLE)


def _is_refusal(exc: BaseException) -> bool:
    error = refusal_of(exc)
    # Typed refusals from the tool body (NOT_FOUND, CONFLICT, INVALID_PATH) are raised
    # before any change is made; a timeout or a crash after the tool started is not one,
    # and neither is a failure the tool marks as after its write was sent (a forge that
    # merged and then lost its answer): ``outcome_unknown``.
    return (
        isinstance(error, NexusError)
        and error.code not in _UNKNOWN_OUTCOME_CODES
        and not error.facts.get(FACT_OUTCOME_UNKNOWN)
    )


_CONTENT = TypeAdapter(list[ContentBlock])


def to_record(result: ToolResult) -> dict[str, Any]:
    """What a completed write's record keeps: the whole result, as the caller got it.

    An ``isError`` result (an upstream tool's own error answer) is recorded as what it is,
    and replays as that same error, never as a success.
    """
    return {
        "content": _CONTENT.dump_python(
            list(result.content), mode="json", by_alias=True, exclude_none=True
        ),
        "structured": result.structured_content,
        "meta": result.meta or {},
        "is_error": bool(result.is_error),
    }


def replay_result(claim: Claim) -> ToolResult:
    record = json.loads(claim.result_json or "{}")
    structured = record.get("structured")
    meta = dict(record.get("meta") or {})
    meta[META_REPLAYED] = True
    meta.setdefault(META_TOOL_EFFECT, {})
    if "content" in record:
        content = _CONTENT.validate_python(record["content"])
    else:  # a record written before the whole result was kept
        structured = structured or {}
        text = json.dumps(structured, ensure_ascii=False, separators=(",", ":"))
        content = [TextContent(type="text", text=text)]
    if record.get("is_error"):
        return ToolResult(content=content, meta=meta, is_error=True)
    return ToolResult(content=content, structured_content=structured, meta=meta)


__all__ = ["META_REPLAYED", "ClassificationMiddleware", "replay_result"]
