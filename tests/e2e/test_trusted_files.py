"""The files the configuration comes from or names are out of the file tools' reach.

A served folder may hold the server's own configuration: the YAML file itself, secrets
given by ``{file: path}`` (operator and metrics tokens, state keys, the fixture key, forge
and upstream credentials), the profiles file that grants tools and the registries with
their lock files. Read, a caller learns a secret it could mint or impersonate with;
written, the server trusts the caller's version at its next start. Each is refused by name
like the rest of the server's state (``INVALID_PATH``), listed nowhere, and left as it was,
whether the settings came from ``load_settings`` or were built directly.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client

import nexus_mcp
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings, load_settings, referenced_files

from .conftest import snapshot, wire

SHIPPED = Path(nexus_mcp.__file__).parent / "data"
CANARY = "trusted-file-canary-0123456789abcdef0123456789"
TRUSTED = [
    "nexus.yaml",
    "secrets/health.token",
    "secrets/metrics.token",
    "secrets/state.key",
    "config/profiles.yaml",
    "config/registry/nexus.json",
]


def served_configuration(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace holding its own server's configuration and secrets, and that config."""
    workspace = tmp_path / "ws"
    (workspace / "secrets").mkdir(parents=True)
    (workspace / "config" / "registry").mkdir(parents=True)
    (workspace / "todo.txt").write_text("ordinary file\n")
    for name in ("health.token", "metrics.token", "state.key"):
        (workspace / "secrets" / name).write_text(f"{CANARY}-{name}\n")
    shutil.copy(SHIPPED / "tool_profiles.yaml", workspace / "config" / "profiles.yaml")
    shutil.copy(SHIPPED / "registries" / "nexus.json", workspace / "config" / "registry")
    config = workspace / "nexus.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "mode": "dev",
                "workspace": str(workspace),
                "data_dir": str(tmp_path / "data"),
                "health": {"bearer_token": {"file": str(workspace / "secrets/health.token")}},
                "metrics": {"bearer_token": {"file": str(workspace / "secrets/metrics.token")}},
                "state": {"request_state_keys": [{"file": str(workspace / "secrets/state.key")}]},
                "profiles": {"file": str(workspace / "config/profiles.yaml")},
                "registry": {"directory": str(workspace / "config/registry")},
            }
        )
    )
    return workspace, config


@pytest.fixture(params=["load_settings", "settings_built_directly"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[NexusServer, Path]]:
    workspace, config = served_configuration(tmp_path)
    if request.param == "load_settings":
        settings = load_settings(config)
    else:
        raw = yaml.safe_load(config.read_text())
        settings = Settings(**raw)
    built = build_server(settings, config_file=config, audit_sinks=[MemoryAuditSink()])
    try:
        yield built, workspace
    finally:
        built.close()


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return wire(await client.call_tool_mcp(tool, arguments))


@pytest.mark.parametrize("relative", TRUSTED)
async def test_a_trusted_file_is_neither_read_nor_written(
    server: tuple[NexusServer, Path], relative: str
) -> None:
    built, workspace = server
    before = snapshot(workspace)
    async with Client(built.mcp) as client:
        for tool, arguments in [
            ("nexus_read_file", {"path": relative}),
            (
                "nexus_write_file",
                {"path": relative, "content": "mine", "overwrite": True, "idempotency_key": "k1"},
            ),
        ]:
            answer = await call(client, tool, arguments)
            assert answer["isError"] is True, (tool, answer)
            text = json.dumps(answer)
            assert json.loads(answer["content"][0]["text"])["code"] == "INVALID_PATH"
            assert CANARY not in text and relative not in text
        ordinary = await call(client, "nexus_read_file", {"path": "todo.txt"})
        assert ordinary["isError"] is False
    assert snapshot(workspace) == before


async def test_trusted_files_are_listed_nowhere(server: tuple[NexusServer, Path]) -> None:
    built, _ = server
    async with Client(built.mcp) as client:
        listed = json.dumps(
            await call(client, "nexus_list_files", {"path": ".", "recursive": True})
        )
        found = json.dumps(await call(client, "nexus_grep", {"pattern": CANARY, "path": "."}))
    assert "todo.txt" in listed
    for relative in TRUSTED:
        assert Path(relative).name not in listed
    assert CANARY not in found


def test_every_file_reference_of_raw_sections_is_found() -> None:
    raw = {
        "upstreams": {
            "servers": [
                {"server_id": "a", "credentials": {"bearer": {"file": "/s/a.token"}}},
                {"server_id": "b", "env": {"TOKEN": {"env": "B"}}},
            ]
        },
        "repos": {"forge": {"token": {"file": "/s/forge"}}},
        "approvals": {"secret": "inline"},
        "profiles": {"file": "/c/profiles.yaml"},
    }
    assert {str(p) for p in referenced_files(raw)} == {
        "/s/a.token",
        "/s/forge",
        "/c/profiles.yaml",
    }
