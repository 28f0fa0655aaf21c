"""The book of tools: every tool the chain knows, registered by the provider that serves it.

"Where does the chain learn about tool X?" has one answer: the ``ToolBook``. The native
provider registers nexus-mcp's own tools when the server is built, a replay its recorded
ones, and the upstream gateway each upstream's tools as they appear, change or go
(``put``/``withdraw``). Every layer that needs to know about a tool reads the book's live,
read-only views: its contract (audit, approval, classification), its route in the
registry (``{server_id, tool_name}``), its arguments model or check, its toolset
(idempotency target) and its catalog entry (discovery). No one else writes them.

The tool catalog: what tools exist, and a ranked search over their names and descriptions.

Pure search, no permissions (seed 004 decision 8): the discovery tools post-filter every
answer through the caller's visible set, so the index never needs to know who asks.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from nexus_mcp.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pydantic import BaseModel

    from nexus_mcp.contracts import ToolContract

    ArgumentCheck = Callable[[Mapping[str, Any]], None]

_TOKEN_RE = re.compile(r"[a-z0-9]+")
NAME_WEIGHT = 3.0
PREFIX_WEIGHT = 1.5
DESCRIPTION_WEIGHT = 1.0


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text.lower())


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    server_id: str
    toolset: str
    description: str
    risk: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]
    name_tokens: frozenset[str] = field(default_factory=frozenset)
    description_tokens: Counter[str] = field(default_factory=Counter)


class ToolCatalog:
    """Every registered tool of this server, indexed for search."""

    def __init__(self) -> None:
        self._entries: dict[str, CatalogEntry] = {}
        self._document_frequency: Counter[str] = Counter()

    def add(
        self,
        *,
        name: str,
        server_id: str,
        toolset: str,
        description: str,
        risk: str,
        input_schema: dict[str, Any],
        annotations: dict[str, Any],
    ) -> None:
        """Index a tool, replacing its namesake (unless listed again unchanged)."""
        held = self._entries.get(name)
        if held is not None and (
            (held.server_id, held.toolset, held.description, held.risk)
            == (server_id, toolset, description, risk)
            and held.input_schema == input_schema
            and held.annotations == annotations
        ):
            return  # listed again unchanged: nothing to index anew
        self.remove(name)
        entry = CatalogEntry(
            name=name,
            server_id=server_id,
            toolset=toolset,
            description=description,
            risk=risk,
            input_schema=input_schema,
            annotations=annotations,
            name_tokens=frozenset(tokenize(name)),
            description_tokens=Counter(tokenize(description)),
        )
        self._entries[name] = entry
        self._document_frequency.update(set(entry.name_tokens) | set(entry.description_tokens))

    def remove(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            terms = set(entry.name_tokens) | set(entry.description_tokens)
            frequency = self._document_frequency
            frequency.subtract(terms)
            # Drop the terms no entry has any more: this entry's only (``+= Counter()``
            # would scan every term of the catalog, once per tool of a huge listing).
            for term in terms:
                if frequency[term] <= 0:
                    del frequency[term]

    def get(self, name: str) -> CatalogEntry | None:
        return self._entries.get(name)

    def entries(self) -> list[CatalogEntry]:
        return [self._entries[name] for name in sorted(self._entries)]

    def rank(self, query: str) -> list[tuple[float, CatalogEntry]]:
        """Every entry with a positive score, best first (ties by name): deterministic."""
        terms = tokenize(query)
        if not terms:
            return []
        total = max(1, len(self._entries))
        scored: list[tuple[float, CatalogEntry]] = []
        for entry in self._entries.values():
            score = 0.0
            for term in terms:
                idf = math.log(1 + total / (1 + self._document_frequency.get(term, 0)))
                if term in entry.name_tokens:
                    score += NAME_WEIGHT * idf
                elif any(token.startswith(term) for token in entry.name_tokens):
                    score += PREFIX_WEIGHT * idf
                count = entry.description_tokens.get(term, 0)
                if count:
                    score += DESCRIPTION_WEIGHT * idf * (1 + math.log(count))
            if score > 0:
                scored.append((score, entry))
        scored.sort(key=lambda item: (-item[0], item[1].name))
        return scored


@dataclass(frozen=True)
class Listing:
    """How a tool is shown to discovery (``nexus_search_tools``)."""

    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]


class ToolBook:
    """Every tool the chain knows, by the name callers use (module docstring)."""

    def __init__(self) -> None:
        self._contracts: dict[str, ToolContract] = {}
        self._models: dict[str, type[BaseModel]] = {}
        self._checks: dict[str, ArgumentCheck] = {}
        self._routes: dict[str, tuple[str, str]] = {}
        self._toolsets: dict[str, str] = {}
        self.catalog = ToolCatalog()
        # Live read-only views, for the layers that read the book on every call.
        self.contracts: Mapping[str, ToolContract] = MappingProxyType(self._contracts)
        self.argument_models: Mapping[str, type[BaseModel]] = MappingProxyType(self._models)
        self.argument_checks: Mapping[str, ArgumentCheck] = MappingProxyType(self._checks)
        self.routes: Mapping[str, tuple[str, str]] = MappingProxyType(self._routes)
        self.toolsets: Mapping[str, str] = MappingProxyType(self._toolsets)

    def add(
        self,
        contract: ToolContract,
        *,
        server_id: str,
        listing: Listing,
        arguments_model: type[BaseModel] | None = None,
        argument_check: ArgumentCheck | None = None,
        route: tuple[str, str] | None = None,
    ) -> None:
        """A tool that must not have a namesake (the tools a server is built with)."""
        if contract.name in self._contracts:
            raise ConfigError(f"two tools are named {contract.name}")
        self.put(
            contract,
            server_id=server_id,
            listing=listing,
            arguments_model=arguments_model,
            argument_check=argument_check,
            route=route,
        )

    def put(
        self,
        contract: ToolContract,
        *,
        server_id: str,
        listing: Listing,
        arguments_model: type[BaseModel] | None = None,
        argument_check: ArgumentCheck | None = None,
        route: tuple[str, str] | None = None,
    ) -> None:
        """Register ``contract``'s tool, replacing what the book held under its name."""
        name = contract.name
        self._contracts[name] = contract
        self._toolsets[name] = contract.toolset
        _set(self._models, name, arguments_model)
        _set(self._checks, name, argument_check)
        _set(self._routes, name, route)
        self.catalog.add(
            name=name,
            server_id=server_id,
            toolset=contract.toolset,
            description=listing.description,
            risk=contract.risk,
            input_schema=listing.input_schema,
            annotations=listing.annotations,
        )

    def withdraw(self, name: str) -> None:
        """The tool is gone: discovery no longer finds it. Its contract, route and toolset
        stay, so a call already past the namespace layer is still audited and refused
        under what it was (the namespace refuses every new call to it)."""
        self.catalog.remove(name)


def _set(table: dict[str, Any], name: str, value: Any) -> None:
    if value is None:
        table.pop(name, None)
    else:
        table[name] = value


__all__ = ["CatalogEntry", "Listing", "ToolBook", "ToolCatalog", "tokenize"]
