"""Frontmatter: the strict split, js-yaml 4 loading rules, and canister JSON."""

from __future__ import annotations

import math

import pytest

from nexus_mcp.notes.frontmatter import (
    load_yaml_frontmatter,
    parse_canister_frontmatter,
    parse_note_frontmatter,
    split_frontmatter,
)
from nexus_mcp.notes.javascript import JsDate


@pytest.mark.parametrize(
    ("content", "block", "body"),
    [
        ("---\ntitle: X\n---\n# Body\n", "title: X", "# Body\n"),
        ("---\r\ntitle: X\r\n---\r\nbody", "title: X", "body"),
        ("---\n\n---\nbody", "", "body"),
        ("---\na\n---\nb\n---\nc", "a", "b\n---\nc"),
        ("---\ntitle: X\n---\n", "title: X", ""),
    ],
)
def test_split_frontmatter_matches_the_strict_pattern(content: str, block: str, body: str) -> None:
    assert split_frontmatter(content) == (block, body)


@pytest.mark.parametrize(
    "content",
    [
        "---\n---\n# x\n",  # empty block written --- newline ---
        "---\ntitle: X\n---",  # closing fence without a newline after it
        "\ufeff---\ntitle: X\n---\n",  # leading BOM
        "\n---\ntitle: X\n---\n",  # leading blank line
        "--- \ntitle: X\n---\n",  # space after the opening fence
        "---\ntitle: X\n--- \n",  # space after the closing fence
        "---\ntitle: X\n...\n",  # '...' is not a closing fence
        "title: X\n---\n",
    ],
)
def test_split_frontmatter_leaves_non_matching_notes_whole(content: str) -> None:
    assert split_frontmatter(content) == (None, content)


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("title: yes", {"title": "yes"}),
        ("title: on", {"title": "on"}),
        ("n: 012", {"n": 12.0}),
        ("n: 0o17", {"n": 15.0}),
        ("n: 0x1F", {"n": 31.0}),
        ("n: 0b101", {"n": 5.0}),
        ("n: 1_000", {"n": 1000.0}),
        ("n: +12.5", {"n": 12.5}),
        ("n: 1e3", {"n": 1000.0}),
        ("n: 1:20", {"n": "1:20"}),
        ("b: True", {"b": True}),
        ("b: FALSE", {"b": False}),
        ("z: ~", {"z": None}),
        ("z: Null", {"z": None}),
        ("z:", {"z": None}),
        ("s: '012'", {"s": "012"}),
        ("s: !!str 5", {"s": "5"}),
        ("list: [a, 1, null]", {"list": ["a", 1.0, None]}),
        ("1: a", {"1": "a"}),
        ("? [a, b]\n: 1", {"a,b": 1.0}),
        (
            "base: &b {title: merged, x: 1}\ntitle: own\n<<: *b",
            {"base": {"title": "merged", "x": 1.0}, "title": "own", "x": 1.0},
        ),
        ("text: |\n  multi\n  line", {"text": "multi\nline\n"}),
        ("a: &x 1\nb: &x 2\nc: *x", {"a": 1.0, "b": 2.0, "c": 2.0}),
    ],
)
def test_yaml_loads_with_js_yaml_core_schema_semantics(
    yaml_text: str, expected: dict[str, object]
) -> None:
    assert load_yaml_frontmatter(yaml_text) == expected


def test_yaml_special_floats_and_timestamps_load_as_javascript_values() -> None:
    loaded = load_yaml_frontmatter(
        "inf: -.inf\nnan: .nan\nday: 2024-01-05\nat: 2024-01-05T10:20:30.5+02:00"
    )
    assert loaded["inf"] == -math.inf
    assert math.isnan(loaded["nan"])
    assert loaded["day"] == JsDate.from_utc(2024, 0, 5)
    assert loaded["at"].to_iso_string() == "2024-01-05T08:20:30.500Z"


@pytest.mark.parametrize(
    "yaml_text",
    [
        "title: a\ntitle: b",  # duplicate keys are an error in js-yaml
        "1: a\n'1': b",  # keys collide once stringified
        "title: [unclosed",
        "title: !!int 'twelve'",
        "title: !!python/object:os.system x",
        "title: !custom x",
        "a: 1\n---\nb: 2",  # two documents
        "bad: \x1c",  # non-printable character
        "- a\n- b",  # not a mapping
        "just a string",
        "0",
        "",
    ],
)
def test_invalid_or_non_mapping_yaml_counts_as_empty(yaml_text: str) -> None:
    assert load_yaml_frontmatter(yaml_text) == {}


def test_invalid_yaml_still_removes_the_block_from_the_body() -> None:
    frontmatter, body = parse_note_frontmatter("---\ntitle: a\ntitle: b\n---\n# Heading\n")
    assert frontmatter == {}
    assert body == "# Heading\n"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, {}),
        ({"title": "Object"}, {"title": "Object"}),
        ('{"title":"Hosted"}', {"title": "Hosted"}),
        ('"{\\"title\\":\\"Twice\\"}"', {"title": "Twice"}),
        ('{\\"title\\":\\"Escaped\\"}', {"title": "Escaped"}),
        ('  {"title":"Trimmed"}\ufeff', {"title": "Trimmed"}),
        ("{}", {}),
        ("", {}),
        ("[1, 2]", {}),
        ("not json", {}),
        (["title"], {}),
        (7, {}),
        ('{"a": NaN}', {}),
    ],
)
def test_canister_frontmatter_parses_like_knowtation(
    value: object, expected: dict[str, object]
) -> None:
    assert parse_canister_frontmatter(value) == expected


def test_canister_frontmatter_that_knowtation_cannot_parse_raises() -> None:
    with pytest.raises(ValueError):
        parse_canister_frontmatter('"a"b"')
