"""An upstream's prompts, resources and resource templates through the gateway (issue 27).

The upstream is the recording test server (``tests/support/upstream_server.py``) as a real
stdio subprocess; ``nexus-mcp upstream pin`` pins its items as it pins tools; callers use
FastMCP's in-memory client on a server built the normal way. What is proven: pinned items
are listed, read and rendered under their exposed names, hashed and bounded; a changed,
unpinned or mutated item never reaches a caller (hidden like an unknown one) and is
audited; the lock file holds them (v2); nothing of the caller's reaches the upstream but
the declared arguments.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client
from mcp.shared.exceptions import MCPError

from .upstream_harness import (
    Gateway,
    all_up_tools,
    make_gateway,
    read_record,
    run_cli,
    stdio_upstream,
)

README = "# Upstream readme\n\nResources through the gateway.\n"
GRANTS: dict[str, Any] = {
    "resources": ["up"],
    "prompts": ["up_greet", "up_review", "up_huge_prompt"],
}


def gateway(tmp_path: Path, *, pin: bool = True, **upstream: Any) -> tuple[Gateway, Path]:
    record = tmp_path / "record.jsonl"
    extra = upstream.pop("extra", None)
    gw = make_gateway(
        tmp_path / "gw",
        [stdio_upstream(record=record, **upstream)],
        grant={"full": all_up_tools()},
        grant_items={"full": GRANTS},
        extra=extra,
    )
    if pin:
        assert gw.pin("up") == 0
    return gw, record


def lock(gw: Gateway) -> dict[str, Any]:
    return json.loads((gw.registry_dir / "up.lock.json").read_text())


async def test_pinned_items_are_served_under_their_exposed_names(tmp_path: Path) -> None:
    gw, record = gateway(tmp_path)
    document = lock(gw)
    assert document["schema_version"] == "v2"
    assert set(document["prompts"]) >= {"greet", "review", "huge_prompt"}
    assert "test://static/readme" in document["resources"]
    assert "test://items/{item_id}" in document["resource_templates"]
    server = gw.build()
    async with Client(server.mcp) as client:
        prompts = {p.name: p for p in await client.list_prompts()}
        assert {"up_greet", "up_review"} <= set(prompts)
        assert [a.name for a in prompts["up_greet"].arguments or []] == ["name", "style"]
        resources = {str(r.uri) for r in await client.list_resources()}
        assert "upstream://up/test://static/readme" in resources
        templates = {t.uri_template for t in await client.list_resource_templates()}
        assert "upstream://up/test://items/{item_id}" in templates

        contents = await client.read_resource("upstream://up/test://static/readme")
        assert contents[0].text == README
        meta = contents[0].meta or {}
        assert meta["nexus/sha256"] == hashlib.sha256(README.encode()).hexdigest()

        blob = await client.read_resource("upstream://up/test://static/blob")
        assert (blob[0].meta or {})["nexus/sha256"] == hashlib.sha256(bytes(range(256))).hexdigest()

        item = await client.read_resource("upstream://up/test://items/42")
        assert item[0].text == "item 42"

        rendered = await client.get_prompt("up_greet", {"name": "Ada", "sneaky": "x"})
        assert rendered.messages[0].content.text == "Hello, Ada (plain)."  # type: ignore[union-attr]
        two = await client.get_prompt("up_review", {"code": "x = 1"})
        assert [m.role for m in two.messages] == ["user", "assistant"]
    # Only the declared arguments went upstream: never an undeclared one.
    gets = [r for r in read_record(record) if r.get("method") == "prompts/get"]
    assert gets and all("sneaky" not in json.dumps(r) for r in gets)


async def test_a_missing_required_prompt_argument_is_invalid_input_not_sent(
    tmp_path: Path,
) -> None:
    gw, record = gateway(tmp_path)
    server = gw.build()
    async with Client(server.mcp) as client:
        for arguments in ({}, None, {"nome": "Ada"}):
            with pytest.raises(MCPError) as refused:
                await client.get_prompt_mcp("up_greet", arguments)
            error = refused.value.error
            assert error.code == -32050
            assert json.loads(error.message) == {
                "error": "missing argument 'name'",
                "code": "INVALID_INPUT",
            }
            assert "nome" not in error.message
    # Nothing went upstream for them.
    assert not [r for r in read_record(record) if r.get("method") == "prompts/get"]


async def test_an_oversized_read_or_prompt_is_refused_not_cut(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path, extra={"limits": {"max_read_bytes": 1024 * 1024}})
    server = gw.build()
    async with Client(server.mcp) as client:
        with pytest.raises(MCPError) as read:
            await client.read_resource("upstream://up/test://static/huge")
        with pytest.raises(MCPError) as got:
            await client.get_prompt("up_huge_prompt", {"n": str(2 * 1024 * 1024)})
    for error in (read.value, got.value):
        assert "zzzz" not in str(error) and "yyyy" not in str(error)


async def test_unpinned_items_are_quarantined_and_hidden_like_unknown_ones(
    tmp_path: Path,
) -> None:
    gw, _record = gateway(tmp_path, pin=False)
    assert gw.pin("up", "echo") == 0  # the tools only: no item pinned
    server = gw.build()
    async with Client(server.mcp) as client:
        assert await client.list_prompts() == []
        assert await client.list_resources() == []
        assert await client.list_resource_templates() == []
        with pytest.raises(MCPError) as hidden:
            await client.read_resource("upstream://up/test://static/readme")
        with pytest.raises(MCPError) as unknown:
            await client.read_resource("upstream://up/test://static/nothing")
        assert str(hidden.value).replace("readme", "X") == str(unknown.value).replace(
            "nothing", "X"
        )
        with pytest.raises(MCPError) as hidden_prompt:
            await client.get_prompt("up_greet", {"name": "a"})
        with pytest.raises(MCPError) as unknown_prompt:
            await client.get_prompt("up_grxxx", {"name": "a"})
        assert str(hidden_prompt.value).replace("up_greet", "X") == str(
            unknown_prompt.value
        ).replace("up_grxxx", "X")
    unpinned = gw.events("upstream_item_unpinned")
    assert unpinned and {e["kind"] for e in unpinned} >= {"prompts", "resources"}
    assert all("readme" not in json.dumps(e) for e in unpinned)


async def test_a_changed_prompt_is_quarantined_until_re_pinned(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path)
    # The upstream now describes greet otherwise (a rug pull between runs).
    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["args"] += ["--item-variant", "evil"]
    gw.config_file.write_text(yaml.safe_dump(config))
    server = gw.build()
    async with Client(server.mcp) as client:
        names = {p.name for p in await client.list_prompts()}
        assert "up_greet" not in names and "up_review" in names
    changed = gw.events("upstream_item_changed")
    assert changed and changed[0]["kind"] == "prompts"
    assert (
        run_cli(
            [
                "upstream",
                "check",
                "up",
                "--config",
                str(gw.config_file),
                "--data-dir",
                str(gw.data_dir),
            ]
        )
        == 1
    )
    assert gw.pin_items(prompt="greet") == 0
    server = gw.build()
    async with Client(server.mcp) as client:
        assert "up_greet" in {p.name for p in await client.list_prompts()}


async def test_a_prompt_changed_at_run_time_disappears_at_once(tmp_path: Path) -> None:
    gw, _record = gateway(tmp_path)
    server = gw.build()
    async with Client(server.mcp) as client:
        assert "up_greet" in {p.name for p in await client.list_prompts()}
        await client.call_tool("up_mutate_prompt", {})

        async def gone() -> bool:
            return "up_greet" not in {p.name for p in await client.list_prompts()}

        for _ in range(200):
            if await gone():
                break
            await asyncio.sleep(0.05)
        assert await gone()
        with pytest.raises(MCPError):
            await client.get_prompt("up_greet", {"name": "a"})
    assert gw.events("upstream_item_changed")


async def test_a_changed_then_reverted_prompt_stays_quarantined_across_a_restart(
    tmp_path: Path,
) -> None:
    """The evidence against an item's pin is kept in the data dir (embedded backend): a
    restart, with the upstream showing the pinned definition again, does not bring the
    prompt back; reviewing and re-pinning it does."""
    gw, _record = gateway(tmp_path)
    server = gw.build()
    async with Client(server.mcp) as client:
        await client.call_tool("up_mutate_prompt", {})
        for _ in range(200):
            if "up_greet" not in {p.name for p in await client.list_prompts()}:
                break
            await asyncio.sleep(0.05)
    again = gw.build()  # new upstream processes: greet is as pinned again
    async with Client(again.mcp) as client:
        assert "up_review" in {p.name for p in await client.list_prompts()}
        assert "up_greet" not in {p.name for p in await client.list_prompts()}
    assert gw.pin_items(prompt="greet") == 0
    pinned = gw.build()
    async with Client(pinned.mcp) as client:
        assert "up_greet" in {p.name for p in await client.list_prompts()}


async def test_a_template_is_no_way_around_a_quarantined_resource(tmp_path: Path) -> None:
    """A static resource its upstream's own template also matches stays hidden when it is
    quarantined, and a template read never carries a query the template does not declare
    (both answer exactly like an unknown resource)."""
    gw, record = gateway(tmp_path)
    config = yaml.safe_load(gw.config_file.read_text())
    config["upstreams"][0]["args"] += ["--item-variant", "evil"]
    gw.config_file.write_text(yaml.safe_dump(config))
    server = gw.build()
    async with Client(server.mcp) as client:
        uris = {str(r.uri) for r in await client.list_resources()}
        assert "upstream://up/test://items/secret" not in uris
        assert (await client.read_resource("upstream://up/test://items/5"))[0].text == "item 5"
        with pytest.raises(MCPError) as via_template:
            await client.read_resource("upstream://up/test://items/secret")
        with pytest.raises(MCPError) as with_query:
            await client.read_resource("upstream://up/test://items/5?admin=true")
        with pytest.raises(MCPError) as unknown:
            await client.read_resource("upstream://up/test://nothing/here")
    assert str(via_template.value) == str(unknown.value) == str(with_query.value)
    sent = [json.dumps(r) for r in read_record(record) if r.get("method") == "resources/read"]
    assert not any("secret" in line or "admin" in line for line in sent)
