"""The one entry point of the notes tools: normalize, read once, build one view.

``read_note_view`` refuses an unsafe path before any read, reads the note through the
backend exactly once, and builds the requested body-free view off the event loop.
``to_log_record`` gives the bounded operational log record the tool layer may emit:
tool name, outcome class, upstream status class, elapsed time, section count and the
truncated flag, never a path, heading, body, frontmatter, header or token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from nexus_mcp.errors import UpstreamError
from nexus_mcp.notes.backends import NoteBackend
from nexus_mcp.notes.builders import (
    build_document_tree,
    build_metadata_facets,
    build_note_outline,
    build_section_source,
)
from nexus_mcp.notes.javascript import JsStringTooLongError
from nexus_mcp.notes.paths import normalize_note_path, to_facet_path
from nexus_mcp.notes.source import NoteSource
from nexus_mcp.principal import Principal

ViewKind = Literal["section_source", "outline", "tree", "facets"]
VIEW_KINDS: tuple[ViewKind, ...] = get_args(ViewKind)

# MCP tool name -> view it serves; the tool layer registers exactly these four.
TOOL_VIEWS: Mapping[str, ViewKind] = {
    "get_section_source": "section_source",
    "get_note_outline": "outline",
    "get_document_tree": "tree",
    "get_metadata_facets": "facets",
}

OUTCOME_OK = "ok"
OUTCOME_OTHER = "error"

_BUILDERS: Mapping[ViewKind, Callable[[str, NoteSource], dict[str, Any]]] = {
    "section_source": build_section_source,
    "outline": build_note_outline,
    "tree": build_document_tree,
    "facets": build_metadata_facets,
}


async def read_note_view(
    backend: NoteBackend, kind: ViewKind, raw_path: object, caller: Principal
) -> dict[str, Any]:
    """Return the ``kind`` view of the note at ``raw_path`` in the caller's vault.

    Raises ``UpstreamError`` only: ``Invalid path`` before any read, ``Upstream 401/403/404``
    from the backend, ``Runtime failure`` for anything else (including an over-cap note).
    """
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise ValueError("unknown notes view")  # a wiring bug, never caller input
    path = normalize_note_path(raw_path)
    if kind == "facets":
        to_facet_path(path)  # a path of only '.' segments has no facets: refuse before reading
    source = await backend.read_note(path, caller)
    try:
        # Parsing a large note is CPU work; keep the event loop answering meanwhile.
        return await asyncio.to_thread(builder, path, source)
    except JsStringTooLongError:
        error = UpstreamError.runtime_failure()
        error.facts["reason"] = "frontmatter_value_too_large"
        raise error from None


def to_log_record(
    tool: str,
    *,
    elapsed_s: float,
    view: Mapping[str, Any] | None = None,
    error: BaseException | None = None,
) -> dict[str, Any]:
    """The bounded log record of one notes tool call (a fixed set of safe fields)."""
    outcome, status_class = _classify(error)
    section_count: int | None = None
    truncated: bool | None = None
    if view is not None and error is None:
        section_count = _count_sections(view)
        truncated = view.get("truncated") is True
    return {
        "tool": tool if tool in TOOL_VIEWS else "unknown",
        "outcome": outcome,
        "upstream_status_class": status_class,
        "elapsed_ms": round(max(elapsed_s, 0.0) * 1000, 3),
        "section_count": section_count,
        "truncated": truncated,
    }


def _classify(error: BaseException | None) -> tuple[str, str | None]:
    if error is None:
        return OUTCOME_OK, None
    if isinstance(error, UpstreamError):
        outcome = error.facts.get("outcome")
        status = error.facts.get("status")
        status_class = f"{status // 100}xx" if isinstance(status, int) else None
        return (outcome if isinstance(outcome, str) else OUTCOME_OTHER), status_class
    return OUTCOME_OTHER, None


def _count_sections(view: Mapping[str, Any]) -> int | None:
    for key in ("sections", "headings"):
        items = view.get(key)
        if isinstance(items, list):
            return len(items)
    root = view.get("root")
    if isinstance(root, Mapping):
        return _count_tree_nodes(root)
    return None


def _count_tree_nodes(node: Mapping[str, Any]) -> int:
    count, pending = 0, list(node.get("children", []))
    while pending:
        child = pending.pop()
        count += 1
        pending.extend(child.get("children", []))
    return count


__all__ = ["TOOL_VIEWS", "VIEW_KINDS", "ViewKind", "read_note_view", "to_log_record"]
