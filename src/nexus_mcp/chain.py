"""The one place that assembles the policy chain, outermost first (DESIGN.md, "The chain").

    1 envelope -> 2 audit -> 3 identity -> 4 namespace -> 5 classification
      -> 6 approval & write policy -> 7 documents -> 8 budgets & timeouts -> 9 connector

The connector (9) is not a middleware: ``@nexus_tool``'s binding wraps each tool function.
FastMCP runs ``mcp.middleware`` in list order, the first being the outermost (its
``DereferenceRefsMiddleware`` is appended after ours and only touches schemas).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastmcp.server.middleware import Middleware
from fastmcp.server.middleware.dereference import DereferenceRefsMiddleware

CHAIN_ORDER = (
    "envelope",
    "audit",
    "identity",
    "namespace",
    "classification",
    "approval",
    "documents",
    "limits",
)


@dataclass(frozen=True)
class ChainLayers:
    """The middleware for each slot; a slot a deployment does not use is ``None``."""

    envelope: Middleware
    audit: Middleware
    identity: Middleware
    namespace: Middleware | None = None
    classification: Middleware | None = None
    approval: Middleware | None = None
    documents: Middleware | None = None
    limits: Middleware | None = None


def build_middleware(layers: ChainLayers) -> list[Middleware]:
    """The chain in DESIGN.md order, skipping empty slots.

    FastMCP's ``DereferenceRefsMiddleware`` (inlines ``$ref`` in listed schemas) is placed
    right inside the envelope instead of innermost, where FastMCP would append it: there
    it only rewrites the tools the namespace lets the caller see, not every registered
    tool (30 instead of 1,000 in benchmarks/bench_list_tools.py). It never touches calls.
    """
    ordered = [getattr(layers, slot) for slot in CHAIN_ORDER]
    chain = [layer for layer in ordered if layer is not None]
    return [chain[0], DereferenceRefsMiddleware(), *chain[1:]]


__all__ = ["CHAIN_ORDER", "ChainLayers", "build_middleware"]
