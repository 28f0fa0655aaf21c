"""What an upstream's tool definition says, made safe for the operator's terminal (and the
console's page), and how it differs from the definition it was pinned from (``upstream
check`` and ``pin``, and the console's Upstream pins page).

Everything here is the upstream's text, so it is hostile: it may carry terminal escapes
(``ESC [ 2 J`` clears the screen, OSC 8 writes links, OSC 52 the clipboard), carriage
returns and bidi overrides that make a line read other than it is, or a megabyte of text.
So every character that is not printable in a line (C0 and C1 controls, DEL, Unicode
format characters such as bidi controls and zero-width ones, line and paragraph
separators, surrogates, private use, unassigned) is written as its escape (``\\x1b``,
``\\u202e``); a line is cut at ``MAX_LINE_CHARS``, a field at ``MAX_FIELD_LINES`` and a
diff at ``MAX_DIFF_LINES``, each cut saying how much was left out. Every line of a
definition or a diff is indented under its tool, so none can pass for a status line.
"""

from __future__ import annotations

import difflib
import json
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

MAX_LINE_CHARS = 200
MAX_FIELD_LINES = 400  # lines of one field (a pretty-printed schema) taken for display
MAX_DIFF_LINES = 200  # lines of one tool's diff printed
# The fields shown, in this order (the name is the tool's, already shown).
SHOWN_FIELDS = ("title", "description", "inputSchema", "outputSchema", "annotations")
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
INDENT = "    "


def escape(text: str) -> str:
    """``text`` with every unprintable character written as its escape (module docstring)."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escape_char(c) for c in text)


def _escape_char(char: str) -> str:
    if unicodedata.category(char) not in _UNSAFE_CATEGORIES:
        return char
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """One line of upstream text: escaped, then cut at ``limit`` characters."""
    head = escape(text[: limit + 1])  # never more than this is escaped
    if len(text) <= limit and len(head) <= limit:
        return head
    return f"{head[:limit]}... ({len(text)} characters)"


def field_lines(value: Any) -> list[str]:
    """The display lines of one field's value: text split at its newlines, JSON pretty
    printed with sorted keys; each line safe, at most ``MAX_FIELD_LINES`` of them."""
    if value is None:
        return []
    if not isinstance(value, str):
        value = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    lines = _split(value)
    shown = [safe_line(line) for line in _first(lines, MAX_FIELD_LINES)]
    if len(shown) == MAX_FIELD_LINES and next(lines, None) is not None:
        shown.append("... (the rest of this field is not shown)")
    return shown


def _split(text: str) -> Iterator[str]:
    """Lines at ``\\n`` only: every other separator (``\\r``, ``\\u2028``) is escaped."""
    start = 0
    while True:
        end = text.find("\n", start)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end]
        start = end + 1


def _first(lines: Iterator[str], count: int) -> list[str]:
    taken = []
    for line in lines:
        taken.append(line)
        if len(taken) == count:
            break
    return taken


def changed_fields(pinned: Mapping[str, Any], listed: Mapping[str, Any]) -> list[str]:
    return [name for name in SHOWN_FIELDS if pinned.get(name) != listed.get(name)]


def definition_diff(pinned: Mapping[str, Any] | None, listed: Mapping[str, Any]) -> list[str]:
    """The lines that show ``listed`` against ``pinned`` (None: nothing pinned, the whole
    definition is new), field by field, indented, at most ``MAX_DIFF_LINES``."""
    lines: list[str] = []
    for name in SHOWN_FIELDS:
        before = pinned.get(name) if pinned is not None else None
        after = listed.get(name)
        if pinned is not None and before == after:
            continue
        if pinned is None and after is None:
            continue
        old, new = field_lines(before), field_lines(after)
        hunk = [
            line
            for line in difflib.unified_diff(old, new, n=2, lineterm="")
            if not line.startswith(("---", "+++"))
        ]
        lines.append(f"{name}:")
        if hunk:
            lines.extend(f"  {line}" for line in hunk)
        else:
            lines.append("  (the difference is past what is shown of this field)")
    if len(lines) > MAX_DIFF_LINES:
        left = len(lines) - MAX_DIFF_LINES
        lines = [*lines[:MAX_DIFF_LINES], f"... ({left} more lines of diff not shown)"]
    return [INDENT + line for line in lines]


__all__ = [
    "MAX_DIFF_LINES",
    "MAX_FIELD_LINES",
    "MAX_LINE_CHARS",
    "changed_fields",
    "definition_diff",
    "escape",
    "field_lines",
    "safe_line",
]
