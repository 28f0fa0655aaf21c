"""The flow policy as plain decisions (issue 28): labels, the trifecta, the section."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.flow import (
    ALL_LABELS,
    EGRESS,
    NATIVE_LABELS,
    NO_LABELS,
    READS_PRIVATE,
    READS_UNTRUSTED,
    FlowConfig,
    FlowHold,
    TaintSource,
    decide_flow,
    hold_text,
    labels_for,
    load_flow_config,
)

REGISTRY = Path(__file__).resolve().parents[3] / "src" / "nexus_mcp" / "data" / "registries"
P, U, E = READS_PRIVATE, READS_UNTRUSTED, EGRESS
SRC_P = TaintSource("call-p", "get_section_source")
SRC_U = TaintSource("call-u", "web/fetch")
SRC_E = TaintSource("call-e", "web/post")


def config(policy: str = "deny", mode: str = "prod", **labels: frozenset[str]) -> FlowConfig:
    return FlowConfig(policy=policy, labels=MappingProxyType(dict(labels)), mode=mode)


def test_every_native_tool_of_the_registry_has_a_documented_default() -> None:
    registry = json.loads((REGISTRY / "nexus.json").read_text(encoding="utf-8"))
    assert set(NATIVE_LABELS) == {entry["tool_name"] for entry in registry["tools"]}


def test_only_the_forge_calls_are_native_egress() -> None:
    assert {name for name, labels in NATIVE_LABELS.items() if E in labels} == {
        "open_pull_request",
        "merge_guarded",
    }
    assert all(U not in labels for labels in NATIVE_LABELS.values())


@pytest.mark.parametrize(
    ("server_id", "tool", "configured", "mode", "expected"),
    [
        (None, "get_section_source", {}, "prod", {P}),
        (None, "open_pull_request", {}, "prod", {E}),
        (None, "nexus_write_file", {}, "prod", set()),
        (None, "read_repo_file", {"read_repo_file": frozenset({P, U})}, "prod", {P, U}),
        (None, "read_repo_file", {"read_repo_file": NO_LABELS}, "prod", set()),
        (None, "an_embedders_tool", {}, "prod", ALL_LABELS),
        (None, "an_embedders_tool", {}, "dev", set()),
        ("web", "fetch", {}, "prod", ALL_LABELS),
        ("web", "fetch", {}, "dev", set()),
        ("web", "fetch", {"web/*": frozenset({U})}, "prod", {U}),
        ("web", "fetch", {"web/*": frozenset({U}), "web/fetch": frozenset({E})}, "prod", {E}),
        # A native name never labels an upstream tool of the same name, nor the reverse.
        ("web", "get_section_source", {}, "prod", ALL_LABELS),
        (None, "fetch", {"web/fetch": NO_LABELS}, "dev", set()),
    ],
)
def test_labels_come_from_configuration_then_defaults_then_the_mode(
    server_id: str | None,
    tool: str,
    configured: dict[str, frozenset[str]],
    mode: str,
    expected: set[str],
) -> None:
    found = labels_for(config(mode=mode, **configured), server_id=server_id, tool=tool)
    assert found == expected


@pytest.mark.parametrize(
    ("labels", "taint", "held"),
    [
        ({E}, {P: SRC_P, U: SRC_U}, True),
        ({E}, {P: SRC_P}, False),
        ({E}, {U: SRC_U}, False),
        ({E}, {}, False),
        ({E}, {E: SRC_E}, False),
        # Reads private itself, after an untrusted read: the same step sends it out.
        ({P, E}, {U: SRC_U}, True),
        # Reads untrusted itself: the injection arrives after the call; it taints the next.
        ({U, E}, {P: SRC_P}, False),
        (ALL_LABELS, {P: SRC_P}, False),
        (ALL_LABELS, {U: SRC_U}, True),
        # Not an egress call: never held, whatever the session touched.
        ({P, U}, {P: SRC_P, U: SRC_U}, False),
        (set(), {P: SRC_P, U: SRC_U}, False),
    ],
)
def test_an_egress_call_is_held_only_after_private_and_untrusted_reads(
    labels: set[str], taint: dict[str, TaintSource], held: bool
) -> None:
    hold = decide_flow(config(), frozenset(labels), taint)
    assert (hold is not None) is held
    if hold is not None:
        assert hold.action == "deny"


@pytest.mark.parametrize("policy", ["approve", "deny"])
def test_the_hold_carries_the_policy_and_only_the_two_read_sources(policy: str) -> None:
    hold = decide_flow(config(policy), frozenset({E}), {E: SRC_E, U: SRC_U, P: SRC_P})
    assert hold == FlowHold(action=policy, sources=((P, SRC_P), (U, SRC_U)))


def test_the_policy_off_holds_nothing() -> None:
    assert decide_flow(config("off"), frozenset({E}), {P: SRC_P, U: SRC_U}) is None
    assert not FlowConfig().enabled  # no flow section: off


def test_the_approver_reads_ids_and_tools_only() -> None:
    text = hold_text(FlowHold("approve", ((P, SRC_P), (U, SRC_U)), reads_private_itself=True))
    assert "reads_private: call call-p (get_section_source)" in text
    assert "reads_untrusted: call call-u (web/fetch)" in text
    assert "this call itself reads private data" in text


# -- the section ---------------------------------------------------------------------


def test_the_section_loads_with_its_defaults() -> None:
    loaded = load_flow_config(
        {"labels": {"read_repo_file": ["reads_private", "reads_untrusted"], "web/*": []}},
        mode="prod",
        upstream_ids=["web"],
    )
    assert loaded.policy == "deny" and loaded.taint_ttl_seconds == 86_400.0
    assert loaded.labels == {"read_repo_file": {P, U}, "web/*": frozenset()}
    assert load_flow_config(None, mode="prod").policy == "off"


SECRET = "sk-live-CANARY-0123456789"


@pytest.mark.parametrize(
    ("section", "place"),
    [
        ({"policy": SECRET}, "flow.policy"),
        ({"labels": {"read_repo_file": [SECRET]}}, "flow.labels.read_repo_file"),
        ({"labels": {"read_repo_file": SECRET}}, "flow.labels.read_repo_file"),
        ({"labels": {"no_such_tool": ["egress"]}}, "flow.labels.no_such_tool"),
        ({"labels": {"ghost/fetch": ["egress"]}}, "flow.labels.ghost/fetch"),
        ({"labels": {"web/bad name": ["egress"]}}, "flow.labels.web/bad name"),
        ({"taint_ttl_seconds": 0}, "flow.taint_ttl_seconds"),
        ({"colour": SECRET}, "flow.colour"),
        (SECRET, "flow"),
    ],
)
def test_a_bad_section_names_the_place_never_the_value(section: object, place: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_flow_config(section, mode="prod", upstream_ids=["web"])
    message = str(caught.value)
    assert place in message
    assert SECRET not in message
