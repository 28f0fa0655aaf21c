"""The note as a backend hands it over: Markdown body and parsed frontmatter, nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field

from nexus_mcp.notes.frontmatter import Frontmatter


@dataclass(frozen=True)
class NoteSource:
    """One note read from a vault.

    ``body`` is the Markdown after frontmatter removal, not yet trimmed; ``frontmatter``
    is the parsed mapping (``{}`` when absent or invalid). Neither ever reaches an output,
    an error or a log line; only derived headings and facets do.
    """

    body: str
    frontmatter: Frontmatter = field(default_factory=dict)

    def __repr__(self) -> str:
        # Keep note content out of tracebacks and debug logs.
        body, keys = len(self.body), len(self.frontmatter)
        return f"NoteSource(body=<{body} chars>, frontmatter=<{keys} keys>)"
