"""The tool catalog: what tools exist, and a ranked search over their names and descriptions.

Pure search, no permissions (seed 004 decision 8): the discovery tools post-filter every
answer through the caller's visible set, so the index never needs to know who asks.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

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
            self._document_frequency.subtract(
                set(entry.name_tokens) | set(entry.description_tokens)
            )
            self._document_frequency += Counter()  # drop the terms no entry has any more

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


__all__ = ["CatalogEntry", "ToolCatalog", "tokenize"]
