"""Numbers canonical JSON cannot write: found anywhere, still fingerprinted for the audit."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_mcp.policy.hashing import (
    digest_arguments,
    fingerprint_arguments,
    first_unrepresentable,
    is_representable,
)

LIMIT = sys.get_int_max_str_digits()
NAN, INF = math.nan, math.inf

# Any JSON value the reader can produce, representable numbers only.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@pytest.mark.parametrize(
    ("number", "representable"),
    [
        (0, True),
        (-(2**63), True),
        (10 ** (LIMIT - 1), True),  # exactly LIMIT digits
        (-(10 ** (LIMIT - 1)), True),
        (10**LIMIT, False),  # one digit more
        (-(10**LIMIT), False),
        (10**5000, False),
        (1e308, True),
        (-0.0, True),
        (NAN, False),
        (INF, False),
        (-INF, False),
        (float("1e999"), False),
    ],
    ids=[
        "zero",
        "int64-min",
        "limit-digits",
        "minus-limit-digits",
        "limit-plus-one-digits",
        "minus-limit-plus-one",
        "5000-digits",
        "1e308",
        "minus-zero",
        "nan",
        "inf",
        "minus-inf",
        "1e999",
    ],
)
def test_numbers_are_representable_unless_non_finite_or_past_the_digit_limit(
    number: int | float, representable: bool
) -> None:
    assert is_representable(number) is representable


@pytest.mark.parametrize(
    ("arguments", "found"),
    [
        ({"path": "a", "n": 1, "flag": True}, None),
        ({"path": NAN}, "path"),
        ({"ok": 1, "bad": [1, 2, {"deep": [[INF]]}]}, "bad"),
        ({"ok": {"a": [-INF]}, "bad": NAN}, "ok"),  # the first argument holding one
        ({"big": [10**5000]}, "big"),
        ({"text": "NaN", "also": "Infinity"}, None),  # strings are not numbers
        ({"tuple": (1, NAN)}, "tuple"),
        ({}, None),
    ],
    ids=["plain", "top-level", "nested", "first-wins", "huge-int", "strings", "tuple", "empty"],
)
def test_first_unrepresentable_names_the_argument_holding_one_at_any_depth(
    arguments: dict[str, Any], found: str | None
) -> None:
    assert first_unrepresentable(arguments) == found


def test_depth_costs_no_stack() -> None:
    value: Any = NAN
    for _ in range(sys.getrecursionlimit() * 3):
        value = [value]
    assert first_unrepresentable({"deep": value}) == "deep"


@given(json_values)
def test_representable_arguments_are_fingerprinted_as_they_are_digested(value: Any) -> None:
    arguments = {"value": value, "idempotency_key": "k"}
    assert first_unrepresentable(arguments) is None
    exclude = frozenset({"idempotency_key"})
    assert fingerprint_arguments(arguments, exclude=exclude) == digest_arguments(
        arguments, exclude=exclude
    )


def test_unrepresentable_arguments_still_get_a_stable_distinct_fingerprint() -> None:
    cases: list[dict[str, Any]] = [
        {"x": NAN},
        {"x": INF},
        {"x": -INF},
        {"x": [10**5000]},
        {"x": [10**5000 + 1]},
        {"x": "nan"},
        {"x": "inf"},
    ]
    prints = [fingerprint_arguments(args) for args in cases]
    assert len(set(prints)) == len(cases)
    assert fingerprint_arguments({"x": NAN}) == fingerprint_arguments({"x": float("nan")})
    with pytest.raises(ValueError):
        digest_arguments({"x": NAN})  # what binds arguments never binds these
