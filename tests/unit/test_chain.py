"""The chain order is DESIGN.md's, decided in one place."""

from __future__ import annotations

from pathlib import Path

from nexus_mcp.chain import CHAIN_ORDER
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings


def test_chain_order_matches_the_design() -> None:
    assert CHAIN_ORDER == (
        "envelope", "audit", "identity", "namespace",
        "classification", "approval", "documents", "limits",
    )  # fmt: skip


def test_built_server_runs_middleware_in_design_order(tmp_path: Path) -> None:
    server = build_server(
        Settings(mode="dev", workspace=tmp_path, data_dir=tmp_path / "d"), audit_sinks=[]
    )
    names = [type(m).__name__ for m in server.mcp.middleware]
    ours = [n for n in names if n != "DereferenceRefsMiddleware"]
    expected_prefix = [
        "EnvelopeMiddleware",
        "AuditMiddleware",
        "IdentityMiddleware",
        "ToolNamespaceMiddleware",
    ]
    assert ours[: len(expected_prefix)] == expected_prefix
    assert names[0] == "EnvelopeMiddleware"
