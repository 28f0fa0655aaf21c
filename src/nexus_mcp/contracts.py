"""``@nexus_tool``: a tool's declared contract (seed 002), attached where the tool is written::

    @nexus_tool(risk="read", description="Read a text file from the workspace.")
    async def nexus_read_file(path: str) -> ReadFileResult: ...

The decorator only attaches a ``ToolContract`` (name, version, description, risk,
required scopes, data handling). The native provider (``providers/native.py``) then binds
the function to the connector (``connector.py``, chain step 9), and
``build_arguments_model`` gives the strict model both the gateway and the tool validate
arguments with.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from fastmcp import Context
from pydantic import BaseModel, ConfigDict, create_model

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


__all__ = [
    "CONTRACT_ATTR",
    "DataHandling",
    "Risk",
    "ToolContract",
    "build_arguments_model",
    "contract_of",
    "nexus_tool",
]
