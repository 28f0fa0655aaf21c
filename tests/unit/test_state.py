"""Where state lives by default, and a state location that cannot be used stopping cleanly."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.settings import Settings, default_data_dir
from nexus_mcp.stores.locations import (
    DATA_DIR_MODE,
    load_state_settings,
    prepare_folder,
    prepare_state,
    server_state_paths,
)

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the XDG layout is Linux's")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No NEXUS_MCP_* from the caller's shell; HOME is a fresh folder; XDG unset."""
    for key in list(os.environ):
        if key.startswith("NEXUS_MCP_"):
            monkeypatch.delenv(key)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@linux_only
def test_the_default_data_dir_is_under_the_home_folder(clean_env: Path) -> None:
    assert default_data_dir() == clean_env / ".local" / "share" / "nexus-mcp"
    assert Settings().data_dir == clean_env / ".local" / "share" / "nexus-mcp"


def test_xdg_data_home_moves_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert Settings().data_dir == tmp_path / "xdg" / "nexus-mcp"


@linux_only
@pytest.mark.parametrize("value", ["relative/data", ".", "", "  "])
def test_an_xdg_data_home_that_is_not_absolute_is_ignored_as_the_spec_says(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path, value: str
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", value)
    assert default_data_dir() == clean_env / ".local" / "share" / "nexus-mcp"


@pytest.mark.parametrize("cwd", ["tmp", "home", "root"])
def test_the_default_is_never_the_current_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clean_env: Path, cwd: str
) -> None:
    folder = {"tmp": tmp_path, "home": clean_env, "root": Path("/")}[cwd]
    monkeypatch.chdir(folder)
    data_dir = Settings().data_dir
    assert data_dir.is_absolute()
    assert data_dir != folder and data_dir.name == "nexus-mcp"
    assert not (folder / ".nexus-data").exists()


@pytest.mark.parametrize("how", ["env", "flag", "config"])
def test_an_operator_command_finds_the_data_dir_the_server_would_use(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str
) -> None:
    chosen = tmp_path / "state"
    flag = None
    if how == "env":
        monkeypatch.setenv("NEXUS_MCP_DATA_DIR", str(chosen))
    elif how == "flag":
        monkeypatch.setenv("NEXUS_MCP_DATA_DIR", str(tmp_path / "not-this-one"))
        flag = chosen
    else:
        config = tmp_path / "nexus.yaml"
        config.write_text(f"data_dir: {chosen}\nwrite_policies: {{}}\n", encoding="utf-8")
        monkeypatch.setenv("NEXUS_MCP_CONFIG", str(config))
    settings = load_state_settings(flag)
    assert settings.data_dir == chosen
    assert settings.audit_path == chosen / "audit.jsonl"


def test_prepare_state_creates_an_owner_only_data_dir_and_leaves_nothing_in_it(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "a" / "b" / "nexus-mcp"
    prepare_state(Settings(data_dir=data_dir))
    assert stat.S_IMODE(data_dir.stat().st_mode) == DATA_DIR_MODE
    assert list(data_dir.iterdir()) == []


def test_prepare_state_accepts_an_existing_data_dir_and_its_files(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "audit.jsonl").write_text("{}\n")
    (data_dir / "grants.sqlite3").write_bytes(b"")
    prepare_state(Settings(data_dir=data_dir))
    assert (data_dir / "audit.jsonl").read_text() == "{}\n"


def _file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("in the way")
    return path


# (settings given, what to plant, the setting the error must name)
UNUSABLE: dict[str, tuple[dict[str, Any], str, str]] = {
    "data-dir-is-a-file": ({"data_dir": "f"}, "file:f", "NEXUS_MCP_DATA_DIR"),
    "data-dir-under-a-file": ({"data_dir": "f/state"}, "file:f", "NEXUS_MCP_DATA_DIR"),
    "data-dir-deep-under-a-file": ({"data_dir": "f/a/b/c"}, "file:f", "NEXUS_MCP_DATA_DIR"),
    "audit-file-under-a-file": (
        {"data_dir": "d", "audit_file": "f/audit.jsonl"}, "file:f", "NEXUS_MCP_AUDIT_FILE"
    ),
    "grants-db-under-a-file": (
        {"data_dir": "d", "profiles": {"grants_db": "f/g.db"}}, "file:f",
        "NEXUS_MCP_PROFILES__GRANTS_DB",
    ),
    "audit-log-is-a-folder": ({"data_dir": "d"}, "dir:d/audit.jsonl", "NEXUS_MCP_DATA_DIR"),
    "configured-audit-file-is-a-folder": (
        {"data_dir": "d", "audit_file": "logs/a.jsonl"}, "dir:logs/a.jsonl",
        "NEXUS_MCP_AUDIT_FILE",
    ),
    "nonce-store-is-a-folder": ({"data_dir": "d"}, "dir:d/nonces.sqlite3", "NEXUS_MCP_DATA_DIR"),
    "approval-requests-store-is-a-folder": (
        {"data_dir": "d"}, "dir:d/approval_requests.sqlite3-wal", "NEXUS_MCP_DATA_DIR"
    ),
    "wal-sidecar-is-a-folder": (
        {"data_dir": "d"}, "dir:d/idempotency.sqlite3-wal", "NEXUS_MCP_DATA_DIR"
    ),
    "audit-log-is-a-fifo": ({"data_dir": "d"}, "fifo:d/audit.jsonl", "NEXUS_MCP_DATA_DIR"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(UNUSABLE))
def test_an_unusable_state_location_is_one_line_naming_the_setting(
    tmp_path: Path, case: str
) -> None:
    given, plant, env_name = UNUSABLE[case]
    kind, _, where = plant.partition(":")
    target = tmp_path / where
    if kind == "file":
        _file(target)
    elif kind == "dir":
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True)
        os.mkfifo(target)  # no reader: opening it for writing must not hang start-up
    values: dict[str, Any] = {
        k: (tmp_path / v if isinstance(v, str) else {kk: tmp_path / vv for kk, vv in v.items()})
        for k, v in given.items()
    }
    with pytest.raises(ConfigError) as info:
        prepare_state(Settings(**values))
    message = str(info.value)
    assert "\n" not in message
    assert env_name in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_prepare_folder_names_the_setting_it_is_given(tmp_path: Path) -> None:
    _file(tmp_path / "f")
    with pytest.raises(ConfigError, match="--db"):
        prepare_folder(tmp_path / "f" / "x", "--db")


def test_home_folder_served_with_the_default_data_dir_hides_all_of_it(clean_env: Path) -> None:
    settings = Settings()
    hidden = server_state_paths(settings, clean_env)
    assert settings.data_dir.resolve() in hidden


def test_a_folder_served_inside_the_data_dir_never_reaches_the_approval_requests(
    tmp_path: Path,
) -> None:
    # A caller who could write the file could approve its own pending request.
    data = tmp_path / "data"
    served = data / "demo-workspace"
    hidden = server_state_paths(Settings(data_dir=data), served)
    for suffix in ("", "-wal", "-shm", "-journal"):
        assert data / f"approval_requests.sqlite3{suffix}" in hidden
