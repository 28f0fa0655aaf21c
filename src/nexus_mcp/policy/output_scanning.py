"""Output secret scanning: what the ``output_scanning`` section decides, and a result scanned.

Every tool result (native, upstream, replayed), and every upstream resource read and prompt
get, is scanned before it leaves (``secret_scan.py`` finds; detect-secrets detects). The
mode for one result is the tool's (``tools``, by the name the client calls), else its
server's (``servers``, by server id; ``nexus`` for the native tools), else ``mode``:

- ``redact`` (default): each secret is replaced by ``[REDACTED:<kind>]`` in text content,
  embedded resource text and every string of ``structuredContent`` (keys included); the
  document hashes and the tool effect describe what the client receives;
- ``refuse``: the result is withheld, ``OUTPUT_DENIED`` naming the secrets' kinds only;
- ``audit``: the result leaves as it is, and the audit records what was found;
- ``off``: not scanned.

Redact is the default in every mode of the server: a secret that reached a read tool's
result is out of its owner's hands the moment a model sees it, while a marker costs a
reader only the secret itself. Binary content (images, audio, blob resources) is not
scanned: the detectors read text.

The audit gets, per result with a finding: the mode, what was done, the kinds and counts,
and the sha256 of each distinct value found (never the value), so an operator can tell
whether a known credential was exposed by hashing it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nexus_mcp.errors import OutputDeniedError
from nexus_mcp.policy.redaction import (
    DEFAULT_BASE64_LIMIT,
    DEFAULT_HEX_LIMIT,
    MIN_SCANNED_CHARS,
    Span,
    cut,
)

if TYPE_CHECKING:
    # The detectors (detect-secrets) load with the first scanner built, not with the
    # configuration: every command reads this section, only a server scans (issue 29).
    from nexus_mcp.policy.secret_scan import SecretScanner

OutputScanMode = Literal["redact", "refuse", "audit", "off"]
NATIVE_SERVER_ID = "nexus"
ACTION_REDACTED = "redacted"
ACTION_REFUSED = "refused"
ACTION_AUDITED = "audited"
MAX_AUDITED_HASHES = 32
# How deep a structured result is walked; deeper values are judged as their JSON text.
MAX_DEPTH = 64


class OutputScanSettings(BaseModel):
    """The ``output_scanning`` section of ``nexus.yaml`` (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: OutputScanMode = Field(
        default="redact", description="redact | refuse | audit | off, for every result"
    )
    tools: dict[str, OutputScanMode] = Field(
        default_factory=dict, description="tool name (as the client calls it) -> mode"
    )
    servers: dict[str, OutputScanMode] = Field(
        default_factory=dict, description="server id ('nexus': the native tools) -> mode"
    )
    entropy_limit: float = Field(
        default=DEFAULT_BASE64_LIMIT,
        ge=0,
        le=8,
        description="Shannon entropy a quoted base64 string must exceed to count as a secret",
    )
    hex_entropy_limit: float = Field(
        default=DEFAULT_HEX_LIMIT,
        ge=0,
        le=8,
        description="Shannon entropy a quoted hex string must exceed to count as a secret",
    )

    def mode_for(self, server_id: str | None, tool: str) -> OutputScanMode:
        found = self.tools.get(tool)
        if found is not None:
            return found
        return self.servers.get(server_id or NATIVE_SERVER_ID, self.mode)

    def scanner(self) -> SecretScanner:
        from nexus_mcp.policy.secret_scan import SecretScanner

        return SecretScanner(base64_limit=self.entropy_limit, hex_limit=self.hex_entropy_limit)


@dataclass
class Findings:
    """What one result held: each finding's kind and the sha256 of its value."""

    found: list[tuple[str, str]] = field(default_factory=list)

    def add(self, text: str, spans: Sequence[Span]) -> None:
        for span in spans:
            value = text[span.start : span.end].encode("utf-8", "surrogatepass")
            self.found.append((span.kind, hashlib.sha256(value).hexdigest()))

    def __bool__(self) -> bool:
        return bool(self.found)

    @property
    def kinds(self) -> list[str]:
        return sorted({kind for kind, _ in self.found})

    def audit_record(self, mode: OutputScanMode, action: str) -> dict[str, Any]:
        """The audit's ``output_scan`` field: never a value, only kinds, counts, hashes."""
        hashes = sorted({digest for _, digest in self.found})
        return {
            "mode": mode,
            "action": action,
            "count": len(self.found),
            "kinds": dict(sorted(Counter(kind for kind, _ in self.found).items())),
            "sha256": hashes[:MAX_AUDITED_HASHES],
        }


def scan_texts(scanner: SecretScanner, texts: Sequence[str], findings: Findings) -> list[str]:
    """Text parts of one result, redacted. The parts are also scanned joined, so a secret
    split across two of them (an upstream's content blocks) is found and cut in each."""
    out = []
    for text in texts:
        spans = scanner.spans(text)
        findings.add(text, spans)
        out.append(cut(text, spans) if spans else text)
    if len(out) > 1:
        out = _cut_across(scanner, out, findings)
    return out


def _cut_across(scanner: SecretScanner, texts: list[str], findings: Findings) -> list[str]:
    joined = "".join(texts)
    spans = [
        s for s in scanner.spans(joined) if not _inside_one(texts, s)
    ]  # what no part held alone
    if not spans:
        return texts
    findings.add(joined, spans)
    out: list[str] = []
    offset = 0
    for text in texts:
        end = offset + len(text)
        local = [
            Span(max(s.start, offset) - offset, min(s.end, end) - offset, s.kind)
            for s in spans
            if s.start < end and s.end > offset
        ]
        out.append(cut(text, local) if local else text)
        offset = end
    return out


def _inside_one(texts: Sequence[str], span: Span) -> bool:
    offset = 0
    for text in texts:
        end = offset + len(text)
        if offset <= span.start and span.end <= end:
            return True
        offset = end
    return False


def scan_structured(scanner: SecretScanner, value: Any, findings: Findings) -> Any:
    """A JSON value with every string (and object key) scanned; unchanged parts are kept as
    the same objects, so a clean result costs no copy."""
    return _walk(scanner, value, None, findings, 0)


_SCALARS = frozenset({int, float, bool})


def _walk(
    scanner: SecretScanner, value: Any, key: str | None, findings: Findings, depth: int
) -> Any:
    if isinstance(value, str):
        if len(value) < MIN_SCANNED_CHARS:
            return value  # what ``spans`` answers for it, without the call
        spans = scanner.spans(value, key=key, whole=True)
        if not spans:
            return value
        findings.add(value, spans)
        return cut(value, spans)
    if depth >= MAX_DEPTH:
        # Deeper than any real result: judged as its JSON text, and where that holds a
        # secret the whole subtree becomes that text, redacted (no deeper walk to smuggle in).
        text = json.dumps(value, ensure_ascii=False, default=str)
        spans = scanner.spans(text)
        if not spans:
            return value
        findings.add(text, spans)
        return cut(text, spans)
    if isinstance(value, Mapping):
        changed = False
        out: dict[str, Any] = {}
        for name, item in value.items():
            # A short key, a number, a boolean or null is returned by _walk as it is: the
            # call is skipped for them (most members of a result).
            named = isinstance(name, str)
            new_name = (
                _walk(scanner, name, None, findings, depth + 1)
                if named and len(name) >= MIN_SCANNED_CHARS
                else name
            )
            new_item = (
                item
                if item is None or type(item) in _SCALARS
                else _walk(scanner, item, name if named else None, findings, depth + 1)
            )
            changed = changed or new_name is not name or new_item is not item
            while new_name in out:  # two keys redacted to the same marker both stay
                new_name = f"{new_name}~"
            out[new_name] = new_item
        return out if changed else value
    if isinstance(value, list | tuple):
        items = [_walk(scanner, item, key, findings, depth + 1) for item in value]
        if any(new is not old for new, old in zip(items, value, strict=True)):
            return items
        return value
    return value


def decide(
    mode: OutputScanMode,
    findings: Findings,
    record: Callable[[dict[str, Any]], None],
) -> bool:
    """After a scan: record what was found and done; refuse in ``refuse`` mode. True when
    the redacted result is the one to deliver (``redact``), False when the original is."""
    if not findings:
        return False
    if mode == "refuse":
        record(findings.audit_record(mode, ACTION_REFUSED))
        raise OutputDeniedError(kinds=",".join(findings.kinds), count=len(findings.found))
    if mode == "audit":
        record(findings.audit_record(mode, ACTION_AUDITED))
        return False
    record(findings.audit_record(mode, ACTION_REDACTED))
    return True


__all__ = [
    "ACTION_AUDITED",
    "ACTION_REDACTED",
    "ACTION_REFUSED",
    "NATIVE_SERVER_ID",
    "Findings",
    "OutputScanMode",
    "OutputScanSettings",
    "decide",
    "scan_structured",
    "scan_texts",
]
