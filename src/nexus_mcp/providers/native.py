"""The native provider: nexus-mcp's own toolsets, bound to the connector and registered.

Each ``@nexus_tool`` function is bound to the one ``Connector`` (chain step 9) by
``bind_native`` and held by FastMCP as a ``NexusTool``; the ``ToolIndex`` finds it by name.
``functools.wraps`` keeps the declared signature, which FastMCP reads to build the input
and output schemas (FASTMCP4_GUIDE 3.2).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from fastmcp import FastMCP
from fastmcp.tools import FunctionTool, ToolResult
from mcp_types import TextContent, ToolAnnotations
from pydantic import BaseModel, PrivateAttr
from pydantic import ValidationError as PydanticValidationError

from nexus_mcp.connector import Connector, Outcome, chained_call
from nexus_mcp.contracts import ToolContract, contract_of
from nexus_mcp.envelope import ConnectorRefusal, invalid_input_from
from nexus_mcp.json_text import to_result_json
from nexus_mcp.providers.tool_index import ToolIndex

ToolFunction = Callable[..., Awaitable[Any]]


def to_structured(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return value
    raise TypeError("a nexus tool must return a pydantic model or a dict")


def bind_native(fn: ToolFunction, connector: Connector) -> Callable[..., Awaitable[ToolResult]]:
    """The declared tool run through ``connector``: what FastMCP registers."""
    contract = contract_of(fn)

    @functools.wraps(fn)
    async def connector_run(*args: Any, **kwargs: Any) -> ToolResult:
        state = chained_call(contract.name)

        async def execute() -> Outcome:
            value = await fn(*args, **kwargs)
            # What the client receives (no lone surrogate: see to_result_json) is what the
            # checks after the call hash.
            structured, text = to_result_json(to_structured(value))
            return Outcome(
                content=[TextContent(type="text", text=text)],
                structured=structured,
                document=structured,
            )

        return await connector.run(contract, state, kwargs, execute)

    # The contract already holds the description (``contract_of`` read the declared
    # docstring), and no nexus tool documents its parameters in its docstring (their
    # descriptions are the arguments model's). Without a docstring on the wrapper FastMCP
    # skips its docstring parser (griffe: imported at the first parse, ~0.1 s of a stdio
    # start, and three parsers tried on each of the 19 tools); the listing is the same
    # (tests/unit/providers/test_native_listing.py).
    connector_run.__doc__ = None

    # functools.wraps copied the declared function's annotations, so FastMCP derives the
    # input and output schemas from them, not from the ToolResult returned here.
    return connector_run


class NexusTool(FunctionTool):
    """How FastMCP holds a bound ``@nexus_tool``: FastMCP's ``FunctionTool``, with its own
    ``run`` (FastMCP's documented extension point for tools).

    Everything else is FastMCP's: ``from_function`` derives the input and output schemas
    from the declared signature, and listing, lookup, visibility and the wire format are
    untouched. ``run`` differs only where a nexus tool never needs FastMCP's general
    machinery: arguments are validated by the tool's strict arguments model (the same one
    the gateway validates with), and the connector already returns a ``ToolResult``, so
    there is no per-call wrapping of the function, no dependency injection (nexus tools
    take no ``Context``), no result conversion and no task or timeout handling (budgets
    and timeouts are chain step 8). That is about 2.5 % of a bare FastMCP call
    (benchmarks/README.md).
    """

    _arguments_model: type[BaseModel] | None = PrivateAttr(default=None)

    @classmethod
    def bind(
        cls,
        connector_run: Callable[..., Awaitable[ToolResult]],
        contract: ToolContract,
        arguments_model: type[BaseModel],
    ) -> NexusTool:
        """FastMCP's tool for a bound ``@nexus_tool``, validating with ``arguments_model``
        (the very class the gateway validates with, from ``build_arguments_model``)."""
        tool = cls.from_function(
            connector_run,
            name=contract.name,
            description=contract.description,
            annotations=ToolAnnotations(**contract.annotations()),
            meta=contract.meta(),
            tags={contract.toolset},
        )
        assert isinstance(tool, NexusTool)
        tool._arguments_model = arguments_model
        return tool

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        model = self._arguments_model
        if model is None:  # pragma: no cover - bind() always sets it
            return await super().run(arguments)
        # Fail closed before the arguments are looked at: reached without the chain, a
        # tool is a missing one, and "invalid arguments" would say it exists.
        state = chained_call(self.name)
        checked = state.validated_arguments
        if checked is not None and checked[0] is arguments:
            # The gateway validated this very object with this very model (chain step 5).
            kwargs = checked[1]
        else:
            try:
                kwargs = model.model_validate(arguments).__dict__
            except PydanticValidationError as exc:
                # Worded as the gateway words it (the field and the declared names, never
                # the value: issue 2), for a call that reached the tool without the chain.
                raise ConnectorRefusal(invalid_input_from(exc, model.model_fields)) from None
        result: ToolResult = await self.fn(**kwargs)
        return result


def register_native_tools(
    mcp: FastMCP[Any],
    index: ToolIndex,
    functions: Iterable[ToolFunction],
    *,
    argument_models: Mapping[str, type[BaseModel]],
    connector: Connector,
) -> list[NexusTool]:
    tools: list[NexusTool] = []
    for fn in functions:
        contract = contract_of(fn)
        tool = NexusTool.bind(bind_native(fn, connector), contract, argument_models[contract.name])
        mcp.add_tool(tool)
        index.add(tool)
        tools.append(tool)
    return tools


__all__ = ["NexusTool", "ToolFunction", "bind_native", "register_native_tools", "to_structured"]
