"""The four body-free views of one note, byte-compatible with Knowtation's builders.

``build_note_outline`` (``knowtation.note_outline/v1``), ``build_document_tree``
(``knowtation.document_tree/v0``), ``build_section_source``
(``knowtation.section_source/v0``) and ``build_metadata_facets``
(``knowtation.metadata_facets/v0``) return plain dicts whose keys are in Knowtation's
order. No view holds body text, snippets, full frontmatter, offsets or absolute paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nexus_mcp.errors import UpstreamError
from nexus_mcp.notes.frontmatter import Frontmatter
from nexus_mcp.notes.javascript import (
    JsDate,
    js_trim,
    js_trim_end,
    to_js_string,
    utf16_length,
    utf16_prefix,
)
from nexus_mcp.notes.markdown import (
    MarkdownTooComplexError,
    ParsedBody,
    compute_body_availability,
    parse_body,
    to_slug,
)
from nexus_mcp.notes.paths import (
    check_normalized_path,
    to_base_name,
    to_facet_path,
    to_folder,
)
from nexus_mcp.notes.source import NoteSource

NOTE_OUTLINE_SCHEMA = "knowtation.note_outline/v1"
DOCUMENT_TREE_SCHEMA = "knowtation.document_tree/v0"
SECTION_SOURCE_SCHEMA = "knowtation.section_source/v0"
METADATA_FACETS_SCHEMA = "knowtation.metadata_facets/v0"

MAX_NOTE_INPUT_CHARS = 1_000_000  # UTF-16 code units of the trimmed body
MAX_NOTE_HEADINGS = 500
MAX_FACET_VALUES = 100
MAX_FACET_VALUE_CHARS = 256  # UTF-16 code units

EMPTY_HEADING_SLUG = "heading"
EMPTY_PATH_SLUG = "note"

_NOTE_EXTENSION_RE = re.compile(r"\.(md|markdown)\Z", re.IGNORECASE | re.ASCII)
_TITLE_SEPARATOR_RE = re.compile(r"[-_]+")
_PROJECT_FOLDER_RE = re.compile(r"projects/([^/]+)")


@dataclass(frozen=True)
class _Outline:
    path: str
    title: str | None
    headings: list[dict[str, Any]]
    truncated: bool
    parsed: ParsedBody


def build_note_outline(path: str, source: NoteSource) -> dict[str, Any]:
    outline = _derive_outline(path, source)
    return {
        "schema": NOTE_OUTLINE_SCHEMA,
        "path": outline.path,
        "title": outline.title,
        "headings": outline.headings,
        "truncated": outline.truncated,
    }


def build_document_tree(path: str, source: NoteSource) -> dict[str, Any]:
    outline = _derive_outline(path, source)
    root: dict[str, Any] = {"children": []}
    stack: list[tuple[int, dict[str, Any]]] = [(0, root)]
    for heading in outline.headings:
        node = {
            "id": heading["id"],
            "level": heading["level"],
            "text": heading["text"],
            "children": [],
        }
        while len(stack) > 1 and stack[-1][0] >= heading["level"]:
            stack.pop()
        stack[-1][1]["children"].append(node)
        stack.append((heading["level"], node))
    return {
        "schema": DOCUMENT_TREE_SCHEMA,
        "path": outline.path,
        "title": outline.title,
        "root": root,
        "truncated": outline.truncated,
    }


def build_section_source(path: str, source: NoteSource) -> dict[str, Any]:
    outline = _derive_outline(path, source)
    path_slug = to_slug(outline.path) or EMPTY_PATH_SLUG
    available = compute_body_availability(outline.parsed, len(outline.headings))
    sections: list[dict[str, Any]] = []
    # (level, heading_path, child_section_ids) of the open ancestors; the root is level 0.
    stack: list[tuple[int, list[str], list[str]]] = [(0, [], [])]
    for heading, body_available in zip(outline.headings, available, strict=True):
        while len(stack) > 1 and stack[-1][0] >= heading["level"]:
            stack.pop()
        section_id = f"{path_slug}:{heading['id']}"
        heading_path = [*stack[-1][1], heading["text"]]
        children: list[str] = []
        stack[-1][2].append(section_id)
        stack.append((heading["level"], heading_path, children))
        sections.append(
            {
                "section_id": section_id,
                "heading_id": heading["id"],
                "level": heading["level"],
                "heading_path": heading_path,
                "heading_text": heading["text"],
                "child_section_ids": children,
                "body_available": body_available,
                "body_returned": False,
                "snippet_returned": False,
            }
        )
    return {
        "schema": SECTION_SOURCE_SCHEMA,
        "path": outline.path,
        "title": outline.title,
        "sections": sections,
        "truncated": outline.truncated,
    }


def build_metadata_facets(path: str, source: NoteSource) -> dict[str, Any]:
    """Facets read from frontmatter only; the body is never looked at (no size cap applies)."""
    facet_path = to_facet_path(path)
    fm = source.frontmatter
    caps = _FacetCaps()
    raw_project = fm.get("project")
    if raw_project is not None:
        project_slug: str | None = to_slug(to_js_string(raw_project))
    else:
        folder_match = _PROJECT_FOLDER_RE.match(facet_path)
        project_slug = to_slug(folder_match.group(1)) if folder_match else None
    return {
        "schema": METADATA_FACETS_SCHEMA,
        "path": facet_path,
        "facets": {
            "project": caps.slug(project_slug) if project_slug else None,
            "tags": caps.slug_list(fm.get("tags")),
            "date": caps.date(fm.get("date")),
            "updated": caps.date(fm.get("updated")),
            "causal_chain_id": caps.optional_slug(fm.get("causal_chain_id")),
            "entity": caps.slug_list(fm.get("entity")),
            "episode_id": caps.optional_slug(fm.get("episode_id")),
        },
        "inferred": {"folder": to_folder(facet_path), "source_type": None},
        "truncated": caps.truncated,
    }


def to_display_title(frontmatter: Frontmatter, path: str) -> str | None:
    """``frontmatter.title`` as ``String(title).trim()``, else the cleaned file base name."""
    raw_title = frontmatter.get("title")
    if raw_title is not None:
        title = js_trim(to_js_string(raw_title))
        if title:
            return title
    base = _NOTE_EXTENSION_RE.sub("", to_base_name(path))
    return js_trim(_TITLE_SEPARATOR_RE.sub(" ", base)) or None


def _derive_outline(path: str, source: NoteSource) -> _Outline:
    safe_path = check_normalized_path(path)
    body = js_trim_end(source.body)
    if len(body) > MAX_NOTE_INPUT_CHARS or utf16_length(body) > MAX_NOTE_INPUT_CHARS:
        raise _refusal("note_too_large")
    try:
        parsed = parse_body(body)
    except (MarkdownTooComplexError, RecursionError):
        raise _refusal("note_too_complex") from None
    headings = []
    for ordinal, heading in enumerate(parsed.headings[:MAX_NOTE_HEADINGS], start=1):
        slug = to_slug(heading.text) or EMPTY_HEADING_SLUG
        headings.append(
            {
                "level": heading.level,
                "text": heading.text,
                "id": f"h{heading.level}-{slug}-{ordinal:04d}",
            }
        )
    return _Outline(
        path=safe_path,
        title=to_display_title(source.frontmatter, safe_path),
        headings=headings,
        truncated=len(parsed.headings) > MAX_NOTE_HEADINGS,
        parsed=parsed,
    )


def _refusal(reason: str) -> UpstreamError:
    error = UpstreamError.runtime_failure()
    error.facts["reason"] = reason
    return error


class _FacetCaps:
    """Knowtation's facet caps; remembers whether any value was cut."""

    def __init__(self) -> None:
        self.truncated = False

    def text(self, value: str) -> str:
        if utf16_length(value) <= MAX_FACET_VALUE_CHARS:
            return value
        self.truncated = True
        return utf16_prefix(value, MAX_FACET_VALUE_CHARS)

    def slug(self, value: str) -> str | None:
        return self.text(to_slug(value)).rstrip("-") or None

    def optional_slug(self, value: object) -> str | None:
        return None if value is None else self.slug(to_js_string(value))

    def date(self, value: object) -> str | None:
        if value is None:
            return None
        if isinstance(value, JsDate):
            try:
                return self.text(value.to_iso_string())
            except ValueError:
                raise _refusal("invalid_date") from None
        return self.text(to_js_string(value))

    def slug_list(self, value: object) -> list[str]:
        if value is None:
            return []
        if isinstance(value, list):
            raw_values: list[object] = list(value)
        else:
            raw_values = [js_trim(item) for item in to_js_string(value).split(",")]
        if len(raw_values) > MAX_FACET_VALUES:
            self.truncated = True
        slugs = (self.slug(to_js_string(raw)) for raw in raw_values[:MAX_FACET_VALUES])
        return [slug for slug in slugs if slug]
