"""Knowtation-compatible notes core: one-note, body-free views over a local or hosted vault.

The tool layer calls ``read_note_view(backend, kind, raw_path, caller)`` and registers one
tool per entry of ``TOOL_VIEWS``; everything here is plain Python without FastMCP.
"""

from typing import TYPE_CHECKING, Any

from nexus_mcp.notes.backends import LocalVaultBackend, NoteBackend
from nexus_mcp.notes.builders import (
    DOCUMENT_TREE_SCHEMA,
    MAX_FACET_VALUE_CHARS,
    MAX_FACET_VALUES,
    MAX_NOTE_HEADINGS,
    MAX_NOTE_INPUT_CHARS,
    METADATA_FACETS_SCHEMA,
    NOTE_OUTLINE_SCHEMA,
    SECTION_SOURCE_SCHEMA,
    build_document_tree,
    build_metadata_facets,
    build_note_outline,
    build_section_source,
)
from nexus_mcp.notes.paths import normalize_note_path
from nexus_mcp.notes.source import NoteSource
from nexus_mcp.notes.views import TOOL_VIEWS, VIEW_KINDS, ViewKind, read_note_view, to_log_record

if TYPE_CHECKING:
    from nexus_mcp.notes.canister import CanisterBackend


def __getattr__(name: str) -> Any:
    # The hosted backend (and the HTTP client it is built on) loads when it is asked for:
    # a local vault never needs it (issue 29).
    if name == "CanisterBackend":
        from nexus_mcp.notes.canister import CanisterBackend

        return CanisterBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DOCUMENT_TREE_SCHEMA",
    "MAX_FACET_VALUES",
    "MAX_FACET_VALUE_CHARS",
    "MAX_NOTE_HEADINGS",
    "MAX_NOTE_INPUT_CHARS",
    "METADATA_FACETS_SCHEMA",
    "NOTE_OUTLINE_SCHEMA",
    "SECTION_SOURCE_SCHEMA",
    "TOOL_VIEWS",
    "VIEW_KINDS",
    "CanisterBackend",
    "LocalVaultBackend",
    "NoteBackend",
    "NoteSource",
    "ViewKind",
    "build_document_tree",
    "build_metadata_facets",
    "build_note_outline",
    "build_section_source",
    "normalize_note_path",
    "read_note_view",
    "to_log_record",
]
