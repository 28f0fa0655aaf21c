"""The public API: the names ``nexus_mcp`` exports, pinned (httpx's test_exported_members).

Changing this list is a change of the public API: say so in CHANGELOG.md.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import nexus_mcp

PUBLIC = {
    "AuditEvent": "nexus_mcp.observability.audit",
    "AuditSink": "nexus_mcp.observability.audit",
    "Code": "nexus_mcp.errors",
    "DataHandling": "nexus_mcp.contracts",
    "JsonlAuditSink": "nexus_mcp.observability.audit",
    "MemoryAuditSink": "nexus_mcp.observability.audit",
    "NexusError": "nexus_mcp.errors",
    "NexusServer": "nexus_mcp.server.runtime",
    "Principal": "nexus_mcp.principal",
    "Settings": "nexus_mcp.settings",
    "ToolContract": "nexus_mcp.contracts",
    "build_server": "nexus_mcp.server.build",
    "load_settings": "nexus_mcp.settings",
    "nexus_tool": "nexus_mcp.contracts",
}


def test_all_is_exactly_the_public_names() -> None:
    assert sorted(nexus_mcp.__all__) == sorted([*PUBLIC, "__version__"])


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_public_name_is_the_object_its_module_defines(name: str) -> None:
    exported = getattr(nexus_mcp, name)
    home = importlib.import_module(PUBLIC[name])
    assert exported is getattr(home, name)
    assert getattr(exported, "__module__", PUBLIC[name]) == PUBLIC[name]
    assert name in dir(nexus_mcp)


def test_star_import_gives_the_public_names_only() -> None:
    namespace: dict[str, object] = {}
    exec("from nexus_mcp import *", namespace)  # noqa: S102 - the import users write
    assert {n for n in namespace if not n.startswith("__")} == set(PUBLIC)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = nexus_mcp.build_servers  # type: ignore[attr-defined]


def test_the_version_is_the_project_version() -> None:
    assert nexus_mcp.__version__ == importlib.import_module("nexus_mcp._version").__version__


def test_importing_the_package_loads_no_server_machinery() -> None:
    # The command line imports the package first: it must not pay for FastMCP until a
    # command needs it.
    probe = (
        "import sys, nexus_mcp; "
        "print(sorted(m for m in ('fastmcp', 'nexus_mcp.server') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_server_builds_from_the_public_names_alone(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "ws").mkdir()
    audit = nexus_mcp.MemoryAuditSink()
    server = nexus_mcp.build_server(
        nexus_mcp.Settings(mode="dev", workspace=root / "ws", data_dir=root / "data"),
        audit_sinks=[audit],
    )
    try:
        assert isinstance(server, nexus_mcp.NexusServer)
    finally:
        server.close()
