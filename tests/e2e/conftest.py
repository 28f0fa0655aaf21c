"""Fixtures for end-to-end tests: a real workspace in tmp_path and servers built from settings."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.observability.logs import json_processors
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .node_clients import NodeClients, find_node_clients, is_ci

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_WORKSPACE = REPO_ROOT / "demo" / "workspace"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of the demo workspace plus a folder outside it to try escaping into."""
    root = tmp_path / "ws"
    shutil.copytree(DEMO_WORKSPACE, root)
    outside = tmp_path / "ws-evil"
    outside.mkdir()
    (outside / "secret.txt").write_text("CANARY-OUTSIDE-SECRET")
    (root / "escape-link").symlink_to(outside)
    return root


@pytest.fixture
def audit() -> MemoryAuditSink:
    return MemoryAuditSink()


ServerFactory = Callable[..., NexusServer]


@pytest.fixture
def make_server(workspace: Path, tmp_path: Path, audit: MemoryAuditSink) -> Iterator[ServerFactory]:
    built: list[NexusServer] = []

    def factory(**overrides: Any) -> NexusServer:
        values: dict[str, Any] = {
            "mode": "dev",
            "workspace": workspace,
            "data_dir": tmp_path / "data",
        }
        values.update(overrides)
        server = build_server(Settings(**values), audit_sinks=[audit])
        built.append(server)
        return server

    yield factory
    for server in built:
        server.close()


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below root (not following links) with its bytes: 'nothing was written'."""
    out: dict[str, bytes] = {}
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_symlink():
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return dict(sorted(out.items()))


def wire(result: Any) -> dict[str, Any]:
    """A CallToolResult as the JSON a client receives."""
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    """Everything logged through structlog during the test, rendered by the server's own
    JSON pipeline, whatever an earlier test left configured."""
    saved = structlog.get_config()
    buffer = io.StringIO()
    structlog.configure(
        processors=json_processors(),
        logger_factory=structlog.PrintLoggerFactory(buffer),
        cache_logger_on_first_use=False,
    )
    try:
        yield buffer
    finally:
        structlog.configure(**saved)


@pytest.fixture(scope="session")
def node_clients() -> NodeClients:
    """The pinned TypeScript SDK and MCP Inspector (``make clients``).

    Missing, they skip with the reason on a developer's machine; in CI (``CI=true``) that
    is a failure instead, so a CI without node cannot pass by skipping them."""
    clients, reason = find_node_clients()
    if clients is None:
        if is_ci():
            pytest.fail(f"CI must run the non-Python client tests: {reason}", pytrace=False)
        pytest.skip(reason)
    return clients
