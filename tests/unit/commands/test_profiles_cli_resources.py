"""``nexus-mcp profiles grant|revoke --resource/--prompt``, ``show`` and ``inspect`` of
resource sources and prompts (issue 27), against a profiles file of this test's own."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nexus_mcp.commands.profiles import add_parser
from nexus_mcp.policy.grants import visible_prompts, visible_resource_sources
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
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("NEXUS_MCP_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def profiles(tmp_path: Path) -> str:
    path = tmp_path / "profiles.yaml"
    path.write_text(PROFILES, encoding="utf-8")
    return str(path)


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="nexus-mcp")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    result: int = args.func(args)
    return result


def stored(data_dir: Path, subject: str) -> tuple[frozenset[str], frozenset[str]]:
    store = SqliteTupleStore(data_dir / "grants.sqlite3")
    try:
        return (
            visible_resource_sources(store, subject, "default"),
            visible_prompts(store, subject, "default"),
        )
    finally:
        store.close()


def test_grant_and_revoke_a_resource_source_and_a_prompt(data_dir: Path, profiles: str) -> None:
    assert run("profiles", "grant", "alice", "--resource", "notes", "--profiles", profiles) == 0
    assert run("profiles", "grant", "alice", "--resource", "github", "--profiles", profiles) == 0
    assert (
        run("profiles", "grant", "alice", "--prompt", "github_review", "--profiles", profiles) == 0
    )
    assert stored(data_dir, "alice") == ({"notes", "github"}, {"github_review"})

    assert run("profiles", "revoke", "alice", "--resource", "github", "--profiles", profiles) == 0
    assert (
        run("profiles", "revoke", "alice", "--prompt", "github_review", "--profiles", profiles) == 0
    )
    assert stored(data_dir, "alice") == ({"notes"}, frozenset())


@pytest.mark.parametrize(
    ("flag", "name"),
    [("--resource", "../etc"), ("--resource", "a/b"), ("--prompt", "x y"), ("--prompt", "a/b")],
)
def test_a_name_that_cannot_be_granted_is_invalid_input_and_creates_nothing(
    data_dir: Path, profiles: str, capsys: pytest.CaptureFixture[str], flag: str, name: str
) -> None:
    assert run("profiles", "grant", "alice", flag, name, "--profiles", profiles) == 1
    err = capsys.readouterr().err
    assert "INVALID_INPUT" in err and name not in err
    assert not (data_dir / "grants.sqlite3").exists()


def test_an_unknown_source_or_prompt_is_refused_unless_allowed(
    data_dir: Path, profiles: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("profiles", "grant", "alice", "--resource", "jira", "--profiles", profiles) == 1
    assert run("profiles", "grant", "alice", "--prompt", "jira_x", "--profiles", profiles) == 1
    err = capsys.readouterr().err
    assert err.count("NOT_FOUND") == 2
    assert not (data_dir / "grants.sqlite3").exists()
    allow = "--allow-unknown-tool"
    assert (
        run("profiles", "grant", "alice", "--resource", "jira", allow, "--profiles", profiles) == 0
    )
    assert (
        run("profiles", "grant", "alice", "--prompt", "jira_x", allow, "--profiles", profiles) == 0
    )
    assert stored(data_dir, "alice") == ({"jira"}, {"jira_x"})


def test_a_tool_and_a_resource_in_one_grant_is_a_usage_error(data_dir: Path, profiles: str) -> None:
    with pytest.raises(SystemExit) as exited:
        run("profiles", "grant", "alice", "nexus_grep", "--resource", "notes")
    assert exited.value.code == 2
    with pytest.raises(SystemExit) as exited:
        run("profiles", "grant", "alice")  # nothing to grant
    assert exited.value.code == 2


def test_revoking_a_direct_grant_the_profile_also_gives_says_it_stays(
    data_dir: Path, profiles: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run("profiles", "assign", "alice", "reader", "--profiles", profiles)
    run("profiles", "grant", "alice", "--resource", "github", "--profiles", profiles)
    capsys.readouterr()
    assert run("profiles", "revoke", "alice", "--resource", "github", "--profiles", profiles) == 0
    assert "stays visible through the subject's profile" in capsys.readouterr().out
    # Revoking the profile removes its sources and prompts from the subject.
    assert run("profiles", "revoke", "alice", "--profile", "--profiles", profiles) == 0
    assert stored(data_dir, "alice") == (frozenset(), frozenset())


def test_show_and_inspect_name_resource_sources_and_prompts(
    data_dir: Path, profiles: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("profiles", "show", "reader", "--profiles", profiles) == 0
    out = capsys.readouterr().out
    assert "resources (1):\n  github\n" in out and "prompts (1):\n  github_review\n" in out

    run("profiles", "assign", "alice", "reader", "--profiles", profiles)
    run("profiles", "grant", "alice", "--resource", "notes", "--profiles", profiles)
    capsys.readouterr()
    assert run("profiles", "inspect", "alice", "--profiles", profiles) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {tuple(line.split(None, 1)) for line in lines}
    assert ("github", "profile:reader") in rows
    assert ("notes", "direct") in rows
    assert ("github_review", "profile:reader") in rows
