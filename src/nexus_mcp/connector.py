"""The connector: the innermost step of the chain (DESIGN.md, step 9), written once.

Native tools (``providers/native.py``), upstream tools (``providers/upstream``) and replayed
fixtures (``providers/fixtures.py``) all run through ``Connector.run``, which does, in
this order and nowhere else:

1. the provider's own argument check, where the gateway's did not run or a replay
   normalizes what it hashes (a native tool's arguments are validated by FastMCP's
   ``NexusTool.run`` with the gateway's own model);
2. the connector checks before the call: the registry re-check against the same loaded
   registry the gateway middleware used (seed 000, PRIMARY enforcement) and the call's
   ``tool_call`` record (``enforcement.py``);
3. the provider's own preparation, which may still refuse without spending anything (a
   replay finds its recorded answer here);
4. spending the approval: only now that the call will really run, so a call refused by
   a later check does not burn its approval (``policy/approvals.spend_approval``);
5. the audit's ``tool_call_started``;
6. the tool itself;
7. output secret scanning (``scanner``: redact, refuse or audit what the result holds), then
   the checks after the call, on the document the client receives;
8. the ``tool_effect`` the result carries (``_meta``), and the finished hook
   (``serve --record``).

A typed refusal leaves as a ``ConnectorRefusal`` (``envelope.py``), so FastMCP passes it up
without a traceback and the envelope answers with its code. Everything the sequence needs
is given to the constructor by the composition root; the connector never calls back into
it, and providers hold a connector, not the server that built it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastmcp.tools import ToolResult
from mcp_types import ContentBlock, EmbeddedResource, TextContent, TextResourceContents

from nexus_mcp.calls import META_TOOL_EFFECT, CallState, current_call
from nexus_mcp.contracts import ToolContract
from nexus_mcp.envelope import ConnectorRefusal, unknown_tool
from nexus_mcp.errors import NexusError
from nexus_mcp.policy.approvals import NonceStore, spend_approval


class ConnectorCheck(Protocol):
    """One connector-side check, run before (``before``) and after (``after``) the tool."""

    def before(
        self, contract: ToolContract, state: CallState, arguments: dict[str, Any]
    ) -> None: ...

    def after(
        self, contract: ToolContract, state: CallState, structured: dict[str, Any]
    ) -> None: ...


# The call's tool_effect (enforcement.RegistryEnforcer.effect).
EffectBuilder = Callable[[CallState], Mapping[str, Any]]
# The audit's tool_call_started, when the tool is about to run (middleware/audit.AuditTrail).
StartedHook = Callable[[ToolContract, CallState], None]
# Called once a call that reached the connector has its outcome: (contract, state, the
# validated arguments, the result or None, the failure or None). ``serve --record``.
FinishedHook = Callable[
    [ToolContract, CallState, Mapping[str, Any], ToolResult | None, BaseException | None], None
]


# Results with more text than this are scanned off the event loop (a small one costs less
# than the hop to a thread).
SCAN_OFF_LOOP_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a tool produced, before the connector adds its effect."""

    content: list[ContentBlock]
    structured: dict[str, Any] | None
    # What the checks after the call hash; None skips them (an upstream's error result).
    document: dict[str, Any] | None
    is_error: bool = False


def block_text(block: object) -> str | None:
    """The text a content block carries: a text block's, or an embedded text resource's;
    None for any other block (images, audio, blobs, links)."""
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, EmbeddedResource) and isinstance(block.resource, TextResourceContents):
        return block.resource.text
    return None


def _text_size(outcome: Outcome) -> int:
    """The characters of text the outcome's content blocks carry (its structured value is
    the same data, for a native tool)."""
    return sum(len(text) for block in outcome.content if (text := block_text(block)) is not None)


class ResultScanner(Protocol):
    """Output secret scanning (``middleware/output_scan.OutputScan``): what may leave of a
    tool's outcome, and of an upstream resource's or prompt's texts; each returns what it
    was given (redacted where policy redacts) or raises ``OutputDeniedError``."""

    def outcome(self, contract: ToolContract, state: CallState, outcome: Outcome) -> Outcome: ...

    def texts(self, server_id: str, name: str, texts: list[str]) -> list[str]: ...


def chained_call(name: str, *, identified: bool = True) -> CallState:
    """The state the envelope opened for this ``tools/call``, for a layer or the connector.

    Fail closed: a call that reached a layer without it (the chain bypassed or mis-built),
    or without an identity where ``identified`` (every layer after the identity layer, and
    the connector), is refused with the answer a hidden or missing tool gets; it is never
    passed on unchecked.
    """
    state = current_call()
    if state is None or (identified and state.principal is None):
        raise unknown_tool(name)
    return state


class Connector:
    """The one connector sequence (module docstring), shared by every provider."""

    __slots__ = ("_effect", "_finished", "_nonces", "_started", "checks", "scanner")

    def __init__(
        self,
        checks: Sequence[ConnectorCheck],
        *,
        effect: EffectBuilder,
        started: StartedHook,
        nonces: NonceStore,
        finished: FinishedHook | None = None,
        scanner: ResultScanner | None = None,
    ) -> None:
        # Iterated on every call (a test may add a check to see the connector refuse).
        self.checks = list(checks)
        self._effect = effect
        self._started = started
        self._nonces = nonces
        self._finished = finished
        # Also read by an upstream's resource reads and prompt gets (providers/upstream).
        self.scanner = scanner

    async def run(
        self,
        contract: ToolContract,
        state: CallState,
        arguments: dict[str, Any],
        execute: Callable[[], Awaitable[Outcome]],
        *,
        validate: Callable[[], dict[str, Any]] | None = None,
        prepare: Callable[[], Awaitable[None]] | None = None,
    ) -> ToolResult:
        """Run one call through the sequence. ``validate`` returns the arguments the checks
        see (default: ``arguments``); ``prepare`` may refuse before anything is spent or
        audited as started; ``execute`` is the tool."""
        checks = self.checks
        try:
            checked = arguments if validate is None else validate()
            for check in checks:
                check.before(contract, state, checked)
            if prepare is not None:
                await prepare()
            # The last gate: what must happen only once the call will really run.
            claims = state.pending_approval
            if claims is not None:
                state.pending_approval = None
                spend_approval(claims, self._nonces)
            state.executed = True
            self._started(contract, state)
            outcome = await execute()
            if self.scanner is not None:
                if _text_size(outcome) > SCAN_OFF_LOOP_CHARS:
                    # A large result is scanned in a worker thread: linear, but about 0.1 s
                    # per MiB, which on the loop would hold up every other caller.
                    outcome = await asyncio.to_thread(
                        self.scanner.outcome, contract, state, outcome
                    )
                else:
                    outcome = self.scanner.outcome(contract, state, outcome)
            document = outcome.document
            if document is not None:
                for check in checks:
                    check.after(contract, state, document)
            effect = self._effect(state)
        except NexusError as exc:
            if self._finished is not None:
                self._finished(contract, state, arguments, None, exc)
            raise ConnectorRefusal(exc) from exc
        except Exception as exc:
            if self._finished is not None:
                self._finished(contract, state, arguments, None, exc)
            raise
        state.effect = effect
        result = ToolResult(
            content=outcome.content,
            structured_content=None if outcome.is_error else outcome.structured,
            meta={META_TOOL_EFFECT: dict(effect)},
            is_error=outcome.is_error,
        )
        if self._finished is not None:
            self._finished(contract, state, arguments, result, None)
        return result


__all__ = [
    "Connector",
    "ConnectorCheck",
    "EffectBuilder",
    "FinishedHook",
    "Outcome",
    "ResultScanner",
    "StartedHook",
    "block_text",
    "chained_call",
]
