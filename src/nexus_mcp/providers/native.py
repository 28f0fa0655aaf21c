"""The native provider: nexus-mcp's own toolsets, bound to the connector and registered.

Each ``@nexus_tool`` function is wrapped by ``decorator.bind_tool`` (the connector, chain
step 9) and held by FastMCP as a ``NexusTool``; the ``ToolIndex`` finds it by name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from fastmcp import FastMCP
from pydantic import BaseModel

from nexus_mcp.calls import CallState
from nexus_mcp.contracts import (
    ConnectorCheck,
    FinishedHook,
    NexusTool,
    ToolContract,
    bind_tool,
    contract_of,
)
from nexus_mcp.providers.tool_index import ToolIndex

ToolFunction = Callable[..., Awaitable[Any]]


def register_native_tools(
    mcp: FastMCP[Any],
    index: ToolIndex,
    functions: Iterable[ToolFunction],
    *,
    argument_models: Mapping[str, type[BaseModel]],
    checks: Sequence[ConnectorCheck],
    build_effect: Callable[[ToolContract, CallState], Mapping[str, Any]],
    on_started: Callable[[ToolContract, CallState], None],
    before_run: Callable[[ToolContract, CallState], None],
    on_finished: FinishedHook | None = None,
) -> list[NexusTool]:
    tools: list[NexusTool] = []
    for fn in functions:
        contract = contract_of(fn)
        bound = bind_tool(
            fn,
            checks=checks,
            build_effect=build_effect,
            on_started=on_started,
            before_run=before_run,
            on_finished=on_finished,
        )
        tool = NexusTool.bind(bound, contract, argument_models[contract.name])
        mcp.add_tool(tool)
        index.add(tool)
        tools.append(tool)
    return tools


__all__ = ["ToolFunction", "register_native_tools"]
