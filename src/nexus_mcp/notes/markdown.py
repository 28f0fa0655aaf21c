"""Markdown headings as Knowtation derives them: texts, levels, slugs and body availability.

Knowtation parses with remark-parse (CommonMark, no GFM) and walks the mdast tree. This
module parses with the tuned markdown-it-py of ``commonmark.py`` and rebuilds the parts of that
tree the outputs depend on: each heading's flattened text (children joined with a space),
its lines, and which top-level blocks hold content.

Inline content is parsed lazily: always for headings, and for other blocks only until
one piece of content is found, so the cost stays linear in note size for real notes.
markdown-it's link-label scan is quadratic on nested or unclosed brackets, so that work
is estimated before each inline parse and a note over budget is refused.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from markdown_it.token import Token

from nexus_mcp.notes.commonmark import PARSER
from nexus_mcp.notes.javascript import collapse_js_whitespace, is_js_blank, js_trim

# Estimated link-label scan steps per note (about 50 ns each): a few seconds at most.
MAX_LABEL_SCAN_WORK = 50_000_000

BYTE_ORDER_MARK = "\ufeff"

_CONTENT_LEAF_TYPES = frozenset({"text", "text_special", "code_inline", "html_inline"})
_TEXT_TYPES = frozenset({"text", "text_special"})
# Characters that may start inline syntax which consumes non-space characters without
# producing text; emphasis markers may vanish too, so they prove nothing either.
_SYNTAX_START = frozenset("[]<`&\\!")
_EMPHASIS_MARKERS = frozenset("*_")
_NON_SLUG_RE = re.compile(r"[^a-z0-9-]+")
_HYPHEN_RUN_RE = re.compile(r"-{2,}")
_BRACKET_RE = re.compile(r"[\[\]]")


class MarkdownTooComplexError(ValueError):
    """The note would take the parser super-linear time (deeply nested or unclosed brackets)."""


@dataclass(frozen=True)
class HeadingNode:
    """One heading of the parse, in document order, wherever it is nested."""

    level: int
    text: str
    start_line: int
    end_line: int  # inclusive: a setext heading ends on its underline


@dataclass(frozen=True)
class ParsedBody:
    headings: tuple[HeadingNode, ...]
    # Start lines, ascending, of top-level non-heading blocks that hold content.
    content_block_starts: tuple[int, ...]


def to_slug(value: str) -> str:
    """Knowtation's ``normalizeSlug``: lowercase, ``[a-z0-9-]`` only, hyphen runs collapsed."""
    return _HYPHEN_RUN_RE.sub("-", _NON_SLUG_RE.sub("-", value.lower())).strip("-")


def normalize_heading_text(raw: str) -> str:
    """NFC, then JavaScript whitespace runs to one space, then a JavaScript trim."""
    return js_trim(collapse_js_whitespace(unicodedata.normalize("NFC", raw)))


def parse_body(body: str) -> ParsedBody:
    """Parse a note body once; raises ``MarkdownTooComplexError`` or ``RecursionError``."""
    env: dict[str, Any] = {}
    # micromark drops a byte order mark at the start of the document; markdown-it keeps it.
    tokens = PARSER.parse(body.removeprefix(BYTE_ORDER_MARK), env)
    budget = [MAX_LABEL_SCAN_WORK]
    headings: list[HeadingNode] = []
    starts: list[int] = []
    heading_children: list[Token] | None = None
    block_start, in_heading_block, has_content = 0, False, False
    for index, token in enumerate(tokens):
        if token.level == 0 and token.nesting >= 0:
            block_start = _start_line(token)
            in_heading_block, has_content = token.type == "heading_open", False
        if token.type == "heading_open":
            heading_children = _parse_inline(tokens[index + 1].content, env, budget)
            start_line, end_line = token.map or (0, 1)
            text = normalize_heading_text(_flatten_heading(heading_children))
            headings.append(HeadingNode(int(token.tag[1:]), text, start_line, end_line - 1))
        elif token.type == "inline":
            children, heading_children = heading_children, None
            if in_heading_block or has_content:
                pass
            elif children is None and _starts_with_plain_text(token.content):
                has_content = True
            else:
                if children is None:
                    children = _parse_inline(token.content, env, budget)
                has_content = _has_inline_content(children)
        elif not in_heading_block and not has_content:
            has_content = _is_content_leaf(token)
        if token.level == 0 and token.nesting <= 0 and has_content and not in_heading_block:
            starts.append(block_start)
    return ParsedBody(tuple(headings), tuple(starts))


def compute_body_availability(parsed: ParsedBody, count: int) -> list[bool]:
    """``body_available`` for the first ``count`` headings.

    A heading has a body when a top-level non-heading block with content starts after it
    ends and no later than the next heading (of the whole parse) at the same or a higher
    level starts. A top-level block shares its first line only with a heading it contains,
    and it starts before that heading, so comparing lines reproduces remark's offsets.
    """
    headings = parsed.headings
    boundaries: list[int | None] = [None] * len(headings)
    stack: list[int] = []
    for index in range(len(headings) - 1, -1, -1):
        level = headings[index].level
        while stack and headings[stack[-1]].level > level:
            stack.pop()
        boundaries[index] = headings[stack[-1]].start_line if stack else None
        stack.append(index)
    starts = parsed.content_block_starts
    result: list[bool] = []
    for index in range(min(count, len(headings))):
        position = bisect_right(starts, headings[index].end_line)
        boundary = boundaries[index]
        result.append(position < len(starts) and (boundary is None or starts[position] <= boundary))
    return result


def _start_line(token: Token) -> int:
    return token.map[0] if token.map else 0


def _parse_inline(content: str, env: dict[str, Any], budget: list[int]) -> list[Token]:
    budget[0] -= _estimate_label_scan_work(content)
    if budget[0] < 0:
        raise MarkdownTooComplexError("link-label scan budget exceeded")
    children: list[Token] = []
    PARSER.inline.parse(content, PARSER, env, children)
    return children


def _estimate_label_scan_work(content: str) -> int:
    """Characters markdown-it scans for link labels: each ``[`` to its ``]`` or the end."""
    if "[" not in content:
        return 0
    open_positions: list[int] = []
    work = 0
    for match in _BRACKET_RE.finditer(content):
        if match.group() == "[":
            open_positions.append(match.start())
        elif open_positions:
            work += match.start() - open_positions.pop()
    return work + sum(len(content) - position for position in open_positions)


def _starts_with_plain_text(content: str) -> bool:
    """True when text before any inline syntax holds a non-space character.

    Such a character can only become part of a text node, so the block has content.
    """
    for char in content:
        if char in _SYNTAX_START:
            return False
        if char not in _EMPHASIS_MARKERS and not is_js_blank(char):
            return True
    return False


def _is_content_leaf(token: Token) -> bool:
    if token.type == "hr":
        return True
    if token.type in ("fence", "code_block", "html_block"):
        return not is_js_blank(token.content)
    return False


def _has_inline_content(children: list[Token]) -> bool:
    for child in children:
        if child.type in _CONTENT_LEAF_TYPES and not is_js_blank(child.content):
            return True
        if child.type == "image" and not is_js_blank(_to_alt_text(child.children or [])):
            return True
    return False


def _to_alt_text(children: list[Token]) -> str:
    """mdast-util-to-string of an image label: leaf values concatenated, breaks dropped."""
    parts: list[str] = []
    for child in children:
        if child.type in _CONTENT_LEAF_TYPES:
            parts.append(child.content)
        elif child.type == "softbreak":
            parts.append("\n")
        elif child.type == "image":
            parts.append(_to_alt_text(child.children or []))
    return "".join(parts)


def _flatten_heading(children: list[Token]) -> str:
    """Rebuild the heading's mdast children and join their texts with single spaces.

    mdast merges adjacent text (line endings included) into one text node, and every
    container joins its children with a space, so node boundaries decide the spacing.
    """
    root: list[object] = []
    stack = [root]
    for child in children:
        siblings = stack[-1]
        if child.type in _TEXT_TYPES or child.type == "softbreak":
            value = "\n" if child.type == "softbreak" else child.content
            if siblings and isinstance(siblings[-1], _Text):
                siblings[-1].value += value
            else:
                siblings.append(_Text(value))
        elif child.type == "hardbreak":
            siblings.append(" ")
        elif child.type in ("code_inline", "html_inline"):
            siblings.append(child.content)
        elif child.type == "image":
            siblings.append(_to_alt_text(child.children or []))
        elif child.nesting == 1:
            container: list[object] = []
            siblings.append(container)
            stack.append(container)
        elif child.nesting == -1 and len(stack) > 1:
            stack.pop()
    return _join_nodes(root)


class _Text:
    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value


def _join_nodes(nodes: list[object]) -> str:
    parts: list[str] = []
    for node in nodes:
        if isinstance(node, _Text):
            parts.append(node.value)
        elif isinstance(node, list):
            parts.append(_join_nodes(node))
        else:
            parts.append(str(node))
    return " ".join(parts)
