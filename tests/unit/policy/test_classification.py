"""Classification decision tables: registry resolution, declaration, read-only, idempotency."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_mcp.errors import Code, NexusError
from nexus_mcp.policy.classification import (
    MAX_IDEMPOTENCY_KEY_LENGTH,
    WARNING_DECLARATION_DIFFERS,
    WARNING_HINTS_CONFLICT,
    WARNING_UNCLASSIFIED,
    Classification,
    classify_call,
    guess_tool_class,
    has_write_verb,
)
from nexus_mcp.policy.registry import RegistrySet, ToolEntry, ToolRegistry

READ = ToolEntry("look", "read", False, None)
WRITE = ToolEntry("save", "write", False, None)
REGISTRY = RegistrySet(
    {"srv": ToolRegistry("srv", "1.0.0", "0" * 64, Path("srv.json"), (READ, WRITE))}
)


def classify(
    tool_name: str,
    *,
    server_id: str = "srv",
    mode: str = "prod",
    read_only: bool = False,
    declared: str | None = None,
    key: str | None = None,
    read_only_hint: bool | None = None,
    destructive_hint: bool | None = None,
) -> Classification:
    return classify_call(
        REGISTRY,
        server_id=server_id,
        tool_name=tool_name,
        mode=mode,
        caller_read_only=read_only,
        declared_class=declared,
        idempotency_key=key,
        read_only_hint=read_only_hint,
        destructive_hint=destructive_hint,
    )


def refusal_code(**kwargs: object) -> Code | None:
    tool_name = str(kwargs.pop("tool_name"))
    try:
        classify(tool_name, **kwargs)  # type: ignore[arg-type]
    except NexusError as exc:
        return exc.code
    return None


# tool, mode, read_only, declared, key -> refusal code (None: allowed)
DECISIONS = [
    # 1. registry resolution
    ("look", "prod", False, None, None, None),
    ("ghost", "prod", False, None, "k", Code.TOOL_UNCLASSIFIED_DENIED),
    ("ghost", "staging", False, None, "k", Code.TOOL_UNCLASSIFIED_DENIED),
    ("ghost", "dev", False, None, "k", None),
    ("ghost", "dev", False, None, None, Code.IDEMPOTENCY_KEY_REQUIRED),
    # 2. declared class: never trusted, mismatch refused against the registry
    ("look", "prod", False, "read", None, None),
    ("look", "prod", False, "write", "k", Code.TOOL_CLASS_DECLARATION_MISMATCH),
    ("save", "prod", False, "read", "k", Code.TOOL_CLASS_DECLARATION_MISMATCH),
    ("save", "prod", False, "admin", "k", Code.INVALID_INPUT),
    ("ghost", "dev", False, "read", "k", None),
    # 3. read-only caller
    ("look", "prod", True, None, None, None),
    ("save", "prod", True, None, "k", Code.TOOL_CLASS_MISMATCH),
    ("save", "prod", True, "write", "k", Code.TOOL_CLASS_MISMATCH),
    ("ghost", "dev", True, None, "k", Code.TOOL_CLASS_MISMATCH),
    # 4. idempotency key for writes
    ("save", "prod", False, None, "k", None),
    ("save", "prod", False, None, None, Code.IDEMPOTENCY_KEY_REQUIRED),
    ("save", "prod", False, None, "", Code.IDEMPOTENCY_KEY_REQUIRED),
    ("save", "prod", False, None, "  \t", Code.IDEMPOTENCY_KEY_REQUIRED),
    ("save", "prod", False, None, "k" * MAX_IDEMPOTENCY_KEY_LENGTH, None),
    ("save", "prod", False, None, "k" * (MAX_IDEMPOTENCY_KEY_LENGTH + 1), Code.INVALID_INPUT),
    # order: unclassified before declaration, declaration before read-only,
    # read-only before idempotency
    ("ghost", "prod", True, "admin", None, Code.TOOL_UNCLASSIFIED_DENIED),
    ("save", "prod", True, "read", None, Code.TOOL_CLASS_DECLARATION_MISMATCH),
    ("save", "prod", True, None, None, Code.TOOL_CLASS_MISMATCH),
    ("ghost", "dev", True, "write", None, Code.TOOL_CLASS_MISMATCH),
]


@pytest.mark.parametrize(("tool_name", "mode", "read_only", "declared", "key", "code"), DECISIONS)
def test_classification_decision_table(
    tool_name: str,
    mode: str,
    read_only: bool,
    declared: str | None,
    key: str | None,
    code: Code | None,
) -> None:
    assert (
        refusal_code(
            tool_name=tool_name, mode=mode, read_only=read_only, declared=declared, key=key
        )
        == code
    )


def test_a_registered_tool_is_classified_by_the_registry_without_warnings() -> None:
    assert classify("save", key="k", read_only_hint=True) == Classification(
        "write", WRITE, False, ()
    )
    assert classify("look", declared="read") == Classification("read", READ, False, ())


def test_the_same_tool_name_on_another_server_is_unclassified() -> None:
    assert refusal_code(tool_name="look", server_id="other") == Code.TOOL_UNCLASSIFIED_DENIED


def test_unclassified_in_dev_is_a_heuristic_with_a_warning() -> None:
    assert classify("ghost", mode="dev", key="k") == Classification(
        "write", None, True, (WARNING_UNCLASSIFIED,)
    )
    assert classify("ghost", mode="dev", read_only_hint=True) == Classification(
        "read", None, True, (WARNING_UNCLASSIFIED,)
    )


def test_a_declaration_that_differs_from_a_dev_guess_only_warns() -> None:
    result = classify("ghost", mode="dev", declared="read", key="k")
    assert result.tool_class == "write"
    assert result.warnings == (WARNING_UNCLASSIFIED, WARNING_DECLARATION_DIFFERS)


def test_conflicting_hints_in_dev_fail_closed_to_write_with_a_warning() -> None:
    result = classify("delete_ghost", mode="dev", key="k", read_only_hint=True)
    assert result.tool_class == "write"
    assert result.warnings == (WARNING_UNCLASSIFIED, WARNING_HINTS_CONFLICT)


# name, readOnlyHint, destructiveHint -> class, conflict
HEURISTICS = [
    ("list_things", True, None, "read", False),
    ("list_things", True, False, "read", False),
    ("list_things", None, None, "write", False),
    ("list_things", False, None, "write", False),
    ("list_things", None, True, "write", False),
    ("list_things", True, True, "write", True),
    ("nexus_write_file", True, None, "write", True),
    ("createIssue", True, None, "write", True),
    ("rm-rf", True, None, "write", True),
    ("git.push", True, None, "write", True),
    ("settings_get", True, None, "read", False),
    ("get_note_outline", None, None, "write", False),
]


@pytest.mark.parametrize(("name", "read_only_hint", "destructive", "cls", "conflict"), HEURISTICS)
def test_dev_heuristic_never_falls_back_to_read_unless_the_hint_says_read(
    name: str, read_only_hint: bool | None, destructive: bool | None, cls: str, conflict: bool
) -> None:
    assert guess_tool_class(name, read_only_hint, destructive) == (cls, conflict)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nexus_write_file", True),
        ("nexus_edit_file", True),
        ("remove-item", True),
        ("make.mkdir", True),
        ("renameFile", True),
        ("HTTPPut", True),
        ("setTitle", True),
        ("apply_patch", True),
        ("merge", True),
        ("moveFolder", True),
        ("update_record", True),
        ("delete", True),
        ("nexus_read_file", False),
        ("settings", False),
        ("rewrite_map", False),
        ("getPushUrl2", True),
        ("get_section_source", False),
    ],
)
def test_write_verbs_are_matched_as_whole_name_tokens(name: str, expected: bool) -> None:
    assert has_write_verb(name) is expected


def test_refusals_carry_no_caller_values_in_their_facts() -> None:
    for kwargs in (
        {"tool_name": "ghost-secret"},
        {"tool_name": "save", "declared": "read", "key": "secret-key"},
        {"tool_name": "save", "read_only": True, "key": "secret-key"},
    ):
        tool_name = str(kwargs.pop("tool_name"))
        with pytest.raises(NexusError) as caught:
            classify(tool_name, **kwargs)
        rendered = f"{caught.value.message} {caught.value.facts}"
        assert "secret" not in rendered
