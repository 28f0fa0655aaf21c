"""Issue 23 (layout) under attack: the refactor must not change what a caller, the audit log
or a recording observes. Each test pins one behaviour of the code before the refactor
(f800fb1) that the new structure (one connector, the tool book, construction-time
dependencies) could have changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from .hostile_harness import hostile_stdio
from .upstream_harness import Gateway, make_gateway

CLASSES = {"echo": "read", "add": "read"}


def _gateway(tmp_path: Path, upstreams: list[dict[str, Any]]) -> Gateway:
    registries = {u["server_id"]: CLASSES for u in upstreams}
    return make_gateway(
        tmp_path / "gw", upstreams, registries=registries, grant={"full": ["h_echo", "h_add"]}
    )


def _pin(gw: Gateway) -> None:
    from .upstream_harness import run_cli

    assert run_cli(["upstream", "pin", "h", "--yes", "--config", str(gw.config_file)]) == 0


@pytest.mark.slow
async def test_a_damaged_lock_file_is_audited_once_per_start(tmp_path: Path) -> None:
    """Before the refactor the upstream's audit log was bound after construction, so the
    lock file's problems found while constructing were only logged, and audited once when
    the upstream started. The gateway now gets the audit log at construction: the event
    must still be written once, not once at build and again at start."""
    gw = _gateway(tmp_path, [hostile_stdio("h", "plain", tmp_path / "r.jsonl")])
    _pin(gw)
    lock = gw.registry_dir / "h.lock.json"
    document = json.loads(lock.read_text())
    document["tools"]["add"]["sha256"] = "Z" * 64
    lock.write_text(json.dumps(document))
    server = gw.build()
    assert gw.events("upstream_pins_invalid") == []  # built, not started: nothing yet
    async with Client(server.mcp) as client:
        await client.list_tools()
    assert len(gw.events("upstream_pins_invalid")) == 1
