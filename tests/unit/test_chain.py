"""The chain order is DESIGN.md's, decided in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastmcp import Client, FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.middleware.middleware import _dispatch_phase

from nexus_mcp.middleware.chain import CHAIN_ORDER, PolicyChain, hooks_for
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
    (chain,) = server.mcp.middleware  # FastMCP sees one middleware: the PolicyChain
    assert isinstance(chain, PolicyChain)
    names = [type(m).__name__ for m in chain.layers]
    ours = [n for n in names if n != "DereferenceRefsMiddleware"]
    expected_prefix = [
        "EnvelopeMiddleware",
        "AuditMiddleware",
        "IdentityMiddleware",
        "ToolNamespaceMiddleware",
    ]
    assert ours == [
        *expected_prefix,
        "ClassificationMiddleware",
        "ApprovalMiddleware",
        "DocumentsMiddleware",
        "LimitsMiddleware",
    ]
    assert names[0] == "EnvelopeMiddleware"
    assert names[1] == "DereferenceRefsMiddleware"


class Recorder(Middleware):
    """Records each hook it defines; ``on_notification`` is left to the base class."""

    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen

    async def on_message(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        self.seen.append(f"{self.name}.message:{context.method}")
        return await call_next(context)

    async def on_request(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        self.seen.append(f"{self.name}.request:{context.method}")
        return await call_next(context)

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        self.seen.append(f"{self.name}.call_tool")
        result = await call_next(context)
        self.seen.append(f"{self.name}.call_tool:done")
        return result

    async def on_list_tools(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        self.seen.append(f"{self.name}.list_tools")
        return await call_next(context)


class RawCall(Middleware):
    """A layer that overrides ``__call__`` itself, as FastMCP allows."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def __call__(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        self.seen.append(f"raw:{context.method}")
        return await call_next(context)


async def run_session(middleware: list[Middleware]) -> None:
    server: FastMCP[Any] = FastMCP("t", middleware=middleware)

    @server.tool
    def echo(text: str) -> str:
        return text

    async with Client(server, mode="legacy") as client:
        await client.list_tools()
        await client.call_tool("echo", {"text": "x"})
        await client.ping()


async def test_the_policy_chain_runs_the_same_hooks_in_the_same_order_as_fastmcp() -> None:
    direct: list[str] = []
    await run_session([Recorder("a", direct), RawCall(direct), Recorder("b", direct)])
    chained: list[str] = []
    await run_session(
        [PolicyChain([Recorder("a", chained), RawCall(chained), Recorder("b", chained)])]
    )
    assert chained == direct
    call = direct.index("a.call_tool")
    assert direct[call - 2 : call + 6] == [
        "a.message:tools/call",
        "a.request:tools/call",
        "a.call_tool",
        "raw:tools/call",
        "b.message:tools/call",
        "b.request:tools/call",
        "b.call_tool",
        "b.call_tool:done",
    ]
    assert "a.list_tools" in direct and "raw:ping" in direct


def test_hooks_are_only_those_a_layer_defines() -> None:
    seen: list[str] = []
    layer = Recorder("a", seen)
    hooks = hooks_for([layer], "tools/call", "request")
    assert [h.__name__ for h in hooks] == ["on_message", "on_request", "on_call_tool"]
    hooks = hooks_for([layer], "notifications/initialized", "notification")
    assert [h.__name__ for h in hooks] == ["on_message"]


async def test_replacing_layers_takes_effect_on_the_next_message() -> None:
    seen: list[str] = []
    chain = PolicyChain([Recorder("a", seen), Recorder("b", seen)])
    await run_session([chain])
    assert any(s.startswith("b.") for s in seen)
    seen.clear()
    chain.replace_layers([Recorder("a", seen)])
    await run_session([chain])
    assert seen and not any(s.startswith("b.") for s in seen)


def test_each_dispatch_phase_runs_only_its_hooks_as_fastmcp_does() -> None:
    """FastMCP observes a request whose params failed validation in an "outer" pass, with
    the raw params (a dict, not the typed message): no typed hook may run there."""
    layer = Recorder("a", [])
    assert [h.__name__ for h in hooks_for([layer], "tools/call", "request", "outer")] == [
        "on_message",
        "on_request",
    ]
    assert [h.__name__ for h in hooks_for([layer], "tools/call", "request", "typed")] == [
        "on_call_tool"
    ]
    assert [h.__name__ for h in hooks_for([layer], "tools/call", "request", "all")] == [
        "on_message",
        "on_request",
        "on_call_tool",
    ]


async def test_the_policy_chain_reads_fastmcps_dispatch_phase() -> None:
    seen: list[str] = []
    chain = PolicyChain([Recorder("a", seen)])
    raw_params = {"name": 1, "arguments": "not an object"}
    context = MiddlewareContext(message=raw_params, method="tools/call", type="request")

    async def handler(_: MiddlewareContext[Any]) -> str:
        return "answered"

    token = _dispatch_phase.set("outer")
    try:
        assert await chain(context, handler) == "answered"
    finally:
        _dispatch_phase.reset(token)
    assert seen == ["a.message:tools/call", "a.request:tools/call"]
