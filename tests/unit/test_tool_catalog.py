"""The tool catalog's index stays exact as tools are listed again, changed and removed
(a huge upstream listing re-publishes every tool: the index work per tool is its own
terms, never the whole catalog's)."""

from __future__ import annotations

from typing import Any

from nexus_mcp.book import ToolCatalog


def add(catalog: ToolCatalog, name: str, description: str, **changes: Any) -> None:
    fields: dict[str, Any] = {
        "server_id": "up",
        "toolset": "upstream.up",
        "risk": "read",
        "input_schema": {"type": "object"},
        "annotations": {},
    }
    catalog.add(name=name, description=description, **{**fields, **changes})


def frequencies(catalog: ToolCatalog) -> dict[str, int]:
    return dict(catalog._document_frequency)


def test_document_frequencies_follow_adds_replacements_and_removals() -> None:
    catalog = ToolCatalog()
    add(catalog, "read_notes", "Read the notes of a repo.")
    add(catalog, "write_notes", "Write notes to a disk.")
    assert frequencies(catalog)["notes"] == 2
    assert frequencies(catalog)["a"] == 2
    # Replaced with other words: its old terms no longer count, the new ones do.
    add(catalog, "write_notes", "Store the memo.")
    assert "disk" not in frequencies(catalog)
    assert frequencies(catalog)["a"] == 1
    assert frequencies(catalog)["notes"] == 2  # both names still have it
    assert frequencies(catalog)["memo"] == 1
    catalog.remove("read_notes")
    assert "read" not in frequencies(catalog)  # no entry has it any more: dropped
    assert "repo" not in frequencies(catalog)
    catalog.remove("write_notes")
    assert frequencies(catalog) == {}
    assert catalog.entries() == []


def test_a_tool_listed_again_unchanged_keeps_its_entry() -> None:
    catalog = ToolCatalog()
    add(catalog, "echo", "Echo text back.")
    entry = catalog.get("echo")
    before = frequencies(catalog)
    add(catalog, "echo", "Echo text back.")
    assert catalog.get("echo") is entry
    assert frequencies(catalog) == before
    # Any change of what discovery shows replaces it.
    add(catalog, "echo", "Echo text back.", risk="write")
    changed = catalog.get("echo")
    assert changed is not entry and changed is not None and changed.risk == "write"
    assert frequencies(catalog) == before
    assert [e.name for _, e in catalog.rank("echo")] == ["echo"]
