"""Registry loading: validation with every error, digests, defaults, pins, parity, lookups."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.registry import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_READ_BYTES,
    DEFAULT_MAX_WRITE_BYTES,
    DocumentSpec,
    RiskMismatch,
    ToolEntry,
    check_risk_parity,
    compute_digest,
    default_registry_dir,
    find_contract_errors,
    find_registry_errors,
    list_registry_files,
    load_registry,
    load_registry_dir,
    load_registry_set,
    schema_path,
)

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "schemas" / "mcp" / "registries" / "nexus.json"

NEXUS_READ_TOOLS = {
    "nexus_list_files",
    "nexus_file_info",
    "nexus_glob",
    "nexus_grep",
    "get_note_outline",
    "get_document_tree",
    "get_metadata_facets",
    "get_section_source",
    "nexus_discovery_search_tools",
    "nexus_discovery_list_servers",
    "nexus_discovery_get_tool_details",
    "nexus_discovery_load_tools",
    "list_repo_files",
    "search_content",
    "locate_component",
}
NEXUS_WRITE_POINTERS = {
    "nexus_write_file": ("/content",),
    "nexus_edit_file": ("/new_text",),
    "nexus_delete_file": ("/path",),
    "nexus_mkdir": ("/path",),
    "nexus_rmdir": ("/path",),
    "nexus_rename_file": ("/source", "/destination"),
    "create_branch": ("/branch",),
    "apply_patch": ("/patch",),
    "open_pull_request": ("/title",),
    "merge_guarded": ("/pull_number",),
}


def registry_document(server_id: str = "srv", **overrides: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "schema_id": "talos.mcp.tool_registry",
        "schema_version": "v1",
        "server_id": server_id,
        "server_version": "1.2.3",
        "tools": [
            {"tool_name": "look", "tool_class": "read", "is_document_op": False},
            {
                "tool_name": "save",
                "tool_class": "write",
                "is_document_op": True,
                "document_spec": {"content_encoding": "base64", "write_content_pointers": ["/b"]},
            },
        ],
    }
    document.update(overrides)
    return document


def write_json(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_the_shipped_nexus_registry_validates_and_classifies_exactly_the_native_tools() -> None:
    registry = load_registry(SHIPPED)
    names = {entry.tool_name for entry in registry.entries}
    assert registry.server_id == "nexus"
    read_documents = {"nexus_read_file", "read_repo_file", "propose_patch"}
    assert names == NEXUS_READ_TOOLS | read_documents | set(NEXUS_WRITE_POINTERS)
    assert len(names) == len(registry.entries)
    for name in NEXUS_READ_TOOLS:
        assert registry.lookup(name) == ToolEntry(name, "read", False, None)
    read_file = registry.lookup("nexus_read_file")
    assert read_file is not None and read_file.document_spec is not None
    assert (read_file.tool_class, read_file.is_document_op) == ("read", True)
    assert read_file.document_spec.content_encoding == "utf8"
    assert read_file.document_spec.read_content_pointers == ("/content",)
    read_repo_file = registry.lookup("read_repo_file")
    assert read_repo_file is not None and read_repo_file.document_spec is not None
    assert read_repo_file.document_spec.read_content_pointers == ("/content",)
    # A dry run of a write: its patch is measured before git runs, its diff after.
    propose = registry.lookup("propose_patch")
    assert propose is not None and propose.document_spec is not None
    assert (propose.tool_class, propose.is_document_op) == ("read", True)
    assert propose.document_spec.write_content_pointers == ("/patch",)
    assert propose.document_spec.read_content_pointers == ("/diff",)
    for name, pointers in NEXUS_WRITE_POINTERS.items():
        entry = registry.lookup(name)
        assert entry is not None and entry.document_spec is not None
        assert (entry.tool_class, entry.is_document_op) == ("write", True)
        assert entry.document_spec.content_encoding == "utf8"
        assert entry.document_spec.write_content_pointers == pointers
        assert entry.document_spec.read_content_pointers == ()


def test_default_locations_point_at_the_shipped_contracts() -> None:
    assert (default_registry_dir() / "nexus.json").is_file()
    assert schema_path().name == "tool_registry.schema.json"
    assert schema_path().is_file()
    assert list_registry_files(default_registry_dir())[0].name == "nexus.json"


def test_digest_is_the_sha256_of_the_exact_file_bytes(tmp_path: Path) -> None:
    path = write_json(tmp_path / "srv.json", registry_document())
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_registry(path).digest == expected
    assert compute_digest(path) == expected
    # Same JSON, different bytes: a different digest.
    path.write_text(json.dumps(registry_document(), indent=2), encoding="utf-8")
    assert load_registry(path).digest != expected


def test_size_fields_get_the_seed_defaults_when_absent(tmp_path: Path) -> None:
    registry = load_registry(write_json(tmp_path / "srv.json", registry_document()))
    assert registry.lookup("save") == ToolEntry(
        "save",
        "write",
        True,
        DocumentSpec("base64", ("/b",), (), 10 * 1024 * 1024, 5 * 1024 * 1024, 50 * 1024 * 1024),
    )
    assert (DEFAULT_MAX_READ_BYTES, DEFAULT_MAX_WRITE_BYTES, DEFAULT_MAX_BATCH_BYTES) == (
        10485760,
        5242880,
        52428800,
    )


def test_explicit_size_fields_are_kept(tmp_path: Path) -> None:
    document = registry_document()
    document["tools"][1]["document_spec"].update(
        max_read_bytes=7, max_write_bytes=8, max_batch_bytes=9
    )
    spec = load_registry(write_json(tmp_path / "srv.json", document)).lookup("save")
    assert spec is not None and spec.document_spec is not None
    assert spec.document_spec.max_read_bytes == 7
    assert spec.document_spec.max_write_bytes == 8
    assert spec.document_spec.max_batch_bytes == 9


def test_an_invalid_file_is_refused_with_every_error_and_its_json_path(tmp_path: Path) -> None:
    document = registry_document(schema_version="v2", owner="x")
    document["tools"][0]["tool_class"] = "admin"
    document["tools"][1]["document_spec"]["write_content_pointers"] = ["$.b"]
    path = write_json(tmp_path / "broken.json", document)
    with pytest.raises(ConfigError) as caught:
        load_registry(path)
    message = str(caught.value)
    assert str(path) in message
    # The root's additionalProperties and unevaluatedProperties both report "owner".
    assert "5 errors" in message
    paths = [line.strip().split(": ")[0] for line in message.splitlines()[1:]]
    assert paths == [
        "$",
        "$",
        "$.schema_version",
        "$.tools[0].tool_class",
        "$.tools[1].document_spec.write_content_pointers[0]",
    ]


def test_errors_are_listed_in_document_order_with_numeric_indices(tmp_path: Path) -> None:
    tools = [
        {"tool_name": f"t{i}", "tool_class": "read", "is_document_op": False} for i in range(12)
    ]
    tools[2]["tool_class"] = "bad"
    tools[10]["tool_class"] = "bad"
    errors = find_registry_errors(registry_document(tools=tools))
    assert [error.split(":")[0] for error in errors] == [
        "$.tools[2].tool_class",
        "$.tools[10].tool_class",
    ]


def test_duplicate_tool_names_in_one_file_are_an_error() -> None:
    document = registry_document()
    document["tools"].append({"tool_name": "look", "tool_class": "write", "is_document_op": False})
    assert find_registry_errors(document) == ["$.tools[2].tool_name: duplicate tool name 'look'"]


def test_a_name_with_a_trailing_newline_is_refused_despite_pythons_dollar() -> None:
    document = registry_document(server_id="srv\n")
    document["tools"][0]["tool_name"] = "look\n"
    assert find_registry_errors(document) == [
        "$.server_id: does not match the pattern",
        "$.tools[0].tool_name: does not match the pattern",
    ]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{not json", "not JSON (line 1"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"server_id": "a", "server_id": "b"}', "duplicate JSON key"),
        (b'{"x": NaN}', "non-standard JSON constant"),
    ],
)
def test_unreadable_registry_files_are_refused_naming_the_file(
    tmp_path: Path, content: bytes, fragment: str
) -> None:
    path = tmp_path / "odd.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_registry(path)
    assert str(path) in str(caught.value)
    assert fragment in str(caught.value)


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"absent\.json"):
        load_registry(tmp_path / "absent.json")
    with pytest.raises(ConfigError, match=r"absent\.json"):
        compute_digest(tmp_path / "absent.json")


def test_pins_that_match_load_and_the_summary_reports_versions_and_digests(tmp_path: Path) -> None:
    path = write_json(tmp_path / "srv.json", registry_document())
    digest = compute_digest(path)
    registry_set = load_registry_set([path], pins={"srv": ("1.2.3", digest.upper())})
    assert registry_set.summary() == {"srv": {"server_version": "1.2.3", "digest": digest}}


@pytest.mark.parametrize(
    ("pin", "fragment"),
    [
        (("1.2.4", None), "server_version '1.2.3' differs from the pinned '1.2.4'"),
        ((None, "0" * 64), "differs from the pinned " + "0" * 64),
    ],
)
def test_a_pin_that_differs_is_refused(
    tmp_path: Path, pin: tuple[str | None, str | None], fragment: str
) -> None:
    path = write_json(tmp_path / "srv.json", registry_document())
    with pytest.raises(ConfigError) as caught:
        load_registry_set([path], pins={"srv": pin})
    assert fragment in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_pinned_server_without_a_registry_is_refused(tmp_path: Path) -> None:
    path = write_json(tmp_path / "srv.json", registry_document())
    with pytest.raises(ConfigError, match="'other' is pinned"):
        load_registry_set([path], pins={"other": (None, None)})


def test_two_files_for_one_server_are_refused(tmp_path: Path) -> None:
    first = write_json(tmp_path / "a.json", registry_document())
    second = write_json(tmp_path / "b.json", registry_document())
    with pytest.raises(ConfigError, match="also in"):
        load_registry_set([first, second])


def test_a_directory_loads_every_registry_and_lookups_need_both_ids(tmp_path: Path) -> None:
    write_json(tmp_path / "a.json", registry_document("alpha"))
    write_json(tmp_path / "b.json", registry_document("beta"))
    (tmp_path / "notes.txt").write_text("not a registry", encoding="utf-8")
    registry_set = load_registry_dir(tmp_path)
    assert set(registry_set.registries) == {"alpha", "beta"}
    look = registry_set.lookup("alpha", "look")
    assert look is not None and look.tool_class == "read"
    assert registry_set.lookup("alpha", "absent") is None
    assert registry_set.lookup("gamma", "look") is None
    alpha = registry_set.get("alpha")
    assert alpha is not None and alpha.path == tmp_path / "a.json"


def test_an_empty_or_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no"):
        load_registry_dir(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_registry_dir(tmp_path / "absent")


def test_loaded_registries_are_frozen(tmp_path: Path) -> None:
    registry_set = load_registry_dir(SHIPPED.parent)
    registry = registry_set.get("nexus")
    assert registry is not None
    with pytest.raises(AttributeError):
        registry.server_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        registry_set.registries["x"] = registry  # type: ignore[index]


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ({"look": "read", "save": "write"}, []),
        ({"save": "admin"}, []),
        ({"look": "write"}, [RiskMismatch("look", "write", "read")]),
        ({"look": "admin"}, [RiskMismatch("look", "admin", "read")]),
        ({"save": "read"}, [RiskMismatch("save", "read", "write")]),
        ({"save": "danger"}, [RiskMismatch("save", "danger", "write")]),
        ({"ghost": "read"}, [RiskMismatch("ghost", "read", None)]),
    ],
)
def test_risk_parity_reports_every_disagreement(
    tmp_path: Path, declared: dict[str, str], expected: list[RiskMismatch]
) -> None:
    registry_set = load_registry_set([write_json(tmp_path / "srv.json", registry_document())])
    assert check_risk_parity(registry_set, server_id="srv", declared_risks=declared) == expected


def test_risk_parity_against_an_unknown_server_reports_every_tool_unclassified(
    tmp_path: Path,
) -> None:
    registry_set = load_registry_set([write_json(tmp_path / "srv.json", registry_document())])
    assert check_risk_parity(registry_set, server_id="x", declared_risks={"look": "read"}) == [
        RiskMismatch("look", "read", None)
    ]


def test_an_unknown_contract_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no_such_contract"):
        find_contract_errors("no_such_contract", {})


@pytest.mark.parametrize(
    "document",
    [[], "registry", {"tools": "x"}, registry_document(tools=[42, {"tool_name": 5}])],
)
def test_documents_of_the_wrong_shape_yield_schema_errors_not_crashes(document: Any) -> None:
    errors = find_registry_errors(document)
    assert errors
    assert all(error.startswith("$") for error in errors)
