"""nexus-mcp: a least-privilege MCP server for AI agents.

The names a user imports live here (``from nexus_mcp import build_server, Settings``);
everything else is an implementation module whose layout may change. They are loaded on
first use, so ``import nexus_mcp`` (and the command line) stays light until a server is
built. ``tests/unit/test_exported_members.py`` pins this list.

- building a server: ``build_server``, ``NexusServer``, ``Settings``, ``load_settings``
- declaring a tool: ``nexus_tool``, ``ToolContract``, ``DataHandling``
- who is calling: ``Principal``
- refusals: ``NexusError`` (every typed refusal) and its stable ``Code``
- the audit trail: ``AuditEvent``, ``AuditSink``, ``JsonlAuditSink``, ``MemoryAuditSink``
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nexus_mcp._version import __version__

if TYPE_CHECKING:
    from nexus_mcp.contracts import DataHandling, ToolContract, nexus_tool
    from nexus_mcp.errors import Code, NexusError
    from nexus_mcp.observability.audit import (
        AuditEvent,
        AuditSink,
        JsonlAuditSink,
        MemoryAuditSink,
    )
    from nexus_mcp.principal import Principal
    from nexus_mcp.server import NexusServer, build_server
    from nexus_mcp.settings import Settings, load_settings

# Each public name and the module that defines it.
_HOMES = {
    "AuditEvent": "nexus_mcp.observability.audit",
    "AuditSink": "nexus_mcp.observability.audit",
    "Code": "nexus_mcp.errors",
    "DataHandling": "nexus_mcp.contracts",
    "JsonlAuditSink": "nexus_mcp.observability.audit",
    "MemoryAuditSink": "nexus_mcp.observability.audit",
    "NexusError": "nexus_mcp.errors",
    "NexusServer": "nexus_mcp.server",
    "Principal": "nexus_mcp.principal",
    "Settings": "nexus_mcp.settings",
    "ToolContract": "nexus_mcp.contracts",
    "build_server": "nexus_mcp.server",
    "load_settings": "nexus_mcp.settings",
    "nexus_tool": "nexus_mcp.contracts",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'nexus_mcp' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AuditEvent",
    "AuditSink",
    "Code",
    "DataHandling",
    "JsonlAuditSink",
    "MemoryAuditSink",
    "NexusError",
    "NexusServer",
    "Principal",
    "Settings",
    "ToolContract",
    "__version__",
    "build_server",
    "load_settings",
    "nexus_tool",
]
