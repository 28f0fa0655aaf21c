"""Tool profiles: loading, inheritance, validation, role mapping and profile selection."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.profiles import (
    ProfileSelection,
    ProfileSource,
    ToolProfile,
    default_profiles_path,
    load_profiles,
    select_profile,
)

REPO_CONFIG = Path(__file__).resolve().parents[3] / "config" / "tool_profiles.yaml"

FILE_READ = {"nexus_read_file", "nexus_list_files", "nexus_file_info", "nexus_glob"}
FILE_WRITE = {
    "nexus_write_file",
    "nexus_edit_file",
    "nexus_delete_file",
    "nexus_mkdir",
    "nexus_rmdir",
    "nexus_rename_file",
}
NOTES = {"get_note_outline", "get_document_tree", "get_metadata_facets", "get_section_source"}
DISCOVERY = {
    "nexus_discovery_search_tools",
    "nexus_discovery_list_servers",
    "nexus_discovery_get_tool_details",
    "nexus_discovery_load_tools",
}
REPO = {
    "list_repo_files",
    "read_repo_file",
    "search_content",
    "locate_component",
    "propose_patch",
    "create_branch",
    "apply_patch",
    "open_pull_request",
    "merge_guarded",
}
SERVER_TOOLS = FILE_READ | FILE_WRITE | {"nexus_grep"} | NOTES | DISCOVERY | REPO


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_minimal_profile_loads_file_reads_and_notes_tools() -> None:
    config = load_profiles(REPO_CONFIG)

    assert config.profiles["minimal"].tools == frozenset(FILE_READ | NOTES)


def test_coding_profile_inherits_minimal_and_adds_writes_and_grep() -> None:
    config = load_profiles(REPO_CONFIG)

    coding = config.profiles["coding"]
    assert coding.extends == "minimal"
    assert coding.tools == frozenset(FILE_READ | NOTES | FILE_WRITE | {"nexus_grep"})


def test_full_profile_resolves_a_three_level_chain_to_every_server_tool() -> None:
    config = load_profiles(REPO_CONFIG, known_tools=SERVER_TOOLS)

    assert config.profiles["full"].tools == frozenset(SERVER_TOOLS)
    assert config.profiles["repo"].extends == "coding"
    assert config.profiles["repo"].tools == frozenset(
        FILE_READ | NOTES | FILE_WRITE | {"nexus_grep"} | REPO
    )
    assert config.profiles["search"].tools == frozenset(
        FILE_READ | NOTES | {"nexus_grep", "nexus_discovery_search_tools"}
    )
    assert config.warnings == ()


def test_deep_inheritance_accumulates_every_ancestors_tools(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        """
default_profile: a
profiles:
  d: {extends: c, tools: [t4]}
  c: {extends: b, tools: [t3]}
  b: {extends: a, tools: [t2]}
  a: {tools: [t1]}
""",
    )

    config = load_profiles(path)

    assert config.profiles["d"].tools == frozenset({"t1", "t2", "t3", "t4"})
    assert config.profiles["b"].tools == frozenset({"t1", "t2"})
    assert list(config.profiles) == ["d", "c", "b", "a"]


@pytest.mark.parametrize(
    ("profiles_yaml", "named"),
    [
        ("  a: {extends: b}\n  b: {extends: c}\n  c: {extends: a}\n", "a"),
        ("  a: {extends: a, tools: [x]}\n", "a"),
    ],
    ids=["three-profile-cycle", "self-cycle"],
)
def test_inheritance_cycle_is_a_config_error_naming_file_and_profile(
    tmp_path: Path, profiles_yaml: str, named: str
) -> None:
    path = write_yaml(tmp_path, "default_profile: a\nprofiles:\n" + profiles_yaml)

    with pytest.raises(ConfigError) as raised:
        load_profiles(path)

    assert str(path) in str(raised.value)
    assert f"'{named}'" in str(raised.value)
    assert "cycle" in str(raised.value)


def test_missing_parent_profile_is_a_config_error_naming_the_child(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "default_profile: a\nprofiles:\n  a: {extends: ghost}\n")

    with pytest.raises(ConfigError) as raised:
        load_profiles(path)

    assert str(path) in str(raised.value)
    assert "'a'" in str(raised.value)
    assert "'ghost'" in str(raised.value)


def test_default_profile_and_role_mapping_come_from_the_file() -> None:
    config = load_profiles(REPO_CONFIG)

    assert config.default_profile == "minimal"
    assert dict(config.role_profiles) == {
        "viewer": "minimal",
        "editor": "coding",
        "evaluator": "search",
        "admin": "full",
    }
    assert config.profile_for_role("superuser") == "minimal"


def test_roles_missing_from_the_file_get_the_default_profile(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        "default_profile: b\nroles: {admin: a}\nprofiles:\n  a: {tools: [x]}\n  b: {}\n",
    )

    config = load_profiles(path)

    assert config.profile_for_role("admin") == "a"
    assert config.profile_for_role("editor") == "b"
    assert config.profile_for_role("root") == "b"


def test_profile_with_zero_tools_resolves_to_an_empty_set(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        "default_profile: empty\nprofiles:\n  empty: {tools: []}\n  bare: {description: x}\n",
    )

    config = load_profiles(path)

    assert config.profiles["empty"].tools == frozenset()
    assert config.profiles["bare"].tools == frozenset()


def test_tools_repeated_in_a_profile_and_its_parent_are_deduplicated(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        """
default_profile: base
profiles:
  base: {tools: [a, b, a]}
  child: {extends: base, tools: [b, c, c]}
""",
    )

    config = load_profiles(path)

    assert config.profiles["base"].tools == frozenset({"a", "b"})
    assert config.profiles["child"].tools == frozenset({"a", "b", "c"})


def test_unknown_tool_is_a_warning_reported_once_by_its_declaring_profile(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        """
default_profile: base
profiles:
  base: {tools: [nexus_read_file, nexus_python]}
  child: {extends: base, tools: [nexus_bash]}
""",
    )

    with capture_logs() as logs:
        config = load_profiles(path, known_tools=SERVER_TOOLS)

    assert "nexus_python" in config.profiles["child"].tools
    assert len(config.warnings) == 2
    assert [(e["profile"], e["tool"]) for e in logs] == [
        ("base", "nexus_python"),
        ("child", "nexus_bash"),
    ]
    assert all(e["log_level"] == "warning" for e in logs)


def test_without_known_tools_no_name_is_reported_unknown(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "default_profile: a\nprofiles:\n  a: {tools: [anything]}\n")

    assert load_profiles(path).warnings == ()


def test_an_agent_profile_can_add_tools_on_top_of_a_shared_profile(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        """
default_profile: minimal
profiles:
  minimal: {tools: [nexus_read_file]}
  agent-7: {extends: minimal, description: one agent, tools: [nexus_grep]}
""",
    )

    agent = load_profiles(path).profiles["agent-7"]

    assert agent == ToolProfile(
        "agent-7", frozenset({"nexus_read_file", "nexus_grep"}), "minimal", "one agent"
    )


def test_yaml_syntax_error_is_a_config_error_naming_file_and_line(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "profiles:\n  a: {tools: [x\n  b: [\n")

    with pytest.raises(ConfigError) as raised:
        load_profiles(path)

    assert str(path) in str(raised.value)
    assert "line" in str(raised.value)
    assert raised.value.__cause__ is None


def test_missing_file_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"

    with pytest.raises(ConfigError) as raised:
        load_profiles(path)

    assert str(path) in str(raised.value)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("- a\n- b\n", None),
        ("profiles: {}\n", None),
        ("profiles: {a: {}}\nextra: 1\n", None),
        ("profiles:\n  a: [x]\n", "a"),
        ("profiles:\n  a: {tools: x}\n", "a"),
        ("profiles:\n  a: {tools: [1]}\n", "a"),
        ("profiles:\n  a: {tools: [has/slash]}\n", "a"),
        ("profiles:\n  a: {extends: 3}\n", "a"),
        ("profiles:\n  a: {description: [x]}\n", "a"),
        ("profiles:\n  a: {tool: [x]}\n", "a"),
        ("profiles:\n  'bad name': {}\n", None),
        ("default_profile: b\nprofiles:\n  a: {}\n", None),
        ("default_profile: a\nroles: {root: a}\nprofiles:\n  a: {}\n", None),
        ("default_profile: a\nroles: {admin: zz}\nprofiles:\n  a: {}\n", None),
        ("default_profile: a\nroles: [admin]\nprofiles:\n  a: {}\n", None),
        ("default_profile: a\nprofiles:\n  a: {}\n  a: {tools: [x]}\n", None),
    ],
    ids=[
        "top-level-list",
        "no-profiles",
        "unknown-top-level-key",
        "profile-not-mapping",
        "tools-not-list",
        "tool-not-string",
        "tool-name-with-slash",
        "extends-not-string",
        "description-not-string",
        "unknown-profile-key",
        "invalid-profile-name",
        "default-profile-undefined",
        "unknown-role",
        "role-to-undefined-profile",
        "roles-not-mapping",
        "duplicate-profile",
    ],
)
def test_wrong_shapes_are_config_errors_naming_the_file(
    tmp_path: Path, text: str, named: str | None
) -> None:
    path = write_yaml(tmp_path, text)

    with pytest.raises(ConfigError) as raised:
        load_profiles(path)

    assert str(path) in str(raised.value)
    if named is not None:
        assert f"'{named}'" in str(raised.value)


def test_loaded_profiles_are_frozen_values() -> None:
    config = load_profiles(REPO_CONFIG)

    with pytest.raises(dataclasses.FrozenInstanceError):
        config.profiles["minimal"].tools = frozenset()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.default_profile = "full"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.profiles["x"] = config.profiles["full"]  # type: ignore[index]
    with pytest.raises(TypeError):
        config.role_profiles["viewer"] = "full"  # type: ignore[index]


def test_default_path_loads_the_shipped_profiles() -> None:
    path = default_profiles_path()

    # The repository's file, or its packaged copy once the package ships one.
    assert path == REPO_CONFIG or path.parts[-3:] == ("nexus_mcp", "data", "tool_profiles.yaml")
    assert path.is_file()
    assert load_profiles().profiles == load_profiles(REPO_CONFIG).profiles


@pytest.mark.parametrize(
    ("principal_profile", "stored", "role", "expected"),
    [
        ("coding", "search", "viewer", ProfileSelection("coding", ProfileSource.PRINCIPAL)),
        (
            "ghost",
            "search",
            "admin",
            ProfileSelection(None, ProfileSource.UNKNOWN_PRINCIPAL_PROFILE),
        ),
        ("", None, "admin", ProfileSelection(None, ProfileSource.UNKNOWN_PRINCIPAL_PROFILE)),
        (None, "search", "admin", ProfileSelection("search", ProfileSource.ASSIGNMENT)),
        (None, "removed", "admin", ProfileSelection(None, ProfileSource.UNKNOWN_ASSIGNED_PROFILE)),
        (None, None, "admin", ProfileSelection("full", ProfileSource.ROLE)),
        (None, None, "editor", ProfileSelection("coding", ProfileSource.ROLE)),
        (None, None, "evaluator", ProfileSelection("search", ProfileSource.ROLE)),
        (None, None, "viewer", ProfileSelection("minimal", ProfileSource.ROLE)),
        (None, None, "superuser", ProfileSelection("minimal", ProfileSource.ROLE)),
    ],
)
def test_profile_selection_prefers_principal_then_assignment_then_role(
    principal_profile: str | None, stored: str | None, role: str, expected: ProfileSelection
) -> None:
    config = load_profiles(REPO_CONFIG)

    selection = select_profile(
        config, principal_profile=principal_profile, stored_assignment=stored, role=role
    )

    assert selection == expected
    assert selection.is_denied is (expected.name is None)
