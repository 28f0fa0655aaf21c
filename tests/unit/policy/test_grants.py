"""Tool grants: profiles and direct grants as tuples, assignment, eager sync, visible tools."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mcp.errors import Code, InvalidInputError, NotFoundError
from nexus_mcp.policy.grants import (
    DIRECT_RELATION,
    PROFILE_RELATION,
    GrantSource,
    ToolGrant,
    assign_profile,
    ensure_principal_grants,
    grant_tool,
    grant_tools_for_profile,
    list_tool_grants,
    revoke_profile_grants,
    revoke_tool,
    revoke_tools_for_profile,
    to_tool_object,
    visible_tools,
)
from nexus_mcp.policy.profiles import ToolProfileConfig, load_profiles
from nexus_mcp.stores.grants import RelationTuple, SqliteTupleStore

REPO_CONFIG = Path(__file__).resolve().parents[3] / "config" / "tool_profiles.yaml"
ZONE = "default"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteTupleStore]:
    opened = SqliteTupleStore(tmp_path / "grants.sqlite3")
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def config() -> ToolProfileConfig:
    return load_profiles(REPO_CONFIG)


def test_granting_a_profile_writes_one_viewer_tuple_per_tool_in_one_batch(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    minimal = config.profiles["minimal"]

    revision = grant_tools_for_profile(store, "alice", minimal, ZONE)

    assert revision == 1
    assert store.list_objects("alice", PROFILE_RELATION, ZONE) == sorted(
        f"/tools/{tool}" for tool in minimal.tools
    )
    assert store.list_objects("alice", DIRECT_RELATION, ZONE) == []


def test_revoking_a_profile_removes_its_tuples_and_keeps_direct_grants(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    coding = config.profiles["coding"]
    grant_tools_for_profile(store, "alice", coding, ZONE)
    grant_tool(store, "alice", "nexus_write_file", ZONE)
    grant_tool(store, "alice", "nexus_discovery_load_tools", ZONE)

    revoke_tools_for_profile(store, "alice", coding, ZONE)

    assert visible_tools(store, "alice", ZONE) == {"nexus_write_file", "nexus_discovery_load_tools"}
    assert store.revision(ZONE) == 4


def test_a_direct_grant_adds_a_tool_on_top_of_the_profile(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    grant_tools_for_profile(store, "alice", config.profiles["minimal"], ZONE)

    grant_tool(store, "alice", "nexus_grep", ZONE)

    assert visible_tools(store, "alice", ZONE) == config.profiles["minimal"].tools | {"nexus_grep"}


def test_revoking_a_direct_grant_hides_it_unless_the_profile_also_grants_it(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    grant_tools_for_profile(store, "alice", config.profiles["minimal"], ZONE)
    grant_tool(store, "alice", "nexus_grep", ZONE)
    grant_tool(store, "alice", "nexus_read_file", ZONE)

    revoke_tool(store, "alice", "nexus_grep", ZONE)
    revoke_tool(store, "alice", "nexus_read_file", ZONE)

    visible = visible_tools(store, "alice", ZONE)
    assert "nexus_grep" not in visible
    assert "nexus_read_file" in visible


def test_assigning_a_profile_replaces_the_previous_profile_and_records_it(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    assign_profile(store, config, "alice", "coding", ZONE)
    grant_tool(store, "alice", "nexus_discovery_list_servers", ZONE)

    assign_profile(store, config, "alice", "minimal", ZONE)

    assert visible_tools(store, "alice", ZONE) == config.profiles["minimal"].tools | {
        "nexus_discovery_list_servers"
    }
    assert store.get_assignment("alice", ZONE) == "minimal"


def test_assigning_an_unknown_profile_is_not_found_and_changes_nothing(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    with pytest.raises(NotFoundError) as raised:
        assign_profile(store, config, "alice", "ghost", ZONE)

    assert raised.value.code is Code.NOT_FOUND
    assert store.revision(ZONE) == 0


def test_ensuring_grants_writes_once_then_reads_only(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    assert ensure_principal_grants(store, config, "agent-1", "search", ZONE) is True
    revision = store.revision(ZONE)

    assert ensure_principal_grants(store, config, "agent-1", "search", ZONE) is False
    assert store.revision(ZONE) == revision
    assert visible_tools(store, "agent-1", ZONE) == config.profiles["search"].tools


def test_ensuring_a_different_profile_resyncs_and_leaves_the_assignment_alone(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    assign_profile(store, config, "agent-1", "full", ZONE)
    grant_tool(store, "agent-1", "extra_tool", ZONE)

    assert ensure_principal_grants(store, config, "agent-1", "minimal", ZONE) is True

    assert visible_tools(store, "agent-1", ZONE) == config.profiles["minimal"].tools | {
        "extra_tool"
    }
    assert store.get_assignment("agent-1", ZONE) == "full"


def test_two_subjects_with_different_profiles_see_different_tools(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    assign_profile(store, config, "alice", "coding", ZONE)
    assign_profile(store, config, "bob", "search", ZONE)

    assert visible_tools(store, "alice", ZONE) == config.profiles["coding"].tools
    assert visible_tools(store, "bob", ZONE) == config.profiles["search"].tools
    assert visible_tools(store, "carol", ZONE) == frozenset()
    assert visible_tools(store, "alice", "other-zone") == frozenset()


def test_revoking_all_profile_grants_removes_tools_of_profiles_no_longer_configured(
    store: SqliteTupleStore,
) -> None:
    store.write([RelationTuple("alice", PROFILE_RELATION, "/tools/retired_tool")], ZONE)
    grant_tool(store, "alice", "nexus_grep", ZONE)

    revoke_profile_grants(store, "alice", ZONE)

    assert visible_tools(store, "alice", ZONE) == {"nexus_grep"}


def test_objects_outside_the_tools_prefix_are_never_visible_tools(
    store: SqliteTupleStore,
) -> None:
    store.write(
        [
            RelationTuple("alice", PROFILE_RELATION, "/files/nexus_read_file"),
            RelationTuple("alice", DIRECT_RELATION, "/toolsets/files"),
            RelationTuple("alice", "owner", "/tools/nexus_write_file"),
        ],
        ZONE,
    )

    assert visible_tools(store, "alice", ZONE) == frozenset()


def test_tool_grants_list_every_source_of_each_tool(store: SqliteTupleStore) -> None:
    store.write([RelationTuple("alice", PROFILE_RELATION, "/tools/b")], ZONE)
    store.write([RelationTuple("alice", PROFILE_RELATION, "/tools/a")], ZONE)
    grant_tool(store, "alice", "a", ZONE)
    grant_tool(store, "alice", "c", ZONE)

    assert list_tool_grants(store, "alice", ZONE) == [
        ToolGrant("a", frozenset({GrantSource.PROFILE, GrantSource.DIRECT})),
        ToolGrant("b", frozenset({GrantSource.PROFILE})),
        ToolGrant("c", frozenset({GrantSource.DIRECT})),
    ]


@pytest.mark.parametrize("name", ["", "../x", "a/b", "x" * 129, "tab\tname"])
def test_tool_names_that_could_leave_the_prefix_are_invalid_input(name: str) -> None:
    with pytest.raises(InvalidInputError) as raised:
        to_tool_object(name)

    assert raised.value.code is Code.INVALID_INPUT


# --- cross-check: an independent model of profiles and grants -----------------------------

TOOLS = [f"t{i}" for i in range(8)]
SUBJECTS = ["s0", "s1", "s2"]


@st.composite
def profile_definitions(draw: st.DrawFn) -> list[tuple[frozenset[str], int | None]]:
    """Profile i has its own tools and may extend an earlier profile (never a cycle)."""
    count = draw(st.integers(min_value=1, max_value=5))
    return [
        (
            draw(st.frozensets(st.sampled_from(TOOLS), max_size=5)),
            draw(st.none() | st.integers(min_value=0, max_value=i - 1)) if i else None,
        )
        for i in range(count)
    ]


def expected_profile_tools(
    definitions: list[tuple[frozenset[str], int | None]], index: int
) -> frozenset[str]:
    tools: frozenset[str] = frozenset()
    current: int | None = index
    while current is not None:
        own, parent = definitions[current]
        tools |= own
        current = parent
    return tools


def to_yaml(definitions: list[tuple[frozenset[str], int | None]]) -> str:
    lines = ["default_profile: p0", "profiles:"]
    for i, (own, parent) in enumerate(definitions):
        extends = f"extends: p{parent}, " if parent is not None else ""
        lines.append(f"  p{i}: {{{extends}tools: [{', '.join(sorted(own))}]}}")
    return "\n".join(lines) + "\n"


OPERATIONS = st.tuples(
    st.sampled_from(
        ["assign", "ensure", "grant_profile", "revoke_profile", "grant", "revoke", "drop_profile"]
    ),
    st.sampled_from(SUBJECTS),
    st.integers(min_value=0, max_value=4),
    st.sampled_from(TOOLS),
)


@settings(max_examples=60, deadline=None)
@given(definitions=profile_definitions(), operations=st.lists(OPERATIONS, max_size=25))
def test_visible_tools_match_an_independent_model_of_profiles_and_grants(
    definitions: list[tuple[frozenset[str], int | None]],
    operations: list[tuple[str, str, int, str]],
) -> None:
    profile_grants: dict[str, set[str]] = {s: set() for s in SUBJECTS}
    direct_grants: dict[str, set[str]] = {s: set() for s in SUBJECTS}
    assignments: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profiles.yaml"
        path.write_text(to_yaml(definitions), encoding="utf-8")
        config = load_profiles(path)
        store = SqliteTupleStore(Path(folder) / "grants.sqlite3")
        try:
            for action, subject, index, tool in operations:
                index %= len(definitions)
                name, tools = f"p{index}", expected_profile_tools(definitions, index)
                if action == "assign":
                    assign_profile(store, config, subject, name, ZONE)
                    profile_grants[subject] = set(tools)
                    assignments[subject] = name
                elif action == "ensure":
                    ensure_principal_grants(store, config, subject, name, ZONE)
                    profile_grants[subject] = set(tools)
                elif action == "grant_profile":
                    grant_tools_for_profile(store, subject, config.profiles[name], ZONE)
                    profile_grants[subject] |= tools
                elif action == "revoke_profile":
                    revoke_tools_for_profile(store, subject, config.profiles[name], ZONE)
                    profile_grants[subject] -= tools
                elif action == "drop_profile":
                    revoke_profile_grants(store, subject, ZONE)
                    profile_grants[subject] = set()
                elif action == "grant":
                    grant_tool(store, subject, tool, ZONE)
                    direct_grants[subject].add(tool)
                else:
                    revoke_tool(store, subject, tool, ZONE)
                    direct_grants[subject].discard(tool)

            for subject in SUBJECTS:
                expected = profile_grants[subject] | direct_grants[subject]
                assert visible_tools(store, subject, ZONE) == expected
                assert store.get_assignment(subject, ZONE) == assignments.get(subject)
        finally:
            store.close()
