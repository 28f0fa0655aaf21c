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
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastmcp.exceptions import FastMCPError, ToolError
from fastmcp.exceptions import NotFoundError as FastMCPNotFoundError
from fastmcp.exceptions import ValidationError as FastMCPValidationError
from fastmcp.tools import ToolResult
from mcp_types import TextContent
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


def invalid_input_from(cause: BaseException | None) -> InvalidInputError:
    """``INVALID_INPUT`` naming the first bad declared field; never the value sent.

    pydantic's messages embed the input value even with ``mask_error_details``, so only
    the location is kept, and not even that for unexpected arguments (the name of an
    unexpected argument is itself caller input).
    """
    if isinstance(cause, PydanticValidationError):
        for err in cause.errors(include_url=False, include_input=False, include_context=False):
            loc = err.get("loc") or ()
            if err.get("type") in ("unexpected_keyword_argument", "extra_forbidden"):
                return InvalidInputError("unexpected argument", problem="unexpected_argument")
            if loc and isinstance(loc[0], str):
                return InvalidInputError(field=loc[0], problem=str(err.get("type")))
    return InvalidInputError(problem="validation")


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
    return ToolResult(
        content=[TextContent(type="text", text=json.dumps(payload, separators=(",", ":")))],
        is_error=True,
    )


__all__ = [
    "ConnectorRefusal",
    "UnknownTool",
    "invalid_input_from",
    "refusal_of",
    "safe_facts",
    "to_envelope",
    "to_wire_error",
    "unknown_tool",
]
