"""The ReBAC tuple store as policy sees it: one grant (``RelationTuple``) and the small
protocol (``TupleStore``) the grants and visibility policies are written against. Its
backends (SQLite embedded, PostgreSQL shared) implement it in ``stores/``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

# Tools are the objects /tools/<name> of the tuple store; resource sources
# /resources/<source> and prompts /prompts/<name>, each kind under its own prefix, so a
# tool listing (the hot path) never reads a resource or prompt grant.
TOOLS_PREFIX = "/tools/"
RESOURCES_PREFIX = "/resources/"
PROMPTS_PREFIX = "/prompts/"


class RelationTuple(NamedTuple):
    """One grant: ``subject`` has ``relation`` on ``object`` (e.g. viewer on /tools/x)."""

    subject: str
    relation: str
    object: str


class TupleStore(Protocol):
    """What policy needs from a grants backend (SQLite embedded, PostgreSQL shared).

    ``zones``, ``export_zone`` and ``import_zone`` move grants between backends
    (``nexus-mcp state export|import``); their format is ``export_document``'s.
    """

    def write(self, tuples: Iterable[RelationTuple], zone: str) -> int: ...

    def delete(self, tuples: Iterable[RelationTuple], zone: str) -> int: ...

    def update(
        self,
        zone: str,
        *,
        write: Iterable[RelationTuple] = (),
        delete: Iterable[RelationTuple] = (),
    ) -> int: ...

    def check(self, subject: str, relation: str, object: str, zone: str) -> bool: ...

    def list_objects(
        self, subject: str, relation: str, zone: str, prefix: str = TOOLS_PREFIX
    ) -> list[str]: ...

    def revision(self, zone: str) -> int: ...

    def set_assignment(self, subject: str, profile: str, zone: str) -> int: ...

    def get_assignment(self, subject: str, zone: str) -> str | None: ...

    def clear_assignment(self, subject: str, zone: str) -> int: ...

    def list_subjects(self, zone: str) -> list[str]: ...

    def zones(self) -> list[str]: ...

    def export_zone(self, zone: str) -> dict[str, Any]: ...

    def import_zone(self, data: Mapping[str, Any], zone: str) -> int: ...

    def close(self) -> None: ...


__all__ = ["PROMPTS_PREFIX", "RESOURCES_PREFIX", "TOOLS_PREFIX", "RelationTuple", "TupleStore"]
