"""The ``notes`` toolset: Knowtation-compatible one-note views, declared with ``@nexus_tool``.

Each tool takes exactly ``{"path": string}``; the vault and the canister user come from
the principal, never from arguments. All the work is in ``nexus_mcp.notes``; this module
only registers the four tools and writes their bounded operational log line (tool,
outcome class, upstream status class, elapsed time, section count, truncated flag).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from pydantic import Field

from nexus_mcp.calls import current_principal
from nexus_mcp.contracts import nexus_tool
from nexus_mcp.errors import UpstreamError
from nexus_mcp.notes import NoteBackend, ViewKind, read_note_view, to_log_record
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.principal import Principal
from nexus_mcp.workspace.replay import ReachedTheWorld

TOOLSET = "notes"
log = get_logger(__name__)

NotePathArg = Annotated[
    str, Field(description="Vault-relative note path, e.g. 'inbox/example.md'.")
]
BackendFor = Callable[[Principal], NoteBackend]


async def _view(backend_for: BackendFor, tool: str, kind: ViewKind, path: str) -> dict[str, Any]:
    principal = current_principal()
    started = time.perf_counter()
    view: dict[str, Any] | None = None
    error: BaseException | None = None
    try:
        if principal is None:  # the connector refuses earlier; never read without a caller
            raise UpstreamError.runtime_failure()
        view = await read_note_view(backend_for(principal), kind, path, principal)
        return view
    except BaseException as exc:
        error = exc
        raise
    finally:
        # A replay's argument pre-check stops at the vault (ReachedTheWorld): not a call.
        if not isinstance(error, ReachedTheWorld):
            log.info(
                "notes_tool",
                **to_log_record(
                    tool, elapsed_s=time.perf_counter() - started, view=view, error=error
                ),
            )


def build_notes_tools(backend_for: BackendFor) -> list[Callable[..., Awaitable[Any]]]:
    """The four notes tools over the caller's vault (``backend_for`` picks the backend)."""

    @nexus_tool(risk="read", toolset=TOOLSET, contains_user_content=True)
    async def get_section_source(path: NotePathArg) -> dict[str, Any]:
        """Body-free section metadata of one note (knowtation.section_source/v0): ids, levels,
        heading paths and whether each section has a body. Never returns note text."""
        return await _view(backend_for, "get_section_source", "section_source", path)

    @nexus_tool(risk="read", toolset=TOOLSET, contains_user_content=True)
    async def get_note_outline(path: NotePathArg) -> dict[str, Any]:
        """The flat heading outline of one note (knowtation.note_outline/v1)."""
        return await _view(backend_for, "get_note_outline", "outline", path)

    @nexus_tool(risk="read", toolset=TOOLSET, contains_user_content=True)
    async def get_document_tree(path: NotePathArg) -> dict[str, Any]:
        """The nested heading tree of one note (knowtation.document_tree/v0)."""
        return await _view(backend_for, "get_document_tree", "tree", path)

    @nexus_tool(risk="read", toolset=TOOLSET, contains_user_content=True)
    async def get_metadata_facets(path: NotePathArg) -> dict[str, Any]:
        """A bounded facet summary of one note's frontmatter (knowtation.metadata_facets/v0)."""
        return await _view(backend_for, "get_metadata_facets", "facets", path)

    return [get_section_source, get_note_outline, get_document_tree, get_metadata_facets]


__all__ = ["TOOLSET", "build_notes_tools"]
