"""The canister deadline against the notes tools' timeouts, as a plain function."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.notes.vaults import CANISTER_DEADLINE_MARGIN_SECONDS, check_canister_deadline
from nexus_mcp.settings import Settings

NOTES_TOOLS = ("get_section_source", "get_note_outline")
NAMED = "'notes.total_timeout_seconds' (NEXUS_MCP_NOTES__TOTAL_TIMEOUT_SECONDS)"


def settings(backend: str = "canister", total: float = 4.0, **budgets: Any) -> Settings:
    notes: dict[str, Any] = {
        "backend": backend,
        "canister_url": "http://127.0.0.1:9",
        "connect_timeout_seconds": 1.0,
        "read_timeout_seconds": 1.0,
        "total_timeout_seconds": total,
    }
    return Settings(notes=notes, budgets=budgets)


@pytest.mark.parametrize(
    "budgets",
    [
        {},  # the 30 s default
        {"tool_timeout_seconds": 4.0 + CANISTER_DEADLINE_MARGIN_SECONDS},
        {"tool_timeouts": {"get_note_outline": 5.0}},
        {"tool_timeout_seconds": 2.0, "tool_timeouts": dict.fromkeys(NOTES_TOOLS, 5.0)},
        {"tool_timeouts": {"nexus_read_file": 0.5}},  # not a notes tool
    ],
    ids=["default", "exactly-the-margin", "override-long-enough", "overrides-lift-all", "other"],
)
def test_a_deadline_ending_a_margin_before_every_notes_tool_timeout_is_accepted(
    budgets: dict[str, Any],
) -> None:
    check_canister_deadline(settings(**budgets), NOTES_TOOLS)


@pytest.mark.parametrize(
    ("budgets", "source"),
    [
        ({"tool_timeout_seconds": 4.0}, "budgets.tool_timeout_seconds gives get_note_outline"),
        ({"tool_timeout_seconds": 3.0}, "budgets.tool_timeout_seconds"),
        ({"tool_timeout_seconds": 4.5}, "budgets.tool_timeout_seconds"),
        (
            {"tool_timeouts": {"get_section_source": 4.9}},
            "budgets.tool_timeouts.get_section_source",
        ),
        (
            {"tool_timeout_seconds": 2.0, "tool_timeouts": {"get_section_source": 9.0}},
            "budgets.tool_timeout_seconds gives get_note_outline",
        ),
    ],
    ids=["equal", "shorter", "inside-the-margin", "one-override", "default-for-the-other"],
)
def test_a_deadline_not_ending_before_a_notes_tool_timeout_names_the_setting_and_the_tool(
    budgets: dict[str, Any], source: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        check_canister_deadline(settings(**budgets), NOTES_TOOLS)
    assert NAMED in str(caught.value)
    assert source in str(caught.value)


def test_the_local_backend_has_no_canister_deadline_to_check() -> None:
    check_canister_deadline(settings(backend="local", tool_timeout_seconds=1.0), NOTES_TOOLS)


def test_no_notes_tools_means_nothing_to_check() -> None:
    check_canister_deadline(settings(tool_timeout_seconds=1.0), ())
