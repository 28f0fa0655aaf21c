"""The CommonMark parser: markdown-it-py tuned to build what remark-parse builds.

Knowtation parses notes with remark-parse (micromark). markdown-it-py's ``commonmark``
preset agrees on almost everything; this module closes the gaps that change headings or
body availability: links are never dropped for their URL scheme, autolink text stays
literal, emphasis neighbours are classified as micromark does (UTF-16 code units,
JavaScript whitespace), and a line after a link reference definition continues the
paragraph micromark keeps open. The core ``inline`` rule is off: callers parse inline
content themselves, lazily.
"""

from __future__ import annotations

import unicodedata

from markdown_it import MarkdownIt
from markdown_it.parser_inline import ParserInline
from markdown_it.rules_block import lheading, paragraph, reference
from markdown_it.rules_block.state_block import StateBlock
from markdown_it.rules_inline.state_inline import Scanned, StateInline
from markdown_it.token import Token
from markdown_it.utils import EnvType

from nexus_mcp.notes.javascript import JS_WHITESPACE

# markdown-it drops content nested deeper than this; remark has no limit. 200 levels
# keeps markdown-it's recursive block parser well inside Python's recursion limit.
NESTING_LIMIT = 200

_EMPHASIS_MARKERS = frozenset("*_")
_OTHER, _WHITESPACE, _PUNCTUATION = 0, 1, 2
_MAX_BMP = 0xFFFF


class _MicromarkDelimiterState(StateInline):
    """Classifies emphasis neighbours as micromark does.

    micromark reads UTF-16 code units, so an astral character (an emoji) next to ``*`` or
    ``_`` counts as a letter, never as punctuation; whitespace is JavaScript's ``\\s``; and
    a run followed or preceded by the other marker may always open or close.
    """

    def scanDelims(self, start: int, canSplitWord: bool) -> Scanned:
        marker = self.src[start]
        end = start
        while end < self.posMax and self.src[end] == marker:
            end += 1
        previous = self.src[start - 1] if start > 0 else " "
        following = self.src[end] if end < self.posMax else " "
        before, after = _classify_neighbour(previous), _classify_neighbour(following)
        opens = after == _OTHER or (after == _PUNCTUATION and before != _OTHER)
        closes = before == _OTHER or (before == _PUNCTUATION and after != _OTHER)
        opens = opens or following in _EMPHASIS_MARKERS
        closes = closes or previous in _EMPHASIS_MARKERS
        if marker == "_":
            opens, closes = (
                opens and (before != _OTHER or not closes),
                closes and (after != _OTHER or not opens),
            )
        return Scanned(opens, closes, end - start)


class _RemarkInlineParser(ParserInline):
    def parse(self, src: str, md: MarkdownIt, env: EnvType, tokens: list[Token]) -> list[Token]:
        state = _MicromarkDelimiterState(src, md, env, tokens)
        self.tokenize(state)
        for rule in self.ruler2.getRules(""):
            rule(state)
        return state.tokens


class _RemarkCompatibleParser(MarkdownIt):
    """markdown-it tuned to build what remark builds from the same text."""

    def __init__(self) -> None:
        super().__init__("commonmark", {"maxNesting": NESTING_LIMIT})
        inline = _RemarkInlineParser()
        inline.ruler, inline.ruler2 = self.inline.ruler, self.inline.ruler2
        self.inline = inline
        self.block.ruler.at("reference", _reference_in_paragraph, {"alt": []})
        self.disable("inline")  # inline content is parsed lazily, see parse_body

    def validateLink(self, url: str) -> bool:
        # remark keeps javascript: and other links as links; markdown-it would unlink them.
        return True

    def normalizeLinkText(self, link: str) -> str:
        # remark keeps an autolink's text literal; markdown-it would percent-decode it.
        return link


def _reference_in_paragraph(state: StateBlock, start: int, end: int, silent: bool) -> bool:
    """Link reference definitions, then the paragraph micromark keeps open after them.

    micromark parses definitions out of paragraph content, so the line after the last
    definition continues that paragraph unless it could interrupt one (an empty list
    item, an ordered list not starting at 1, indented code or a lazy line cannot).
    markdown-it would start a new block there instead.
    """
    if not reference(state, start, end, silent):
        return False
    if silent:
        return True
    line = state.line
    while line < end and reference(state, line, end, False):
        line = state.line
    if line >= end or state.isEmpty(line) or _interrupts_paragraph(state, line, end):
        return True
    indent = state.sCount[line]
    state.sCount[line] = min(indent, state.blkIndent)  # a continuation line may be indented
    try:
        if not lheading(state, line, end, False):
            paragraph(state, line, end, False)
    finally:
        state.sCount[line] = indent
    return True


def _interrupts_paragraph(state: StateBlock, line: int, end: int) -> bool:
    previous_parent = state.parentType
    state.parentType = "paragraph"
    try:
        return any(
            rule(state, line, end, True) for rule in state.md.block.ruler.getRules("paragraph")
        )
    finally:
        state.parentType = previous_parent


def _classify_neighbour(char: str) -> int:
    if char in JS_WHITESPACE:
        return _WHITESPACE
    if ord(char) > _MAX_BMP or unicodedata.category(char)[0] not in "PS":
        return _OTHER
    return _PUNCTUATION


PARSER = _RemarkCompatibleParser()
# Compile the rule chains once at import, so threads never race to build the caches.
PARSER.inline.parse("*a* [b](c)", PARSER, {}, [])
PARSER.parse("# a\n\n> b\n")
