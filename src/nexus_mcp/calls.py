"""Per-call state shared by the chain and the connector for the duration of one tools/call.

The envelope (outermost) opens a ``CallState`` in a context variable; each layer records
what it decided (principal, class, document hashes, approval) so the audit middleware can
write one complete event and the connector can re-check with the same facts. Context
variables follow the call into async tools and into worker threads started with
``asyncio.to_thread``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from nexus_mcp.errors import Code
from nexus_mcp.ids import new_id
from nexus_mcp.observability.audit import AuditEvent
from nexus_mcp.policy.documents import DocumentCheck
from nexus_mcp.principal import Principal

META_PREFIX = "nexus.mcp/"
META_IDEMPOTENCY_KEY = "nexus.mcp/idempotency_key"
META_APPROVAL_TOKEN = "nexus.mcp/approval_token"  # noqa: S105 - a key name, not a secret
META_EXPECTED_HASHES = "nexus.mcp/expected_document_hashes"
META_TOOL_CLASS = "nexus.mcp/tool_class"
META_CORRELATION_ID = "nexus.mcp/correlation_id"
META_TOOL_EFFECT = "nexus.mcp/tool_effect"
# On a result: the recorded result of an earlier call with the same idempotency key.
META_REPLAYED = "nexus.mcp/idempotent_replay"

# Tool arguments that are call plumbing, not the action itself.
ARG_IDEMPOTENCY_KEY = "idempotency_key"
ARG_APPROVAL_TOKEN = "approval_token"  # noqa: S105 - an argument name, not a secret
PLUMBING_ARGS = frozenset({ARG_IDEMPOTENCY_KEY, ARG_APPROVAL_TOKEN})

# The ``tool_name`` of the state a resources/read or a prompts/get runs under.
RESOURCE_READ = "(resource)"
PROMPT_GET = "(prompt)"


@dataclass(frozen=True, slots=True)
class ClaimHold:
    """Renews a call's pending idempotency claim (``renew``: False once it is no longer the
    call's); a call that waits before running calls it at least every ``every`` seconds."""

    renew: Callable[[], bool]
    every: float


@dataclass(slots=True)
class CallState:
    """What the chain knows about the current call. Mutable; one per tools/call."""

    tool_name: str
    arguments: dict[str, Any]
    meta: Mapping[str, Any]
    transport: str | None
    session_key: str | None = None
    tool_call_id: str = field(default_factory=new_id)
    # The client's correlation id (``_meta["nexus.mcp/correlation_id"]``) when it sent one;
    # otherwise the call correlates only with itself and uses its own tool_call_id.
    correlation_id: str = ""
    started_at: float = field(default_factory=time.perf_counter)
    principal: Principal | None = None
    # Set for a tool of an upstream server: its server_id and its own name for the tool.
    server_id: str | None = None
    upstream_tool: str | None = None
    args_digest: str | None = None
    # The call's tool_call record (tool_call.schema.json), built and validated by the
    # connector before the tool runs (enforcement.ToolCallRecordCheck).
    tool_call_record: Mapping[str, Any] | None = None
    risk: str | None = None
    tool_class: str | None = None
    # The gateway's and the connector's classifications, kept apart on purpose.
    classification: Any = None
    connector_classification: Any = None
    idempotency_key: str | None = None
    idempotency_outcome: str | None = None
    # Keeps the call's idempotency claim while it waits for an approver (classification).
    hold_claim: ClaimHold | None = None
    approval: Mapping[str, Any] | None = None
    pending_approval: Any = None  # verified approval claims, spent when the tool starts
    policy_decision: str | None = None
    policy_rule: str | None = None
    document_check: DocumentCheck | None = None  # the latest pre- or post-exec check
    # What output secret scanning found and did (kinds, counts, sha256s; never a value).
    output_scan: Mapping[str, Any] | None = None
    effect: Mapping[str, Any] | None = None
    # What a write changed, named as its toolset names it (a branch ref, a commit id).
    target_ref: str | None = None
    # What the approval layer decided for a toolset's write, for the tool to act on
    # (``repos/writes.Prepared``): set by a write gate, read by the tool it gated.
    prepared: Any = None
    block_reason: str | None = None
    # The audit outcome of a call answered as an unknown tool, when the truth has a code
    # of its own (an unclassified upstream tool: TOOL_UNCLASSIFIED_DENIED).
    block_outcome: str | None = None
    executed: bool = False
    # Set by the audit layer, which writes the call's end record: a read-class call's
    # started event may then wait and be written with it (``middleware/audit.py``).
    audit_finishes: bool = False
    started_event: AuditEvent | None = None  # a read's started event, not yet written
    # (the arguments object the gateway validated, the validated keyword arguments)
    validated_arguments: tuple[Mapping[str, Any], dict[str, Any]] | None = None
    # A resources/read or prompts/get (``tool_name`` is then RESOURCE_READ or PROMPT_GET):
    # the source the URI is granted under and the sha256 of the URI (never its text), and
    # the prompt's name once it is known to be a real prompt (else it is caller input).
    resource_source: str | None = None
    uri_sha256: str | None = None
    prompt: str | None = None

    def __post_init__(self) -> None:
        if not self.correlation_id:
            self.correlation_id = self.tool_call_id

    def mark_hidden(self, server_id: str, upstream_tool: str, reason: str) -> None:
        """The call named an upstream tool hidden from everyone (unclassified, quarantined,
        left out): the caller is answered as for an unknown tool, the audit records which
        tool it was and why (the README's reason code)."""
        self.server_id, self.upstream_tool, self.block_reason = server_id, upstream_tool, reason
        if reason == Code.TOOL_UNCLASSIFIED_DENIED:
            self.block_outcome = reason

    @property
    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started_at) * 1000, 3)


T = TypeVar("T")

_current: ContextVar[CallState | None] = ContextVar("nexus_call_state", default=None)
_principal: ContextVar[Principal | None] = ContextVar("nexus_principal", default=None)


# The call state of the running call, or None: the context variable's own getter (a C
# function, no Python frame), because every layer asks for it.
current_call: Callable[[], CallState | None] = _current.get


class _Bound(Generic[T]):
    """Binds a context variable for a ``with`` block (a class, not ``@contextmanager``:
    this runs twice per call and a generator-based manager costs several times more)."""

    __slots__ = ("_token", "_value", "_var")

    def __init__(self, var: ContextVar[T | None], value: T) -> None:
        self._var = var
        self._value = value

    def __enter__(self) -> T:
        self._token: Token[T | None] = self._var.set(self._value)
        return self._value

    def __exit__(self, *exc: object) -> None:
        self._var.reset(self._token)


def open_call(state: CallState) -> AbstractContextManager[CallState]:
    return _Bound(_current, state)


current_principal: Callable[[], Principal | None] = _principal.get


def bind_principal(principal: Principal | None) -> AbstractContextManager[Principal | None]:
    return _Bound[Principal | None](_principal, principal)


@dataclass(frozen=True, slots=True)
class SubjectToken:
    """The caller's own verified access token (HTTP only), kept beside the principal it
    was mapped to, for one use: the subject token of an RFC 8693 exchange
    (``providers/upstream/credentials.py``). Never on ``CallState`` (which is audited and
    recorded), never forwarded, never in a ``repr``."""

    value: str = field(repr=False)
    expires_at: float | None = None


_subject_token: ContextVar[SubjectToken | None] = ContextVar("nexus_subject_token", default=None)
current_subject_token: Callable[[], SubjectToken | None] = _subject_token.get


def bind_subject_token(token: SubjectToken | None) -> AbstractContextManager[SubjectToken | None]:
    """Bound by the identity layer for the request whose principal came from ``token``."""
    return _Bound[SubjectToken | None](_subject_token, token)


@dataclass(slots=True)
class ListingFilter:
    """The tool names a ``tools/list`` in progress may show, bound by the namespace around
    its own listing only, so FastMCP's per-tool work (enabled and auth checks, app URIs)
    runs over the caller's tools, not every registered one (``ToolIndex.list_tools``);
    ``dropped`` counts what that narrowing left out, for the namespace's metric.

    ``task`` is the listing's own task: a task started meanwhile inherits the context
    variable, and its listings (the change notifier's full view, say) must not be narrowed.
    """

    names: frozenset[str]
    task: object
    dropped: int = 0


_listing: ContextVar[ListingFilter | None] = ContextVar("nexus_listing", default=None)
current_listing: Callable[[], ListingFilter | None] = _listing.get


def bind_listing(listing: ListingFilter) -> AbstractContextManager[ListingFilter | None]:
    return _Bound[ListingFilter | None](_listing, listing)


def nexus_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """Only the ``nexus.mcp/*`` keys of a request's ``_meta``."""
    if not meta:
        return {}
    return {k: v for k, v in meta.items() if isinstance(k, str) and k.startswith(META_PREFIX)}


__all__ = [
    "ARG_APPROVAL_TOKEN",
    "ARG_IDEMPOTENCY_KEY",
    "META_APPROVAL_TOKEN",
    "META_CORRELATION_ID",
    "META_EXPECTED_HASHES",
    "META_IDEMPOTENCY_KEY",
    "META_TOOL_CLASS",
    "META_TOOL_EFFECT",
    "PLUMBING_ARGS",
    "PROMPT_GET",
    "RESOURCE_READ",
    "CallState",
    "ClaimHold",
    "ListingFilter",
    "SubjectToken",
    "bind_listing",
    "bind_principal",
    "bind_subject_token",
    "current_call",
    "current_listing",
    "current_principal",
    "current_subject_token",
    "nexus_meta",
    "open_call",
]
