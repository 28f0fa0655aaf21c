"""Registry enforcement for one call, shared by the gateway middleware and the connector.

Seed 000 asks for the same rules at two points (connector PRIMARY, gateway SECONDARY)
against the same pinned registry. ``RegistryEnforcer`` holds that one loaded
``RegistrySet`` and applies ``classify_call`` and the document checks to a ``CallState``;
the classification and documents middleware call it, and so does ``RegistryConnectorCheck``
right before the tool function runs. No FastMCP import here: it is policy glue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema.exceptions import best_match

from nexus_mcp.calls import (
    ARG_IDEMPOTENCY_KEY,
    META_EXPECTED_HASHES,
    META_IDEMPOTENCY_KEY,
    META_TOOL_CLASS,
    PLUMBING_ARGS,
    CallState,
)
from nexus_mcp.contracts import ToolContract
from nexus_mcp.errors import InvalidInputError, ToolCallRecordInvalidError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.classification import Classification, classify_call
from nexus_mcp.policy.documents import (
    DocumentCheck,
    build_tool_call,
    build_tool_effect,
    check_read_documents,
    check_write_documents,
    parse_expected_hashes,
)
from nexus_mcp.policy.hashing import fingerprint_arguments
from nexus_mcp.policy.registry import (
    TOOL_CALL_SCHEMA,
    DocumentSpec,
    RegistrySet,
    contract_check,
    contract_validator,
)

log = get_logger(__name__)


def plumbing_value(state: CallState, arg_name: str, meta_key: str) -> str | None:
    """A call-plumbing value from the arguments or ``_meta``; both and different is refused."""
    from_args = state.arguments.get(arg_name)
    from_meta = state.meta.get(meta_key)
    if from_meta is not None and not isinstance(from_meta, str):
        raise InvalidInputError(field=meta_key)
    if from_args is not None and from_meta is not None and from_args != from_meta:
        raise InvalidInputError(
            f"{arg_name} and _meta {meta_key} differ", field=arg_name, problem="plumbing_conflict"
        )
    value = from_args if from_args is not None else from_meta
    return value if isinstance(value, str) else None


class RegistryEnforcer:
    """Classification and document rules over one loaded registry set."""

    def __init__(
        self,
        registry: RegistrySet,
        *,
        server_id: str,
        mode: str,
        contracts: Mapping[str, ToolContract],
    ) -> None:
        self.registry = registry
        self.server_id = server_id
        self.mode = mode
        self.contracts = contracts
        # Exposed name -> (server_id, the server's own tool name) for tools of upstream
        # servers (providers/upstream/server.py); any other name is this server's own tool.
        self.routes: dict[str, tuple[str, str]] = {}
        # Each contract's MCP hints, derived once (contracts never change once declared).
        self._hints: dict[str, Mapping[str, Any]] = {}

    def _hints_for(self, tool_name: str) -> Mapping[str, Any]:
        hints = self._hints.get(tool_name)
        if hints is None:
            contract = self.contracts.get(tool_name)
            hints = contract.annotations() if contract is not None else {}
            self._hints[tool_name] = hints
        return hints

    def route(self, tool_name: str) -> tuple[str, str]:
        """``{server_id, tool_name}`` as the registry knows the tool (seed 000)."""
        return self.routes.get(tool_name) or (self.server_id, tool_name)

    def classify(self, state: CallState) -> Classification:
        principal = state.principal
        routed = self.routes.get(state.tool_name)
        if routed is not None:
            server_id, registry_name = routed
            state.server_id, state.upstream_tool = routed
            # An upstream's annotations are its own claims: never evidence of a read.
            hints: Mapping[str, Any] = {}
        else:
            server_id, registry_name = self.server_id, state.tool_name
            hints = self._hints_for(state.tool_name)
        declared = state.meta.get(META_TOOL_CLASS)
        if declared is not None and not isinstance(declared, str):
            raise InvalidInputError(field=META_TOOL_CLASS)
        classification = classify_call(
            self.registry,
            server_id=server_id,
            tool_name=registry_name,
            mode=self.mode,
            caller_read_only=principal.read_only if principal is not None else True,
            declared_class=declared,
            idempotency_key=plumbing_value(state, ARG_IDEMPOTENCY_KEY, META_IDEMPOTENCY_KEY),
            read_only_hint=hints.get("readOnlyHint"),
            destructive_hint=hints.get("destructiveHint"),
        )
        if classification.warnings:
            log.warning(
                "tool_classification_warning",
                tool=state.tool_name,
                warnings=list(classification.warnings),
            )
        return classification

    def classify_into(self, state: CallState) -> Classification:
        """Classify the call and record the gateway's result on the state."""
        classification = self.classify(state)
        state.classification = classification
        state.tool_class = classification.tool_class
        state.heuristic_class = classification.heuristic
        return classification

    def ensure_classified(self, state: CallState) -> Classification:
        """The gateway's classification, computed here when its layer is not in the chain.

        Later layers (approval, documents) call this so that removing the classification
        layer can never switch their checks off.
        """
        if isinstance(state.classification, Classification):
            return state.classification
        return self.classify_into(state)

    @staticmethod
    def write_spec(classification: Classification) -> DocumentSpec | None:
        """The spec of the content a call sends: a write document op's, or a read document
        op's that declares write pointers too (a dry run of a write, such as
        ``propose_patch``: its arguments are measured before it runs, like the write's)."""
        entry = classification.entry
        if entry is None or not entry.is_document_op or entry.document_spec is None:
            return None
        if classification.tool_class != "write" and not entry.document_spec.write_content_pointers:
            return None
        return entry.document_spec

    @staticmethod
    def read_spec(classification: Classification) -> DocumentSpec | None:
        entry = classification.entry
        if entry is None or not entry.is_document_op or classification.tool_class != "read":
            return None
        return entry.document_spec

    def check_write(
        self, state: CallState, classification: Classification, arguments: Mapping[str, Any]
    ) -> DocumentCheck:
        expected_raw = state.meta.get(META_EXPECTED_HASHES)
        expected = parse_expected_hashes(expected_raw) if expected_raw is not None else None
        return check_write_documents(self.write_spec(classification), arguments, expected)

    def check_read(
        self, classification: Classification, structured: Mapping[str, Any]
    ) -> DocumentCheck:
        return check_read_documents(self.read_spec(classification), structured)

    def effect(self, state: CallState, check: DocumentCheck | None) -> dict[str, Any]:
        server_id, tool_name = self.route(state.tool_name)
        return build_tool_effect(
            check,
            tool_call_id=state.tool_call_id,
            server_id=server_id,
            tool_name=tool_name,
            tool_class=state.tool_class or "write",  # type: ignore[arg-type]
            target_ref=state.target_ref,
        )


class RegistryConnectorCheck:
    """The connector's re-check (seed 000 PRIMARY enforcement), right before the tool runs."""

    def __init__(self, enforcer: RegistryEnforcer) -> None:
        self.enforcer = enforcer

    def before(self, contract: ToolContract, state: CallState, arguments: dict[str, Any]) -> None:
        # Computed afresh, never taken from the gateway's result: that is the point.
        classification = self.enforcer.classify(state)
        state.connector_classification = classification
        state.tool_class = classification.tool_class
        state.heuristic_class = classification.heuristic
        # Pointers resolve in what the caller sent (seed 000: "request args"): FastMCP has
        # filled in defaults, which must not make a missing document appear.
        sent = {k: v for k, v in arguments.items() if k in state.arguments}
        state.document_check = self.enforcer.check_write(state, classification, sent)

    def after(self, contract: ToolContract, state: CallState, structured: dict[str, Any]) -> None:
        classification = state.connector_classification
        if not isinstance(classification, Classification):  # pragma: no cover - before() ran
            classification = self.enforcer.classify(state)
        if self.enforcer.read_spec(classification) is not None:
            state.document_check = self.enforcer.check_read(classification, structured)


class ToolCallRecordCheck:
    """Builds the call's ``tool_call`` record and validates it (seed 000, 9.2.2).

    A connector check, so the one sequence that runs native, upstream and replayed tools
    (``decorator.bind_tool``, ``UpstreamTool.run``, ``FixtureTool.run``) builds it for all
    three, right before the tool runs. The record carries the call's own
    ``tool_call_id`` (the id of its audit events and of its ``tool_effect``), the routed
    ``{server_id, tool_name}``, the digest of the arguments (the audit's), the caller's
    declared class, idempotency key and expected hashes. A record the schema refuses
    stops the call with ``TOOL_CALL_RECORD_INVALID``, naming the field, never its value.
    The schema is compiled once to plain checks (``contract_check``); jsonschema runs only
    to name the failing field of a refused record.
    """

    def __init__(self, enforcer: RegistryEnforcer) -> None:
        self.enforcer = enforcer
        self.is_valid = contract_check(TOOL_CALL_SCHEMA)
        self.validator = contract_validator(TOOL_CALL_SCHEMA)

    def record(self, state: CallState) -> dict[str, Any]:
        server_id, tool_name = self.enforcer.route(state.tool_name)
        if state.args_digest is None:
            state.args_digest = fingerprint_arguments(state.arguments, exclude=PLUMBING_ARGS)
        expected_raw = state.meta.get(META_EXPECTED_HASHES)
        declared = state.meta.get(META_TOOL_CLASS)
        record = build_tool_call(
            server_id=server_id,
            tool_name=tool_name,
            args_digest=state.args_digest,
            tool_call_id=state.tool_call_id,
            idempotency_key=plumbing_value(state, ARG_IDEMPOTENCY_KEY, META_IDEMPOTENCY_KEY),
            expected_hashes=(
                parse_expected_hashes(expected_raw) if expected_raw is not None else None
            ),
        )
        if declared is not None:
            record["tool_class"] = declared  # as sent: the schema decides, not a filter here
        return record

    def before(self, contract: ToolContract, state: CallState, arguments: dict[str, Any]) -> None:
        record = self.record(state)
        if not self.is_valid(record):
            error = best_match(self.validator.iter_errors(record))
            field = str(error.path[0]) if error is not None and error.path else "record"
            rule = str(error.validator) if error is not None else "schema"
            raise ToolCallRecordInvalidError(field=field, rule=rule)
        state.tool_call_record = record

    def after(self, contract: ToolContract, state: CallState, structured: dict[str, Any]) -> None:
        return None


__all__ = [
    "RegistryConnectorCheck",
    "RegistryEnforcer",
    "ToolCallRecordCheck",
    "plumbing_value",
]
