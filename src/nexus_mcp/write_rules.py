"""The plain words a ``WRITE_POLICY_DENIED`` refusal gives for each rule of a write policy
(``policy/write_policy.py``, ``policy/repos.py``, ``policy/upstreams.py``, the workspace and
the targets): always the setting that decided, never the path, branch or content the caller
sent. ``errors.WritePolicyDeniedError`` renders through ``write_rule_text``."""

from __future__ import annotations

from typing import Any

# The operations a write policy names (workspace files, repositories): a message names
# one only from this set, so it is always ours, never the caller's text.
_FILE_OPERATIONS = ("write", "edit", "delete", "mkdir", "rmdir", "rename")
_REPO_OPERATIONS = ("create_branch", "apply_patch", "open_pull_request", "merge_guarded")
WRITE_OPERATION_NAMES = frozenset((*_FILE_OPERATIONS, *_REPO_OPERATIONS))
WRITE_POLICY_DENIED_PREFIX = "write denied by the write policy"
# Each rule a write policy refuses by, in plain words naming the setting that decided
# (``policy/write_policy.py``, ``policy/repos.py``, ``policy/upstreams.py``, the
# workspace and the targets). Never the path, branch or content the caller sent.
WRITE_RULES = {
    "no_policy": "no write policy is configured here, so every write is refused",
    "unknown_operation": "the write policy has no rule for this tool",
    "not_decided": "the write policy did not decide this call",
    "unknown_target": "the target of this write cannot be identified",
    "no_paths": "the write names no path",
    "path_not_normalized": "this path is not a plain relative path",
    "workspace_root": "the workspace root itself cannot be written",
    "path_not_allowed": "no allowed_paths entry matches this path",
    "path_disallowed": "a path this write touches is under disallowed_paths",
    "disallowed_subtree": "a folder moved or removed holds a path the write policy denies",
    "link_retarget": "moving this link would change what it points to",
    "upstream_no_policy": "the upstream has no write policy, so every write to it is refused",
    "upstream_tool_not_allowed": "this tool is not in the upstream's allowed_tools",
    "branch_not_allowed": "the branch matches no allowed_branches pattern",
    "branch_protected": "the branch matches a protected_branches pattern",
    "branch_symbolic": "the branch is a symbolic ref (an alias of another branch)",
    "binary_content": "the change holds binary content, which is never allowed",
    "symlink": "the change adds or changes a symbolic link, which is never allowed",
    "submodule": "the change adds or changes a submodule, which is never allowed",
    "codeowners": "the approver does not own every path written (require_codeowners)",
    "empty_patch": "the patch changes nothing",
    "no_forge": "the repository has no forge configured",
    "range_too_large": "the commits to publish are too many to judge",
}
# Rules with a bound: the setting, the fact holding its value, and the value's unit.
WRITE_LIMITS = {
    "max_bytes": ("the content is over max_bytes_per_write", "limit_bytes", "bytes"),
    "max_diff_size": ("the patch is over max_diff_size", "limit", "bytes"),
    "max_changed_files": ("the change touches more files than max_changed_files", "limit", "files"),
    "max_changed_lines": ("the change is over max_changed_lines", "limit", "lines"),
}


def write_rule_text(facts: dict[str, Any]) -> str | None:
    rule = facts.get("rule")
    if not isinstance(rule, str):
        return None
    if rule == "operation_not_allowed":
        operation = facts.get("operation")
        if operation in WRITE_OPERATION_NAMES:
            return f"the operation '{operation}' is not in allowed_operations"
        return "this operation is not in allowed_operations"
    entry = _disallowed_entry(facts)
    if rule == "path_disallowed" and entry is not None:
        return f"this path is under {entry}"
    if rule == "disallowed_subtree" and entry is not None:
        return f"a folder moved or removed holds a path under {entry}"
    if rule == "max_changed_lines" and _is_count(facts.get("limit_lines")):
        # The workspace's setting (a repository's is max_changed_lines, below).
        limit = facts["limit_lines"]
        return f"the edit changes more lines than max_changed_lines_per_edit ({limit} lines)"
    if rule in WRITE_LIMITS:
        text, key, unit = WRITE_LIMITS[rule]
        bound = facts.get(key)
        return f"{text} ({bound} {unit})" if _is_count(bound) else text
    return WRITE_RULES.get(rule)


def _disallowed_entry(facts: dict[str, Any]) -> str | None:
    entry = facts.get("disallowed_entry")
    if _is_count(entry):
        return f"disallowed_paths entry {entry}"
    if facts.get("disallowed_builtin") is True:
        return "a built-in disallowed path (.git or .github/workflows)"
    return None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
