"""Every name rule holds for the whole string, never up to a final newline.

``re.match(r"^[A-Za-z0-9_.-]{1,128}$", "echo\\n")`` matches: Python's ``$`` also matches
before a string's last ``\\n``. Each rule below was such a ``match``; each must refuse the
valid name with a newline after it (and still take the name itself).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from nexus_mcp.errors import ConfigError, InvalidInputError
from nexus_mcp.ids import is_uuid7, new_id
from nexus_mcp.policy.approvals import ApprovalKeys
from nexus_mcp.policy.budgets import ToolTimeouts
from nexus_mcp.policy.grants import to_tool_object
from nexus_mcp.policy.pins import PINS_SCHEMA_ID, PINS_SCHEMA_VERSION, load_pins
from nexus_mcp.policy.upstreams import Credentials, UpstreamConfig
from nexus_mcp.providers.upstream.listing import definition_problem


def listed(name: str) -> bool:
    return definition_problem({"name": name, "inputSchema": {"type": "object"}}, {}) is None


def granted(name: str) -> bool:
    try:
        to_tool_object(name)
    except InvalidInputError:
        return False
    return True


def approval_kid(kid: str) -> bool:
    try:
        ApprovalKeys({kid: b"s" * 32}, kid)
    except ConfigError:
        return False
    return True


def timeout_override(name: str) -> bool:
    try:
        ToolTimeouts(overrides={name: 5.0})
    except ConfigError:
        return False
    return True


def header_credential(name: str) -> bool:
    try:
        Credentials(type="header", header=name, value="v")
    except ValidationError:
        return False
    return True


def env_name(name: str) -> bool:
    try:
        UpstreamConfig(server_id="u", transport="stdio", command="x", env={name: "v"})
    except ValidationError:
        return False
    return True


def pinned(tmp_path: Path) -> Callable[[str], bool]:
    def check(name: str) -> bool:
        document = {
            "schema_id": PINS_SCHEMA_ID,
            "schema_version": PINS_SCHEMA_VERSION,
            "server_id": "u",
            "tools": {name: {"sha256": "a" * 64}},
        }
        (tmp_path / "u.lock.json").write_text(json.dumps(document))
        pins = load_pins(tmp_path, "u")
        assert pins.unusable is None
        return name in pins.digests

    return check


RULES: dict[str, tuple[Callable[[str], bool], str]] = {
    "upstream tool name": (listed, "echo"),
    "grant object": (granted, "nexus_read_file"),
    "approval kid": (approval_kid, "k1"),
    "timeout override": (timeout_override, "nexus_read_file"),
    "credential header": (header_credential, "X-Api-Key"),
    "upstream env name": (env_name, "HOME_DIR"),
    "uuid7": (is_uuid7, new_id()),
}


@pytest.mark.parametrize("label", sorted(RULES))
def test_a_rule_refuses_a_trailing_newline(label: str) -> None:
    rule, good = RULES[label]
    assert rule(good) is True
    assert rule(good + "\n") is False


def test_a_pin_name_with_a_trailing_newline_is_not_a_pin(tmp_path: Path) -> None:
    check = pinned(tmp_path)
    assert check("echo") is True
    assert check("echo\n") is False
