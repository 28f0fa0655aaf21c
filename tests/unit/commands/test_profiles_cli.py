"""The ``profiles`` command: list, show, assign, grant, revoke, inspect, and its exit codes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nexus_mcp.commands.profiles import add_parser, default_grants_path
from nexus_mcp.policy.grants import visible_tools
from nexus_mcp.policy.profiles import load_profiles
from nexus_mcp.stores.grants import SqliteTupleStore

REPO_CONFIG = Path(__file__).resolve().parents[3] / "config" / "tool_profiles.yaml"


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("NEXUS_MCP_DATA_DIR", str(folder))
    return folder


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="nexus-mcp")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    result: int = args.func(args)
    return result


def stored_state(data_dir: Path, subject: str) -> tuple[frozenset[str], str | None]:
    store = SqliteTupleStore(data_dir / "grants.sqlite3")
    try:
        return visible_tools(store, subject, "default"), store.get_assignment(subject, "default")
    finally:
        store.close()


def test_list_names_every_profile_the_default_and_the_roles(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run("profiles", "list") == 0

    out = capsys.readouterr().out
    for name in load_profiles(REPO_CONFIG).profiles:
        assert f"\n{name} " in out
    assert "default profile: minimal" in out
    assert "admin=full" in out


def test_show_prints_the_resolved_tools_of_a_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("profiles", "show", "coding") == 0

    out = capsys.readouterr().out
    listed = {line.strip() for line in out.splitlines() if line.startswith("  ")}
    assert listed == load_profiles(REPO_CONFIG).profiles["coding"].tools


def test_show_of_an_unknown_profile_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("profiles", "show", "ghost") == 1
    assert "ghost" not in capsys.readouterr().err


def test_assign_writes_the_profile_grants_and_the_assignment(data_dir: Path) -> None:
    assert run("profiles", "assign", "alice", "coding") == 0

    tools, assignment = stored_state(data_dir, "alice")
    assert tools == load_profiles(REPO_CONFIG).profiles["coding"].tools
    assert assignment == "coding"


def test_assigning_an_unknown_profile_is_refused_and_writes_nothing(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("profiles", "assign", "alice", "ghost") == 1

    assert "NOT_FOUND" in capsys.readouterr().err
    assert stored_state(data_dir, "alice") == (frozenset(), None)


def test_grant_then_revoke_tool_adds_and_removes_a_direct_grant(data_dir: Path) -> None:
    assert run("profiles", "grant", "alice", "nexus_grep") == 0
    assert stored_state(data_dir, "alice")[0] == {"nexus_grep"}

    assert run("profiles", "revoke", "alice", "--tool", "nexus_grep") == 0
    assert stored_state(data_dir, "alice")[0] == frozenset()


def test_revoke_profile_removes_profile_grants_and_assignment_but_not_direct_grants(
    data_dir: Path,
) -> None:
    run("profiles", "assign", "alice", "full")
    run("profiles", "grant", "alice", "custom_tool")

    assert run("profiles", "revoke", "alice", "--profile") == 0

    assert stored_state(data_dir, "alice") == (frozenset({"custom_tool"}), None)


def test_revoke_needs_either_a_tool_or_the_profile(data_dir: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        run("profiles", "revoke", "alice")

    assert exited.value.code == 2


def test_granting_an_invalid_tool_name_is_refused(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("profiles", "grant", "alice", "../escape") == 1

    err = capsys.readouterr().err
    assert "INVALID_INPUT" in err
    assert "escape" not in err


def test_inspect_shows_each_visible_tool_with_its_source(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run("profiles", "assign", "alice", "minimal")
    run("profiles", "grant", "alice", "nexus_grep")
    run("profiles", "grant", "alice", "nexus_read_file")
    capsys.readouterr()

    assert run("profiles", "inspect", "alice") == 0

    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("TOOL"))
    rows = dict(line.split(None, 1) for line in lines[header + 1 :] if not line.startswith("note"))
    assert len(rows) == len(load_profiles(REPO_CONFIG).profiles["minimal"].tools) + 1
    assert rows["nexus_grep"] == "direct"
    assert rows["nexus_read_file"] == "profile:minimal, direct"
    assert rows["nexus_glob"] == "profile:minimal"


def test_inspect_without_assignment_uses_the_role_profile(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("profiles", "inspect", "bob", "--role", "evaluator") == 0

    out = capsys.readouterr().out
    assert "profile: search (from role)" in out
    assert "nexus_discovery_search_tools  profile:search" in out


def test_inspect_of_a_stale_assignment_shows_no_tools(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqliteTupleStore(data_dir / "grants.sqlite3")
    store.set_assignment("alice", "retired", "default")
    store.close()

    assert run("profiles", "inspect", "alice") == 0

    assert "sees no tools" in capsys.readouterr().out


def test_a_secret_looking_subject_is_hashed_in_confirmations(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    subject = "sk-live-0123456789abcdef"

    assert run("profiles", "assign", subject, "minimal") == 0

    out = capsys.readouterr().out
    assert subject not in out
    assert "sha256:" in out


def test_options_choose_the_database_zone_and_profiles_file(tmp_path: Path, data_dir: Path) -> None:
    profiles = tmp_path / "p.yaml"
    profiles.write_text("default_profile: solo\nprofiles:\n  solo: {tools: [only_tool]}\n")
    db = tmp_path / "elsewhere.sqlite3"

    code = run(
        "profiles", "assign", "alice", "solo", "--db", str(db), "--zone", "z2",
        "--profiles", str(profiles),
    )  # fmt: skip

    assert code == 0
    store = SqliteTupleStore(db)
    try:
        assert visible_tools(store, "alice", "z2") == {"only_tool"}
        assert visible_tools(store, "alice", "default") == frozenset()
    finally:
        store.close()
    assert not (data_dir / "grants.sqlite3").exists()


def test_a_broken_profiles_file_exits_with_a_config_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("profiles: [\n")

    assert run("profiles", "list", "--profiles", str(broken)) == 2

    assert str(broken) in capsys.readouterr().err


def test_default_database_lives_in_the_data_dir(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert default_grants_path() == data_dir / "grants.sqlite3"

    monkeypatch.delenv("NEXUS_MCP_DATA_DIR")

    assert default_grants_path() == Path(".nexus-data") / "grants.sqlite3"
