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
    │   ├── MergeBlockedError            MERGE_BLOCKED
    │   └── FlowDeniedError              FLOW_DENIED
    ├── LimitError
    │   ├── BudgetExceededError          BUDGET_EXCEEDED
    │   ├── RateLimitedError             RATE_LIMITED
    │   └── ToolTimeoutError             TOOL_TIMEOUT
    ├── UpstreamError                    UPSTREAM_ERROR (Knowtation-compatible messages)
    ├── FixtureNotFoundError             FIXTURE_NOT_FOUND (replay: no recorded answer)
    ├── OutputDeniedError                OUTPUT_DENIED (a secret in a result, refused)
    └── InternalError                    INTERNAL_ERROR

``ConfigError`` is separate: it stops start-up and never reaches a client.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any, ClassVar

from .write_rules import WRITE_OPERATION_NAMES, WRITE_POLICY_DENIED_PREFIX, write_rule_text


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
    FLOW_DENIED = "FLOW_DENIED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    RATE_LIMITED = "RATE_LIMITED"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    INVALID_INPUT = "INVALID_INPUT"
    INVALID_PATH = "INVALID_PATH"
    NOT_FOUND = "NOT_FOUND"
    CONFLICT = "CONFLICT"
    UPSTREAM_ERROR = "UPSTREAM_ERROR"
    FIXTURE_NOT_FOUND = "FIXTURE_NOT_FOUND"
    OUTPUT_DENIED = "OUTPUT_DENIED"
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


# A name a message may carry: an argument or setting the tool's schema declares. A name
# of any other shape is left out (an upstream's schema is not ours to trust with text).
_SCHEMA_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MAX_ACCEPTED_NAMED = 16  # declared names an unexpected-argument refusal lists at most
# A misspelling is looked for among at most 128 declared names, for 4 names sent: difflib
# costs per pair, and a schema's thousands of anagram names made one refusal take a minute.
MAX_SUGGESTION_CANDIDATES, MAX_SUGGESTION_SENT = 128, 4
PROBLEM_MISSING = "missing"
PROBLEM_UNEXPECTED = "unexpected_argument"
PROBLEM_WRONG_TYPE = "wrong_type"

# What a value should have been, in plain words, by pydantic's error type or JSON Schema's
# type name (``problem``, or ``expected`` with ``PROBLEM_WRONG_TYPE``).
_KINDS = {
    name: words
    for words, names in (
        ("text", "string_type string"),
        ("a whole number", "int_type int_from_float integer"),
        ("a number", "float_type number"),
        ("true or false", "bool_type boolean"),
        ("a list", "list_type tuple_type set_type frozen_set_type array"),
        ("an object", "dict_type model_type model_attributes_type object"),
        ("null", "none_required null"),
    )
    for name in names.split()
}
# A bound broken, in plain words; ``limit`` is the schema's own bound, never the value sent.
_BOUNDS = {
    name: words
    for words, names in (
        ("should be at least {}", "greater_than_equal minimum"),
        ("should be greater than {}", "greater_than exclusiveMinimum"),
        ("should be at most {}", "less_than_equal maximum"),
        ("should be less than {}", "less_than exclusiveMaximum"),
        ("is too long (at most {} characters)", "string_too_long maxLength"),
        ("is too short (at least {} characters)", "string_too_short minLength"),
        ("has too many entries (at most {})", "too_long maxItems"),
        ("has too few entries (at least {})", "too_short minItems"),
    )
    for name in names.split()
}
_NOT_ACCEPTED_VALUE = frozenset({"literal_error", "enum", "const"})


def is_schema_name(value: object) -> bool:
    """Whether ``value`` may appear in a message as an argument's or setting's name."""
    return isinstance(value, str) and _SCHEMA_NAME_RE.fullmatch(value) is not None


class InvalidInputError(InputError):
    """Arguments that fail validation: names the declared argument and says in plain words
    what is wrong (facts ``field``, ``problem``, ``expected``, ``limit``, ``entry``); never
    the value sent, nor a name the caller made up (an unexpected argument is answered with
    the ``accepted`` names and a ``suggestion`` among them)."""

    code = Code.INVALID_INPUT

    @classmethod
    def unexpected(
        cls, sent: Iterable[object], accepted: Sequence[str] | None
    ) -> InvalidInputError:
        """An unexpected argument among ``sent`` (caller names, never kept): lists the
        ``accepted`` names and suggests the one a sent name is a close misspelling of."""
        declared = tuple(accepted) if accepted is not None else None
        suggestion = None
        candidates = [n for n in declared or () if is_schema_name(n)]
        if candidates and len(candidates) <= MAX_SUGGESTION_CANDIDATES:
            # A declared name is short (is_schema_name): a long one cannot be its
            # misspelling, and difflib's cost grows with the length of what it compares.
            short = (n for n in sent if isinstance(n, str) and len(n) <= 128)
            for name in itertools.islice(short, MAX_SUGGESTION_SENT):
                close = difflib.get_close_matches(name, candidates, n=1)
                if close:
                    suggestion = close[0]
                    break
        return cls(problem=PROBLEM_UNEXPECTED, accepted=declared, suggestion=suggestion)

    def render(self, facts: dict[str, Any]) -> str:
        problem = facts.get("problem")
        if problem == PROBLEM_UNEXPECTED:
            return _unexpected_message(facts.get("accepted"), facts.get("suggestion"))
        field = facts.get("field")
        if not is_schema_name(field):
            return "invalid input"
        if problem == PROBLEM_MISSING and not facts.get("entry"):
            return f"missing argument '{field}'"
        subject = f"an entry of argument '{field}'" if facts.get("entry") else f"argument '{field}'"
        kind = _KINDS.get(str(facts.get("expected") if problem == PROBLEM_WRONG_TYPE else problem))
        if kind is not None:
            return f"{subject} should be {kind}"
        limit = facts.get("limit")
        bound = _BOUNDS.get(str(problem))
        if bound is not None and isinstance(limit, int | float) and not isinstance(limit, bool):
            return f"{subject} {bound.format(limit)}"
        if problem in _NOT_ACCEPTED_VALUE:
            return f"{subject} is not one of the accepted values"
        return f"invalid input for field '{field}'"


def _unexpected_message(accepted: object, suggestion: object) -> str:
    text = "unexpected argument"
    if isinstance(accepted, tuple):
        names = [name for name in accepted if is_schema_name(name)]
        if not accepted:
            text += "; this tool takes no arguments"
        elif names:
            shown = names[:MAX_ACCEPTED_NAMED]
            more = len(accepted) - len(shown)
            text += "; accepted: " + ", ".join(shown) + (f" and {more} more" if more else "")
    if is_schema_name(suggestion) and isinstance(accepted, tuple) and suggestion in accepted:
        text += f"; did you mean '{suggestion}'?"
    return text


class InvalidPathError(InputError):
    code = Code.INVALID_PATH
    default_message = "path is not allowed"


# A write that makes an entry in a folder that is not there: what the refusal says, by the
# operation (``reason`` names the folder's state, ``operation`` the write).
_NO_PARENT = {
    "parent_missing": "the parent folder does not exist",
    "parent_not_folder": "a parent of this path is a file, not a folder",
}
_MKDIR_FIRST = "create it first with nexus_mkdir (parents=true creates every missing level)"
_CREATE_PARENT = {
    "write": _MKDIR_FIRST,
    "rename": _MKDIR_FIRST,
    "mkdir": "call nexus_mkdir with parents=true to create the missing folders as well",
}


class NotFoundError(InputError):
    """Something the call names does not exist. For a write that creates an entry
    (``operation``: write, rename, mkdir) whose parent folder is missing (``reason``
    ``parent_missing``) the message says so and how to create it, without the path."""

    code = Code.NOT_FOUND
    default_message = "not found"

    def render(self, facts: dict[str, Any]) -> str:
        state = _NO_PARENT.get(str(facts.get("reason")))
        advice = _CREATE_PARENT.get(str(facts.get("operation")))
        if state is None or advice is None:
            return self.default_message
        if facts.get("reason") == "parent_not_folder":
            return f"{state}: a file cannot hold another entry"
        return f"{state}: {advice}"


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
    """The write policy refused: the message names the ``rule`` and the setting that
    decided (``operation``, a bound such as ``limit_bytes``, ``disallowed_entry`` N, 1-based
    in the configured list, or ``disallowed_builtin``); never the path, branch or content."""

    code = Code.WRITE_POLICY_DENIED
    default_message = WRITE_POLICY_DENIED_PREFIX

    def render(self, facts: dict[str, Any]) -> str:
        reason = write_rule_text(facts)
        rule = facts.get("rule")
        if reason is None or not isinstance(rule, str):
            return self.default_message
        return f"{WRITE_POLICY_DENIED_PREFIX} (rule {rule}): {reason}"


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


class FlowDeniedError(ApprovalError):
    """The flow policy refused an egress call after private and untrusted reads in this
    session (``policy/flow.py``). Names no call, tool, id or value."""

    code = Code.FLOW_DENIED
    default_message = (
        "egress refused by the flow policy: this session has read private data and "
        "untrusted content, so this call could send one under the other's instructions"
    )


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


class OutputDeniedError(NexusError):
    """Output scanning found a secret in a result and policy refuses such results
    (``policy/output_scanning.py``). ``kinds`` names the detectors' kinds (our own words,
    comma-separated); nothing of the result, the value or where it was is said."""

    code = Code.OUTPUT_DENIED
    default_message = "result withheld: it holds a secret"

    def render(self, facts: dict[str, Any]) -> str:
        kinds = facts.get("kinds")
        if isinstance(kinds, str) and re.fullmatch(r"[a-z0-9_,]{1,512}", kinds):
            return f"{self.default_message} ({kinds.replace(',', ', ')})"
        return self.default_message


# The store names an UNAVAILABLE message may carry (our own labels, never an address).
UNAVAILABLE_STORES = frozenset(
    {
        "approvals",
        "flow",
        "grants",
        "idempotency",
        "nonces",
        "limits",
        "postgres",
        "upstream_quarantine",
    }
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
    "MAX_ACCEPTED_NAMED",
    "MERGE_BLOCKED_REASONS",
    "PROBLEM_MISSING",
    "PROBLEM_UNEXPECTED",
    "PROBLEM_WRONG_TYPE",
    "UPSTREAM_INVALID_PATH",
    "UPSTREAM_RUNTIME_FAILURE",
    "WRITE_OPERATION_NAMES",
    "WRITE_POLICY_DENIED_PREFIX",
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
    "FlowDeniedError",
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
    "OutputDeniedError",
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
    "is_schema_name",
    "rebuild_error",
]
