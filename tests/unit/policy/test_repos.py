"""The ``repos:`` section and the repository write policy: validation and decision tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.repos import (
    DEV_ALL_REPOS_WARNING,
    PatchFacts,
    RepositoryConfig,
    WritePolicy,
    branch_rule,
    decide_operation,
    is_desktop_folder,
    is_safe_repo_name,
    load_repos_config,
    patch_risks,
)


def section(tmp_path: Path, **entry: Any) -> dict[str, Any]:
    return {
        "allowed_roots": [str(tmp_path)],
        "repositories": {"proj": {"path": str(tmp_path / "proj"), **entry}},
    }


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("myproject", True),
        ("api-service", True),
        ("frontend_v2", True),
        ("a.b", True),
        ("..", False),
        (".", False),
        ("../../etc/passwd", False),
        ("repo/with/slashes", False),
        ("[A-Za-z]", False),  # the seed's v1 bug matched literal brackets
        ("", False),
        ("x" * 101, False),
        ("répo", False),
        ("a b", False),
    ],
)
def test_safe_repo_names_follow_the_corrected_seed_regex(name: str, safe: bool) -> None:
    assert is_safe_repo_name(name) is safe


def test_no_section_serves_no_repository() -> None:
    assert not load_repos_config(None, mode="prod").enabled


def test_a_path_is_shorthand_for_a_repository_without_policy(tmp_path: Path) -> None:
    config = load_repos_config(
        {"allowed_roots": [str(tmp_path)], "repositories": {"p": str(tmp_path / "p")}},
        mode="prod",
    )
    assert config.repositories["p"].write_policy is None
    assert config.repositories["p"].path == tmp_path / "p"


def test_the_seed_defaults_apply_to_an_empty_policy(tmp_path: Path) -> None:
    config = load_repos_config(section(tmp_path, write_policy={}), mode="prod")
    policy = config.repositories["proj"].write_policy
    assert policy is not None
    assert policy.allowed_branches == ("feature/.*", "bugfix/.*")
    assert (policy.max_diff_size, policy.max_changed_files, policy.max_changed_lines) == (
        10_000,
        10,
        400,
    )
    assert policy.require_codeowners is True
    assert ".github/workflows/" in policy.effective_disallowed_paths
    assert ".git/" in policy.effective_disallowed_paths
    assert policy.allowed_operations == {"create_branch", "apply_patch", "open_pull_request"}


@pytest.mark.parametrize(
    ("raw", "mode", "fragment"),
    [
        ({"repositories": {"../x": "/tmp/x"}}, "dev", "repository name"),
        ({"repositories": {"p": "/x"}}, "prod", "`repos.allowed_roots` is required in production"),
        ({"allowed_roots": ["rel"], "repositories": {}}, "prod", "should be an absolute path"),
        ({"dev_allow_all_repos": True, "allowed_roots": ["/srv"]}, "prod", "dev mode only"),
        ({"dev_allow_all_repos": True}, "dev", "needs at least one"),
        ({"allowed_roots": ["/home/u/Desktop"]}, "prod", "Desktop"),
        ({"allowed_roots": ["/home/u/Desktop/code"]}, "prod", "Desktop"),
        ({"allowed_roots": ["/root/Desktop"]}, "prod", "Desktop"),
        ({"repositories": {"p": {"path": "/x", "unknown": 1}}}, "dev", "repositories.p"),
        ({"surprise": True}, "dev", "repos.surprise"),
        ("not a mapping", "dev", "`repos` should be a mapping"),
    ],
)
def test_bad_sections_stop_start_up_naming_the_place(raw: Any, mode: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_repos_config(raw, mode=mode)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("policy", "where"),
    [
        ({"allowed_branches": ["feature/("]}, "allowed_branches[0]"),
        ({"allowed_branches": [""]}, "allowed_branches[0]"),
        ({"disallowed_paths": ["../x"]}, "disallowed_paths[0]"),
        ({"disallowed_paths": ["a**b"]}, "disallowed_paths[0]"),
        ({"max_diff_size": 0}, "max_diff_size"),
        ({"max_changed_files": "10"}, "max_changed_files"),
        ({"allowed_operations": ["delete_repo"]}, "allowed_operations"),
        ({"require_codeowners": "yes"}, "require_codeowners"),
    ],
)
def test_a_bad_policy_entry_is_named_by_location_never_by_value(
    tmp_path: Path, policy: dict[str, Any], where: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_repos_config(section(tmp_path, write_policy=policy), mode="prod")
    message = str(caught.value)
    assert f"repos.repositories.proj.write_policy.{where}" in message
    for value in policy.values():
        if isinstance(value, list) and value and value[0]:
            assert str(value[0]) not in message


def test_an_inline_forge_token_is_refused_in_prod_and_allowed_in_dev(tmp_path: Path) -> None:
    forge = {"base_url": "https://api.github.com", "repository": "o/r", "token": "ghp_SECRET"}
    with pytest.raises(ConfigError) as caught:
        load_repos_config(section(tmp_path, forge=forge), mode="prod")
    assert "inline secrets" in str(caught.value) and "ghp_SECRET" not in str(caught.value)
    assert load_repos_config(section(tmp_path, forge=forge), mode="dev").enabled


def test_dev_allow_all_repos_warns(tmp_path: Path) -> None:
    config = load_repos_config(
        {"dev_allow_all_repos": True, "allowed_roots": [str(tmp_path)]}, mode="dev"
    )
    assert config.enabled and DEV_ALL_REPOS_WARNING in config.warnings


def test_desktop_is_recognised_under_any_home(tmp_path: Path) -> None:
    assert is_desktop_folder(Path("/home/sam/Desktop"))
    assert is_desktop_folder(Path("/Users/sam/Desktop/projects"))
    assert is_desktop_folder(tmp_path / "Desktop" / "x", home=tmp_path)
    assert not is_desktop_folder(Path("/srv/repos/Desktop-app"))
    assert not is_desktop_folder(Path("/srv/Desktop"))


REPO = RepositoryConfig(path=Path("/srv/repos/p"))
POLICY = WritePolicy()


@pytest.mark.parametrize(
    ("branch", "rule"),
    [
        ("feature/x", None),
        ("bugfix/y-1", None),
        ("feature/", None),  # matches feature/.*; git itself refuses the name elsewhere
        ("main", "branch_protected"),
        ("master", "branch_protected"),
        ("develop", "branch_protected"),
        ("release/2.0", "branch_protected"),
        ("trunk-x", "branch_not_allowed"),
        ("feature", "branch_not_allowed"),
        ("my-feature/x", "branch_not_allowed"),  # anchored at the start
        ("hotfix/x", "branch_not_allowed"),
    ],
)
def test_branch_rules_are_anchored_and_protect_the_default(branch: str, rule: str | None) -> None:
    assert branch_rule(REPO, POLICY, branch, "main") == rule


def test_a_default_branch_is_protected_whatever_its_name() -> None:
    policy = WritePolicy(allowed_branches=(".*",))
    assert branch_rule(REPO, policy, "stable", "stable") == "branch_protected"
    assert branch_rule(REPO, policy, "stable", "main") is None
    assert branch_rule(REPO, None, "feature/x", "main") == "branch_not_allowed"


def test_operations_are_denied_by_default() -> None:
    assert decide_operation(None, "apply_patch").rule == "no_policy"
    assert decide_operation(POLICY, "merge_guarded").rule == "operation_not_allowed"
    assert decide_operation(POLICY, "rm_rf").rule == "operation_not_allowed"
    allowed = decide_operation(POLICY, "apply_patch")
    assert allowed.allowed and allowed.requires_approval


def test_require_codeowners_implies_approval() -> None:
    policy = WritePolicy(require_approval=False, require_codeowners=True)
    assert decide_operation(policy, "apply_patch").requires_approval
    relaxed = WritePolicy(require_approval=False, require_codeowners=False)
    assert not decide_operation(relaxed, "apply_patch").requires_approval


def facts(**overrides: Any) -> PatchFacts:
    values: dict[str, Any] = {
        "diff_bytes": 100,
        "changed_paths": ("src/a.py",),
        "lines_added": 1,
        "lines_removed": 1,
    }
    values.update(overrides)
    return PatchFacts(**values)


@pytest.mark.parametrize(
    ("patch", "rules"),
    [
        (facts(), []),
        (facts(changed_paths=()), ["empty_patch"]),
        (facts(diff_bytes=10_000), []),
        (facts(diff_bytes=10_001), ["max_diff_size"]),
        (facts(changed_paths=tuple(f"f{i}" for i in range(10))), []),
        (facts(changed_paths=tuple(f"f{i}" for i in range(11))), ["max_changed_files"]),
        (facts(lines_added=200, lines_removed=200), []),
        (facts(lines_added=201, lines_removed=200), ["max_changed_lines"]),
        (facts(changed_paths=(".github/workflows/x.yml",)), ["path_disallowed"]),
        (facts(changed_paths=(".GITHUB/workflows/x.yml",)), ["path_disallowed"]),
        (facts(changed_paths=(".git/config",)), ["path_disallowed"]),
        (facts(changed_paths=("a/.git/hooks/x",)), ["path_disallowed"]),
        (facts(changed_paths=("a\\b",)), ["path_disallowed"]),  # not a normalized path
        (facts(symlink_paths=("l",), changed_paths=("l",)), ["symlink"]),
        (facts(submodule_paths=("s",), changed_paths=("s",)), ["submodule"]),
        (facts(binary_paths=("b",), changed_paths=("b",)), ["binary_content"]),
    ],
)
def test_patch_risks_table(patch: PatchFacts, rules: list[str]) -> None:
    assert [risk.rule for risk in patch_risks(POLICY, patch)] == rules


def test_without_a_policy_the_default_disallowed_paths_still_show() -> None:
    risks = patch_risks(None, facts(changed_paths=(".github/workflows/ci.yml", "ok.py")))
    assert [(r.rule, r.paths) for r in risks] == [
        ("path_disallowed", (".github/workflows/ci.yml",))
    ]
