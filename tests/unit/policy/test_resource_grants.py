"""Issue 27: profiles grant resource sources and prompts as they grant tools.

Profiles (``resources:``, ``prompts:``, inherited, validated, unknown names warned), their
tuples (own prefixes, written and removed with the profile, direct grants on top), the
tools' lookup untouched, and ``resource_source`` on hostile URIs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nexus_mcp.errors import ConfigError, InvalidInputError
from nexus_mcp.identity.access import GrantedTools, profile_subject
from nexus_mcp.policy.grant_admin import assign, revoke_profile
from nexus_mcp.policy.grants import (
    DIRECT_RELATION,
    PROFILE_RELATION,
    assign_profile,
    ensure_principal_grants,
    grant_prompt,
    grant_resource,
    grant_tool,
    grant_tools_for_profile,
    revoke_profile_grants,
    revoke_prompt,
    revoke_resource,
    revoke_tools_for_profile,
    to_prompt_object,
    to_resource_object,
    visible_prompts,
    visible_resource_sources,
    visible_tools,
)
from nexus_mcp.policy.profiles import ToolProfileConfig, load_profiles
from nexus_mcp.policy.resources import NOTES_SOURCE, resource_source, uri_sha256
from nexus_mcp.principal import Principal
from nexus_mcp.stores.grants import SqliteTupleStore

ZONE = "default"
PROFILES = """
default_profile: base
roles: {viewer: base, editor: reader, evaluator: base, admin: everything}
profiles:
  base:
    tools: [nexus_read_file]
  reader:
    extends: base
    tools: [nexus_glob]
    resources: [notes, github]
    prompts: [github_review]
  everything:
    extends: reader
    resources: [jira]
    prompts: [jira_triage]
"""


def write(tmp_path: Path, text: str, name: str = "profiles.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def config(tmp_path: Path) -> ToolProfileConfig:
    return load_profiles(write(tmp_path, PROFILES))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteTupleStore]:
    opened = SqliteTupleStore(tmp_path / "grants.sqlite3")
    yield opened
    opened.close()


# --- profiles --------------------------------------------------------------------------


def test_resources_and_prompts_are_inherited_like_tools(config: ToolProfileConfig) -> None:
    base, reader, everything = (config.profiles[n] for n in ("base", "reader", "everything"))
    assert base.resources == frozenset() and base.prompts == frozenset()
    assert reader.resources == {"notes", "github"}
    assert reader.prompts == {"github_review"}
    assert everything.resources == {"notes", "github", "jira"}
    assert everything.prompts == {"github_review", "jira_triage"}
    assert everything.tools == {"nexus_read_file", "nexus_glob"}


def test_the_shipped_profiles_still_load_with_no_resources_or_prompts() -> None:
    shipped = load_profiles()
    assert all(not p.resources and not p.prompts for p in shipped.profiles.values())


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        ("resources: notes", "'resources' must be a list"),
        ("resources: [../x]", "every resource source must be a name"),
        ("resources: [upstream://x]", "every resource source must be a name"),
        ("resources: ['a/b']", "every resource source must be a name"),
        ("resources: [-x]", "every resource source must be a name"),
        ("resources: ['']", "every resource source must be a name"),
        ("resources: [1]", "every resource source must be a name"),
        ("resources: [" + "a" * 65 + "]", "every resource source must be a name"),
        ("prompts: {a: b}", "'prompts' must be a list"),
        ("prompts: ['x y']", "every prompt must be a name"),
        ("prompts: ['/prompts/x']", "every prompt must be a name"),
        ("prompts: [" + "p" * 129 + "]", "every prompt must be a name"),
        ("resource: [notes]", "unknown keys ['resource']"),
    ],
)
def test_bad_resource_and_prompt_entries_are_config_errors(
    tmp_path: Path, body: str, rule: str
) -> None:
    path = write(tmp_path, f"profiles:\n  p:\n    {body}\ndefault_profile: p\n")
    with pytest.raises(ConfigError) as caught:
        load_profiles(path)
    assert rule in str(caught.value)


def test_null_resources_and_prompts_are_empty(tmp_path: Path) -> None:
    path = write(tmp_path, "profiles:\n  p:\n    resources:\n    prompts:\ndefault_profile: p\n")
    profile = load_profiles(path).profiles["p"]
    assert profile.resources == frozenset() and profile.prompts == frozenset()


def test_unknown_sources_and_prompts_are_warnings_once_by_their_declaring_profile(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, PROFILES)
    with capture_logs() as logs:
        config = load_profiles(
            path,
            known_tools=["nexus_read_file", "nexus_glob"],
            known_resources=["notes", "github"],
            known_prompts=["github_review"],
        )
    assert config.warnings == (
        f"{path}: profile 'everything' names unknown resource source 'jira'",
        f"{path}: profile 'everything' names unknown prompt 'jira_triage'",
    )
    events = {(e["event"], e.get("source") or e.get("prompt")) for e in logs}
    assert events == {
        ("tool_profile_unknown_resource_source", "jira"),
        ("tool_profile_unknown_prompt", "jira_triage"),
    }
    # Unknown names still resolve: they grant nothing until such a source exists.
    assert "jira" in config.profiles["everything"].resources


def test_without_known_lists_nothing_is_warned(tmp_path: Path) -> None:
    assert load_profiles(write(tmp_path, PROFILES)).warnings == ()


# --- tuples ----------------------------------------------------------------------------


def test_a_profile_writes_its_sources_and_prompts_under_their_own_prefixes(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    revision = grant_tools_for_profile(store, "alice", config.profiles["reader"], ZONE)
    assert revision == 1  # one batch for every kind
    assert store.list_objects("alice", PROFILE_RELATION, ZONE, "/resources/") == [
        "/resources/github",
        "/resources/notes",
    ]
    assert store.list_objects("alice", PROFILE_RELATION, ZONE, "/prompts/") == [
        "/prompts/github_review"
    ]
    # The tools' lookup reads only tools.
    assert visible_tools(store, "alice", ZONE) == {"nexus_read_file", "nexus_glob"}
    assert visible_resource_sources(store, "alice", ZONE) == {"notes", "github"}
    assert visible_prompts(store, "alice", ZONE) == {"github_review"}


def test_revoking_or_replacing_a_profile_removes_its_sources_and_prompts(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    assign_profile(store, config, "alice", "everything", ZONE)
    assert visible_resource_sources(store, "alice", ZONE) == {"notes", "github", "jira"}

    assign_profile(store, config, "alice", "base", ZONE)  # replaced
    assert visible_resource_sources(store, "alice", ZONE) == frozenset()
    assert visible_prompts(store, "alice", ZONE) == frozenset()
    assert visible_tools(store, "alice", ZONE) == {"nexus_read_file"}

    assign_profile(store, config, "alice", "reader", ZONE)
    revoke_profile_grants(store, "alice", ZONE)
    assert store.list_objects("alice", PROFILE_RELATION, ZONE, "/") == []

    grant_tools_for_profile(store, "bob", config.profiles["reader"], ZONE)
    revoke_tools_for_profile(store, "bob", config.profiles["reader"], ZONE)
    assert store.list_objects("bob", PROFILE_RELATION, ZONE, "/") == []


def test_direct_grants_survive_the_profile_and_revoke_alone(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    assign(store, config, "alice", "reader", ZONE)
    grant_resource(store, "alice", "jira", ZONE)
    grant_resource(store, "alice", "github", ZONE)  # also from the profile
    grant_prompt(store, "alice", "jira_triage", ZONE)

    revoke_profile(store, "alice", ZONE)
    assert visible_resource_sources(store, "alice", ZONE) == {"jira", "github"}
    assert visible_prompts(store, "alice", ZONE) == {"jira_triage"}
    assert store.get_assignment("alice", ZONE) is None

    revoke_resource(store, "alice", "github", ZONE)
    revoke_prompt(store, "alice", "jira_triage", ZONE)
    assert visible_resource_sources(store, "alice", ZONE) == {"jira"}
    assert visible_prompts(store, "alice", ZONE) == frozenset()
    assert store.list_objects("alice", DIRECT_RELATION, ZONE, "/tools/") == []


def test_ensure_writes_only_when_the_profile_changed(
    store: SqliteTupleStore, config: ToolProfileConfig, tmp_path: Path
) -> None:
    subject = profile_subject("reader")
    assert ensure_principal_grants(store, config, subject, "reader", ZONE) is True
    assert ensure_principal_grants(store, config, subject, "reader", ZONE) is False
    # The file gains a prompt: the next start re-syncs exactly that.
    grown = load_profiles(
        write(tmp_path, PROFILES.replace("[github_review]", "[a_b, github_review]"), "g.yaml")
    )
    assert ensure_principal_grants(store, grown, subject, "reader", ZONE) is True
    assert visible_prompts(store, subject, ZONE) == {"a_b", "github_review"}


@pytest.mark.parametrize("name", ["", "../x", "a/b", "x\x00", "a" * 65, "-x", "notes/", " notes"])
def test_a_source_that_could_escape_its_prefix_is_invalid_input(
    store: SqliteTupleStore, name: str
) -> None:
    with pytest.raises(InvalidInputError):
        to_resource_object(name)
    with pytest.raises(InvalidInputError):
        grant_resource(store, "alice", name, ZONE)
    assert store.revision(ZONE) == 0


@pytest.mark.parametrize("name", ["", "a/b", "x y", "p" * 129, "ü"])
def test_a_prompt_name_outside_the_tool_name_rule_is_invalid_input(
    store: SqliteTupleStore, name: str
) -> None:
    with pytest.raises(InvalidInputError):
        to_prompt_object(name)
    with pytest.raises(InvalidInputError):
        grant_prompt(store, "alice", name, ZONE)
    assert store.revision(ZONE) == 0


def test_a_tool_grant_never_grants_a_prompt_or_source_of_the_same_name(
    store: SqliteTupleStore,
) -> None:
    grant_tool(store, "alice", "notes", ZONE)
    grant_tool(store, "alice", "github_review", ZONE)
    assert visible_resource_sources(store, "alice", ZONE) == frozenset()
    assert visible_prompts(store, "alice", ZONE) == frozenset()


# --- the namespace (GrantedTools) --------------------------------------------------------


def principal(subject: str, role: str = "viewer", **extra: object) -> Principal:
    return Principal(subject=subject, role=role, source="env", **extra)  # type: ignore[arg-type]


def test_granted_tools_answers_sources_and_prompts_per_principal(
    store: SqliteTupleStore, config: ToolProfileConfig
) -> None:
    access = GrantedTools(store, config, write_tools=())
    access.grant_profiles()
    editor = principal("ed", "editor")
    assert access.visible_resource_sources(editor) == {"notes", "github"}
    assert access.visible_prompts(editor) == {"github_review"}
    # Read-only keeps them: both are reads.
    read_only = principal("ro", "editor", read_only=True)
    assert access.visible_resource_sources(read_only) == {"notes", "github"}
    assert access.visible_prompts(read_only) == {"github_review"}
    viewer = principal("vi")
    assert access.visible_resource_sources(viewer) == frozenset()
    # A direct grant reaches the next lookup once this server forgets (as after a change).
    grant_resource(store, "vi", "jira", ZONE)
    grant_prompt(store, "vi", "jira_triage", ZONE)
    access.forget("vi")
    assert access.visible_resource_sources(viewer) == {"jira"}
    assert access.visible_prompts(viewer) == {"jira_triage"}
    # A principal naming an unknown profile, or posing as a profile, sees none.
    assert access.visible_resource_sources(principal("x", "editor", profile="nope")) == frozenset()
    assert access.visible_prompts(principal(profile_subject("everything"), "admin")) == frozenset()


# --- resource_source -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "source"),
    [
        ("upstream://github/repos/x/README.md", "github"),
        ("upstream://github/{owner}/{repo}", "github"),
        ("upstream://GitHub/x", "GitHub"),
        ("UPSTREAM://github/x", "github"),
        ("upstream://a.b-c_d/", "a.b-c_d"),
        ("nexus://notes/projects/a.md", NOTES_SOURCE),
        ("nexus://notes/{path*}", NOTES_SOURCE),
        ("NeXuS://notes/a", NOTES_SOURCE),
        # never granted
        ("nexus://NOTES/a", None),
        ("nexus://notes", None),
        ("nexus://other/a", None),
        ("upstream://notes/a", None),  # "notes" is the native notes' source only
        ("upstream://github", None),
        ("upstream:///x", None),
        ("upstream://{sid}/x", None),
        ("upstream://user@github/x", None),
        ("upstream://github:443/x", None),
        ("upstream://git%68ub/x", None),
        ("upstream://-x/a", None),
        ("upstream://" + "a" * 65 + "/x", None),
        ("upstream:/github/x", None),
        ("upstream:github/x", None),
        ("file:///etc/passwd", None),
        ("https://github/x", None),
        ("github/x", None),
        ("", None),
        ("upstream://github\x00/x", None),
        ("upstream://" + "g" * 10 + "/" + "x" * 9000, None),
    ],
)
def test_resource_source(uri: str, source: str | None) -> None:
    assert resource_source(uri) == source


def test_uri_digest_is_the_sha256_of_the_text_and_never_the_text() -> None:
    digest = uri_sha256("nexus://notes/secret-CANARY.md")
    assert len(digest) == 64 and "CANARY" not in digest
    assert digest == uri_sha256("nexus://notes/secret-CANARY.md")
    assert digest != uri_sha256("nexus://notes/secret-CANARY.mD")
    assert len(uri_sha256("nexus://notes/\udcff")) == 64  # a lone surrogate still hashes
