"""Fail closed in every layer: a call that reaches a layer (or the connector) without the
state the layers before it open is refused, never passed on unchecked (issue 23).

The envelope opens a call's state and the identity layer gives it a principal; every
layer after them, and the connector, asks for that state through ``calls.chained_call``,
which refuses a call without it with the answer a hidden tool gets. These tests take
layers out of a real server's chain (as a mis-built chain or a bypass would) and show
that every call is still refused, that nothing is written and that nothing is read out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from fastmcp import Client
from fastmcp.server.middleware import Middleware, MiddlewareContext

from nexus_mcp.calls import CallState, open_call
from nexus_mcp.connector import chained_call
from nexus_mcp.envelope import UnknownTool
from nexus_mcp.middleware.approval import ApprovalMiddleware
from nexus_mcp.middleware.audit import AuditMiddleware
from nexus_mcp.middleware.chain import PolicyChain
from nexus_mcp.middleware.classification import ClassificationMiddleware
from nexus_mcp.middleware.documents import DocumentsMiddleware
from nexus_mcp.middleware.envelope import EnvelopeMiddleware
from nexus_mcp.middleware.identity import IdentityMiddleware
from nexus_mcp.middleware.limits import LimitsMiddleware
from nexus_mcp.middleware.namespace import ToolNamespaceMiddleware
from nexus_mcp.principal import Principal
from nexus_mcp.server import NexusServer

from .conftest import ServerFactory, snapshot

CANARY = "CANARY-FAIL-CLOSED-7f3"
WRITE = ("nexus_write_file", {"path": "fail-closed.txt", "content": CANARY})

# The layers that must find the call's state (all but the one that opens it and the one
# that names the caller), by the slot they fill.
CHECKING = {
    "audit": AuditMiddleware,
    "classification": ClassificationMiddleware,
    "approval": ApprovalMiddleware,
    "documents": DocumentsMiddleware,
    "limits": LimitsMiddleware,
}
# The layers that must find a principal in it (all but the audit, which runs first).
IDENTIFIED = ("classification", "approval", "documents", "limits")

LAYER_TYPES: dict[str, type[Middleware]] = {
    "envelope": EnvelopeMiddleware,
    "identity": IdentityMiddleware,
    "namespace": ToolNamespaceMiddleware,
    **CHECKING,
}


def chain_of(server: NexusServer) -> PolicyChain:
    (chain,) = server.mcp.middleware
    assert isinstance(chain, PolicyChain)
    return chain


def layer(server: NexusServer, slot: str) -> Middleware:
    (found,) = [m for m in chain_of(server).layers if isinstance(m, LAYER_TYPES[slot])]
    return found


def without(server: NexusServer, slots: Sequence[str]) -> None:
    chain = chain_of(server)
    removed = tuple(LAYER_TYPES[slot] for slot in slots)
    kept = [m for m in chain.layers if not isinstance(m, removed)]
    assert len(chain.layers) - len(kept) == len(slots)
    chain.replace_layers(kept)


def context(name: str, arguments: dict[str, Any]) -> MiddlewareContext[Any]:
    return MiddlewareContext(
        message=mcp_types.CallToolRequestParams(name=name, arguments=arguments),
        method="tools/call",
    )


class Next:
    """A ``call_next`` that records whether the layer passed the call on."""

    def __init__(self) -> None:
        self.called = False

    async def __call__(self, _context: MiddlewareContext[Any]) -> Any:
        self.called = True
        return "ran"


@pytest.mark.parametrize("slot", sorted(CHECKING))
async def test_a_layer_reached_without_the_call_state_refuses_and_passes_nothing_on(
    make_server: ServerFactory, slot: str
) -> None:
    server = make_server()
    call_next = Next()
    with pytest.raises(UnknownTool):
        await layer(server, slot).on_call_tool(context(*WRITE), call_next)  # type: ignore[attr-defined]
    assert not call_next.called


@pytest.mark.parametrize("slot", IDENTIFIED)
async def test_a_layer_reached_without_a_principal_refuses_and_passes_nothing_on(
    make_server: ServerFactory, slot: str
) -> None:
    server = make_server()
    call_next = Next()
    state = CallState(tool_name=WRITE[0], arguments=dict(WRITE[1]), meta={}, transport=None)
    with open_call(state), pytest.raises(UnknownTool):
        await layer(server, slot).on_call_tool(context(*WRITE), call_next)  # type: ignore[attr-defined]
    assert not call_next.called
    assert not state.executed


def test_chained_call_is_the_one_helper_and_says_nothing_of_the_call() -> None:
    with pytest.raises(UnknownTool) as refused:
        chained_call(CANARY)
    # The unknown-tool answer names the tool as sent (FastMCP's own words), nothing else.
    assert str(refused.value) == f"Unknown tool: {CANARY!r}"
    state = CallState(tool_name="t", arguments={}, meta={}, transport=None)
    with open_call(state):
        assert chained_call("t", identified=False) is state
        with pytest.raises(UnknownTool):
            chained_call("t")
        state.principal = Principal(subject="someone", role="viewer")
        assert chained_call("t") is state


BYPASSES = [
    ("envelope",),
    ("envelope", "audit"),
    ("identity",),
    ("identity", "namespace"),
    ("envelope", "identity", "namespace"),
    ("envelope", "audit", "identity", "namespace", "classification", "approval"),
    tuple(LAYER_TYPES),  # the connector alone
]


async def answer(server: NexusServer, name: str, arguments: dict[str, Any]) -> str:
    """What a client gets, as text: an error either way (a result or a protocol error)."""
    async with Client(server.mcp) as client:
        try:
            result = await client.call_tool_mcp(name, arguments)
        except Exception as exc:
            return f"error: {exc}"
    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped.get("isError") is True, dumped
    return json.dumps(dumped)


@pytest.mark.parametrize("slots", BYPASSES, ids=["-".join(s) for s in BYPASSES])
async def test_a_write_through_a_chain_missing_layers_is_refused_and_changes_nothing(
    make_server: ServerFactory, workspace: Path, slots: tuple[str, ...]
) -> None:
    server = make_server(read_only=False)
    before = snapshot(workspace)
    without(server, slots)
    text = await answer(server, *WRITE)
    assert CANARY not in text
    assert snapshot(workspace) == before


@pytest.mark.parametrize("slots", BYPASSES, ids=["-".join(s) for s in BYPASSES])
async def test_a_read_through_a_chain_missing_layers_is_refused_and_reads_nothing_out(
    make_server: ServerFactory, workspace: Path, slots: tuple[str, ...]
) -> None:
    (workspace / "private.txt").write_text(CANARY)
    server = make_server()
    without(server, slots)
    text = await answer(server, "nexus_read_file", {"path": "private.txt"})
    assert CANARY not in text
