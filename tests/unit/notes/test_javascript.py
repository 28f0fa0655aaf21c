"""JavaScript value semantics: whitespace, UTF-16 lengths, String(value), Date."""

from __future__ import annotations

import math

import pytest

from nexus_mcp.notes.javascript import (
    JsDate,
    collapse_js_whitespace,
    js_trim,
    js_trim_end,
    to_js_number_string,
    to_js_property_key,
    to_js_string,
    utf16_length,
    utf16_prefix,
)


def test_js_trim_strips_feff_but_keeps_0085_and_information_separators() -> None:
    assert js_trim("\ufeff\u00a0 x \u3000\ufeff") == "x"
    assert js_trim("\u0085x\u001c") == "\u0085x\u001c"
    assert js_trim_end("x \r\n\t\ufeff") == "x"
    assert js_trim_end("x\u001f") == "x\u001f"
    assert collapse_js_whitespace("a \u2028\ufeff b\u0085c") == "a b\u0085c"


def test_utf16_length_counts_astral_characters_twice() -> None:
    assert utf16_length("abc") == 3
    assert utf16_length("\U0001f600") == 2
    assert utf16_length("a\U0001f600b") == 4


def test_utf16_prefix_cuts_code_units_and_may_leave_a_lone_surrogate() -> None:
    assert utf16_prefix("ab\U0001f600", 3) == "ab\ud83d"
    assert utf16_prefix("ab\U0001f600", 4) == "ab\U0001f600"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.5, "1.5"),
        (1.50, "1.5"),
        (12.0, "12"),
        (-0.0, "0"),
        (100.0, "100"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1.5e-7, "1.5e-7"),
        (0.000001, "0.000001"),
        (123e-20, "1.23e-18"),
        (2**53 + 2, "9007199254740994"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
        (math.nan, "NaN"),
        (0.1 + 0.2, "0.30000000000000004"),
    ],
)
def test_numbers_render_like_javascript(value: float, text: str) -> None:
    assert to_js_number_string(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (12, "12"),
        (10**400, "Infinity"),
        ("  x  ", "  x  "),
        (["a", "b", "c"], "a,b,c"),
        (["a", None, ["b", "c"], 1.0], "a,,b,c,1"),
        ({"a": 1}, "[object Object]"),
        ([{"a": 1}, []], "[object Object],"),
        (b"\x01\x02", "1,2"),
    ],
)
def test_to_js_string_matches_javascript_string(value: object, text: str) -> None:
    assert to_js_string(value) == text


def test_to_js_string_renders_a_cycle_as_empty_like_array_join() -> None:
    cyclic: list[object] = [1]
    cyclic.append(cyclic)
    assert to_js_string(cyclic) == "1,"


def test_property_keys_stringify_like_js_yaml() -> None:
    assert to_js_property_key(1.0) == "1"
    assert to_js_property_key(["a", {"b": 1}]) == "a,[object Object]"
    with pytest.raises(ValueError):
        to_js_property_key([["nested"]])


def test_dates_roll_over_and_render_in_utc() -> None:
    date = JsDate.from_utc(2024, 0, 5)
    assert date.to_iso_string() == "2024-01-05T00:00:00.000Z"
    assert date.to_js_string() == "Fri Jan 05 2024 00:00:00 GMT+0000 (Coordinated Universal Time)"
    assert JsDate.from_utc(2024, 12, 45).to_iso_string() == "2025-02-14T00:00:00.000Z"
    assert JsDate.from_utc(99, 0, 1).to_iso_string() == "1999-01-01T00:00:00.000Z"
    assert JsDate.from_utc(2024, 0, 1, 25, 61, 0, 500).to_iso_string() == "2024-01-02T02:01:00.500Z"
    assert JsDate.from_utc(9999, 12, 1).to_iso_string() == "+010000-01-01T00:00:00.000Z"
    assert JsDate(math.nan).to_js_string() == "Invalid Date"
    with pytest.raises(ValueError):
        JsDate(math.nan).to_iso_string()
