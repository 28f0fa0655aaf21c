"""A hostile upstream's prompts and resources (issue 27): what breaks the rules is never
pinned nor exposed and is reported by position and digest only; endless and cyclic
listings are cut; nothing hostile reaches the audit, the log or the operator's terminal.
The upstream is ``tests/support/hostile_upstream.py`` as a real stdio process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastmcp import Client

from .hostile_harness import hostile_stdio
from .upstream_harness import make_gateway, read_record, run_cli

HOSTILE_TEXT = ("\u202e", "\x1b", "t://a\nb", "a" * 5000, "bad name")


def gateway(tmp_path: Path, mode: str):  # type: ignore[no-untyped-def]
    record = tmp_path / "record.jsonl"
    gw = make_gateway(
        tmp_path / "gw",
        [hostile_stdio("h", mode, record)],
        registries={"h": {"echo": "read", "add": "read"}},
        grant={"full": ["h_echo", "h_add"]},
        grant_items={"full": {"resources": ["h"], "prompts": ["h_greet"]}},
    )
    return gw, record


async def test_only_the_items_that_keep_the_rules_are_pinned_and_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gw, _record = gateway(tmp_path, "items")
    assert gw.pin("h") == 0
    printed = capsys.readouterr()
    for text in HOSTILE_TEXT:
        assert text not in printed.out + printed.err
    lock = json.loads((gw.registry_dir / "h.lock.json").read_text())
    assert set(lock["prompts"]) == {"greet"}
    assert set(lock["resources"]) == {"t://good"}
    assert set(lock["resource_templates"]) == {"t://items/{id}"}
    server = gw.build()
    async with Client(server.mcp) as client:
        assert {p.name for p in await client.list_prompts()} == {"h_greet"}
        assert {str(r.uri) for r in await client.list_resources()} == {"upstream://h/t://good"}
    invalid = gw.events("upstream_item_invalid")
    assert {e["kind"] for e in invalid} == {"prompts", "resources"}
    reasons = {i["reason"] for e in invalid for i in e["items"]}
    assert {"key_rule", "duplicate_key", "arguments", "description_type"} <= reasons
    dumped = json.dumps(gw.events())
    for text in HOSTILE_TEXT:
        assert json.dumps(text)[1:-1] not in dumped


@pytest.mark.parametrize(
    ("mode", "kind", "reason"),
    [
        ("items-endless", "resources", "items"),
        ("items-cycle", "prompts", "cursor"),
    ],
)
async def test_an_endless_or_cyclic_item_listing_is_cut(
    tmp_path: Path, mode: str, kind: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gw, record = gateway(tmp_path, mode)
    server = gw.build()
    async with Client(server.mcp) as client:
        await client.list_tools()
        await client.list_resources()
    cut = [e for e in gw.events("upstream_items_unlisted") if e["kind"] == kind]
    assert cut and cut[0]["reason"] == reason
    method = {"resources": "resources/list", "prompts": "prompts/list"}[kind]
    pages = [r for r in read_record(record) if r.get("method") == method]
    assert len(pages) <= 101  # the caps hold: never an endless fetch
    assert (
        run_cli(
            [
                "upstream",
                "check",
                "h",
                "--config",
                str(gw.config_file),
                "--data-dir",
                str(gw.data_dir),
            ]
        )
        == 1
    )
