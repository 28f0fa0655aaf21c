"""The ``profiles`` command: list, show, assign, grant, revoke, inspect, and its exit codes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from nexus_mcp.commands.profiles import add_parser, default_grants_path
from nexus_mcp.identity.access import GrantedTools
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
    run("profiles", "grant", "alice", "custom_tool", "--allow-unknown-tool")

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
    monkeypatch.setenv("XDG_DATA_HOME", str(data_dir.parent / "xdg"))

    # The per-user data directory serve uses, never the current folder.
    assert default_grants_path() == data_dir.parent / "xdg" / "nexus-mcp" / "grants.sqlite3"


# -- grant: only tools a profile or a registered server has --------------------------------

REGISTRIES = Path(__file__).resolve().parents[3] / "schemas" / "mcp" / "registries"


def notes(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("note:")]


def files_in(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` with its bytes ({} when the folder does not exist)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "tool",
    [
        "nexus_read_fil",  # a typo
        "Nexus_read_file",  # tool names are case-sensitive
        "nexus.read_file",
        "nexus_read_file_",
        "create_issue",  # a tool of a server that is not registered
        "a" * 128,
    ],
)
def test_granting_a_tool_no_profile_or_server_has_is_refused_and_creates_nothing(
    data_dir: Path, capsys: pytest.CaptureFixture[str], tool: str
) -> None:
    assert run("profiles", "grant", "alice", tool) == 1

    err = capsys.readouterr().err
    assert "NOT_FOUND" in err and "--allow-unknown-tool" in err
    assert tool not in err
    assert not data_dir.exists()


def test_allow_unknown_tool_grants_a_tool_of_a_server_not_connected_yet(data_dir: Path) -> None:
    assert run("profiles", "grant", "alice", "create_issue", "--allow-unknown-tool") == 0

    assert stored_state(data_dir, "alice")[0] == {"create_issue"}


def test_an_invalid_tool_name_is_refused_even_with_allow_unknown_tool(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("profiles", "grant", "alice", "../escape", "--allow-unknown-tool") == 1

    assert "INVALID_INPUT" in capsys.readouterr().err
    assert not data_dir.exists()


def test_a_tool_only_a_registered_upstream_server_has_can_be_granted(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registries = tmp_path / "registries"
    registries.mkdir()
    (registries / "nexus.json").write_bytes((REGISTRIES / "nexus.json").read_bytes())
    upstream = {
        "schema_id": "talos.mcp.tool_registry",
        "schema_version": "v1",
        "server_id": "github",
        "server_version": "1.0.0",
        "tools": [{"tool_name": "create_issue", "tool_class": "write", "is_document_op": False}],
    }
    (registries / "github.json").write_text(json.dumps(upstream), encoding="utf-8")
    monkeypatch.setenv("NEXUS_MCP_REGISTRY__DIRECTORY", str(registries))

    assert run("profiles", "grant", "alice", "create_issue") == 0

    assert stored_state(data_dir, "alice")[0] == {"create_issue"}


def test_a_tool_only_a_profile_names_can_be_granted(data_dir: Path, tmp_path: Path) -> None:
    profiles = tmp_path / "p.yaml"
    profiles.write_text("default_profile: solo\nprofiles:\n  solo: {tools: [only_tool]}\n")

    assert run("profiles", "grant", "alice", "only_tool", "--profiles", str(profiles)) == 0

    assert stored_state(data_dir, "alice")[0] == {"only_tool"}


# -- inspect: reads only, and notes only a real difference ---------------------------------


@pytest.mark.parametrize("role", ["viewer", "admin", "no-such-role"])
def test_inspect_without_a_database_creates_nothing_and_prints_no_note(
    data_dir: Path, capsys: pytest.CaptureFixture[str], role: str
) -> None:
    assert run("profiles", "inspect", "bob", "--role", role) == 0

    out = capsys.readouterr().out
    assert "(from role)" in out
    assert notes(out) == []
    assert not data_dir.exists()


def test_inspect_of_a_db_path_that_does_not_exist_creates_neither_file_nor_folder(
    tmp_path: Path, data_dir: Path
) -> None:
    db = tmp_path / "absent" / "grants.sqlite3"

    assert run("profiles", "inspect", "bob", "--db", str(db)) == 0

    assert not db.parent.exists()
    assert not data_dir.exists()


def test_inspect_leaves_an_existing_database_exactly_as_it_was(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run("profiles", "assign", "alice", "coding")
    run("profiles", "grant", "alice", "nexus_grep")
    before = files_in(data_dir)

    for subject in ("alice", "bob", "profile:full"):
        assert run("profiles", "inspect", subject) == 0

    assert files_in(data_dir) == before
    assert notes(capsys.readouterr().out) == []


def start_server_grants(db: Path, profiles_file: Path = REPO_CONFIG) -> None:
    """What a server does with the grants database when it starts: write every profile."""
    store = SqliteTupleStore(db)
    try:
        GrantedTools(store, load_profiles(profiles_file), write_tools=()).grant_profiles()
    finally:
        store.close()


def test_inspect_prints_no_note_when_the_served_profiles_match_the_file(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start_server_grants(data_dir / "grants.sqlite3")
    run("profiles", "assign", "alice", "minimal")
    capsys.readouterr()

    for argv in (("alice",), ("bob", "--role", "editor"), ("carol", "--role", "admin")):
        assert run("profiles", "inspect", *argv) == 0
        assert notes(capsys.readouterr().out) == []


def test_inspect_notes_a_served_profile_that_differs_from_the_file(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start_server_grants(data_dir / "grants.sqlite3")
    edited = tmp_path / "edited.yaml"
    edited.write_text(
        "default_profile: minimal\nroles: {viewer: minimal}\n"
        "profiles:\n  minimal: {tools: [nexus_read_file]}\n"
    )

    assert run("profiles", "inspect", "bob", "--role", "viewer", "--profiles", str(edited)) == 0

    assert len(notes(capsys.readouterr().out)) == 1
