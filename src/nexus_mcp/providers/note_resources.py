"""Native note resources: each Markdown note of the caller's vault as ``nexus://notes/{path*}``.

One resource template, read through the notes rules (``nexus_mcp.notes``): the path after
``nexus://notes/`` is percent-decoded strictly (invalid UTF-8 is refused, never replaced),
then normalized as the notes tools normalize theirs (backslashes, no ``..``, no leading
``/``, no drive, no NUL); the vault is the one the notes tools read for this principal
(``VaultRouter``), walked beneath its root on directory descriptors with the same hidden
server state, link and hard-link refusals. Only ``.md`` and ``.markdown`` files are notes:
anything else, a folder and a missing file alike are ``Upstream 404``, and a refused path is
``Invalid path``, exactly as the notes tools answer. A file over ``limits.max_read_bytes``
is ``DOC_SIZE_EXCEEDED``, found before it is read. A refusal is raised as its typed
``NexusError`` (never holding the URI, the path or note content); the chain's envelope
layer sends it as the envelope of a ``resources/read`` (``envelope.to_request_error``).

A content is the file's bytes as stored: text when they are UTF-8 (so its UTF-8 encoding is
those bytes), else a blob; ``mimeType`` is ``text/markdown`` and ``_meta["nexus/sha256"]``
the sha256 of those bytes. A text is scanned for secrets first, as the notes tools' results
are (output scanning, server ``nexus``): redacted (the hash then of the text delivered),
refused (``OUTPUT_DENIED``) or audited.

No listing: ``resources/list`` would walk a whole vault on every page (FastMCP pages after
listing everything), per principal, for vaults of tens of thousands of notes; the file
tools (``nexus_list_files``, ``nexus_glob``) already find notes, bounded. FastMCP's own path
screening is off for this template (``security=None``): it answers a refused path with the
URI in the message; the notes normalizer is the screening.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import unquote_to_bytes

from fastmcp import FastMCP
from fastmcp.exceptions import ResourceError
from fastmcp.resources import ResourceContent, ResourceResult, ResourceTemplate

from nexus_mcp.calls import current_principal
from nexus_mcp.connector import ResultScanner
from nexus_mcp.errors import NexusError, UpstreamError
from nexus_mcp.notes.backends import NOT_FOUND_STATUS, NoteFileReader
from nexus_mcp.notes.paths import PATH_SEPARATOR, normalize_note_path
from nexus_mcp.notes.vaults import VaultRouter
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.hashing import sha256_hex
from nexus_mcp.policy.output_scanning import NATIVE_SERVER_ID

TOOLSET = "notes"
NOTES_URI_PREFIX = "nexus://notes/"
NOTES_URI_TEMPLATE = NOTES_URI_PREFIX + "{path*}"
MARKDOWN_MIME_TYPE = "text/markdown"
META_SHA256 = "nexus/sha256"
MARKDOWN_SUFFIXES = (".md", ".markdown")
# A URI's query and fragment are no part of a note's name (a '?' or '#' in a name is
# written %3F, %23): a note URI that has one names no note.
_NOT_IN_NOTE_URI = frozenset("?#")

# The text of the FastMCP error a refusal travels in (never sent: the refusal is).
REFUSED = "note refused"

log = get_logger(__name__)


class NoteResourceTemplate(ResourceTemplate):
    """``nexus://notes/{path*}``: one Markdown note of the caller's vault, read whole."""

    _vaults: VaultRouter | None = None
    _max_bytes: int = 0
    _scanner: ResultScanner | None = None

    @classmethod
    def build(
        cls, vaults: VaultRouter, *, max_bytes: int, scanner: ResultScanner | None = None
    ) -> NoteResourceTemplate:
        template = cls(
            uri_template=NOTES_URI_TEMPLATE,
            name="note",
            title="Note",
            description=(
                "One Markdown note of your vault, whole, by its vault-relative path "
                "(percent-encoded, e.g. nexus://notes/inbox/reading-list.md)."
            ),
            mime_type=MARKDOWN_MIME_TYPE,
            parameters={
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
            tags={TOOLSET},
            meta={"nexus": {"risk": "read", "toolset": TOOLSET}},
            security=None,  # the notes normalizer screens (module docstring)
        )
        template._vaults = vaults
        template._max_bytes = max_bytes
        template._scanner = scanner
        return template

    def matches(self, uri: str) -> dict[str, Any] | None:
        # Every URI under the prefix is this template's, so each gets the notes answer
        # (FastMCP's unknown-resource answer would quote it).
        if not uri.startswith(NOTES_URI_PREFIX):
            return None
        return {"path": uri[len(NOTES_URI_PREFIX) :]}

    async def _read(self, uri: str, params: dict[str, Any]) -> ResourceResult:
        started = time.perf_counter()
        size: int | None = None
        error: NexusError | None = None
        try:
            data = await self._read_note(params.get("path"))
            size = len(data)
            content = to_note_content(data)
            if self._scanner is not None and isinstance(content.content, str):
                # The same note through a notes tool is scanned: so is it here.
                (text,) = self._scanner.texts(NATIVE_SERVER_ID, self.name, [content.content])
                if text is not content.content:
                    content = to_note_content(text.encode("utf-8", "surrogatepass"))
            return ResourceResult([content])
        except NexusError as exc:
            error = exc
            # FastMCP logs a resource's own exception as an error with its traceback; a
            # refusal is an expected outcome. Its own error at debug level passes through,
            # and the envelope layer sends the refusal it carries (envelope.request_refusal).
            raise ResourceError(REFUSED, log_level=logging.DEBUG) from exc
        finally:
            log.info("notes_resource", **to_log_record(time.perf_counter() - started, size, error))

    async def _read_note(self, raw: object) -> bytes:
        principal = current_principal()
        vaults = self._vaults
        if principal is None or vaults is None:  # never read without a caller
            raise UpstreamError.runtime_failure()
        path = normalize_note_path(decode_note_path(raw))
        if not is_markdown_name(path):
            raise UpstreamError.status(NOT_FOUND_STATUS)  # not a note: as a missing one
        backend = vaults.backend_for(principal)
        if not isinstance(backend, NoteFileReader):  # the canister serves no files
            raise UpstreamError.runtime_failure()
        return await backend.read_note_bytes(path, principal, max_bytes=self._max_bytes)


def decode_note_path(raw: object) -> str:
    """The note path a URI's rest names: percent-decoded once, strictly UTF-8."""
    if not isinstance(raw, str) or any(c in _NOT_IN_NOTE_URI for c in raw):
        raise UpstreamError.invalid_path()
    try:
        return unquote_to_bytes(raw).decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise UpstreamError.invalid_path() from None


def is_markdown_name(path: str) -> bool:
    name = path.rpartition(PATH_SEPARATOR)[2]
    return name.lower().endswith(MARKDOWN_SUFFIXES)


def to_note_content(data: bytes) -> ResourceContent:
    """The note as one content: text when its bytes are UTF-8, else a blob; hashed."""
    meta = {META_SHA256: sha256_hex(data)}
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return ResourceContent(data, mime_type=MARKDOWN_MIME_TYPE, meta=meta)
    return ResourceContent(text, mime_type=MARKDOWN_MIME_TYPE, meta=meta)


def to_log_record(elapsed_s: float, size: int | None, error: NexusError | None) -> dict[str, Any]:
    """The bounded log record of one note read: outcome class, status class, elapsed time
    and size; never the URI, the path or content."""
    outcome, status_class = "ok", None
    if error is not None:
        outcome = str(error.facts.get("outcome") or error.code)
        status = error.facts.get("status")
        status_class = f"{status // 100}xx" if isinstance(status, int) else None
    return {
        "outcome": outcome,
        "upstream_status_class": status_class,
        "elapsed_ms": round(max(elapsed_s, 0.0) * 1000, 3),
        "size_bytes": size,
    }


def register_note_resources(
    mcp: FastMCP[Any], vaults: VaultRouter, *, max_bytes: int, scanner: ResultScanner | None = None
) -> NoteResourceTemplate:
    template = NoteResourceTemplate.build(vaults, max_bytes=max_bytes, scanner=scanner)
    mcp.add_template(template)
    return template


__all__ = [
    "MARKDOWN_MIME_TYPE",
    "META_SHA256",
    "NOTES_URI_PREFIX",
    "NOTES_URI_TEMPLATE",
    "NoteResourceTemplate",
    "decode_note_path",
    "is_markdown_name",
    "register_note_resources",
    "to_note_content",
]
