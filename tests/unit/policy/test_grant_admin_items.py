"""``grant_admin``'s resource-source and prompt grants: what ``nexus-mcp profiles
grant|revoke --resource/--prompt`` and the console's Access page share."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_mcp.errors import InvalidInputError
from nexus_mcp.policy.grant_admin import (
    assign,
    grant_item,
    item_object,
    known_item,
    revoke_item,
)
from nexus_mcp.policy.grants import visible_prompts, visible_resource_sources
from nexus_mcp.policy.profiles import ToolProfileConfig, load_profiles
from nexus_mcp.stores.grants import SqliteTupleStore

PROFILES = """
default_profile: base
profiles:
  base:
    tools: [nexus_read_file]
  reader:
    extends: base
    resources: [github]
    prompts: [github_review]
"""


@pytest.fixture
def config(tmp_path: Path) -> ToolProfileConfig:
    path = tmp_path / "profiles.yaml"
    path.write_text(PROFILES, encoding="utf-8")
    return load_profiles(path)


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("resource", "../etc"),
        ("resource", "a b"),
        ("resource", "x" * 65),
        ("prompt", "<script>"),
        ("prompt", "p\u202e"),
        ("prompt", ""),
    ],
)
def test_a_malformed_name_is_invalid_input_naming_the_field_not_the_value(
    kind: str, name: str
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        item_object(kind, name)  # type: ignore[arg-type]
    assert refused.value.message == f"invalid input for field '{kind}'"
    assert name not in refused.value.message or not name


def test_known_items_come_from_the_profiles_the_notes_and_the_upstreams(
    config: ToolProfileConfig,
) -> None:
    assert known_item(config, "resource", "notes")
    assert known_item(config, "resource", "github")
    assert not known_item(config, "resource", "up")
    assert known_item(config, "resource", "up", upstream_ids=["up"])
    assert known_item(config, "prompt", "github_review")
    assert not known_item(config, "prompt", "up_greet")
    assert known_item(config, "prompt", "up_greet", prompt_prefixes=["up_"])
    assert not known_item(config, "prompt", "upgreet", prompt_prefixes=["up_"])


def test_a_direct_grant_is_revoked_and_the_profile_s_stays(
    tmp_path: Path, config: ToolProfileConfig
) -> None:
    store = SqliteTupleStore(tmp_path / "grants.sqlite3")
    assign(store, config, "agent", "reader", "z")
    grant_item(store, "agent", "resource", "notes", "z")
    grant_item(store, "agent", "prompt", "github_review", "z")
    assert visible_resource_sources(store, "agent", "z") == {"github", "notes"}
    assert not revoke_item(store, "agent", "resource", "notes", "z").still_from_profile
    assert revoke_item(store, "agent", "prompt", "github_review", "z").still_from_profile
    assert visible_resource_sources(store, "agent", "z") == {"github"}
    assert visible_prompts(store, "agent", "z") == {"github_review"}
