"""Typed refusals and the one function that turns any exception into the wire envelope.

Every refusal nexus-mcp makes is a ``NexusError`` subclass that carries its stable code,
the structured facts of the refusal (for audit), and builds its own safe message. Safe
means: no input values, no paths the caller sent, no exception text, no secrets.

    NexusError
    ├── InputError
    │   ├── InvalidInputError            INVALID_INPUT
    │   ├── InvalidPathError             INVALID_PATH
    │   ├── NotFoundError                NOT_FOUND
    │   └── ConflictError                CONFLICT
    ├── RegistryError
    │   ├── ToolUnclassifiedError        TOOL_UNCLASSIFIED_DENIED
    │   ├── ToolClassMismatchError       TOOL_CLASS_MISMATCH
    │   ├── ToolClassDeclarationError    TOOL_CLASS_DECLARATION_MISMATCH
    │   ├── IdempotencyKeyRequiredError  IDEMPOTENCY_KEY_REQUIRED
    │   ├── IdempotencyKeyConflictError  IDEMPOTENCY_KEY_CONFLICT
    │   └── ToolCallRecordInvalidError   TOOL_CALL_RECORD_INVALID
    ├── DocumentError
    │   ├── DocSizeExceededError         DOC_SIZE_EXCEEDED
    │   ├── DocHashMismatchError         DOC_HASH_MISMATCH
    │   ├── DocPointerInvalidError       DOC_CONTENT_POINTER_INVALID
    │   └── DocEncodingInvalidError      DOC_ENCODING_INVALID
    ├── ApprovalError
    │   ├── ApprovalRequiredError        APPROVAL_REQUIRED
    │   ├── ApprovalInvalidError         APPROVAL_INVALID
    │   ├── ApprovalExpiredError         APPROVAL_EXPIRED
    │   ├── ApprovalReplayedError        APPROVAL_REPLAYED
    │   ├── WritePolicyDeniedError       WRITE_POLICY_DENIED
    │   └── MergeBlockedError            MERGE_BLOCKED
    ├── LimitError
    │   ├── BudgetExceededError          BUDGET_EXCEEDED
    │   ├── RateLimitedError             RATE_LIMITED
    │   └── ToolTimeoutError             TOOL_TIMEOUT
    ├── UpstreamError                    UPSTREAM_ERROR (Knowtation-compatible messages)
    ├── FixtureNotFoundError             FIXTURE_NOT_FOUND (replay: no recorded answer)
    └── InternalError                    INTERNAL_ERROR

``ConfigError`` is separate: it stops start-up and never reaches a client.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any, ClassVar


class Code(StrEnum):
    """The stable error codes of the envelope (DESIGN.md). Never rename one."""

    TOOL_UNCLASSIFIED_DENIED = "TOOL_UNCLASSIFIED_DENIED"
    TOOL_CLASS_MISMATCH = "TOOL_CLASS_MISMATCH"
    TOOL_CLASS_DECLARATION_MISMATCH = "TOOL_CLASS_DECLARATION_MISMATCH"
    IDEMPOTENCY_KEY_REQUIRED = "IDEMPOTENCY_KEY_REQUIRED"
    IDEMPOTENCY_KEY_CONFLICT = "IDEMPOTENCY_KEY_CONFLICT"
    TOOL_CALL_RECORD_INVALID = "TOOL_CALL_RECORD_INVALID"
    DOC_SIZE_EXCEEDED = "DOC_SIZE_EXCEEDED"
    DOC_HASH_MISMATCH = "DOC_HASH_MISMATCH"
    DOC_CONTENT_POINTER_INVALID = "DOC_CONTENT_POINTER_INVALID"
    DOC_ENCODING_INVALID = "DOC_ENCODING_INVALID"
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    APPROVAL_INVALID = "APPROVAL_INVALID"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    APPROVAL_REPLAYED = "APPROVAL_REPLAYED"
    WRITE_POLICY_DENIED = "WRITE_POLICY_DENIED"
    MERGE_BLOCKED = "MERGE_BLOCKED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    RATE_LIMITED = "RATE_LIMITED"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    INVALID_INPUT = "INVALID_INPUT"
    INVALID_PATH = "INVALID_PATH"
    NOT_FOUND = "NOT_FOUND"
    CONFLICT = "CONFLICT"
    UPSTREAM_ERROR = "UPSTREAM_ERROR"
    FIXTURE_NOT_FOUND = "FIXTURE_NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"


class ConfigError(Exception):
    """Invalid configuration: stops start-up with a message naming the setting or file."""


class NexusError(Exception):
    """Root of every refusal that reaches a client as the error envelope.

    ``facts`` are structured details for the audit log (limits, sizes, pointers, rule
    names). They must never hold caller-supplied values; the message is built by the
    class from a template and only the facts listed in ``public_facts`` may appear in it.
    """

    code: ClassVar[Code] = Code.INTERNAL_ERROR
    default_message: ClassVar[str] = "internal error"

    def __init__(self, message: str | None = None, **facts: Any) -> None:
        self.facts: dict[str, Any] = facts
        self.message = message if message is not None else self.render(facts)
        super().__init__(self.message)

    def render(self, facts: dict[str, Any]) -> str:
        """Build the safe message from facts. Subclasses override for richer text."""
        return self.default_message

    def to_payload(self) -> dict[str, str]:
        return {"error": self.message, "code": str(self.code)}


# --- input and data -------------------------------------------------------------------


class InputError(NexusError):
    code = Code.INVALID_INPUT
    default_message = "invalid input"


class InvalidInputError(InputError):
    """Arguments that fail validation. Names the field only, never the value sent."""

    code = Code.INVALID_INPUT

    def render(self, facts: dict[str, Any]) -> str:
        field = facts.get("field")
        if field:
            return f"invalid input for field '{field}'"
        return "invalid input"


class InvalidPathError(InputError):
    code = Code.INVALID_PATH
    default_message = "path is not allowed"


class NotFoundError(InputError):
    code = Code.NOT_FOUND
    default_message = "not found"


class ConflictError(InputError):
    code = Code.CONFLICT
    default_message = "conflict with the current state"


# --- registry ---------------------------------------------------------------------------


class RegistryError(NexusError):
    code = Code.TOOL_UNCLASSIFIED_DENIED


class ToolUnclassifiedError(RegistryError):
    code = Code.TOOL_UNCLASSIFIED_DENIED
    default_message = "tool is not classified in the registry"


class ToolClassMismatchError(RegistryError):
    code = Code.TOOL_CLASS_MISMATCH
    default_message = "a read-only caller cannot invoke a write tool"


class ToolClassDeclarationError(RegistryError):
    code = Code.TOOL_CLASS_DECLARATION_MISMATCH
    default_message = "declared tool class does not match the registry"


class IdempotencyKeyRequiredError(RegistryError):
    code = Code.IDEMPOTENCY_KEY_REQUIRED
    default_message = "write tools require an idempotency_key"


class IdempotencyKeyConflictError(RegistryError):
    code = Code.IDEMPOTENCY_KEY_CONFLICT
    default_message = "idempotency_key was already used with different arguments"


class ToolCallRecordInvalidError(RegistryError):
    """The call's ``tool_call`` record (seed 000, 9.2.2) fails ``tool_call.schema.json``.

    Names the record's field (a schema property name) only, never its value.
    """

    code = Code.TOOL_CALL_RECORD_INVALID

    def render(self, facts: dict[str, Any]) -> str:
        field = facts.get("field")
        if isinstance(field, str):
            return f"the tool call record is invalid at '{field}'"
        return "the tool call record is invalid"


# --- documents --------------------------------------------------------------------------


class DocumentError(NexusError):
    code = Code.DOC_SIZE_EXCEEDED


class DocSizeExceededError(DocumentError):
    code = Code.DOC_SIZE_EXCEEDED

    def render(self, facts: dict[str, Any]) -> str:
        limit = facts.get("limit_bytes")
        kind = facts.get("limit_name", "size")
        if isinstance(limit, int):
            return f"document exceeds the {kind} limit of {limit} bytes"
        return "document exceeds the size limit"


class DocHashMismatchError(DocumentError):
    code = Code.DOC_HASH_MISMATCH

    def render(self, facts: dict[str, Any]) -> str:
        pointer = facts.get("pointer")
        if isinstance(pointer, str):
            return f"document hash does not match the expected hash at {pointer}"
        return "document hash does not match the expected hash"


class DocPointerInvalidError(DocumentError):
    code = Code.DOC_CONTENT_POINTER_INVALID

    def render(self, facts: dict[str, Any]) -> str:
        pointer = facts.get("pointer")
        if isinstance(pointer, str):
            return f"document content pointer {pointer} does not resolve"
        return "document content pointer does not resolve"


class DocEncodingInvalidError(DocumentError):
    code = Code.DOC_ENCODING_INVALID

    def render(self, facts: dict[str, Any]) -> str:
        encoding = facts.get("encoding")
        if isinstance(encoding, str):
            return f"document content is not valid {encoding}"
        return "document content encoding is invalid"


# --- approvals and write policy ---------------------------------------------------------


class ApprovalError(NexusError):
    code = Code.APPROVAL_INVALID


class ApprovalRequiredError(ApprovalError):
    code = Code.APPROVAL_REQUIRED
    default_message = (
        "this write requires an approval token: ask an approver to mint one for this tool "
        "and these exact arguments, then pass it as approval_token"
    )


class ApprovalInvalidError(ApprovalError):
    code = Code.APPROVAL_INVALID
    default_message = "approval token is not valid for this call"


class ApprovalExpiredError(ApprovalError):
    code = Code.APPROVAL_EXPIRED
    default_message = "approval token has expired"


class ApprovalReplayedError(ApprovalError):
    code = Code.APPROVAL_REPLAYED
    default_message = "approval token was already used"


class WritePolicyDeniedError(ApprovalError):
    code = Code.WRITE_POLICY_DENIED
    default_message = "write denied by the write policy"


# The reason classes ``merge_guarded`` may name (never a check's or reviewer's name).
MERGE_BLOCKED_REASONS = frozenset(
    {
        "pull_not_open",
        "not_mergeable",
        "head_changed",
        "checks_pending",
        "checks_failed",
        "checks_missing",
        "reviews_missing",
        "changes_requested",
        "codeowners_missing",
        "base_not_allowed",
        "write_policy",
    }
)


class MergeBlockedError(ApprovalError):
    """``merge_guarded`` re-queried the forge at merge time and the rules do not hold.

    The message names the reason class only (``reason`` fact, one of
    ``MERGE_BLOCKED_REASONS``): never a check, a reviewer or anything the forge said.
    """

    code = Code.MERGE_BLOCKED

    def render(self, facts: dict[str, Any]) -> str:
        reason = facts.get("reason")
        if isinstance(reason, str) and reason in MERGE_BLOCKED_REASONS:
            return f"merge blocked: {reason}"
        return "merge blocked"


# --- limits -----------------------------------------------------------------------------


class LimitError(NexusError):
    code = Code.BUDGET_EXCEEDED


class BudgetExceededError(LimitError):
    code = Code.BUDGET_EXCEEDED
    default_message = "call budget for this session is exhausted"


class RateLimitedError(LimitError):
    code = Code.RATE_LIMITED
    default_message = "too many calls; retry later"


class ToolTimeoutError(LimitError):
    code = Code.TOOL_TIMEOUT
    default_message = "tool call timed out"


# --- upstream (Knowtation-compatible) and internal --------------------------------------

UPSTREAM_INVALID_PATH = "Invalid path"
UPSTREAM_RUNTIME_FAILURE = "Runtime failure"


class UpstreamError(NexusError):
    """Knowtation's hosted envelope: ``Invalid path``, ``Upstream <status>``,
    ``Runtime failure``."""

    code = Code.UPSTREAM_ERROR
    default_message = UPSTREAM_RUNTIME_FAILURE

    @classmethod
    def invalid_path(cls) -> UpstreamError:
        return cls(UPSTREAM_INVALID_PATH, outcome="invalid_path")

    @classmethod
    def status(cls, status: int) -> UpstreamError:
        return cls(f"Upstream {int(status)}", outcome="upstream_status", status=int(status))

    @classmethod
    def runtime_failure(cls) -> UpstreamError:
        return cls(UPSTREAM_RUNTIME_FAILURE, outcome="runtime_failure")


class FixtureNotFoundError(NexusError):
    """Replay (``serve --replay``): the fixtures hold no answer for this tool, contract
    version and normalized arguments. Names nothing of the arguments."""

    code = Code.FIXTURE_NOT_FOUND
    default_message = "no recorded result for this call (tool, version and arguments)"


# The store names an UNAVAILABLE message may carry (our own labels, never an address).
UNAVAILABLE_STORES = frozenset(
    {"grants", "idempotency", "nonces", "limits", "postgres", "upstream_quarantine"}
)


class UnavailableError(NexusError):
    """A shared state store (PostgreSQL, Redis) could not answer in time: the call is
    refused (fail closed) and nothing was done. ``store`` names which one (``grants``,
    ``idempotency``, ``nonces``, ``limits``), never its address or the driver's text.
    The store recovers by itself; a retry later works."""

    code = Code.UNAVAILABLE
    default_message = "a state store is unavailable; retry later"

    def render(self, facts: dict[str, Any]) -> str:
        store = facts.get("store")
        if isinstance(store, str) and store in UNAVAILABLE_STORES:
            return f"the {store} store is unavailable; retry later"
        return self.default_message


class InternalError(NexusError):
    code = Code.INTERNAL_ERROR

    def render(self, facts: dict[str, Any]) -> str:
        ref = facts.get("ref")
        return f"internal error (ref {ref})" if ref else "internal error"


# A fact a tool sets on a failure that came after its write was sent: the write may have
# happened, so an idempotency key is never freed for it (its retry must not run again).
FACT_OUTCOME_UNKNOWN = "outcome_unknown"


def _leaf_classes() -> dict[Code, type[NexusError]]:
    """The one class of this module that carries each code (the most derived one)."""
    found: dict[Code, type[NexusError]] = {}
    stack: list[type[NexusError]] = [NexusError]
    while stack:
        cls = stack.pop()
        own = [sub for sub in cls.__subclasses__() if sub.__module__ == __name__]
        stack.extend(own)
        if not own or cls.code not in found:
            found[cls.code] = cls
    return found


def rebuild_error(code: str, message: str, facts: dict[str, Any] | None = None) -> NexusError:
    """The typed refusal a recording kept (code, the safe message the caller saw, its audit
    facts), made again for a replay; an unknown code is ``ValueError``."""
    cls = _leaf_classes()[Code(code)]
    return cls(message, **(facts or {}))


def correlation_ref(correlation_id: str) -> str:
    """A short, non-reversible reference a user can quote to an operator."""
    return hashlib.sha256(correlation_id.encode("utf-8")).hexdigest()[:12]


__all__ = [
    "FACT_OUTCOME_UNKNOWN",
    "MERGE_BLOCKED_REASONS",
    "UPSTREAM_INVALID_PATH",
    "UPSTREAM_RUNTIME_FAILURE",
    "ApprovalError",
    "ApprovalExpiredError",
    "ApprovalInvalidError",
    "ApprovalReplayedError",
    "ApprovalRequiredError",
    "BudgetExceededError",
    "Code",
    "ConfigError",
    "ConflictError",
    "DocEncodingInvalidError",
    "DocHashMismatchError",
    "DocPointerInvalidError",
    "DocSizeExceededError",
    "DocumentError",
    "FixtureNotFoundError",
    "IdempotencyKeyConflictError",
    "IdempotencyKeyRequiredError",
    "InputError",
    "InternalError",
    "InvalidInputError",
    "InvalidPathError",
    "LimitError",
    "MergeBlockedError",
    "NexusError",
    "NotFoundError",
    "RateLimitedError",
    "RegistryError",
    "ToolCallRecordInvalidError",
    "ToolClassDeclarationError",
    "ToolClassMismatchError",
    "ToolTimeoutError",
    "ToolUnclassifiedError",
    "UnavailableError",
    "UpstreamError",
    "WritePolicyDeniedError",
    "correlation_ref",
    "rebuild_error",
]
