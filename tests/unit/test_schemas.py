"""The MCP contracts: each schema is valid 2020-12, and its examples pass or fail as labelled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "schemas" / "mcp"
EXAMPLES = SCHEMAS / "examples"
CONTRACTS = ("tool_registry", "tool_call", "tool_effect")

# Each invalid example fails for one stated reason: (validator keyword, JSON path).
EXPECTED_FAILURES: dict[str, dict[str, tuple[str, str]]] = {
    "tool_registry": {
        "wrong_schema_id": ("const", "$.schema_id"),
        "wrong_schema_version": ("const", "$.schema_version"),
        "extra_root_property": ("additionalProperties", "$"),
        "extra_tool_property": ("additionalProperties", "$.tools[2]"),
        "extra_document_spec_property": ("additionalProperties", "$.tools[0].document_spec"),
        "missing_server_id": ("required", "$"),
        "missing_tools": ("required", "$"),
        "empty_tools": ("minItems", "$.tools"),
        "missing_is_document_op": ("required", "$.tools[2]"),
        "tool_class_admin": ("enum", "$.tools[2].tool_class"),
        "is_document_op_string": ("type", "$.tools[2].is_document_op"),
        "document_op_without_spec": ("required", "$.tools[1]"),
        "non_document_op_with_spec": ("not", "$.tools[2]"),
        "write_document_op_without_write_pointers": ("required", "$.tools[0].document_spec"),
        "write_document_op_with_empty_write_pointers": (
            "minItems",
            "$.tools[0].document_spec.write_content_pointers",
        ),
        "read_document_op_without_read_pointers": ("required", "$.tools[1].document_spec"),
        "read_document_op_with_empty_read_pointers": (
            "minItems",
            "$.tools[1].document_spec.read_content_pointers",
        ),
        "missing_content_encoding": ("required", "$.tools[1].document_spec"),
        "content_encoding_utf_8": ("enum", "$.tools[1].document_spec.content_encoding"),
        "jsonpath_instead_of_pointer": (
            "pattern",
            "$.tools[0].document_spec.write_content_pointers[0]",
        ),
        "pointer_bad_escape": ("pattern", "$.tools[0].document_spec.write_content_pointers[0]"),
        "pointer_without_leading_slash": (
            "pattern",
            "$.tools[0].document_spec.write_content_pointers[0]",
        ),
        "duplicate_pointers": ("uniqueItems", "$.tools[0].document_spec.write_content_pointers"),
        "size_above_maximum": ("maximum", "$.tools[1].document_spec.max_read_bytes"),
        "batch_above_maximum": ("maximum", "$.tools[0].document_spec.max_batch_bytes"),
        "size_zero": ("minimum", "$.tools[0].document_spec.max_write_bytes"),
        "size_fractional": ("type", "$.tools[0].document_spec.max_write_bytes"),
        "tool_name_with_space": ("pattern", "$.tools[2].tool_name"),
        "tool_name_too_long": ("maxLength", "$.tools[2].tool_name"),
        "server_version_not_semver": ("pattern", "$.server_version"),
    },
    "tool_call": {
        "tool_call_id_uuid4": ("pattern", "$.tool_call_id"),
        "args_digest_uppercase": ("pattern", "$.args_digest"),
        "tool_class_admin": ("enum", "$.tool_class"),
        "content_hash_alg_sha1": ("const", "$.content_hash_alg"),
        "missing_content_hash_alg": ("required", "$"),
        "extra_property_arguments": ("additionalProperties", "$"),
        "empty_idempotency_key": ("minLength", "$.idempotency_key"),
        "expected_hash_without_pointer": ("required", "$.expected_document_hashes[0]"),
        "expected_hash_short": ("pattern", "$.expected_document_hashes[0].hash"),
        "expected_hash_jsonpath_pointer": ("pattern", "$.expected_document_hashes[0].pointer"),
    },
    "tool_effect": {
        "effect_id_uuid4": ("pattern", "$.effect_id"),
        "effect_id_uppercase": ("pattern", "$.effect_id"),
        "effect_id_wrong_variant": ("pattern", "$.effect_id"),
        "effect_id_braced": ("maxLength", "$.effect_id"),
        "hash_uppercase": ("pattern", "$.document_hashes[0].hash"),
        "negative_size": ("minimum", "$.document_hashes[0].size_bytes"),
        "missing_size": ("required", "$.document_hashes[0]"),
        "missing_batch_total_bytes": ("required", "$"),
        "content_hash_alg_md5": ("const", "$.content_hash_alg"),
        "extra_document_hash_property": ("additionalProperties", "$.document_hashes[0]"),
        "tool_class_declared_admin": ("enum", "$.tool_class"),
    },
}


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def validator_for(contract: str) -> Draft202012Validator:
    schema = load(SCHEMAS / f"{contract}.schema.json")
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def examples(kind: str) -> list[tuple[str, Path]]:
    return [
        (contract, path)
        for contract in CONTRACTS
        for path in sorted((EXAMPLES / kind / contract).glob("*.json"))
    ]


@pytest.mark.parametrize("contract", CONTRACTS)
def test_each_contract_is_a_valid_2020_12_schema(contract: str) -> None:
    schema = load(SCHEMAS / f"{contract}.schema.json")
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_registry_schema_pins_its_identity_and_forbids_unknown_properties() -> None:
    schema = load(SCHEMAS / "tool_registry.schema.json")
    assert schema["properties"]["schema_id"] == {"const": "talos.mcp.tool_registry"}
    assert schema["properties"]["schema_version"] == {"const": "v1"}
    assert schema["additionalProperties"] is False
    assert schema["unevaluatedProperties"] is False


def test_every_object_in_every_contract_forbids_additional_properties() -> None:
    def objects(node: Any) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        if isinstance(node, dict):
            if node.get("type") == "object":
                found.append(node)
            for value in node.values():
                found.extend(objects(value))
        elif isinstance(node, list):
            for value in node:
                found.extend(objects(value))
        return found

    for contract in CONTRACTS:
        object_schemas = objects(load(SCHEMAS / f"{contract}.schema.json"))
        assert object_schemas
        assert all(schema.get("additionalProperties") is False for schema in object_schemas)


def test_the_seed_example_registry_is_among_the_valid_examples() -> None:
    seed = load(EXAMPLES / "valid" / "tool_registry" / "seed_example.json")
    assert seed["server_id"] == "mcp-github"
    assert seed["tools"][0]["document_spec"]["write_content_pointers"] == [
        "/body",
        "/files/0/content",
    ]
    assert list(validator_for("tool_registry").iter_errors(seed)) == []


@pytest.mark.parametrize(("contract", "path"), examples("valid"), ids=lambda v: str(v))
def test_valid_examples_validate(contract: str, path: Path) -> None:
    errors = [e.message for e in validator_for(contract).iter_errors(load(path))]
    assert errors == []


@pytest.mark.parametrize(("contract", "path"), examples("invalid"), ids=lambda v: str(v))
def test_invalid_examples_fail_for_their_stated_reason(contract: str, path: Path) -> None:
    expected = EXPECTED_FAILURES[contract][path.stem]
    found = {(e.validator, e.json_path) for e in validator_for(contract).iter_errors(load(path))}
    assert expected in found


def test_every_expected_failure_has_its_example_file() -> None:
    on_disk = {
        contract: {path.stem for path in (EXAMPLES / "invalid" / contract).glob("*.json")}
        for contract in CONTRACTS
    }
    assert on_disk == {contract: set(table) for contract, table in EXPECTED_FAILURES.items()}


@pytest.mark.parametrize(
    "pointer",
    ["", "/", "/a", "/a/b", "/a~0b", "/a~1b", "/~01", "/0", "//", "/a b/ü", "/files/0/content"],
)
def test_pointer_pattern_admits_rfc_6901_pointers(pointer: str) -> None:
    effect = load(EXAMPLES / "valid" / "tool_effect" / "write_with_hash.json")
    effect["document_hashes"][0]["pointer"] = pointer
    assert list(validator_for("tool_effect").iter_errors(effect)) == []


@pytest.mark.parametrize("pointer", ["a", "$.a", "/a~", "/a~2", "~0", "/a/~b", "#/a"])
def test_pointer_pattern_refuses_what_is_not_a_json_pointer(pointer: str) -> None:
    effect = load(EXAMPLES / "valid" / "tool_effect" / "write_with_hash.json")
    effect["document_hashes"][0]["pointer"] = pointer
    found = {e.validator for e in validator_for("tool_effect").iter_errors(effect)}
    assert found == {"pattern"}


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("create-pr", True),
        ("nexus_read_file", True),
        ("a.b-c_D9", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("", False),
        ("create pr", False),
        ("tool/name", False),
        ("outil_é", False),
    ],
)
def test_tool_names_follow_the_mcp_rule(name: str, valid: bool) -> None:
    registry = load(EXAMPLES / "valid" / "tool_registry" / "minimal.json")
    registry["tools"][0]["tool_name"] = name
    assert (list(validator_for("tool_registry").iter_errors(registry)) == []) is valid
