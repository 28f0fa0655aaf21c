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
- ``RequestRefusal``: a typed refusal of a request that has no error result (a
  ``resources/read``): a JSON-RPC error with code ``REFUSAL_JSONRPC_CODE``, the envelope's
  ``error`` text as message and the envelope ``{"error", "code"}`` as ``data``.
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
from mcp_types import TextContent
from pydantic import ValidationError as PydanticValidationError

from nexus_mcp.errors import Code, InternalError, InvalidInputError, NexusError, correlation_ref

# The JSON-RPC code of a typed refusal of a request that has no error result (an
# implementation-defined server error, -32000 to -32099); the wire filter keeps its
# message and envelope (transport/wire_errors.py), the envelope layer makes sure nothing
# but a ``RequestRefusal`` carries it.
REFUSAL_JSONRPC_CODE = -32050
_CODES = frozenset(str(code) for code in Code)


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


class RequestRefusal(MCPError, FastMCPError):
    """A typed refusal of a ``resources/read``: a JSON-RPC error carrying the envelope.

    Resources have no error result, so the envelope travels as the error's ``data`` (and
    its text as the message). Also a ``FastMCPError`` at debug level: FastMCP then logs
    it as an expected outcome and passes it on unchanged (``to_mcp_error`` keeps an
    ``MCPError``).
    """

    def __init__(self, error: NexusError) -> None:
        super().__init__(REFUSAL_JSONRPC_CODE, error.message, error.to_payload())
        self.log_level = logging.DEBUG
        self.refusal = error


def is_refusal_payload(message: object, data: object) -> bool:
    """Whether a JSON-RPC error's ``message`` and ``data`` are a refusal's envelope: ``data``
    exactly ``{"error": message, "code": <a stable code>}``."""
    return (
        isinstance(data, dict)
        and set(data) == {"error", "code"}
        and isinstance(message, str)
        and data["error"] == message
        and data["code"] in _CODES
    )


def unknown_tool(name: str) -> UnknownTool:
    return UnknownTool(name)


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
    "REFUSAL_JSONRPC_CODE",
    "ConnectorRefusal",
    "RequestRefusal",
    "UnknownTool",
    "invalid_input_from",
    "is_refusal_payload",
    "refusal_of",
    "safe_facts",
    "to_envelope",
    "to_wire_error",
    "unknown_tool",
]
