"""Issue 27 on every grants backend (SQLite, PostgreSQL): a profile's resource sources and
prompts are written, replaced and revoked with it, direct grants stay apart, and each kind
is listed under its own prefix only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nexus_mcp.identity.access import GrantedTools
from nexus_mcp.policy.grant_admin import assign, revoke_profile
from nexus_mcp.policy.grants import (
    grant_prompt,
    grant_resource,
    visible_prompts,
    visible_resource_sources,
    visible_tools,
)
from nexus_mcp.policy.profiles import ToolProfileConfig, load_profiles
from nexus_mcp.principal import Principal
from nexus_mcp.stores.grants import SqliteTupleStore, TupleStore
from nexus_mcp.stores.postgres_grants import PostgresTupleStore
from tests.unit.stores.conftest import BACKENDS, PoolFactory

ZONE = "default"
PROFILES = """
default_profile: base
profiles:
  base:
    tools: [nexus_read_file]
  reader:
    extends: base
    resources: [notes, github]
    prompts: [github_review]
"""


@pytest.fixture(params=BACKENDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TupleStore, ...]]:
    """Two stores on one storage: a writer and another replica (or process) reading it."""
    opened: list[TupleStore] = []
    for _ in range(2):
        if request.param == "sqlite":
            opened.append(SqliteTupleStore(tmp_path / "grants.sqlite3"))
        else:
            url: str = request.getfixturevalue("migrated_url")
            pools: PoolFactory = request.getfixturevalue("pg_pools")
            opened.append(PostgresTupleStore(pools(url)))
    yield tuple(opened)
    for store in opened:
        store.close()


@pytest.fixture
def config(tmp_path: Path) -> ToolProfileConfig:
    path = tmp_path / "profiles.yaml"
    path.write_text(PROFILES, encoding="utf-8")
    return load_profiles(path)


def test_a_profile_grants_sources_and_prompts_and_revoking_it_removes_them(
    stores: tuple[TupleStore, TupleStore], config: ToolProfileConfig
) -> None:
    writer, other = stores
    assign(writer, config, "alice", "reader", ZONE)
    grant_resource(writer, "alice", "jira", ZONE)
    grant_prompt(writer, "alice", "jira_triage", ZONE)
    # Another replica reads the same grants, each kind under its own prefix.
    assert visible_resource_sources(other, "alice", ZONE) == {"notes", "github", "jira"}
    assert visible_prompts(other, "alice", ZONE) == {"github_review", "jira_triage"}
    assert visible_tools(other, "alice", ZONE) == {"nexus_read_file"}

    assign(writer, config, "alice", "base", ZONE)  # replaced: the profile's go, direct stay
    assert visible_resource_sources(other, "alice", ZONE) == {"jira"}
    assert visible_prompts(other, "alice", ZONE) == {"jira_triage"}

    assign(writer, config, "alice", "reader", ZONE)
    revoke_profile(writer, "alice", ZONE)
    assert visible_resource_sources(other, "alice", ZONE) == {"jira"}
    assert visible_prompts(other, "alice", ZONE) == {"jira_triage"}
    assert visible_tools(other, "alice", ZONE) == frozenset()


def test_the_namespace_of_another_replica_sees_a_profile_revoked_once_it_forgets(
    stores: tuple[TupleStore, TupleStore], config: ToolProfileConfig
) -> None:
    writer, other = stores
    access = GrantedTools(other, config, write_tools=())
    access.grant_profiles()
    caller = Principal(subject="dana", role="viewer")
    assert access.visible_resource_sources(caller) == frozenset()

    assign(writer, config, "dana", "reader", ZONE)
    access.forget()  # what the grants watch does on a change announced by any replica
    assert access.visible_resource_sources(caller) == {"notes", "github"}
    assert access.visible_prompts(caller) == {"github_review"}

    revoke_profile(writer, "dana", ZONE)
    access.forget()
    assert access.visible_resource_sources(caller) == frozenset()
    assert access.visible_prompts(caller) == frozenset()


def test_export_and_import_carry_resource_and_prompt_grants(
    stores: tuple[TupleStore, TupleStore], config: ToolProfileConfig
) -> None:
    writer, other = stores
    assign(writer, config, "alice", "reader", ZONE)
    grant_prompt(writer, "alice", "x_y", ZONE)
    exported = writer.export_zone(ZONE)
    other.import_zone(exported, "copy")
    assert visible_resource_sources(other, "alice", "copy") == {"notes", "github"}
    assert visible_prompts(other, "alice", "copy") == {"github_review", "x_y"}
