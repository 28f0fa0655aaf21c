"""Recording (``serve --record DIR``, seed 002 "Deterministic tool providers").

``Recorder`` is the connector's finished hook (``connector.py``). Every call that reached
a tool, native or upstream, successful or refused by the tool, is appended to the
server's fixture file (``fixtures/lines.py``) once the connector has its outcome, exactly
as the caller receives it; a recording failure is logged and never changes that outcome.
The tools themselves are recorded as listed, native ones at start-up and an upstream's
as it publishes them. ``providers/fixtures.py`` replays what this records.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastmcp.tools import Tool, ToolResult

from nexus_mcp.calls import META_TOOL_EFFECT, CallState
from nexus_mcp.contracts import ToolContract
from nexus_mcp.envelope import safe_facts, to_envelope, to_wire_error
from nexus_mcp.fixtures.lines import (
    arguments_hash,
    call_line,
    listing_digest,
    secret_fields,
    stable_effect,
    tool_line,
)
from nexus_mcp.fixtures.secrets import MIN_ARGUMENT_SECRET_CHARS, SecretScanner
from nexus_mcp.fixtures.store import FixtureWriter
from nexus_mcp.observability.logs import get_logger

log = get_logger(__name__)


def listed_definition(tool: Tool) -> dict[str, Any]:
    """A tool as ``tools/list`` gives it, before the chain's listing transforms."""
    return tool.to_mcp_tool().model_dump(by_alias=True, exclude_none=True, mode="json")


def dump_content(content: Sequence[Any]) -> list[dict[str, Any]]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in content]


@dataclass(frozen=True)
class _Recorded:
    server_id: str
    version: str
    secret: frozenset[str]


class Recorder:
    """Appends what reached each tool to ``<DIR>/<server_id>.jsonl`` (``serve --record``)."""

    def __init__(self, writer: FixtureWriter, scanner: SecretScanner) -> None:
        self.writer = writer
        self.scanner = scanner
        self._tools: dict[str, _Recorded] = {}
        self._lock = threading.Lock()

    def record_tool(
        self,
        server_id: str,
        tool: Tool,
        contract: ToolContract,
        *,
        upstream_tool: str | None = None,
    ) -> None:
        """Record ``tool`` as listed (once per definition) and remember how its calls hash."""
        # Redacted before it is digested, so the digest a replay checks is the line's own.
        definition, redacted = self.scanner.redact(listed_definition(tool))
        # An upstream's own annotations (the listing carries the gateway's): with the
        # listed fields they are the definition its pin names, which a replay checks.
        view = getattr(tool, "view", None) if upstream_tool is not None else None
        raw_annotations = view.definition.get("annotations") if view is not None else None
        upstream_annotations, redacted_too = self.scanner.redact(
            raw_annotations if isinstance(raw_annotations, Mapping) else None
        )
        redacted = redacted or redacted_too
        secret = secret_fields(contract.data_handling.secret_args, definition.get("inputSchema"))
        with self._lock:
            self._tools[contract.name] = _Recorded(server_id, contract.version, secret)
        key = (contract.name, contract.version, listing_digest(definition))
        try:
            if self.writer.has_definition(server_id, key):
                return
            line = tool_line(
                server_id=server_id,
                tool=contract.name,
                version=contract.version,
                definition=definition,
                risk=contract.risk,
                toolset=contract.toolset,
                secret_args=secret,
                upstream_tool=upstream_tool,
                upstream_annotations=upstream_annotations,
            )
            if redacted:
                log.warning("fixture_redacted", tool=contract.name, part="definition")
            self.writer.append(server_id, line)
        except Exception as exc:  # noqa: BLE001 - recording never stops the server
            log.error("fixture_record_failed", tool=contract.name, exc_type=type(exc).__name__)

    def record_call(
        self,
        contract: ToolContract,
        state: CallState,
        arguments: Mapping[str, Any],
        result: ToolResult | None,
        error: BaseException | None,
    ) -> None:
        """The connector's hook once a call has its outcome. Only a call that reached the
        tool is recorded; nothing here can change what the caller receives."""
        if not state.executed:
            return
        try:
            self._record_call(contract, state, arguments, result, error)
        except Exception as exc:  # noqa: BLE001 - recording never changes the answer
            log.error("fixture_record_failed", tool=contract.name, exc_type=type(exc).__name__)

    def _record_call(
        self,
        contract: ToolContract,
        state: CallState,
        arguments: Mapping[str, Any],
        result: ToolResult | None,
        error: BaseException | None,
    ) -> None:
        with self._lock:
            recorded = self._tools.get(contract.name)
        if recorded is None:
            # A tool is recorded as listed before it can be called; one that was not is
            # not replayable, and its answer is not kept.
            log.warning("fixture_tool_not_recorded", tool=contract.name)
            return
        digest = arguments_hash(arguments, secret=recorded.secret)
        refusal: dict[str, Any] | None = None
        if result is None:
            # What the envelope makes of it, by the envelope's own mapping.
            nexus = to_wire_error(error or Exception(), correlation_id=state.correlation_id)
            envelope = to_envelope(nexus)
            answer: dict[str, Any] = {"content": dump_content(envelope.content), "isError": True}
            refusal = {"code": str(nexus.code), "message": nexus.message}
            facts = safe_facts(nexus)
            if facts:
                refusal["facts"] = facts
            effect = None
        else:
            answer = {"content": dump_content(result.content)}
            if result.structured_content is not None:
                answer["structuredContent"] = result.structured_content
            answer["isError"] = bool(result.is_error)
            effect = stable_effect((result.meta or {}).get(META_TOOL_EFFECT))
        scanner = self.scanner
        own = [v for k, v in arguments.items() if k in recorded.secret and isinstance(v, str)]
        if own:
            # A secret argument the tool echoed back is as secret as the argument.
            scanner = scanner.with_values(own, min_chars=MIN_ARGUMENT_SECRET_CHARS)
        payload, redacted = scanner.redact({"result": answer, "effect": effect, "error": refusal})
        if redacted:
            log.warning("fixture_redacted", tool=contract.name, part="result")
        self.writer.append(
            recorded.server_id,
            call_line(
                server_id=recorded.server_id,
                tool=contract.name,
                version=recorded.version,
                args_sha256=digest,
                result=payload["result"],
                effect=payload["effect"],
                error=payload["error"],
                redacted=redacted,
            ),
        )

    def close(self) -> None:
        self.writer.close()


__all__ = ["Recorder", "dump_content", "listed_definition"]
