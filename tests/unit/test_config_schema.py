"""The shipped JSON Schema of nexus.yaml is a fresh generation from the models, accepts what
the loaders accept and refuses what they refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from nexus_mcp.commands.config_schema import (
    ApprovalsSection,
    config_schema,
    schema_text,
    shipped_schema_path,
)
from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.approvals import SECTION_KEYS, load_approval_settings
from nexus_mcp.settings import EXTERNAL_SECTIONS, Settings

ROOT = Path(__file__).resolve().parents[2]


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(config_schema())


def test_the_shipped_schema_is_a_fresh_generation() -> None:
    shipped = shipped_schema_path()
    assert shipped == ROOT / "src" / "nexus_mcp" / "data" / "schemas" / "nexus.schema.json"
    assert shipped.read_text(encoding="utf-8") == schema_text(), (
        "regenerate: nexus-mcp init --print-schema > src/nexus_mcp/data/schemas/nexus.schema.json"
    )


def test_the_schema_is_a_valid_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(config_schema())


def test_every_setting_and_section_is_described() -> None:
    properties = config_schema()["properties"]
    assert set(properties) == set(Settings.model_fields) | EXTERNAL_SECTIONS


def test_the_demo_configuration_validates() -> None:
    document = yaml.safe_load((ROOT / "demo" / "nexus.yaml").read_text(encoding="utf-8"))
    validator().validate(document)


@pytest.mark.parametrize(
    "document",
    [
        {"mdoe": "prod"},
        {"mode": "staging"},
        {"port": "eighty"},
        {"write_policies": {"workspace": {"allowed_paths": ["a/**"]}}},
        {"write_policies": {"workspace": {"allowed_paths": ["a"], "allowed_operations": ["x"]}}},
        {"approvals": {"secret": "s" * 40, "colour": "blue"}},
        {"approvals": {"ttl_seconds": 60}},
        {"upstreams": {"server_id": "x"}},
        {"repos": {"repositories": {"r": 3}}},
        {"flow": {"policy": "sometimes"}},
        {"flow": {"labels": {"read_repo_file": ["sends_mail"]}}},
    ],
)
def test_mistakes_are_refused(document: dict[str, Any]) -> None:
    assert list(validator().iter_errors(document))


def test_sections_in_their_documented_forms_validate() -> None:
    validator().validate(
        {
            "write_policies": {
                "workspace": {"allowed_paths": ["notes/**"], "allowed_operations": ["write"]},
                "vaults": {"v1": {"allowed_paths": ["**"], "allowed_operations": ["edit"]}},
            },
            "approvals": {"keys": {"k1": "a" * 40, "k2": "b" * 40}, "active_kid": "k2"},
            "upstreams": [
                {"server_id": "fs", "transport": "stdio", "command": "npx", "args": ["-y"]},
                {
                    "server_id": "web",
                    "transport": "http",
                    "url": "https://example.com/mcp",
                    "credentials": {"type": "bearer", "token": {"env": "WEB_TOKEN"}},
                },
            ],
            "repos": {"repositories": {"short": "/srv/repo", "long": {"path": "/srv/other"}}},
            "state": {"redis_url": {"env": "REDIS_URL"}},
            "flow": {
                "policy": "approve",
                "labels": {"read_repo_file": ["reads_private", "reads_untrusted"], "web/*": []},
                "taint_ttl_seconds": 3600,
            },
        }
    )


def test_the_approvals_model_names_exactly_what_the_loader_accepts() -> None:
    every = {"secret": "s" * 40, "audience": "a", "issuer": "i", "ttl_seconds": 120}
    every |= {"keys": None, "active_kid": "k1", "request_ttl_seconds": 60, "wait_seconds": 30}
    every |= {"allow_self_approval": False}
    assert set(every) == set(ApprovalsSection.model_fields) == set(SECTION_KEYS)
    load_approval_settings({}, {"approvals": every})  # nothing unknown to the loader
    with pytest.raises(ConfigError):
        load_approval_settings({}, {"approvals": {"colour": "blue"}})
