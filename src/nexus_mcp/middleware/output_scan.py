"""Output secret scanning of a tool's result, for the connector (chain step 7's read side).

The connector calls ``OutputScan.outcome`` right after the tool returns and before its
checks after the call, so the document hashes and the tool effect describe what the
client receives (redacted where policy redacts). What a native result carries is its
``structuredContent`` and the JSON text of it: the structured value is scanned (every
string and key, ``policy/output_scanning.py``) and the text made again from it, so both
say the same. An upstream's result is scanned part by part: its text blocks (also joined,
so a secret split across blocks is found), embedded text resources, and its
``structuredContent``; images, audio and blob resources pass unscanned (binary).
The decision and the audit facts are policy's; this module only takes the MCP content
apart and puts it together again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp_types import ContentBlock, EmbeddedResource, TextContent

from nexus_mcp.calls import CallState, current_call
from nexus_mcp.connector import Outcome, block_text
from nexus_mcp.contracts import ToolContract
from nexus_mcp.json_text import to_result_json
from nexus_mcp.policy.output_scanning import (
    Findings,
    OutputScanSettings,
    decide,
    scan_structured,
    scan_texts,
)

if TYPE_CHECKING:
    from nexus_mcp.policy.secret_scan import SecretScanner


class OutputScan:
    """The deployment's output scanning: its settings and one detector set."""

    def __init__(self, settings: OutputScanSettings) -> None:
        self.settings = settings
        modes = {settings.mode, *settings.tools.values(), *settings.servers.values()}
        # Built now, so detectors that cannot load stop the start, never a call; unless no
        # result is ever scanned, and then detect-secrets is not loaded at all.
        self._scanner = settings.scanner() if modes != {"off"} else None

    @property
    def scanner(self) -> SecretScanner:
        if self._scanner is None:  # every mode is off: only reached by a direct call
            self._scanner = self.settings.scanner()
        return self._scanner

    def outcome(self, contract: ToolContract, state: CallState, outcome: Outcome) -> Outcome:
        """``outcome`` as policy lets it leave: as it is, redacted, or refused
        (``OutputDeniedError``); what was found goes to ``state.output_scan``."""
        mode = self.settings.mode_for(state.server_id, state.tool_name)
        if mode == "off":
            return outcome
        findings = Findings()
        native = state.server_id is None and outcome.structured is not None
        if native:
            structured = scan_structured(self.scanner, outcome.structured, findings)
            content: list[ContentBlock] = outcome.content
        else:
            content = self._content(outcome.content, findings)
            structured = (
                scan_structured(self.scanner, outcome.structured, findings)
                if outcome.structured is not None
                else None
            )

        def record(facts: dict[str, Any]) -> None:
            state.output_scan = facts

        if not decide(mode, findings, record):
            return outcome
        if native:
            structured, text = to_result_json(structured)
            content = [TextContent(type="text", text=text)]
            document = None if outcome.document is None else structured
        else:
            document = None if outcome.document is None else _upstream_document(content, structured)
        return Outcome(
            content=content, structured=structured, document=document, is_error=outcome.is_error
        )

    def texts(self, server_id: str, name: str, texts: list[str]) -> list[str]:
        """An upstream resource's or prompt's texts as policy lets them leave (``name``: as
        the caller knows it); what was found goes to the current request's state."""
        mode = self.settings.mode_for(server_id, name)
        if mode == "off" or not texts:
            return texts
        findings = Findings()
        scanned = scan_texts(self.scanner, texts, findings)
        state = current_call()

        def record(facts: dict[str, Any]) -> None:
            if state is not None:
                state.output_scan = facts

        return scanned if decide(mode, findings, record) else texts

    def _content(self, blocks: list[ContentBlock], findings: Findings) -> list[ContentBlock]:
        """Text blocks and embedded text resources redacted, and every other string a block
        carries (a resource link's URI, name, title and description, an embedded resource's
        URI, any ``_meta``): an upstream chooses them all, and a client shows or follows
        them. Binary payloads (images, audio, blobs) pass as they are."""
        places: list[int] = []
        texts: list[str] = []
        for index, block in enumerate(blocks):
            text = block_text(block)
            if text is not None:
                places.append(index)
                texts.append(text)
        out = list(blocks)
        if texts:
            scanned = scan_texts(self.scanner, texts, findings)
            for index, old, new in zip(places, texts, scanned, strict=True):
                if new is not old:
                    out[index] = _with_text(blocks[index], new)
        for index, block in enumerate(out):
            out[index] = self._fields(block, findings)
        return out

    def _fields(self, block: ContentBlock, findings: Findings) -> ContentBlock:
        """``block`` with every string but its payload (``_PAYLOAD``) scanned."""
        dumped = block.model_dump(mode="json", by_alias=True, exclude_none=True)
        held = _without_payload(dumped)
        scanned = scan_structured(self.scanner, held, findings)
        if scanned is held:
            return block
        merged = {**dumped, **scanned}
        if isinstance(scanned.get("resource"), dict):
            merged["resource"] = {**dumped["resource"], **scanned["resource"]}
        try:
            return type(block).model_validate(merged)
        except ValueError:
            # A field redacted out of its shape (a URI that is no longer one): the block
            # is withheld rather than passed on as it was.
            kinds = ",".join(findings.kinds)
            return TextContent(type="text", text=f"[REDACTED:{kinds}]")


# What a block carries as its content (scanned as text, or binary) rather than about it.
_PAYLOAD = frozenset({"type", "text", "data", "blob"})


def _without_payload(dumped: dict[str, Any]) -> dict[str, Any]:
    held = {k: v for k, v in dumped.items() if k not in _PAYLOAD}
    resource = dumped.get("resource")
    if isinstance(resource, dict):
        held["resource"] = {k: v for k, v in resource.items() if k not in _PAYLOAD}
    return held


def _with_text(block: ContentBlock, text: str) -> ContentBlock:
    if isinstance(block, TextContent):
        return block.model_copy(update={"text": text})
    assert isinstance(block, EmbeddedResource)
    resource = block.resource.model_copy(update={"text": text})
    return block.model_copy(update={"resource": resource})


def _upstream_document(content: list[ContentBlock], structured: Any) -> dict[str, Any]:
    """What an upstream tool's read pointers resolve in (``providers/upstream/tools.py``)."""
    return {
        "content": [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in content],
        "structuredContent": structured,
    }


__all__ = ["OutputScan"]
