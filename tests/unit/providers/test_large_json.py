"""A large JSON text parsed in steps: the same value as ``json.loads``, the same errors,
and the event loop given turns while a page of thousands of definitions is parsed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nexus_mcp.providers.upstream import large_json
from nexus_mcp.providers.upstream.large_json import loads_in_steps
from nexus_mcp.providers.upstream.stdio import parse_large_line

from .conftest import CountTurns

SAMPLES: list[Any] = [
    {},
    [],
    {"a": []},
    {"a": {}},
    "text",
    12,
    -1.5e3,
    None,
    True,
    [1, "two", {"three": [3]}, [[[[4]]]]],
    {"jsonrpc": "2.0", "id": 7, "result": {"tools": [{"name": 'é\u2028\\"x'}], "n": None}},
    {"k": "v", "k2": {"deep": {"deeper": {"deepest": [1, {"x": "\ud83d\ude00"}]}}}},
]


@pytest.mark.parametrize("value", SAMPLES)
@pytest.mark.parametrize("indent", [None, 2])
async def test_the_value_is_json_loads_own(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    for depth in (0, 1, 3, 10):
        assert await loads_in_steps(f" \n{text}\t ", depth=depth) == json.loads(text)


async def test_duplicate_keys_keep_the_last_as_json_loads_does() -> None:
    text = '{"result": {"tools": [1], "tools": [2]}}'
    assert await loads_in_steps(text) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "{",
        "[1,",
        "[1 2]",
        '{"a" 1}',
        '{"a": 1,}',
        "[1,]",
        "{a: 1}",
        '{"a": 1} x',
        '{"a": 1}{}',
        '{"a": [NaN]}',
        '{"a": {"b": {"c": Infinity}}}',
        '{"a": "\x01"}',
        "[-Infinity]",
    ],
)
async def test_what_is_not_json_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        await loads_in_steps(text)


def listing_line(tools: int) -> str:
    padding = "p" * 5000
    definitions = [
        {
            "name": f"bulk_{i:05d}",
            "description": f"Bulk tool {i}. {padding}",
            "inputSchema": {"type": "object", "properties": {"value": {"type": "string"}}},
        }
        for i in range(tools)
    ]
    return json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"tools": definitions}})


async def test_a_large_listing_gives_the_loop_turns_while_it_is_parsed(
    count_turns: CountTurns,
) -> None:
    """Counted, not timed: with a zero slice, the loop gets a turn between definitions."""
    line = listing_line(300)
    value, turns = await count_turns(loads_in_steps(line))
    assert value == json.loads(line)
    assert turns >= 300


async def test_a_large_line_becomes_the_sdk_s_message() -> None:
    line = listing_line(50)
    message = await parse_large_line(line)
    assert not isinstance(message, Exception)
    assert message.message.model_dump(by_alias=True, exclude_none=True) == json.loads(line)
    broken = await parse_large_line(line[:-1])
    assert isinstance(broken, ValueError)
    not_jsonrpc = await parse_large_line(json.dumps({"result": {}}))
    assert isinstance(not_jsonrpc, ValueError)


def test_the_slice_bounds_each_step() -> None:
    """What one step decodes whole is one definition, not the page."""
    steps = large_json._value(listing_line(200), 0, large_json.DEPTH)
    count = sum(1 for _ in steps)
    assert count == 200 + 2  # each definition, then "jsonrpc" and "id" beside "result"
