"""EnvelopeMiddleware: the outermost layer and the only place that catches ``Exception``.

Every refusal and failure of a ``tools/call`` leaves as the error envelope of DESIGN.md:
``isError: true`` and text content ``{"error", "code"}`` JSON, with no ``structuredContent``
(clients validate that against the tool's output schema even on errors). Unknown tools keep
FastMCP's own answer (``Unknown tool: '<name>'``) so that a hidden tool cannot be told from
a missing one. Failures of other requests are re-raised as a masked JSON-RPC error, because
on handshake-era connections FastMCP would pass a plain exception's text to the client
(FASTMCP4_GUIDE 1.5).

A ``resources/read`` or ``prompts/get`` has no error result: a typed refusal leaves as the
JSON-RPC error ``REFUSAL_JSONRPC_CODE`` carrying the envelope (``envelope.to_request_error``),
anything else as ``INTERNAL_ERROR`` the same way, and a hidden or missing resource or
prompt as one fixed not-found error that quotes neither URI nor name. Each opens a call
state as a tool call does, so identity, namespace and audit record it alike.
"""

from __future__ import annotations

import re
from typing import Any

import mcp_types
from fastmcp.exceptions import DisabledError, FastMCPError
from fastmcp.exceptions import NotFoundError as FastMCPNotFoundError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import ValidationError as PydanticValidationError

from nexus_mcp.calls import (
    META_CORRELATION_ID,
    PROMPT_GET,
    RESOURCE_READ,
    CallState,
    nexus_meta,
    open_call,
)
from nexus_mcp.envelope import (
    not_found_error,
    request_refusal,
    to_envelope,
    to_request_error,
    to_wire_error,
)
from nexus_mcp.errors import InternalError, InvalidInputError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.resources import uri_sha256

log = get_logger(__name__)

_CORRELATION_RE = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")
INTERNAL_JSONRPC_CODE = -32603
# What the SDK answers a request whose params do not validate (mcp.shared.jsonrpc_dispatcher).
INVALID_PARAMS_MESSAGE = "Invalid request parameters"
# What logs say instead of a tool name the chain has not matched to a tool (as the audit).
UNREGISTERED_TOOL = "(unregistered)"


def _correlation_id(meta: dict[str, Any]) -> str | None:
    value = meta.get(META_CORRELATION_ID)
    if isinstance(value, str) and _CORRELATION_RE.fullmatch(value):
        return value
    return None


def _loggable_tool_name(state: CallState) -> str:
    # The name a client sent is its own input until the chain has matched it to a tool
    # (classification runs after the namespace layer has refused unknown names).
    return state.tool_name if state.classification is not None else UNREGISTERED_TOOL


def estimate_size(value: Any, budget: int) -> int:
    """Approximate serialized size of JSON arguments, stopping once it passes ``budget``."""
    total = 0
    stack = [value]
    while stack and total <= budget:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            for key, val in item.items():
                total += len(str(key))
                stack.append(val)
        elif isinstance(item, list | tuple):
            total += 2 + len(item)
            stack.extend(item)
        else:
            total += 8
    return total


class EnvelopeMiddleware(Middleware):
    """Opens the call state and turns every failure into the envelope.

    It also bounds the size of a call's arguments: HTTP bodies are bounded by the
    transport, but stdio has no limit of its own (DESIGN.md, transport hardening).
    """

    def __init__(self, max_request_bytes: int) -> None:
        self.max_request_bytes = max_request_bytes

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        ctx = context.fastmcp_context
        request = ctx.request_context if ctx is not None else None
        meta = nexus_meta(getattr(request, "meta", None))
        message = context.message
        state = CallState(
            tool_name=str(message.name),
            arguments=dict(message.arguments or {}),
            meta=meta,
            transport=ctx.transport if ctx is not None else None,
        )
        if (given := _correlation_id(meta)) is not None:
            state.correlation_id = given
        with open_call(state):
            try:
                if estimate_size(state.arguments, self.max_request_bytes) > self.max_request_bytes:
                    raise InvalidInputError("request is too large", problem="request_size")
                return await call_next(context)
            except FastMCPNotFoundError:
                raise
            except Exception as exc:  # noqa: BLE001 - the one place that catches all (DESIGN.md)
                error = to_wire_error(exc, correlation_id=state.correlation_id)
                if isinstance(error, InternalError):
                    log.error(
                        "tool_call_internal_error",
                        tool=_loggable_tool_name(state),
                        correlation_id=state.correlation_id,
                        ref=error.facts.get("ref"),
                        exc_type=type(exc.__cause__ or exc).__name__,
                    )
                return to_envelope(error)

    async def on_read_resource(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = _request_state(context, RESOURCE_READ, {})
        state.uri_sha256 = uri_sha256(str(context.message.uri))
        return await self._answer(context, call_next, state, prompt=False)

    async def on_get_prompt(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        arguments = context.message.arguments
        state = _request_state(context, PROMPT_GET, dict(arguments or {}))
        return await self._answer(context, call_next, state, prompt=True)

    async def _answer(
        self,
        context: MiddlewareContext[Any],
        call_next: CallNext[Any, Any],
        state: CallState,
        *,
        prompt: bool,
    ) -> Any:
        with open_call(state):
            try:
                if estimate_size(state.arguments, self.max_request_bytes) > self.max_request_bytes:
                    raise InvalidInputError("request is too large", problem="request_size")
                return await call_next(context)
            except (FastMCPNotFoundError, DisabledError):
                raise not_found_error(prompt=prompt) from None
            except Exception as exc:  # noqa: BLE001 - the one place that catches all (DESIGN.md)
                error = request_refusal(exc, correlation_id=state.correlation_id)
                if isinstance(error, InternalError):
                    log.error(
                        "request_internal_error",
                        method=context.method,
                        correlation_id=state.correlation_id,
                        ref=error.facts.get("ref"),
                        exc_type=type(exc.__cause__ or exc).__name__,
                    )
                raise to_request_error(error) from None

    async def on_request(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        try:
            return await call_next(context)
        except (MCPError, FastMCPError, FastMCPNotFoundError):
            raise
        except PydanticValidationError as exc:
            if not is_request_validation(exc):
                raise _masked_internal(context, exc) from exc
            # The client's request does not have the protocol's shape: the SDK's own
            # answer (-32602, fixed message, empty data, so no value is echoed), and a
            # client mistake is not a server fault, so no ERROR line.
            log.warning(
                "request_invalid_params",
                method=context.method,
                problem=_first_error_type(exc),
            )
            raise MCPError(code=INVALID_PARAMS, message=INVALID_PARAMS_MESSAGE, data="") from exc
        except Exception as exc:  # masked: never let exception text reach the client
            raise _masked_internal(context, exc) from exc


def _request_state(
    context: MiddlewareContext[Any], kind: str, arguments: dict[str, Any]
) -> CallState:
    ctx = context.fastmcp_context
    request = ctx.request_context if ctx is not None else None
    meta = nexus_meta(getattr(request, "meta", None))
    state = CallState(
        tool_name=kind,
        arguments=arguments,
        meta=meta,
        transport=ctx.transport if ctx is not None else None,
    )
    if (given := _correlation_id(meta)) is not None:
        state.correlation_id = given
    return state


def is_request_validation(exc: PydanticValidationError) -> bool:
    """Whether ``exc`` is the SDK refusing a request's shape (its params), not our fault.

    The SDK validates a request against the protocol's ``<Method>Request`` model (or its
    ``<Method>RequestParams``), and the error names that model; any other model failing
    inside a request is a server bug.
    """
    model = getattr(mcp_types, exc.title, None)
    return isinstance(model, type) and issubclass(
        model, mcp_types.Request | mcp_types.RequestParams
    )


def _first_error_type(exc: PydanticValidationError) -> str:
    # pydantic's error type ("dict_type", "missing"): says what is wrong, never the value.
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    return str(errors[0].get("type")) if errors else "validation"


def _masked_internal(context: MiddlewareContext[Any], exc: Exception) -> MCPError:
    log.error("request_internal_error", method=context.method, exc_type=type(exc).__name__)
    return MCPError(code=INTERNAL_JSONRPC_CODE, message="Internal server error")


__all__ = [
    "EnvelopeMiddleware",
    "estimate_size",
]
