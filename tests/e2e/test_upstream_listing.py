"""A hostile upstream's listing and a damaged lock file: one upstream's problem, never the
server's (providers/upstream/listing.py, policy/pins.py).

The upstream is ``tests/support/hostile_upstream.py`` as a real process (raw JSON-RPC over
stdio or HTTP): invalid tool definitions, endless or cyclic cursors, oversized pages.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.providers.upstream.listing import MAX_LIST_PAGES, MAX_TOOLS_PER_UPSTREAM

from .hostile_harness import hostile_http, hostile_stdio
from .upstream_harness import Gateway, http_upstream, make_gateway, read_record

pytestmark = pytest.mark.slow

HOSTILE_NAMES = ("../x", "a\u200bb", "ec\u0441ho", "x" * 300)
GRANTED = ["h_echo", "h_add", "p_echo", "p_add"]
CLASSES = {"echo": "read", "add": "read"}


def gateway(tmp_path: Path, upstreams: list[dict[str, Any]], *, mode: str = "prod") -> Gateway:
    registries = {u["server_id"]: CLASSES for u in upstreams}
    return make_gateway(
        tmp_path / "gw", upstreams, mode=mode, registries=registries, grant={"full": GRANTED}
    )


def cli(gw: Gateway, *args: str) -> int:
    from .upstream_harness import run_cli

    return run_cli(["upstream", *args, "--config", str(gw.config_file)])


def lock(gw: Gateway, server_id: str = "h") -> Path:
    return gw.registry_dir / f"{server_id}.lock.json"


def pages_served(record: Path) -> int:
    return sum(1 for r in read_record(record) if r.get("method") == "tools/list")


async def served(gw: Gateway) -> tuple[set[str], dict[str, Any]]:
    server = gw.build()
    async with Client(server.mcp) as client:
        names = {t.name for t in await client.list_tools()}
        upstreams = server.runtime.upstreams
        assert upstreams is not None
        summaries = {sid: s.summary() for sid, s in upstreams.servers.items()}
    return names, summaries


# -- item 8: invalid definitions are never pinned; a bad lock entry is one tool's problem


def test_invalid_definitions_are_never_pinned_and_never_echoed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "record.jsonl"
    gw = gateway(tmp_path, [hostile_stdio("h", "names", record)])
    assert cli(gw, "pin", "h", "--yes") == 0
    pinned = json.loads(lock(gw).read_text())["tools"]
    assert set(pinned) == {"echo", "add"}  # the duplicate, bad schemas, oversize: skipped
    # The lock file it wrote is one the next commands read: check, pin again, serve.
    capsys.readouterr()
    assert cli(gw, "check", "h") == 1  # the upstream still lists invalid definitions
    captured = capsys.readouterr()
    for reason in ("name_rule", "duplicate_name", "description_size"):
        assert f"({reason})" in captured.err
    assert "definition_size" in captured.err
    for name in HOSTILE_NAMES:
        assert name not in captured.out + captured.err
    assert cli(gw, "pin", "h", "--yes") == 0
    assert "nothing to pin" in capsys.readouterr().out


async def test_serve_exposes_the_valid_tools_of_a_hostile_listing(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    gw = gateway(tmp_path, [hostile_stdio("h", "names", record)])
    assert cli(gw, "pin", "h", "--yes") == 0
    names, summaries = await served(gw)
    assert {"h_echo", "h_add"} <= names
    assert names - {"h_echo", "h_add"}  # native tools are served
    assert summaries["h"]["state"] == "ready"
    invalid = gw.events("upstream_tool_invalid")
    assert invalid and invalid[0]["count"] == 9
    text = json.dumps(gw.events(), ensure_ascii=False)
    for name in HOSTILE_NAMES:
        assert name not in text


async def test_a_name_with_a_trailing_newline_is_never_pinned_nor_exposed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``^[A-Za-z0-9_.-]{1,128}$`` with ``re.match`` accepts ``"echo\\n"``: every name rule
    must hold for the whole string, so that name is invalid, not a second ``echo``."""
    gw = gateway(tmp_path, [hostile_stdio("h", "newline", tmp_path / "record.jsonl")])
    assert cli(gw, "pin", "h", "--yes") == 0
    assert set(json.loads(lock(gw).read_text())["tools"]) == {"echo", "add"}
    capsys.readouterr()
    assert cli(gw, "check", "h") == 1
    assert "(name_rule)" in capsys.readouterr().err
    names, summaries = await served(gw)
    assert {"h_echo", "h_add"} <= names
    assert [name for name in names if "\n" in name or name.startswith("h_wipe")] == []
    assert summaries["h"]["state"] == "ready"
    assert gw.events("upstream_tool_invalid")[0]["count"] == 2


async def test_a_page_the_sdk_refuses_downs_that_upstream_only(tmp_path: Path) -> None:
    """An inputSchema that is not an object: the MCP SDK refuses the whole page; that
    upstream is down (its listing failed), the other one and native tools are served."""
    upstreams = [
        hostile_stdio("h", "badschema", tmp_path / "h.jsonl"),
        hostile_stdio("p", "plain", tmp_path / "p.jsonl"),
    ]
    gw = gateway(tmp_path, upstreams)
    assert cli(gw, "pin", "p", "--yes") == 0
    assert cli(gw, "pin", "h", "--yes") == 2  # could not connect: nothing written
    assert not lock(gw).exists()
    names, summaries = await served(gw)
    assert {"p_echo", "p_add"} <= names
    assert summaries["h"]["state"] == "degraded"


def pinned_then(gw: Gateway, edit: Any) -> None:
    assert cli(gw, "pin", "h", "--yes") == 0
    document = json.loads(lock(gw).read_text())
    text = edit(document)
    lock(gw).write_text(text if isinstance(text, str) else json.dumps(document))


def bad_digest(document: dict[str, Any]) -> None:
    document["tools"]["add"]["sha256"] = "Z" * 64


def bad_names(document: dict[str, Any]) -> None:
    document["tools"]["add"]["extra"] = "field"
    for name in HOSTILE_NAMES:
        document["tools"][name] = {"sha256": "a" * 64}
    document["tools"][""] = {"sha256": "a" * 64}


def duplicate(document: dict[str, Any]) -> str:
    text = json.dumps(document)
    add = json.dumps(document["tools"]["add"])
    return text.replace('"add": ', f'"add": {add}, "add": ', 1)


@pytest.mark.parametrize("edit", [bad_digest, bad_names, duplicate])
@pytest.mark.parametrize("mode", ["prod", "dev"])
async def test_a_bad_lock_entry_quarantines_that_tool_only(
    tmp_path: Path, edit: Any, mode: str
) -> None:
    gw = gateway(tmp_path, [hostile_stdio("h", "plain", tmp_path / "r.jsonl")], mode=mode)
    pinned_then(gw, edit)
    names, summaries = await served(gw)
    assert "h_echo" in names and "h_add" not in names
    quarantined = {q["tool"]: q["reason"] for q in summaries["h"]["quarantined"]}
    assert quarantined == {"add": "pin_entry_invalid"}
    problems = gw.events("upstream_pins_invalid")
    assert problems and all("#" in p for p in problems[0]["problems"])
    text = json.dumps(gw.events(), ensure_ascii=False)
    for name in HOSTILE_NAMES:
        assert name not in text
    # upstream check says so; pin writes a clean lock file again.
    assert cli(gw, "check", "h") == 1
    assert cli(gw, "pin", "h", "--yes") == 0
    assert set(json.loads(lock(gw).read_text())["tools"]) == {"echo", "add"}
    assert cli(gw, "check", "h") == 0


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"schema_id":"nexus.mcp.tool_pins","schema_version":"v1","server_id":"other","tools":{}}',
        b"\xff\xfe".decode("latin-1"),
    ],
)
async def test_an_unusable_lock_file_quarantines_that_upstream_only(
    tmp_path: Path, content: str
) -> None:
    upstreams = [
        hostile_stdio("h", "plain", tmp_path / "h.jsonl"),
        hostile_stdio("p", "plain", tmp_path / "p.jsonl"),
    ]
    gw = gateway(tmp_path, upstreams)
    assert cli(gw, "pin", "h", "--yes") == 0 and cli(gw, "pin", "p", "--yes") == 0
    lock(gw).write_text(content, encoding="latin-1")
    names, summaries = await served(gw)
    assert {"p_echo", "p_add"} <= names  # the other upstream
    assert not {"h_echo", "h_add"} & names
    assert {q["tool"] for q in summaries["h"]["quarantined"]} == {"echo", "add"}
    # pin refuses to overwrite it (every pin it held would go): the operator moves it away.
    before = lock(gw).read_bytes()
    assert cli(gw, "pin", "h", "--yes") == 2
    assert lock(gw).read_bytes() == before
    assert cli(gw, "check", "h") == 1


# -- item 10: the listing is bounded in pages, definitions and bytes


def test_an_endless_listing_is_cut_at_the_tool_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "record.jsonl"
    gw = gateway(tmp_path, [hostile_stdio("h", "endless", record)])
    assert cli(gw, "check", "h") == 1
    err = capsys.readouterr().err
    assert f"listing cut after {MAX_TOOLS_PER_UPSTREAM} definitions (tools)" in err
    assert pages_served(record) == MAX_TOOLS_PER_UPSTREAM // 500


def test_a_cursor_cycle_ends_the_listing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "record.jsonl"
    gw = gateway(tmp_path, [hostile_stdio("h", "cycle", record)])
    assert cli(gw, "check", "h") == 1
    assert "(cursor_cycle)" in capsys.readouterr().err
    assert pages_served(record) == 3  # first, A, B; A again is not asked


def test_fat_pages_are_cut_at_the_byte_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "record.jsonl"
    gw = gateway(tmp_path, [hostile_stdio("h", "fat", record)])
    assert cli(gw, "check", "h") == 1
    assert "(bytes)" in capsys.readouterr().err
    # 8 definitions of 200 KB a page: 8 MiB of definitions is reached on the sixth page.
    assert pages_served(record) <= 6 < MAX_LIST_PAGES


def test_an_endless_listing_over_http_is_cut_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with hostile_http("endless", tmp_path / "record.jsonl") as upstream:
        gw = gateway(tmp_path, [http_upstream("h", upstream.url)])
        assert cli(gw, "check", "h") == 1
        assert "(tools)" in capsys.readouterr().err
        assert pages_served(upstream.record) == MAX_TOOLS_PER_UPSTREAM // 500


def test_an_oversized_http_page_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], log_output: io.StringIO
) -> None:
    """One 24 MB page: over the per-response cap, the listing fails (the upstream is
    down) instead of being read whole and cut afterwards."""
    with hostile_http("bigpage", tmp_path / "record.jsonl") as upstream:
        gw = gateway(tmp_path, [http_upstream("h", upstream.url, timeouts={"connect_seconds": 30})])
        assert cli(gw, "check", "h") == 1
        err = capsys.readouterr().err
        assert "could not connect" in err
        assert '"upstream_message_too_large"' in log_output.getvalue()


def test_a_compressed_page_is_refused_not_inflated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], log_output: io.StringIO
) -> None:
    """A 24 KB gzip body that inflates to 24 MB: the response cap counted the bytes on
    the wire, and httpx inflates whatever Content-Encoding the upstream names (it asks
    for gzip by default), so a gzip bomb went through whole. The gateway asks for
    ``identity`` and refuses an encoded body."""
    with hostile_http("gzipbomb", tmp_path / "record.jsonl") as upstream:
        gw = gateway(tmp_path, [http_upstream("h", upstream.url, timeouts={"connect_seconds": 5})])
        assert cli(gw, "check", "h") == 1
        err = capsys.readouterr().err
        assert "could not connect" in err
        assert '"upstream_message_encoded"' in log_output.getvalue()
        asked = {r["accept_encoding"] for r in upstream.requests() if r["method"] == "POST"}
    assert asked == {"identity"}


def test_an_oversized_stdio_message_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], log_output: io.StringIO
) -> None:
    """The same 24 MB page as one stdio line: over the per-message cap the connection
    ends (the upstream is down) instead of the line being buffered whole."""
    record = tmp_path / "record.jsonl"
    gw = gateway(
        tmp_path, [hostile_stdio("h", "bigpage", record, timeouts={"connect_seconds": 30})]
    )
    assert cli(gw, "check", "h") == 1
    err = capsys.readouterr().err
    assert "could not connect" in err
    assert '"upstream_message_too_large"' in log_output.getvalue()
    assert pages_served(record) >= 1


async def test_serve_exposes_at_most_the_cap_and_audits_the_cut(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    gw = gateway(tmp_path, [hostile_stdio("h", "endless", record)], mode="dev")
    names, summaries = await served(gw)
    assert len(summaries["h"]["tools"]) == MAX_TOOLS_PER_UPSTREAM
    assert names  # native tools are served
    cut = gw.events("upstream_listing_cut")
    assert cut and cut[0]["reason"] == "tools" and cut[0]["kept"] == MAX_TOOLS_PER_UPSTREAM
    assert pages_served(record) == MAX_TOOLS_PER_UPSTREAM // 500
