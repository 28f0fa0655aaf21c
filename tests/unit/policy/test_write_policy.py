"""The write policy decision table, its glob semantics, loading, and changed-line counting."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_mcp.errors import Code, ConfigError, WritePolicyDeniedError
from nexus_mcp.policy.write_policy import (
    DEFAULT_DISALLOWED_PATHS,
    DEV_POLICY_WARNING,
    DEV_WRITE_POLICY,
    OPERATIONS,
    TOOL_OPERATIONS,
    WriteDecision,
    WritePolicy,
    check_write,
    count_changed_lines,
    decide_write,
    is_path_disallowed,
    load_write_policy_config,
)

ALL_OPERATIONS = sorted(OPERATIONS)


def make_policy(**changes: Any) -> WritePolicy:
    fields: dict[str, Any] = {
        "allowed_paths": ["notes/**", "src/**/*.py", "docs/*.md", "data/file[0-9].csv"],
        "disallowed_paths": ["notes/private/", "src/secrets_*.py"],
        "allowed_operations": ALL_OPERATIONS,
        "max_bytes_per_write": 1000,
        "max_changed_lines_per_edit": 10,
    }
    fields.update(changes)
    return WritePolicy.model_validate(fields)


POLICY = make_policy()


def rule_for(
    path: str | list[str],
    operation: str = "write",
    policy: WritePolicy | None = POLICY,
    **limits: Any,
) -> str:
    paths = [path] if isinstance(path, str) else path
    return decide_write(policy, operation=operation, paths=paths, **limits).rule


# --- paths --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "notes",
        "notes/a.md",
        "notes/deep/er/b.txt",
        "notes/.hidden",
        "src/a.py",
        "src/pkg/sub/mod.py",
        "docs/readme.md",
        "data/file7.csv",
    ],
)
def test_a_path_matching_an_allowed_pattern_is_allowed(path: str) -> None:
    assert rule_for(path) == "allowed"


@pytest.mark.parametrize(
    "path",
    [
        "README.md",
        "src/a.txt",
        "src",
        "docs/sub/readme.md",
        "docs",
        "data/fileX.csv",
        "data/file10.csv",
        "notesx/a.md",
        "Notes/a.md",
        "other/notes/a.md",
    ],
)
def test_a_path_matching_no_allowed_pattern_is_denied(path: str) -> None:
    assert rule_for(path) == "path_not_allowed"


@pytest.mark.parametrize(
    "path",
    [
        "notes/private",
        "notes/private/x.md",
        "NOTES/PRIVATE/x.md",
        "src/secrets_prod.py",
        "src/secrets_prod.py/inner",
    ],
)
def test_a_configured_disallowed_path_wins_over_an_allowed_pattern(path: str) -> None:
    assert rule_for(path) == "path_disallowed"


@pytest.mark.parametrize(
    "path",
    [
        ".git",
        ".git/config",
        ".git/hooks/pre-commit",
        ".GIT/config",
        ".Git/hooks/post-checkout",
        ".git./config",
        ".git /config",
        ".git::$INDEX_ALLOCATION/config",
        ".g\u200cit/config",
        "\ufeff.git/config",
        "notes/.git/config",
        "notes/sub/.GIT/hooks/x",
        ".github/workflows/ci.yml",
        ".GitHub/Workflows/ci.yml",
        ".github/workflows",
    ],
)
def test_the_default_disallowed_paths_apply_in_every_case_variant(path: str) -> None:
    everything = make_policy(allowed_paths=["**"], disallowed_paths=[])
    assert rule_for(path, policy=everything) == "path_disallowed"
    assert is_path_disallowed(everything, path)
    assert is_path_disallowed(None, path)


@pytest.mark.parametrize("path", [".github/dependabot.yml", "notes/git/x", "notes/.gitignore"])
def test_neighbours_of_the_defaults_are_not_disallowed(path: str) -> None:
    everything = make_policy(allowed_paths=["**"], disallowed_paths=[])
    assert rule_for(path, policy=everything) == "allowed"
    assert not is_path_disallowed(everything, path)


def test_the_defaults_hold_even_when_the_config_lists_other_disallowed_paths() -> None:
    policy = make_policy(allowed_paths=["**"], disallowed_paths=["tmp/"])
    assert set(DEFAULT_DISALLOWED_PATHS) <= set(policy.effective_disallowed_paths)
    assert rule_for(".git/config", policy=policy) == "path_disallowed"
    assert rule_for("tmp/x", policy=policy) == "path_disallowed"


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "notes/../x", "notes//a", "notes\\a", "./notes/a", "a\x00b"]
)
def test_a_path_that_is_not_normalized_is_denied(path: str) -> None:
    assert rule_for(path) == "path_not_normalized"
    assert is_path_disallowed(POLICY, path)


@pytest.mark.parametrize("path", ["", ".", "/"])
def test_the_workspace_root_itself_is_never_writable(path: str) -> None:
    expected = "path_not_normalized" if path == "/" else "workspace_root"
    assert rule_for(path, "rmdir", policy=DEV_WRITE_POLICY) == expected


# --- operations ---------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ALL_OPERATIONS)
def test_an_operation_outside_the_allowed_list_is_denied(operation: str) -> None:
    others = [op for op in ALL_OPERATIONS if op != operation]
    policy = make_policy(allowed_operations=others)
    assert rule_for("notes/a.md", operation, policy=policy) == "operation_not_allowed"
    assert rule_for("notes/a.md", operation, policy=make_policy()) == "allowed"


def test_an_unknown_operation_is_denied() -> None:
    assert rule_for("notes/a.md", "chmod") == "unknown_operation"


def test_every_write_tool_maps_to_an_operation() -> None:
    assert set(TOOL_OPERATIONS.values()) == set(OPERATIONS)


@pytest.mark.parametrize(
    ("source", "destination", "rule"),
    [
        ("notes/a.md", "notes/b.md", "allowed"),
        ("notes/a.md", "README.md", "path_not_allowed"),
        ("README.md", "notes/a.md", "path_not_allowed"),
        ("notes/a.md", ".github/workflows/ci.yml", "path_disallowed"),
        (".git/config", "notes/config", "path_disallowed"),
        ("notes/ci", ".github", "disallowed_subtree"),
        ("notes/private", "notes/public", "path_disallowed"),
    ],
)
def test_a_rename_checks_both_source_and_destination(
    source: str, destination: str, rule: str
) -> None:
    everything_but_defaults = make_policy(allowed_paths=["notes/**", ".github"])
    assert rule_for([source, destination], "rename", policy=everything_but_defaults) == rule


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        (".github", "disallowed_subtree"),
        ("src", "disallowed_subtree"),
        ("notes", "disallowed_subtree"),
        ("notes/public", "allowed"),
        ("tmp", "allowed"),
    ],
)
def test_removing_a_directory_above_a_disallowed_path_is_denied(path: str, rule: str) -> None:
    policy = make_policy(allowed_paths=["**"])
    assert rule_for(path, "rmdir", policy=policy) == rule
    # a plain write to the same path is judged on the path alone
    assert rule_for(path, "mkdir", policy=policy) == "allowed"


def test_no_paths_are_denied() -> None:
    assert rule_for([], "write") == "no_paths"


# --- limits -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "rule"), [(0, "allowed"), (1000, "allowed"), (1001, "max_bytes"), (-1, "max_bytes")]
)
def test_a_write_larger_than_the_byte_limit_is_denied(size: int, rule: str) -> None:
    assert rule_for("notes/a.md", size_bytes=size) == rule


@pytest.mark.parametrize(
    ("lines", "rule"), [(0, "allowed"), (10, "allowed"), (11, "max_changed_lines")]
)
def test_an_edit_changing_more_lines_than_the_limit_is_denied(lines: int, rule: str) -> None:
    assert rule_for("notes/a.md", "edit", changed_lines=lines) == rule


# --- decisions and errors -------------------------------------------------------------------


def test_no_policy_denies_every_write() -> None:
    for operation in ALL_OPERATIONS:
        assert rule_for("notes/a.md", operation, policy=None) == "no_policy"


def test_an_allowed_write_carries_the_approval_requirement() -> None:
    elicit = make_policy(approval_mode="elicit")
    decision = check_write(elicit, operation="write", paths=["notes/a.md"], size_bytes=5)
    assert decision == WriteDecision(True, "allowed", True, "elicit")
    relaxed = make_policy(require_approval=False)
    assert check_write(relaxed, operation="mkdir", paths=["notes/x"]) == WriteDecision(
        True, "allowed", False, "token"
    )


def test_a_denial_raises_with_the_rule_and_never_the_path() -> None:
    with pytest.raises(WritePolicyDeniedError) as caught:
        check_write(POLICY, operation="write", paths=["notes/private/diary.md"])
    assert caught.value.code == Code.WRITE_POLICY_DENIED
    assert caught.value.facts == {
        "rule": "path_disallowed",
        "operation": "write",
        "disallowed_entry": 1,
    }
    assert "diary" not in str(caught.value)


def test_a_size_denial_records_the_limit() -> None:
    with pytest.raises(WritePolicyDeniedError) as caught:
        check_write(POLICY, operation="write", paths=["notes/a.md"], size_bytes=5000)
    assert caught.value.facts == {
        "rule": "max_bytes",
        "operation": "write",
        "limit_bytes": 1000,
        "actual_bytes": 5000,
    }


def test_a_denial_for_an_unknown_operation_does_not_record_it() -> None:
    with pytest.raises(WritePolicyDeniedError) as caught:
        check_write(POLICY, operation="caller-chosen", paths=["notes/a.md"])
    assert caught.value.facts == {"rule": "unknown_operation", "operation": None}


# --- loading ------------------------------------------------------------------------------


GOOD_POLICY: dict[str, Any] = {
    "allowed_paths": ["notes/**"],
    "allowed_operations": ["write", "edit"],
}


def test_dev_mode_without_configuration_applies_the_permissive_policy_with_a_warning() -> None:
    config, warnings = load_write_policy_config(None, mode="dev")
    assert warnings == [DEV_POLICY_WARNING]
    policy = config.policy_for_workspace()
    assert policy == DEV_WRITE_POLICY
    assert config.policy_for_vault("any-vault") == DEV_WRITE_POLICY
    for operation in ALL_OPERATIONS:
        decision = check_write(policy, operation=operation, paths=["anything/at/all"])
        assert decision.requires_approval is False
    assert rule_for(".git/config", policy=policy) == "path_disallowed"


@pytest.mark.parametrize("mode", ["prod", "production", "DEV", ""])
def test_production_never_falls_back_to_the_permissive_policy(mode: str) -> None:
    config, warnings = load_write_policy_config(None, mode=mode)
    assert config.policy_for_workspace() is None
    assert config.policy_for_vault("v") is None
    assert len(warnings) == 1


def test_dev_mode_with_a_configuration_does_not_add_the_permissive_fallback() -> None:
    config, _ = load_write_policy_config({"vaults": {"v1": GOOD_POLICY}}, mode="dev")
    assert config.policy_for_workspace() is None
    assert config.policy_for_vault("v2") is None
    assert config.policy_for_vault("v1") == WritePolicy.model_validate(GOOD_POLICY)


def test_a_full_configuration_loads_with_secure_defaults() -> None:
    config, warnings = load_write_policy_config({"workspace": GOOD_POLICY}, mode="prod")
    assert warnings == []
    policy = config.policy_for_workspace()
    assert policy is not None
    assert policy.require_approval is True
    assert policy.approval_mode == "token"
    assert policy.allowed_operations == frozenset({"write", "edit"})


@pytest.mark.parametrize(
    ("raw", "location"),
    [
        (
            {"workspace": {**GOOD_POLICY, "allowed_paths": ["a/**", "b", "c[d"]}},
            "write_policies.workspace.allowed_paths[2]",
        ),
        (
            {"workspace": {**GOOD_POLICY, "disallowed_paths": ["/abs"]}},
            "write_policies.workspace.disallowed_paths[0]",
        ),
        (
            {"workspace": {**GOOD_POLICY, "allowed_paths": ["a/../b"]}},
            "write_policies.workspace.allowed_paths[0]",
        ),
        (
            {"workspace": {**GOOD_POLICY, "allowed_paths": ["a/x**"]}},
            "write_policies.workspace.allowed_paths[0]",
        ),
        (
            {"workspace": {**GOOD_POLICY, "allowed_paths": ["a\\b"]}},
            "write_policies.workspace.allowed_paths[0]",
        ),
        (
            {"workspace": {**GOOD_POLICY, "allowed_paths": [""]}},
            "write_policies.workspace.allowed_paths[0]",
        ),
        ({"workspace": {**GOOD_POLICY, "surprise": 1}}, "write_policies.workspace.surprise"),
        ({"workspace": {"allowed_paths": ["x"]}}, "write_policies.workspace.allowed_operations"),
        (
            {"workspace": {**GOOD_POLICY, "allowed_operations": ["write", "chmod"]}},
            "write_policies.workspace.allowed_operations",
        ),
        (
            {"workspace": {**GOOD_POLICY, "max_bytes_per_write": "100"}},
            "write_policies.workspace.max_bytes_per_write",
        ),
        (
            {"workspace": {**GOOD_POLICY, "max_changed_lines_per_edit": 0}},
            "write_policies.workspace.max_changed_lines_per_edit",
        ),
        (
            {"workspace": {**GOOD_POLICY, "approval_mode": "maybe"}},
            "write_policies.workspace.approval_mode",
        ),
        (
            {"vaults": {"team": {**GOOD_POLICY, "allowed_paths": ["ok", "[x"]}}},
            "write_policies.vaults.team.allowed_paths[1]",
        ),
        ({"workspaces": GOOD_POLICY}, "write_policies.workspaces"),
    ],
)
def test_a_malformed_policy_stops_start_up_naming_its_location(
    raw: dict[str, Any], location: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_write_policy_config(raw, mode="dev")
    assert location in str(caught.value)


def test_a_write_policies_section_that_is_not_a_mapping_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        load_write_policy_config(["notes/**"], mode="dev")  # type: ignore[arg-type]


def test_the_policy_is_immutable() -> None:
    with pytest.raises(Exception, match="frozen"):
        POLICY.require_approval = False  # type: ignore[misc,unused-ignore]


# --- changed lines ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        ("", "", 0),
        ("a\nb\n", "a\nb\n", 0),
        ("a\nb\nc\n", "a\nX\nc\n", 2),
        ("a\nb\nc\n", "a\nc\n", 1),
        ("a\nc\n", "a\nb\nc\n", 1),
        ("", "x\ny\n", 2),
        ("x\ny\n", "", 2),
        ("a\nb\n", "a\r\nb\r\n", 4),
        ("one line", "one line, longer", 2),
        ("a\nb\nc\nd\n", "A\nb\nc\nD\n", 8),
    ],
)
def test_changed_lines_count_removed_plus_added_lines(old: str, new: str, changed: int) -> None:
    assert count_changed_lines(old, new) == changed


def test_one_changed_line_in_a_large_file_counts_two() -> None:
    old = "".join(f"line {i}\n" for i in range(200_000))
    new = old.replace("line 100000\n", "changed\n")
    assert count_changed_lines(old, new) == 2
