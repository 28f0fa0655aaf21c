"""The one mapping from an exception to what the wire carries (DESIGN.md, "Error envelope").

Every layer that turns a failure into an answer imports it from here: the envelope and
audit middleware, the classification layer's refusal test, the connector and the
providers. Nothing else maps an exception to a code or builds an unknown-tool answer.

- ``to_wire_error``: any exception to a safe ``NexusError``. Typed refusals pass through
  (unwrapped from FastMCP's ``ToolError`` and from ``ConnectorRefusal``); a validation
  failure becomes ``INVALID_INPUT`` naming the field, never the value; anything else
  becomes ``INTERNAL_ERROR`` holding only a hashed reference to the correlation id.
- ``to_envelope``: that error as the tool result the client receives.
- ``unknown_tool``: the answer a hidden or missing tool gets, byte for byte FastMCP's own
  (``Unknown tool: '<name>'``), whichever layer gives it.
- ``ConnectorRefusal``: a typed refusal crossing FastMCP's tool boundary.
- ``to_request_error``: a refusal of a ``resources/read`` or ``prompts/get`` (which have no
  error result) as the JSON-RPC error the client receives: code ``REFUSAL_JSONRPC_CODE``,
  the envelope's JSON as its message and the envelope itself as its ``data``.
- ``not_found_error``: the one answer to a resource or prompt that is hidden or missing:
  FastMCP's code (``-32602``) with a fixed message and no ``data``, so it quotes neither
  the URI nor the name (FastMCP's own answer quotes both).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from fastmcp.exceptions import FastMCPError, ToolError
from fastmcp.exceptions import NotFoundError as FastMCPNotFoundError
from fastmcp.exceptions import ValidationError as FastMCPValidationError
from fastmcp.tools import ToolResult
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, TextContent
from pydantic import ValidationError as PydanticValidationError

from nexus_mcp.errors import InternalError, InvalidInputError, NexusError, correlation_ref


class ConnectorRefusal(ToolError):
    """A typed refusal crossing FastMCP's tool boundary; ``to_wire_error`` unwraps ``.error``."""

    def __init__(self, error: NexusError) -> None:
        # A typed refusal is an expected outcome, not a server fault: FastMCP logs it at
        # this level instead of as an error with a traceback.
        super().__init__(error.message, log_level=logging.DEBUG)
        self.error = error


class UnknownTool(FastMCPNotFoundError, FastMCPError):
    """``Unknown tool: '<name>'``, exactly the message FastMCP raises for a tool that does not
    exist, so a hidden tool cannot be told from a missing one. Also a ``FastMCPError``:
    raised from inside a tool's ``run``, FastMCP passes its own errors through unchanged
    (at debug level) instead of wrapping them as a tool failure."""

    def __init__(self, name: str) -> None:
        FastMCPError.__init__(self, f"Unknown tool: {name!r}", log_level=logging.DEBUG)


def unknown_tool(name: str) -> UnknownTool:
    return UnknownTool(name)


# The JSON-RPC code of a typed refusal of a resources/read or prompts/get (the range
# -32000..-32099 is the implementation's; the MCP SDK uses none near it).
REFUSAL_JSONRPC_CODE = -32050
RESOURCE_NOT_FOUND_MESSAGE = "Resource not found"
PROMPT_NOT_FOUND_MESSAGE = "Unknown prompt"


def not_found_error(*, prompt: bool) -> MCPError:
    """What a hidden or missing resource (or prompt) answers: nothing of the request."""
    message = PROMPT_NOT_FOUND_MESSAGE if prompt else RESOURCE_NOT_FOUND_MESSAGE
    return MCPError(code=INVALID_PARAMS, message=message)


def to_request_error(error: NexusError) -> MCPError:
    """A refusal of a resources/read or prompts/get: the envelope's JSON as the message,
    the envelope (``{"error", "code"}``) as ``data``."""
    payload = error.to_payload()
    return MCPError(
        code=REFUSAL_JSONRPC_CODE,
        message=json.dumps(payload, separators=(",", ":")),
        data=payload,
    )


def request_refusal(exc: BaseException, *, correlation_id: str) -> NexusError:
    """``to_wire_error`` for a resources/read or prompts/get: FastMCP wraps what a resource
    or prompt raises in its ``ResourceError``/``PromptError`` (with the URI or name in the
    text), so a typed refusal is taken from the cause and anything else is internal."""
    cause = exc.__cause__
    if isinstance(exc, FastMCPError) and isinstance(cause, NexusError | ConnectorRefusal):
        exc = cause
    if isinstance(exc, ConnectorRefusal | NexusError | FastMCPValidationError):
        return to_wire_error(exc, correlation_id=correlation_id)
    internal = InternalError(ref=correlation_ref(correlation_id), exception=type(exc).__name__)
    internal.__cause__ = exc
    return internal


def refusal_of(exc: BaseException) -> BaseException:
    """The typed refusal a ``ConnectorRefusal`` carries, or ``exc`` itself."""
    return exc.error if isinstance(exc, ConnectorRefusal) else exc


def to_wire_error(exc: BaseException, *, correlation_id: str) -> NexusError:
    """The one mapping from any exception to a safe ``NexusError``.

    Typed refusals pass through; anything else becomes ``INTERNAL_ERROR`` whose message
    holds only a hashed reference to the correlation id (the operator's log has the rest).
    """
    if isinstance(exc, ConnectorRefusal):
        return exc.error
    if isinstance(exc, FastMCPValidationError):
        return invalid_input_from(exc.__cause__)
    if isinstance(exc, ToolError) and isinstance(exc.__cause__, NexusError):
        return exc.__cause__
    if isinstance(exc, NexusError):
        return exc
    internal = InternalError(ref=correlation_ref(correlation_id), exception=type(exc).__name__)
    internal.__cause__ = exc
    return internal


_UNEXPECTED_TYPES = frozenset({"unexpected_keyword_argument", "extra_forbidden"})


def invalid_input_from(
    cause: BaseException | None, accepted: Iterable[str] | None = None
) -> InvalidInputError:
    """``INVALID_INPUT`` naming the first bad declared argument and, in plain words, what
    is wrong with it (missing, of the wrong type, out of bounds); never the value sent.

    pydantic's messages embed the input value even with ``mask_error_details``, so only
    the error type, the location and the schema's bound are kept. An unexpected argument
    is reported first, and never by its name (which is caller input): the refusal lists
    the ``accepted`` names (the tool's declared arguments) and suggests the one it is a
    close misspelling of, if any.
    """
    declared = tuple(accepted) if accepted is not None else None
    if isinstance(cause, PydanticValidationError):
        errors = cause.errors(include_url=False, include_input=False, include_context=True)
        unexpected = [err for err in errors if err.get("type") in _UNEXPECTED_TYPES]
        if unexpected:
            sent = [err["loc"][0] for err in unexpected if err.get("loc")]
            return InvalidInputError.unexpected(sent, declared)
        for err in errors:
            loc = err.get("loc") or ()
            if not loc or not isinstance(loc[0], str):
                continue
            facts: dict[str, Any] = {"field": loc[0], "problem": str(err.get("type"))}
            if len(loc) == 2 and isinstance(loc[1], int):
                facts["entry"] = True  # an entry of a list argument
            elif len(loc) > 1:
                facts["problem"] = "nested"  # a union member or a key: nothing more to say
            limit = _schema_bound(err.get("ctx"))
            if limit is not None:
                facts["limit"] = limit
            return InvalidInputError(**facts)
    return InvalidInputError(problem="validation")


def _schema_bound(ctx: Any) -> int | float | None:
    """The bound a bounds error names (``ge``, ``max_length``, ...): the schema's, a number."""
    if not isinstance(ctx, dict):
        return None
    for key in ("ge", "gt", "le", "lt", "min_length", "max_length"):
        value = ctx.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    return None


META_APPROVAL_REQUEST_ID = "nexus.mcp/approval_request_id"


def safe_facts(error: NexusError | None) -> dict[str, Any] | None:
    """The facts of a refusal that may be written down (audit, recording): scalars only."""
    if error is None or not error.facts:
        return None
    return {k: v for k, v in error.facts.items() if isinstance(v, str | int | float | bool)}


def to_envelope(error: NexusError) -> ToolResult:
    """The envelope as text content only. Never ``structuredContent``: the TypeScript SDK
    1.x and the MCP Inspector validate it against the tool's ``outputSchema`` even when
    ``isError`` is set, and throw on a refusal instead of showing it (DESIGN.md)."""
    payload = error.to_payload()
    # An approval request's id (ours, never the caller's) travels in _meta as well.
    request_id = error.facts.get("approval_request_id")
    return ToolResult(
        content=[TextContent(type="text", text=json.dumps(payload, separators=(",", ":")))],
        meta={META_APPROVAL_REQUEST_ID: request_id} if isinstance(request_id, str) else None,
        is_error=True,
    )


__all__ = [
    "PROMPT_NOT_FOUND_MESSAGE",
    "REFUSAL_JSONRPC_CODE",
    "RESOURCE_NOT_FOUND_MESSAGE",
    "ConnectorRefusal",
    "UnknownTool",
    "invalid_input_from",
    "not_found_error",
    "refusal_of",
    "request_refusal",
    "safe_facts",
    "to_envelope",
    "to_request_error",
    "to_wire_error",
    "unknown_tool",
]
