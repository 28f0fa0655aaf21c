"""Upstream tools as FastMCP holds them.

``UpstreamTool.run`` is the connector of an upstream call (DESIGN.md step 9): the same
connector checks as ``@nexus_tool`` (classification and documents against the same loaded
registry object), the approval spend and the audit start, then the call goes upstream on
the caller's session (``provider.py`` lists them to FastMCP).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from fastmcp.tools import Tool, ToolResult
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError
from mcp_types import TextContent, ToolAnnotations

from nexus_mcp.calls import PLUMBING_ARGS, CallState, current_call
from nexus_mcp.connector import Connector, Outcome
from nexus_mcp.contracts import ToolContract
from nexus_mcp.envelope import ConnectorRefusal, unknown_tool
from nexus_mcp.errors import (
    PROBLEM_MISSING,
    PROBLEM_WRONG_TYPE,
    InvalidInputError,
    NexusError,
)
from nexus_mcp.policy.hashing import to_canonical_json
from nexus_mcp.policy.pins import PinState
from nexus_mcp.policy.registry import ToolEntry
from nexus_mcp.policy.upstreams import UPSTREAM_TOOLSET_PREFIX
from nexus_mcp.providers.upstream.sessions import UpstreamFailure


@dataclass(frozen=True)
class ToolView:
    """What nexus decided about one tool an upstream lists."""

    upstream_name: str
    exposed_name: str | None
    definition: Mapping[str, Any]
    digest: str
    entry: ToolEntry | None  # registry classification; None: unclassified
    pin_state: PinState
    status: Literal["exposed", "quarantined", "unclassified", "not_allowed", "bad_name"]
    reason: str | None = None

    @property
    def tool_class(self) -> str:
        return self.entry.tool_class if self.entry is not None else "write"


class ToolHost(Protocol):
    """What an ``UpstreamTool`` needs of the upstream it belongs to (``UpstreamServer``
    satisfies it): is the tool still exposed, its contract, and the forwarding. The tool
    never holds the server itself, only this much of it."""

    @property
    def server_id(self) -> str: ...

    @property
    def max_result_bytes(self) -> int: ...

    @property
    def connector(self) -> Connector | None: ...

    def visible_tools(self) -> Mapping[str, UpstreamTool]: ...

    async def check_call(self, tool: UpstreamTool) -> bool: ...

    def hidden_reason(self, exposed: str) -> tuple[str, str] | None: ...

    def contract_for(self, view: ToolView) -> ToolContract: ...

    async def forward(
        self, state: CallState, upstream_name: str, arguments: dict[str, Any], retryable: bool
    ) -> Any: ...


class UpstreamTool(Tool):
    """An upstream tool as FastMCP holds it; ``run`` is the connector of an upstream call."""

    _server: Any = None
    _view: Any = None

    @classmethod
    def for_view(cls, server: ToolHost, view: ToolView) -> UpstreamTool:
        definition = view.definition
        annotations = definition.get("annotations")
        tool = cls(
            name=view.exposed_name or view.upstream_name,
            title=definition.get("title"),
            description=definition.get("description"),
            parameters=definition.get("inputSchema") or {"type": "object"},
            output_schema=definition.get("outputSchema"),
            annotations=ToolAnnotations(**_annotations_for(view, annotations)),
            meta={
                "nexus": {
                    "server_id": server.server_id,
                    "upstream_tool": view.upstream_name,
                    "risk": view.tool_class,
                    "sha256": view.digest,
                }
            },
            tags={UPSTREAM_TOOLSET_PREFIX + server.server_id},
        )
        tool._server = server
        tool._view = view
        return tool

    @property
    def view(self) -> ToolView:
        return self._view  # type: ignore[no-any-return]

    @view.setter
    def view(self, value: ToolView) -> None:
        self._view = value

    async def run(self, arguments: dict[str, Any], context: Any = None) -> ToolResult:
        server: ToolHost = self._server
        view: ToolView = self._view
        state = current_call()
        current = server.visible_tools().get(self.name)
        connector = server.connector
        if state is None or state.principal is None or current is not self or connector is None:
            # Reached without the chain, quarantined since it was looked up, or served by
            # no connector: the answer a hidden or missing tool gets.
            raise unknown_tool(self.name)
        try:
            # The pins as on disk now and, on the shared backend, what every replica saw.
            exposed = await server.check_call(self)
        except NexusError as exc:  # the evidence store cannot answer: fail closed
            raise ConnectorRefusal(exc) from exc
        if not exposed:
            found = server.hidden_reason(self.name)  # quarantined now (audited by the server)
            if found is not None:
                state.mark_hidden(server.server_id, *found)
            raise unknown_tool(self.name)
        contract = server.contract_for(view)

        def validate() -> dict[str, Any]:
            checked = state.validated_arguments
            if checked is None or checked[0] is not arguments:
                check_arguments(view, arguments)  # the gateway's check did not run
            return arguments

        async def execute() -> Outcome:
            try:
                raw = await server.forward(
                    state,
                    view.upstream_name,
                    _upstream_arguments(arguments, view),
                    retryable=state.tool_class == "read",
                )
            except UpstreamFailure as failure:
                raise failure.to_error() from None
            result = _to_result(raw, server.max_result_bytes)
            return Outcome(
                content=result.content,
                structured=result.structured,
                document=None if result.is_error else result.document,
                is_error=result.is_error,
            )

        return await connector.run(contract, state, arguments, execute, validate=validate)


def _skip(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    return iter(())


# The pinned inputSchema, checked before anything goes upstream, except for the keywords
# that run a regular expression from the upstream's schema on the caller's text (a
# catastrophic pattern would hold the event loop): the upstream checks those itself.
_ArgumentsValidator = validators.extend(
    Draft202012Validator, {"pattern": _skip, "patternProperties": _skip}
)


_VALIDATORS: dict[str, Any] = {}  # definition digest -> validator (None: not checkable here)
_MAX_VALIDATORS = 4096


def _validator_for(view: ToolView) -> Any:
    found = _VALIDATORS.get(view.digest, _VALIDATORS)
    if found is not _VALIDATORS:
        return found
    schema = view.definition.get("inputSchema")
    validator = None
    # Without its patterns, "additionalProperties" would refuse what "patternProperties"
    # allows: such a schema is left to the upstream.
    if isinstance(schema, Mapping) and "patternProperties" not in json.dumps(schema):
        try:
            _ArgumentsValidator.check_schema(schema)
            validator = _ArgumentsValidator(schema)
        except SchemaError:
            validator = None  # not checkable here: the upstream checks its own arguments
    if len(_VALIDATORS) >= _MAX_VALIDATORS:
        _VALIDATORS.clear()
    _VALIDATORS[view.digest] = validator
    return validator


def check_arguments(view: ToolView, arguments: Mapping[str, Any]) -> None:
    """``INVALID_INPUT`` for arguments the tool's pinned ``inputSchema`` refuses, worded as
    a native tool's refusal (``envelope.invalid_input_from``): naming only a property the
    schema declares, never a value; call plumbing is not the tool's."""
    validator = _validator_for(view)
    if validator is None:
        return
    own = _upstream_arguments(dict(arguments), view)
    errors = list(itertools.islice(validator.iter_errors(own), MAX_SCHEMA_ERRORS))
    if not errors:
        return
    schema = view.definition.get("inputSchema")
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    declared = tuple(properties) if isinstance(properties, Mapping) else ()
    raise _schema_refusal(errors, declared, own)


MAX_SCHEMA_ERRORS = 64  # the errors looked at for the one to report (an extra one first)


def _schema_refusal(
    errors: list[Any], declared: tuple[str, ...], arguments: Mapping[str, Any]
) -> InvalidInputError:
    """The refusal for JSON Schema ``errors`` of an arguments object: an unexpected
    argument first (answered with the ``declared`` names, never the one sent), then the
    first error, on a declared argument only."""
    for error in errors:
        if error.validator == "additionalProperties" and not error.path:
            known = frozenset(declared)  # a schema may declare thousands: no tuple scans
            return InvalidInputError.unexpected([k for k in arguments if k not in known], declared)
    error = errors[0]
    path = list(error.path)
    if error.validator == "required" and not path:
        wanted = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [n for n in wanted if isinstance(n, str) and n not in arguments]
        return InvalidInputError(field=missing[0] if missing else None, problem=PROBLEM_MISSING)
    field = path[0] if path else None
    if not isinstance(field, str) or field not in declared:
        return InvalidInputError(problem="upstream_schema")
    entry = len(path) == 2 and isinstance(path[1], int)
    facts: dict[str, Any] = {"field": field, "problem": str(error.validator)}
    if len(path) > 1 and not entry:
        facts["problem"] = "nested"
    elif error.validator == "type" and isinstance(error.validator_value, str):
        facts.update(problem=PROBLEM_WRONG_TYPE, expected=error.validator_value)
    elif isinstance(error.validator_value, int | float) and not isinstance(
        error.validator_value, bool
    ):
        facts["limit"] = error.validator_value
    if entry:
        facts["entry"] = True
    return InvalidInputError(**facts)


def _upstream_arguments(arguments: dict[str, Any], view: ToolView) -> dict[str, Any]:
    """The arguments the upstream gets: nexus's call plumbing (idempotency key, approval
    token) stays here, unless the upstream's own schema declares such an argument."""
    schema = view.definition.get("inputSchema")
    declared = schema.get("properties") if isinstance(schema, Mapping) else None
    own = set(declared) if isinstance(declared, Mapping) else set()
    if not (PLUMBING_ARGS & arguments.keys()):
        return arguments
    return {k: v for k, v in arguments.items() if k not in PLUMBING_ARGS or k in own}


def _annotations_for(view: ToolView, annotations: Any) -> dict[str, Any]:
    """The upstream's hints, except the ones nexus decides: read-only only when the
    registry says read; never idempotent or non-destructive on the upstream's word."""
    hints = dict(annotations) if isinstance(annotations, Mapping) else {}
    allowed = {k: v for k, v in hints.items() if k in ("title", "openWorldHint")}
    read = view.tool_class == "read"
    allowed["readOnlyHint"] = read
    allowed["destructiveHint"] = not read
    allowed["idempotentHint"] = read
    return allowed


@dataclass(frozen=True)
class _Result:
    content: list[Any]
    structured: dict[str, Any] | None
    is_error: bool

    @property
    def document(self) -> dict[str, Any]:
        """What the registry's read pointers resolve in for an upstream tool: the result
        object (``/structuredContent/...``, ``/content/0/text``)."""
        return {
            "content": [
                c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in self.content
            ],
            "structuredContent": self.structured,
        }


def _to_result(raw: Any, max_bytes: int) -> _Result:
    """The upstream's CallToolResult, checked for shape and size (never echoed).

    The size is that of the content blocks and ``structuredContent`` as JSON, whatever
    their kind (text, images, embedded resources); over ``limits.max_read_bytes`` the
    result is refused, never truncated.
    """
    try:
        content = list(raw.content or [])
        structured = raw.structured_content
        is_error = bool(raw.is_error)
        if structured is not None and not isinstance(structured, dict):
            raise TypeError("structuredContent is not an object")
        dumped = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in content]
        size = len(to_canonical_json([dumped, structured]))
    except Exception:  # noqa: BLE001 - an upstream's malformed answer, never echoed
        raise UpstreamFailure("error", "bad_result").to_error() from None
    if size > max_bytes:
        raise UpstreamFailure("error", "result_too_large").to_error()
    if is_error:
        # Its text is the tool's output, like a native tool's; an error result carries
        # no structuredContent (DESIGN.md, Error envelope).
        content = [c for c in content if isinstance(c, TextContent)] or [
            TextContent(type="text", text="")
        ]
        return _Result(content, None, True)
    return _Result(content, structured, False)


__all__ = [
    "UPSTREAM_TOOLSET_PREFIX",
    "ToolHost",
    "ToolView",
    "UpstreamTool",
    "check_arguments",
]
