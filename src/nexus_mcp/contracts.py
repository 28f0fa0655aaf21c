"""``@nexus_tool``: declares a tool's contract and binds it to the connector enforcement point.

A tool function is decorated where it is written::

    @nexus_tool(risk="read", description="Read a text file from the workspace.")
    async def nexus_read_file(path: str) -> ReadFileResult: ...

The decorator only attaches a ``ToolContract`` (seed 002: name, version, description,
risk, required scopes, data handling). ``server.py`` then calls ``bind_tool`` to wrap the
function with the connector, the innermost layer of the chain (DESIGN.md, step 9): right
before the function runs it re-checks the call against the same loaded registry object
the gateway middleware used (defense in depth), and it turns typed refusals into a
FastMCP ``ToolError`` that carries them, so FastMCP passes them up without logging a
traceback and the envelope can answer with the right code. ``functools.wraps`` keeps the
signature, which FastMCP reads to build the input schema (FASTMCP4_GUIDE 3.2).
"""

from __future__ import annotations

import functools
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from fastmcp import Context
from fastmcp.exceptions import NotFoundError as FastMCPNotFoundError
from fastmcp.exceptions import ToolError
from fastmcp.exceptions import ValidationError as FastMCPValidationError
from fastmcp.tools import FunctionTool, ToolResult
from mcp_types import TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, PrivateAttr, create_model
from pydantic import ValidationError as PydanticValidationError

from nexus_mcp.calls import META_TOOL_EFFECT, CallState, current_call
from nexus_mcp.errors import NexusError
from nexus_mcp.json_text import to_result_json

Risk = Literal["read", "write", "admin"]
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

CONTRACT_ATTR = "__nexus_contract__"


@dataclass(frozen=True)
class DataHandling:
    """What of a call may be logged (seed 002 ``data_handling``).

    ``loggable_args`` names the argument fields whose values may appear in the audit log;
    every other argument is represented only by the digest of all arguments.
    ``secret_args`` names the fields that are secrets: a recording (``serve --record``)
    neither writes nor hashes them (an argument schema marked ``writeOnly`` or
    ``format: password`` counts as one too, ``fixtures/lines.secret_fields``).
    """

    loggable_args: frozenset[str] = frozenset()
    secret_args: frozenset[str] = frozenset()
    contains_user_content: bool = True


@dataclass(frozen=True)
class ToolContract:
    """The declared contract of one tool."""

    name: str
    description: str
    risk: Risk
    toolset: str
    version: str = "1.0.0"
    title: str | None = None
    required_scopes: frozenset[str] = frozenset()
    data_handling: DataHandling = field(default_factory=DataHandling)
    idempotent: bool | None = None

    @property
    def tool_class(self) -> Literal["read", "write"]:
        """The registry class this risk corresponds to (admin is a write)."""
        return "read" if self.risk == "read" else "write"

    def annotations(self) -> dict[str, Any]:
        """MCP tool annotations derived from the risk."""
        read = self.risk == "read"
        return {
            "title": self.title or self.name,
            "readOnlyHint": read,
            "destructiveHint": not read,
            "idempotentHint": read if self.idempotent is None else self.idempotent,
            "openWorldHint": False,
        }

    def meta(self) -> dict[str, Any]:
        return {
            "nexus": {
                "risk": self.risk,
                "version": self.version,
                "toolset": self.toolset,
                "required_scopes": sorted(self.required_scopes),
            }
        }


def nexus_tool(
    *,
    risk: Risk,
    toolset: str,
    description: str | None = None,
    name: str | None = None,
    version: str = "1.0.0",
    title: str | None = None,
    required_scopes: Sequence[str] = (),
    loggable_args: Sequence[str] = (),
    secret_args: Sequence[str] = (),
    contains_user_content: bool = True,
    idempotent: bool | None = None,
) -> Callable[[F], F]:
    """Declare a tool's contract. The function must be ``async`` and return a model or dict."""

    def decorate(fn: F) -> F:
        if not inspect.iscoroutinefunction(typing.cast(Any, fn)):
            raise TypeError(f"@nexus_tool needs an async function: {fn.__qualname__}")
        doc = inspect.getdoc(fn) or ""
        contract = ToolContract(
            name=name or fn.__name__,
            description=description or doc.split("\n\n")[0].strip() or fn.__name__,
            risk=risk,
            toolset=toolset,
            version=version,
            title=title,
            required_scopes=frozenset(required_scopes),
            data_handling=DataHandling(
                loggable_args=frozenset(loggable_args),
                secret_args=frozenset(secret_args),
                contains_user_content=contains_user_content,
            ),
            idempotent=idempotent,
        )
        setattr(fn, CONTRACT_ATTR, contract)
        return fn

    return decorate


def build_arguments_model(fn: Callable[..., Any]) -> type[BaseModel]:
    """A strict model of the tool's arguments, for validating a call before policy sees it.

    Same rules as FastMCP's own validation (strict, no extra keys), but without running
    the function, so the chain can refuse bad input before classification or approval.
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        hint = hints.get(name, Any)
        if isinstance(hint, type) and issubclass(hint, Context):
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (hint, default)
    config = ConfigDict(extra="forbid", strict=True)
    return create_model(f"{fn.__name__}_arguments", __config__=config, **fields)


def contract_of(fn: Callable[..., Any]) -> ToolContract:
    contract = getattr(fn, CONTRACT_ATTR, None)
    if not isinstance(contract, ToolContract):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)!r} is not declared with @nexus_tool")
    return contract


class ConnectorRefusal(ToolError):
    """A typed refusal crossing FastMCP's tool boundary; the envelope unwraps ``.error``."""

    def __init__(self, error: NexusError) -> None:
        # A typed refusal is an expected outcome, not a server fault: FastMCP logs it at
        # this level instead of as an error with a traceback.
        super().__init__(error.message, log_level=logging.DEBUG)
        self.error = error


class ConnectorCheck(Protocol):
    """One connector-side check, run before (``before``) and after (``after``) the tool."""

    def before(
        self, contract: ToolContract, state: CallState, arguments: dict[str, Any]
    ) -> None: ...

    def after(
        self, contract: ToolContract, state: CallState, structured: dict[str, Any]
    ) -> None: ...


EffectBuilder = Callable[[ToolContract, CallState], Mapping[str, Any]]
# Called once a call that reached the connector has its outcome: (contract, state, the
# validated arguments, the result or None, the failure or None). ``serve --record``.
FinishedHook = Callable[
    [ToolContract, CallState, Mapping[str, Any], ToolResult | None, BaseException | None], None
]


def to_structured(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return value
    raise TypeError("a nexus tool must return a pydantic model or a dict")


def bind_tool(
    fn: Callable[..., Awaitable[Any]],
    *,
    checks: Sequence[ConnectorCheck],
    build_effect: EffectBuilder,
    on_started: Callable[[ToolContract, CallState], None],
    before_run: Callable[[ToolContract, CallState], None] = lambda contract, state: None,
    on_finished: FinishedHook | None = None,
) -> Callable[..., Awaitable[ToolResult]]:
    """Wrap a declared tool with the connector; the result is what FastMCP registers."""
    contract = contract_of(fn)

    @functools.wraps(fn)
    async def connector(*args: Any, **kwargs: Any) -> ToolResult:
        state = current_call()
        if state is None or state.principal is None:
            # Reached without the chain (or without an identity): behave as if the tool
            # did not exist, the same answer the namespace gives for a hidden tool.
            raise FastMCPNotFoundError(f"Unknown tool: {contract.name!r}")
        try:
            for check in checks:
                check.before(contract, state, kwargs)
            # The last gate: what must happen only once the call will really run (spending
            # an approval nonce). Not a removable check: it is part of the binding.
            before_run(contract, state)
            state.executed = True
            on_started(contract, state)
            value = await fn(*args, **kwargs)
            # What the client receives (no lone surrogate: see to_result_json) is what the
            # checks after the call hash.
            structured, text = to_result_json(to_structured(value))
            for check in checks:
                check.after(contract, state, structured)
            effect = build_effect(contract, state)
        except NexusError as exc:
            if on_finished is not None:
                on_finished(contract, state, kwargs, None, exc)
            raise ConnectorRefusal(exc) from exc
        except Exception as exc:
            if on_finished is not None:
                on_finished(contract, state, kwargs, None, exc)
            raise
        state.effect = effect
        result = ToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content=structured,
            meta={META_TOOL_EFFECT: dict(effect)},
        )
        if on_finished is not None:
            on_finished(contract, state, kwargs, result, None)
        return result

    # functools.wraps copied the declared function's annotations, so FastMCP derives the
    # input and output schemas from them, not from the ToolResult returned here.
    return connector


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
        connector: Callable[..., Awaitable[ToolResult]],
        contract: ToolContract,
        arguments_model: type[BaseModel],
    ) -> NexusTool:
        """FastMCP's tool for a bound ``@nexus_tool``, validating with ``arguments_model``
        (the very class the gateway validates with, from ``build_arguments_model``)."""
        tool = cls.from_function(
            connector,
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
        state = current_call()
        checked = state.validated_arguments if state is not None else None
        if checked is not None and checked[0] is arguments:
            # The gateway validated this very object with this very model (chain step 5).
            kwargs = checked[1]
        else:
            try:
                kwargs = model.model_validate(arguments).__dict__
            except PydanticValidationError as exc:
                # The envelope names the field from the cause, never the value (issue 2).
                raise FastMCPValidationError("invalid arguments") from exc
        result: ToolResult = await self.fn(**kwargs)
        return result


__all__ = [
    "CONTRACT_ATTR",
    "ConnectorCheck",
    "ConnectorRefusal",
    "DataHandling",
    "FinishedHook",
    "NexusTool",
    "Risk",
    "ToolContract",
    "bind_tool",
    "build_arguments_model",
    "contract_of",
    "nexus_tool",
    "to_structured",
]
