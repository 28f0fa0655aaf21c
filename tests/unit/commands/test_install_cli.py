"""``nexus-mcp install CLIENT``: real configuration files of each client's documented shape,
driven through the real command line (``nexus_mcp.cli.main``) and one real subprocess."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.cli import main
from nexus_mcp.commands.install import CLIENTS, default_config_path

# Each client's documented file, holding another server and keys nexus-mcp does not know.
EXISTING: dict[str, dict[str, Any]] = {
    "claude-desktop": {
        "mcpServers": {
            "filesystem": {
                "command": "npx",
                "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                "env": {"DEBUG": "1"},
            }
        },
        "globalShortcut": "Ctrl+Space",
    },
    "claude-code": {
        "mcpServers": {
            "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"], "env": {}},
            "remote": {"type": "http", "url": "https://example.com/mcp"},
        },
        "$comment": "kept",
    },
    "cursor": {
        "mcpServers": {"git": {"command": "uvx", "args": ["mcp-server-git"]}},
        "someFutureSetting": {"nested": [1, 2, 3]},
    },
    "vscode": {
        "inputs": [{"type": "promptString", "id": "api-key", "password": True}],
        "servers": {
            "github": {"type": "http", "url": "https://api.githubcopilot.com/mcp/"},
            "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"]},
        },
    },
}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    return folder


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.bak-*"))


def write_json(path: Path, document: Any) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = (json.dumps(document, indent=4) + "\n").encode()
    path.write_bytes(raw)
    return raw


def expected_args(workspace: Path, *rest: str) -> list[str]:
    return ["serve", "--workspace", str(workspace), *rest]


def entry_args(entry: dict[str, Any]) -> list[str]:
    """The entry's arguments from ``serve`` on (a ``-m nexus_mcp`` fallback is skipped)."""
    args: list[str] = entry["args"]
    return args[args.index("serve") :]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_merges_into_an_existing_config_of_the_documented_shape(
    client: str, tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "client" / "config.json"
    old = write_json(config, EXISTING[client])
    os.chmod(config, 0o640)

    code, out, err = run(
        capsys,
        ["install", client, "--workspace", str(workspace), "--subject", "alice",
         "--role", "editor", "--config-file", str(config)],
    )  # fmt: skip

    assert (code, err) == (0, "")
    assert "added 'nexus-mcp'" in out and "next: " in out
    document = json.loads(config.read_text(encoding="utf-8"))
    key = CLIENTS[client].servers_key
    # Every other server and every unknown key is still there, unchanged.
    for name, value in EXISTING[client].items():
        if name != key:
            assert document[name] == value
    for name, value in EXISTING[client][key].items():
        assert document[key][name] == value
    entry = document[key]["nexus-mcp"]
    assert entry_args(entry) == expected_args(workspace, "--subject", "alice", "--role", "editor")
    command = Path(entry["command"])
    assert command.is_absolute() and command.is_file() and os.access(command, os.X_OK)
    shape = CLIENTS[client]
    assert entry.get("type") == shape.entry_type
    assert ("env" in entry) == shape.with_env
    # The old file is kept, byte for byte, and the new one has the old one's mode.
    (backup,) = backups(config)
    assert backup.read_bytes() == old
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert not list(config.parent.glob(".config.json.*.tmp"))


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_server_of_the_same_name_is_replaced_only_with_force(
    client: str, tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    key = CLIENTS[client].servers_key
    document = json.loads(json.dumps(EXISTING[client]))
    document[key]["mine"] = {"command": "/old/nexus-mcp", "args": ["serve"]}
    before = write_json(config, document)
    argv = ["install", client, "--workspace", str(workspace), "--name", "mine",
            "--config-file", str(config)]  # fmt: skip

    code, out, err = run(capsys, argv)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "already has a server named 'mine'" in err
    assert "--force" in err
    assert config.read_bytes() == before and backups(config) == []

    code, out, err = run(capsys, [*argv, "--force"])
    assert (code, err) == (0, "") and "replaced 'mine'" in out
    after = json.loads(config.read_text(encoding="utf-8"))
    assert after[key]["mine"]["command"] != "/old/nexus-mcp"
    assert entry_args(after[key]["mine"])[:3] == ["serve", "--workspace", str(workspace)]
    assert list(after[key]) == list(document[key])  # the entry keeps its place
    (backup,) = backups(config)
    assert backup.read_bytes() == before

    # The same entry again: nothing to do, nothing written, no new backup.
    code, out, _ = run(capsys, [*argv, "--force"])
    assert code == 0 and "nothing changed" in out
    assert backups(config) == [backup]


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize(
    "text",
    ['{"mcpServers": {', "// a comment\n{}", "[1, 2]", '{"servers": 1, "mcpServers": 1}'],
)
def test_a_file_that_is_not_a_json_object_is_refused_and_left_untouched(
    client: str, text: str, tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(text, encoding="utf-8")
    code, out, err = run(
        capsys, ["install", client, "--workspace", str(workspace), "--config-file", str(config)]
    )
    assert code == 1 and out == ""
    assert err.startswith("nexus-mcp: ") and err.count("\n") == 1
    assert "left unchanged" in err
    assert config.read_text(encoding="utf-8") == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "notes"]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_new_file_and_its_folder_are_created(
    client: str, tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "missing" / "folder" / "mcp.json"
    code, out, _ = run(
        capsys, ["install", client, "--workspace", str(workspace), "--config-file", str(config)]
    )
    assert code == 0 and "added" in out and "kept as" not in out
    document = json.loads(config.read_text(encoding="utf-8"))
    assert list(document) == [CLIENTS[client].servers_key]
    assert backups(config) == []


def test_an_empty_file_is_an_empty_configuration(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "claude_desktop_config.json"
    config.write_text("\n", encoding="utf-8")
    code, _, _ = run(
        capsys,
        ["install", "claude-desktop", "--workspace", str(workspace), "--config-file", str(config)],
    )
    assert code == 0
    assert list(json.loads(config.read_text(encoding="utf-8"))["mcpServers"]) == ["nexus-mcp"]


HOSTILE_NAMES = ['my notes "2024" \\ draft', "naïve café 日本語 ✓", "it's $HOME `x` ; rm -rf"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_workspace_path_is_written_exactly(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / name
    workspace.mkdir()
    config_yaml = tmp_path / f"{name}.yaml"
    config_yaml.write_text("mode: prod\n", encoding="utf-8")
    config = tmp_path / "mcp.json"
    code, _, _ = run(
        capsys,
        ["install", "cursor", "--workspace", str(workspace), "--config", str(config_yaml),
         "--subject", 'o"brien', "--config-file", str(config)],
    )  # fmt: skip
    assert code == 0
    entry = json.loads(config.read_text(encoding="utf-8"))["mcpServers"]["nexus-mcp"]
    # One argument each, exactly as given: no shell quoting anywhere.
    assert entry_args(entry) == expected_args(
        workspace, "--subject", 'o"brien', "--config", str(config_yaml)
    )


def test_a_symlinked_config_file_is_written_through_and_stays_a_link(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dotfiles = tmp_path / "dotfiles"
    target = dotfiles / "claude_desktop_config.json"
    before = write_json(target, EXISTING["claude-desktop"])
    link = tmp_path / "Claude" / "claude_desktop_config.json"
    link.parent.mkdir()
    link.symlink_to(target)

    code, out, _ = run(
        capsys,
        ["install", "claude-desktop", "--workspace", str(workspace), "--config-file", str(link)],
    )
    assert code == 0 and str(target) in out
    assert link.is_symlink() and Path(os.readlink(link)) == target
    document = json.loads(target.read_text(encoding="utf-8"))
    assert set(document["mcpServers"]) == {"filesystem", "nexus-mcp"}
    (backup,) = backups(target)
    assert backup.read_bytes() == before
    assert backups(link) == []


def test_a_link_to_nothing_is_refused(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "mcp.json"
    link.symlink_to(tmp_path / "nowhere.json")
    code, _, err = run(
        capsys, ["install", "cursor", "--workspace", str(workspace), "--config-file", str(link)]
    )
    assert code == 1 and "does not exist" in err and err.count("\n") == 1
    assert link.is_symlink() and not (tmp_path / "nowhere.json").exists()


def test_a_config_file_that_is_a_folder_is_refused(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "mcp.json"
    folder.mkdir()
    code, out, err = run(
        capsys, ["install", "cursor", "--workspace", str(workspace), "--config-file", str(folder)]
    )
    assert code == 1 and out == "" and "is not a file" in err and err.count("\n") == 1
    assert list(folder.iterdir()) == []


def test_a_workspace_that_is_not_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "mcp.json"
    code, _, err = run(
        capsys,
        ["install", "cursor", "--workspace", str(tmp_path / "none"), "--config-file", str(config)],
    )
    assert code == 1 and "workspace is not a folder" in err
    assert not config.exists()


def test_a_missing_nexus_config_is_refused(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        capsys,
        ["install", "cursor", "--workspace", str(workspace), "--config", "nope.yaml", "--print"],
    )
    assert code == 1 and "does not exist" in err


def test_default_locations_are_the_documented_ones(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "project"

    def where(client: str, platform: str, environ: dict[str, str] | None = None) -> Path:
        return default_config_path(
            client, platform=platform, environ=environ or {}, home=home, cwd=cwd
        )

    assert where("claude-desktop", "darwin") == (
        home / "Library/Application Support/Claude/claude_desktop_config.json"
    )
    assert where("claude-desktop", "win32", {"APPDATA": str(tmp_path / "Roaming")}) == (
        tmp_path / "Roaming" / "Claude" / "claude_desktop_config.json"
    )
    assert where("claude-desktop", "linux") == home / ".config/Claude/claude_desktop_config.json"
    assert where("claude-desktop", "linux", {"XDG_CONFIG_HOME": str(tmp_path / "x")}) == (
        tmp_path / "x" / "Claude" / "claude_desktop_config.json"
    )
    assert where("claude-code", "linux") == cwd / ".mcp.json"
    assert where("cursor", "darwin") == home / ".cursor" / "mcp.json"
    assert where("vscode", "win32") == cwd / ".vscode" / "mcp.json"


def test_claude_code_writes_dot_mcp_json_in_the_current_folder(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, ["install", "claude-code", "--workspace", "notes"])
    assert code == 0 and "claude mcp list" in out
    entry = json.loads((tmp_path / ".mcp.json").read_text(encoding="utf-8"))["mcpServers"][
        "nexus-mcp"
    ]
    assert entry["type"] == "stdio" and entry["env"] == {}
    assert entry_args(entry)[:3] == ["serve", "--workspace", str(workspace)]


def test_print_in_a_real_subprocess_writes_nothing(tmp_path: Path, workspace: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-m", "nexus_mcp", "install", "vscode", "--workspace", str(workspace),
         "--role", "viewer", "--name", "notes", "--print"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    entry = document["servers"]["notes"]
    assert entry["type"] == "stdio" and Path(entry["command"]).is_absolute()
    assert Path(entry["command"]).is_file()
    assert entry_args(entry)[:3] == ["serve", "--workspace", str(workspace)]
    assert entry_args(entry)[-2:] == ["--role", "viewer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]  # no .vscode/


@pytest.mark.slow
async def test_the_written_entry_starts_a_server_a_client_can_call(
    tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init, then install, then start the entry exactly as a client would (from ``/``)."""
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport

    (workspace / "notes").mkdir()
    nexus_yaml = tmp_path / "nexus.yaml"
    assert main(["init", str(nexus_yaml), "--workspace", str(workspace)]) == 0
    config = tmp_path / ".mcp.json"
    argv = ["install", "claude-code", "--workspace", str(workspace), "--subject", "alice",
            "--role", "editor", "--config", str(nexus_yaml),
            "--config-file", str(config)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    entry = json.loads(config.read_text(encoding="utf-8"))["mcpServers"]["nexus-mcp"]
    env = {
        **os.environ,
        **entry["env"],
        "PYTHONPATH": os.pathsep.join(sys.path),
        "NEXUS_MCP_DATA_DIR": str(tmp_path / "state"),
    }
    for name in ("NEXUS_MCP_SUBJECT", "NEXUS_MCP_ROLE", "NEXUS_MCP_MODE", "NEXUS_MCP_CONFIG"):
        env.pop(name, None)
    log = tmp_path / "server.log"  # the server's stderr (pytest's capture has no fileno)
    transport = StdioTransport(entry["command"], entry["args"], env=env, cwd="/", log_file=log)
    async with Client(transport) as client:
        names = {tool.name for tool in await client.list_tools()}
        assert "nexus_write_file" in names
        allowed = await client.call_tool(
            "nexus_write_file",
            {"path": "notes/a.md", "content": "hi", "idempotency_key": "k1"},
            raise_on_error=False,
        )
        assert not allowed.is_error
        denied = await client.call_tool(
            "nexus_write_file",
            {"path": "elsewhere/a.md", "content": "hi", "idempotency_key": "k2"},
            raise_on_error=False,
        )
        assert denied.is_error
    assert (workspace / "notes" / "a.md").read_text(encoding="utf-8") == "hi"
