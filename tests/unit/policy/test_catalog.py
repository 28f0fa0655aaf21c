"""Prompts, resources and resource templates of an upstream: their rules and their pins
(``policy/catalog.py``, the v2 lock file of ``policy/pins.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from nexus_mcp.policy.catalog import (
    Kind,
    backend_uri,
    canonical_item,
    exposed_uri,
    item_digest,
    item_problem,
    key_ok,
)
from nexus_mcp.policy.pins import PinState, load_pins, renewed_items, write_pins

SCHEMA = Path(__file__).parents[3] / "src/nexus_mcp/data/schemas/tool_pins.schema.json"


def problem(kind: Kind, item: dict[str, Any]) -> str | None:
    return item_problem(kind, item, {}, canonical_item(kind, item))


@pytest.mark.parametrize(
    "uri",
    [
        "test://static/readme",
        "file:///tmp/a%20b.txt",
        "test://items/42",
        "https://example.com/x?y=1#z",
    ],
)
def test_uris_that_may_name_a_resource(uri: str) -> None:
    assert key_ok(Kind.RESOURCE, uri)
    assert problem(Kind.RESOURCE, {"uri": uri, "name": "n"}) is None


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "no-scheme",
        "test://a b",
        "test://a\nb",
        "test://a\x1b[2Jb",
        "test://a\u202eb",
        "test://a\u200bb",
        "test://" + "a" * 3000,
        "1test://x",
        None,
        42,
    ],
)
def test_hostile_uris_are_never_pinned_nor_exposed(uri: Any) -> None:
    assert not key_ok(Kind.RESOURCE, uri)
    assert problem(Kind.RESOURCE, {"uri": uri, "name": "n"}) == "key_rule"


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ({"name": "a b"}, "key_rule"),
        ({"name": "ok", "description": 5}, "description_type"),
        ({"name": "ok", "description": "x" * 40_000}, "description_type"),
        ({"name": "ok", "arguments": "x"}, "arguments"),
        ({"name": "ok", "arguments": [{"name": "a"}, {"name": "a"}]}, "arguments"),
        ({"name": "ok", "arguments": [{"name": "bad name"}]}, "arguments"),
        ({"name": "ok", "arguments": [{"name": "a", "required": "yes"}]}, "arguments"),
        ({"name": "ok", "arguments": [{"name": f"a{i}"} for i in range(100)]}, "arguments"),
        ({"name": "ok", "arguments": [{"name": "a", "description": "d"}]}, None),
    ],
)
def test_prompt_rules(item: dict[str, Any], reason: str | None) -> None:
    assert problem(Kind.PROMPT, item) == reason


def test_a_key_listed_twice_is_skipped() -> None:
    item = {"name": "greet"}
    assert item_problem(Kind.PROMPT, item, {"greet": 2}, canonical_item(Kind.PROMPT, item)) == (
        "duplicate_key"
    )


def test_every_pinned_field_moves_the_digest_but_size_does_not() -> None:
    base = {"uri": "t://r", "name": "r", "description": "d", "mimeType": "text/plain"}
    digest = item_digest(Kind.RESOURCE, base)
    for field in ("uri", "name", "description", "mimeType", "title"):
        assert item_digest(Kind.RESOURCE, {**base, field: "other://x"}) != digest
    assert item_digest(Kind.RESOURCE, {**base, "annotations": {"priority": 1}}) != digest
    assert item_digest(Kind.RESOURCE, {**base, "size": 12345}) == digest


def test_exposed_and_backend_uris_round_trip() -> None:
    exposed = exposed_uri("up", "test://items/{id}")
    assert exposed == "upstream://up/test://items/{id}"
    assert backend_uri("up", "upstream://up/test://items/7") == "test://items/7"
    assert backend_uri("up", "upstream://upx/test://items/7") is None
    assert backend_uri("up", "upstream://up/") is None


def test_item_pins_are_written_as_v2_and_read_back(tmp_path: Path) -> None:
    pins = load_pins(tmp_path, "up").with_pins({"echo": "a" * 64})
    v1 = pins.to_document()
    assert v1["schema_version"] == "v1" and "prompts" not in v1
    pins = pins.with_item_pins(Kind.PROMPT, {"greet": "b" * 64})
    pins = pins.with_item_pins(Kind.RESOURCE, {"test://static/readme": "c" * 64})
    write_pins(pins)
    document = json.loads((tmp_path / "up.lock.json").read_text())
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert document["schema_version"] == "v2"
    again = load_pins(tmp_path, "up")
    assert again.digests == {"echo": "a" * 64}
    assert again.item_state(Kind.PROMPT, "greet", "b" * 64) is PinState.PINNED
    assert again.item_state(Kind.PROMPT, "greet", "d" * 64) is PinState.CHANGED
    assert again.item_state(Kind.RESOURCE, "test://other", "c" * 64) is PinState.UNPINNED
    renewed = again.with_item_pins(Kind.PROMPT, {"greet": "b" * 64}, renew=True)
    assert renewed_items(again, renewed) == {("prompts", "greet")}


def test_a_bad_item_entry_quarantines_that_item_only(tmp_path: Path) -> None:
    document = {
        "schema_id": "nexus.mcp.tool_pins",
        "schema_version": "v2",
        "server_id": "up",
        "tools": {"echo": {"sha256": "a" * 64}},
        "prompts": {"greet": {"sha256": "not-a-digest"}, "ok": {"sha256": "b" * 64}},
        "resources": {"test://a\u202eb": {"sha256": "c" * 64}},
    }
    (tmp_path / "up.lock.json").write_text(json.dumps(document))
    pins = load_pins(tmp_path, "up")
    assert pins.unusable is None
    assert pins.digests == {"echo": "a" * 64}
    assert pins.quarantines_item(Kind.PROMPT, "greet")
    assert not pins.quarantines_item(Kind.PROMPT, "ok")
    assert pins.item_pin(Kind.PROMPT, "ok") == "b" * 64
    # Reported by kind and position, never the text.
    assert all("\u202e" not in p and "greet" not in p for p in pins.problems())
    assert len(pins.problems()) == 2


def test_a_v2_file_that_a_v1_reader_sees_is_refused_whole(tmp_path: Path) -> None:
    """Rolling back to a version that knows only v1 must not half-read item pins: a v2
    document is not v1, so that version quarantines the upstream (fail closed)."""
    schema = json.loads(SCHEMA.read_text())
    document = {
        "schema_id": "nexus.mcp.tool_pins",
        "schema_version": "v1",
        "server_id": "up",
        "tools": {},
        "prompts": {"greet": {"sha256": "b" * 64}},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)
    (tmp_path / "up.lock.json").write_text(json.dumps(document))
    assert load_pins(tmp_path, "up").unusable is not None


@pytest.mark.parametrize("server_id", ["notes", "Notes"])
def test_an_upstream_may_not_take_the_notes_source_id(server_id: str) -> None:
    from pydantic import ValidationError

    from nexus_mcp.policy.upstreams import UpstreamConfig

    with pytest.raises(ValidationError):
        UpstreamConfig(server_id=server_id, transport="stdio", command="x")
    assert UpstreamConfig(server_id="notes2", transport="stdio", command="x")


@pytest.mark.parametrize(
    ("template", "refused"),
    [
        ("test://items/{item_id}", False),
        ("file:///{path*}", False),
        ("x://{a*}/{b}/{c}", False),
        ("x://{a}/{b}{?q,r}", False),
        ("x:{a}{b}", True),  # two variables in one segment: every split is tried
        ("x:{a}-{b}", True),
        ("x://{a*}/{b*}", True),  # two ``.+``
        ("x://" + "/{a}" * 9, True),  # too many
        ("x://{bad", True),
    ],
)
def test_templates_whose_matching_could_hang_the_gateway_are_refused(
    template: str, refused: bool
) -> None:
    item = {"uriTemplate": template, "name": "t"}
    assert (problem(Kind.RESOURCE_TEMPLATE, item) == "template_variables") is refused


def test_a_crafted_template_would_take_seconds_to_fail_a_match() -> None:
    """Why the rule exists: FastMCP's own matcher on an adjacent-variable template."""
    import time

    from fastmcp.resources import ResourceTemplate

    template = ResourceTemplate(uri_template="x:{a}{b}{c}{d}{e}{f}!", name="t", parameters={})
    started = time.perf_counter()
    template.matches("x:" + "a" * 60)  # about 0.4 s here (0.03 s at 40, 2.2 s at 80)
    assert time.perf_counter() - started > 0.05


@pytest.mark.parametrize(
    "uri",
    ["x:a/../../y", "x:é", "x:\xadb", "x:\U000e0041", "x:\u061cb", "x:\ud800"],
)
def test_uris_rewritten_or_hiding_characters_are_refused(uri: str) -> None:
    assert problem(Kind.RESOURCE, {"uri": uri, "name": "n"}) == "key_rule"
