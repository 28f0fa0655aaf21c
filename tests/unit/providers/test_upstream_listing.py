"""The bounded listing and the definition screen, as plain functions (decision tables).

The upstream is a page source standing in for the MCP client (the outside boundary):
``list_tools_mcp(cursor=)`` answering typed ``ListToolsResult`` pages.
"""

from __future__ import annotations

from typing import Any

import mcp_types
import pytest

from nexus_mcp.providers.upstream.listing import (
    MAX_DEFINITION_BYTES,
    MAX_DESCRIPTION_CHARS,
    MAX_LIST_PAGES,
    MAX_TOOLS_PER_UPSTREAM,
    definition_problem,
    fetch_listing,
    screen,
)

SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def wire(name: Any = "echo", **fields: Any) -> dict[str, Any]:
    return {"name": name, "description": "d", "inputSchema": SCHEMA, **fields}


@pytest.mark.parametrize(
    ("definition", "problem"),
    [
        (wire(), None),
        (wire(""), "name_rule"),
        (wire("../x"), "name_rule"),
        (wire("a\u200bb"), "name_rule"),
        (wire("ec\u0441ho"), "name_rule"),
        (wire("x" * 129), "name_rule"),
        (wire(5), "name_rule"),
        (wire(title=5), "title_type"),
        (wire(description=["d"]), "description_type"),
        (wire(inputSchema={"type": "string"}), "input_schema"),
        (wire(inputSchema=[]), "input_schema"),
        (wire(inputSchema={"type": "object", "properties": {"a": 5}}), "input_schema"),
        (wire(inputSchema={"type": "object", "required": "a"}), "input_schema"),
        (wire(outputSchema={"type": "array"}), "output_schema"),
        (wire(description="d" * (MAX_DESCRIPTION_CHARS + 1)), "description_size"),
        (
            wire(inputSchema={"type": "object", "x": "s" * MAX_DEFINITION_BYTES}),
            "definition_size",
        ),
    ],
)
def test_definition_problem(definition: dict[str, Any], problem: str | None) -> None:
    assert definition_problem(definition, {definition["name"]: 1}) == problem


def test_a_duplicated_name_skips_every_definition_of_it_by_position_and_digest() -> None:
    valid, invalid = screen([wire("a"), wire("twice"), wire("b"), wire("twice", title="t")])
    assert set(valid) == {"a", "b"}
    assert [(i.position, i.reason) for i in invalid] == [
        (1, "duplicate_name"),
        (3, "duplicate_name"),
    ]
    assert all(len(i.sha256) == 64 and "twice" not in str(i.as_record()) for i in invalid)


class Pages:
    """A page source: ``per_page`` fresh tools a page, and the cursor ``next_of`` says."""

    def __init__(self, per_page: int, next_of: Any, description: str = "d") -> None:
        self.per_page = per_page
        self.next_of = next_of
        self.description = description
        self.asked: list[str | None] = []

    async def list_tools_mcp(self, *, cursor: str | None = None) -> mcp_types.ListToolsResult:
        self.asked.append(cursor)
        number = len(self.asked)
        tools = [
            mcp_types.Tool(name=f"t{number}_{i}", description=self.description, inputSchema=SCHEMA)
            for i in range(self.per_page)
        ]
        return mcp_types.ListToolsResult(tools=tools, nextCursor=self.next_of(cursor, number))


@pytest.mark.parametrize(
    ("pages", "cut", "asked", "kept"),
    [
        (Pages(10, lambda c, n: None), None, 1, 10),
        (Pages(10, lambda c, n: f"c{n}" if n < 3 else None), None, 3, 30),
        (Pages(500, lambda c, n: f"c{n}"), "tools", 2, MAX_TOOLS_PER_UPSTREAM),
        (Pages(300, lambda c, n: f"c{n}"), "tools", 4, MAX_TOOLS_PER_UPSTREAM),
        (Pages(1, lambda c, n: f"c{n}"), "pages", MAX_LIST_PAGES, MAX_LIST_PAGES),
        (Pages(1, lambda c, n: {None: "A", "A": "B", "B": "A"}[c]), "cursor_cycle", 3, 3),
        (Pages(1, lambda c, n: "c" * 5000), "cursor_size", 1, 1),
        (Pages(8, lambda c, n: f"c{n}", "d" * 200_000), "bytes", 6, 41),
    ],
)
async def test_fetch_listing_stops_at_the_first_cap(
    pages: Pages, cut: str | None, asked: int, kept: int
) -> None:
    listing = await fetch_listing(pages)
    assert (listing.cut, len(pages.asked), len(listing.wire)) == (cut, asked, kept)
    assert listing.pages == asked
