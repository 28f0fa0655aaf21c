"""The entry point: normalize before any read, read once, build the view, log safely."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nexus_mcp.errors import UpstreamError
from nexus_mcp.notes.backends import LocalVaultBackend
from nexus_mcp.notes.source import NoteSource
from nexus_mcp.notes.views import TOOL_VIEWS, VIEW_KINDS, read_note_view, to_log_record
from nexus_mcp.principal import Principal

CALLER = Principal(subject="tester", vault_id="vault-1", user_id="user-1")
SPEC_NOTE = (
    "---\ntitle: Example\n---\n# Plan\n\nIntro text.\n\n## Background\n\nFacts.\n\n## Method\n"
)


class CountingBackend:
    """A NoteBackend that serves one fixed note and counts reads (a test double for the role)."""

    def __init__(self, source: NoteSource) -> None:
        self.source = source
        self.paths: list[str] = []

    async def read_note(self, path: str, caller: Principal) -> NoteSource:
        self.paths.append(path)
        return self.source


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "example.md").write_text(SPEC_NOTE, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("kind", VIEW_KINDS)
async def test_every_view_reads_the_note_once_and_reports_the_normalized_path(kind: str) -> None:
    backend = CountingBackend(NoteSource("# Plan\n\ntext\n", {"title": "Example"}))
    view = await read_note_view(backend, kind, "  notes\\example.md ", CALLER)  # type: ignore[arg-type]
    assert backend.paths == ["notes/example.md"]
    assert view["path"] == "notes/example.md"


async def test_section_source_through_the_local_vault_matches_the_spec(vault: Path) -> None:
    view = await read_note_view(
        LocalVaultBackend(vault), "section_source", "notes/example.md", CALLER
    )
    assert view["title"] == "Example"
    assert [(s["heading_id"], s["body_available"]) for s in view["sections"]] == [
        ("h1-plan-0001", True),
        ("h2-background-0002", True),
        ("h2-method-0003", False),
    ]


@pytest.mark.parametrize("raw_path", [None, 7, "", "../x.md", "/abs.md", "C:/x.md", "a\x00b"])
async def test_an_invalid_path_is_refused_before_any_read(raw_path: object) -> None:
    backend = CountingBackend(NoteSource("# x"))
    with pytest.raises(UpstreamError) as caught:
        await read_note_view(backend, "outline", raw_path, CALLER)
    assert caught.value.message == "Invalid path"
    assert backend.paths == []


async def test_facets_of_a_dot_only_path_are_refused_before_any_read() -> None:
    backend = CountingBackend(NoteSource(""))
    with pytest.raises(UpstreamError):
        await read_note_view(backend, "facets", "./.", CALLER)
    assert backend.paths == []


async def test_tool_names_map_onto_the_four_views() -> None:
    assert sorted(TOOL_VIEWS) == [
        "get_document_tree", "get_metadata_facets", "get_note_outline", "get_section_source",
    ]  # fmt: skip
    assert set(TOOL_VIEWS.values()) == set(VIEW_KINDS)


async def test_log_records_hold_only_bounded_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    backend = CountingBackend(
        NoteSource("# CANARY-HEADING\n\nCANARY-BODY\n", {"title": "CANARY-TITLE"})
    )
    view = await read_note_view(backend, "section_source", "CANARY-PATH.md", CALLER)
    record = to_log_record("get_section_source", elapsed_s=0.0123, view=view)
    assert record == {
        "tool": "get_section_source",
        "outcome": "ok",
        "upstream_status_class": None,
        "elapsed_ms": 12.3,
        "section_count": 1,
        "truncated": False,
    }
    assert "CANARY" not in json.dumps(record)
    assert "CANARY" not in caplog.text


@pytest.mark.parametrize(
    ("error", "outcome", "status_class"),
    [
        (UpstreamError.invalid_path(), "invalid_path", None),
        (UpstreamError.status(404), "upstream_status", "4xx"),
        (UpstreamError.runtime_failure(), "runtime_failure", None),
        (RuntimeError("CANARY"), "error", None),
    ],
)
def test_log_records_classify_failures_without_their_text(
    error: BaseException, outcome: str, status_class: str | None
) -> None:
    record = to_log_record("get_note_outline", elapsed_s=0.5, error=error)
    assert (record["outcome"], record["upstream_status_class"]) == (outcome, status_class)
    assert record["section_count"] is None and record["truncated"] is None
    assert "CANARY" not in json.dumps(record)


def test_log_records_count_tree_nodes_and_never_echo_an_unknown_tool_name() -> None:
    tree = {
        "root": {"children": [{"children": [{"children": []}]}, {"children": []}]},
        "truncated": True,
    }
    record = to_log_record("CANARY-tool", elapsed_s=1, view=tree)
    assert record["tool"] == "unknown"
    assert (record["section_count"], record["truncated"]) == (3, True)
