"""The compiled contract check says what jsonschema says, on records near and far from valid."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mcp.policy.contract_check import ContractValidator, compile_contract, ecma_regex
from nexus_mcp.policy.registry import TOOL_CALL_SCHEMA, contract_check, contract_validator

VALID = {
    "tool_call_id": "01a21569-9bbd-7227-9217-4c7c4eb92568",
    "server_id": "nexus",
    "tool_name": "nexus_write_file",
    "args_digest": "a" * 64,
    "tool_class": "write",
    "idempotency_key": "k",
    "expected_document_hashes": [{"pointer": "/content", "hash": "b" * 64}],
    "content_hash_alg": "sha256",
}

# Values that sit on either side of each rule of the tool_call schema.
edge_values = st.sampled_from(
    [
        "",
        "k",
        "k" * 256,
        "k" * 257,
        "a" * 64,
        "A" * 64,
        "a" * 63,
        "nexus",
        "bad name",
        "x" * 128,
        "x" * 129,
        "read",
        "write",
        "execute",
        "sha256",
        "sha1",
        "/content",
        "content",
        "/a~2",
        "/" + "p" * 1023,
        "/" + "p" * 1024,
        "01a21569-9bbd-7227-9217-4c7c4eb92568",
        "01a21569-9bbd-4227-9217-4c7c4eb92568",
        "01a21569-9bbd-7227-9217-4c7c4eb92568\n",
        None,
        7,
        True,
        [],
        {},
        [{"pointer": "/x", "hash": "c" * 64}],
        [{"pointer": "/x"}],
        [{"pointer": "/x", "hash": "c" * 64, "extra": 1}],
        [{"pointer": "/x", "hash": "c" * 64}] * 65,
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(st.sampled_from([*VALID, "extra"]), edge_values, max_size=3),
    st.sets(st.sampled_from(list(VALID)), max_size=2),
)
def test_the_compiled_check_agrees_with_jsonschema(
    changes: dict[str, Any], removed: set[str]
) -> None:
    record = {k: v for k, v in {**VALID, **changes}.items() if k not in removed}
    expected = contract_validator(TOOL_CALL_SCHEMA).is_valid(record)
    assert contract_check(TOOL_CALL_SCHEMA)(record) is expected


def test_the_valid_record_passes_and_a_non_object_does_not() -> None:
    check = contract_check(TOOL_CALL_SCHEMA)
    assert check(VALID) is True
    assert check([VALID]) is False
    assert check("record") is False


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer"},
        {"type": ["string", "null"]},
        {"format": "uuid"},
        {"enum": [1, 2]},
        {"properties": {"a": {"minimum": 0}}},
        {"additionalProperties": {"type": "string"}},
        {"$ref": "#/$defs/x"},
    ],
)
def test_a_schema_outside_the_subset_is_not_compiled(schema: dict[str, Any]) -> None:
    assert compile_contract(schema) is None


# -- patterns are ECMA regexes: Python's ``$`` also matches before a final newline, and its
# ``\d``/``\w`` match any Unicode digit or letter; a contract's ``^...$`` means neither.

TRAILING_NEWLINE = [
    ("tool_name", "nexus_write_file\n"),
    ("server_id", "nexus\n"),
    ("tool_name", "x" * 127 + "\n"),
]


@pytest.mark.parametrize(("field", "value"), TRAILING_NEWLINE)
def test_an_anchored_pattern_refuses_a_trailing_newline(field: str, value: str) -> None:
    record = {**VALID, field: value}
    assert contract_check(TOOL_CALL_SCHEMA)(record) is False
    assert contract_validator(TOOL_CALL_SCHEMA).is_valid(record) is False


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        (r"^[a-z]+$", "abc\n", False),
        (r"^[a-z]+$", "abc", True),
        (r"^\d+$", "\u0661\u0662", False),  # ARABIC-INDIC digits: not ECMA's \d
        (r"^\d+$", "12", True),
        (r"^\w+$", "\u00e9t\u00e9", False),  # accented letters: not ECMA's \w
        (r"^[\w.]+$", "a.b\n", False),
        (r"^[$]+$", "$$", True),  # a dollar inside a class stays a dollar
        (r"^a\$$", "a$", True),  # an escaped dollar too
    ],
)
def test_the_compiled_check_reads_patterns_as_ecma_does(
    pattern: str, value: str, expected: bool
) -> None:
    schema = {"type": "string", "pattern": pattern}
    compiled = compile_contract(schema)
    assert compiled is not None
    assert compiled(value) is expected
    assert ContractValidator(schema).is_valid(value) is expected
    assert (ecma_regex(pattern).search(value) is not None) is expected
