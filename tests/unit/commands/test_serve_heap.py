"""``nexus-mcp serve`` sets the built server's start-up heap aside from the collector.

``server/heap.py``: once, in the serving process, after ``build_server`` and before the
first request; never inside ``build_server`` (tests and commands build many servers in one
process).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp import cli
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings
from tests.support.logging_state import isolated_logging


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_serve_freezes_the_built_heap_before_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thawed: None
) -> None:
    seen: dict[str, Any] = {}

    async def serve(server: Any) -> None:  # stands in for the transport: nothing is served
        seen["frozen"] = gc.get_freeze_count()
        seen["tools"] = len(await server.mcp.list_tools())
        server.close()

    monkeypatch.setattr("nexus_mcp.transport.serve.serve", serve)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with isolated_logging():  # serve configures the process's logging first
        status = cli.main(
            ["serve", "--transport", "stdio", "--mode", "dev", "--workspace", str(workspace),
             "--data-dir", str(tmp_path / "data"), "--log-level", "ERROR"]
        )  # fmt: skip
    assert status == 0
    assert seen["tools"] > 0  # the built server reached the transport
    # Everything the build made is frozen (a plain server: well over 10,000 objects).
    assert seen["frozen"] > 10_000


def test_building_a_server_freezes_nothing(tmp_path: Path, thawed: None) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    built = build_server(
        Settings(mode="dev", workspace=workspace, data_dir=tmp_path / "data"),
        audit_sinks=[MemoryAuditSink()],
    )
    built.close()
    assert gc.get_freeze_count() == 0
