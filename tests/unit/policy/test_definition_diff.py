"""What ``upstream check`` and ``pin`` print of an upstream's definitions: escaped, cut,
and diffed field by field (``policy/definition_diff.py``)."""

from __future__ import annotations

import pytest

from nexus_mcp.policy.definition_diff import (
    MAX_DIFF_LINES,
    MAX_FIELD_LINES,
    MAX_LINE_CHARS,
    definition_diff,
    escape,
    field_lines,
    safe_line,
)

BASE = {
    "name": "echo",
    "title": None,
    "description": "Echo text back.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "outputSchema": None,
    "annotations": {"readOnlyHint": True},
}


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # CSI: clear the screen
        ("\x1b]52;c;ZXZpbA==\x07", "\\x1b]52;c;ZXZpbA==\\x07"),  # OSC 52: the clipboard
        ("\x9b2J", "\\x9b2J"),  # the 8-bit CSI
        ("a\rb", "a\\x0db"),  # a carriage return rewrites the line
        ("a\x7fb", "a\\x7fb"),
        ("\u202eexe.txt", "\\u202eexe.txt"),  # a bidi override
        ("\u2066x\u2069", "\\u2066x\\u2069"),  # bidi isolates
        ("a\u200bb", "a\\u200bb"),  # zero width
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # line and paragraph separators
        ("\ufeff", "\\ufeff"),
        ("\U000e0041", "\\U000e0041"),  # a tag character
        ("\ue000", "\\ue000"),  # private use
        ("plain ascii", "plain ascii"),
        ("café 日本 \\d", "café 日本 \\d"),  # printable text and backslashes stay as written
    ],
)
def test_everything_a_terminal_acts_on_is_written_as_its_escape(raw: str, shown: str) -> None:
    assert escape(raw) == shown


def test_a_line_is_cut_and_says_how_long_it_was() -> None:
    line = safe_line("x" * 1_000_000)
    assert line == "x" * MAX_LINE_CHARS + "... (1000000 characters)"
    escaped = safe_line("\x1b" * 1_000_000)
    assert escaped.startswith("\\x1b" * (MAX_LINE_CHARS // 4))
    assert len(escaped) < MAX_LINE_CHARS + 40 and "\x1b" not in escaped


def test_text_is_split_at_newlines_only_and_a_field_is_cut() -> None:
    assert field_lines("a\nb\rc\u2028d") == ["a", "b\\x0dc\\u2028d"]
    many = field_lines("line\n" * 1_000_000)
    assert len(many) == MAX_FIELD_LINES + 1
    assert many[-1] == "... (the rest of this field is not shown)"
    assert field_lines({"b": 1, "a": "\u202e"}) == ["{", '  "a": "\\u202e",', '  "b": 1', "}"]
    assert field_lines(None) == []


def test_only_the_fields_that_changed_are_diffed_and_every_line_is_indented() -> None:
    listed = {**BASE, "description": "Echo text back.\nadd  pinned, unchanged"}
    lines = definition_diff(BASE, listed)
    assert lines == [
        "    description:",
        "      @@ -1 +1,2 @@",
        "       Echo text back.",
        "      +add  pinned, unchanged",
    ]


def test_a_tool_not_pinned_yet_shows_its_whole_definition() -> None:
    lines = definition_diff(None, BASE)
    assert "    description:" in lines and "      +Echo text back." in lines
    assert "    inputSchema:" in lines and "    annotations:" in lines
    assert "    title:" not in lines  # null fields are not shown


def test_a_difference_past_what_is_shown_is_said() -> None:
    head = "\n".join(["same"] * MAX_FIELD_LINES)
    lines = definition_diff(
        {**BASE, "description": head + "\nold"}, {**BASE, "description": head + "\nnew"}
    )
    assert lines == [
        "    description:",
        "      (the difference is past what is shown of this field)",
    ]


def test_a_diff_is_bounded() -> None:
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}
    other = {"type": "object", "properties": {f"q{i}": {"type": "string"} for i in range(5000)}}
    lines = definition_diff({**BASE, "inputSchema": big}, {**BASE, "inputSchema": other})
    assert len(lines) == MAX_DIFF_LINES + 1
    assert lines[-1].endswith("more lines of diff not shown)")
    assert all(line.startswith("    ") for line in lines)
