"""A data directory that cannot be used stops every command with one line, exit 2.

``serve`` (stdio and HTTP), ``profiles`` and ``audit`` meet the same data directory, and
when it cannot be created, written or read (a file in the way, a read-only file system,
permission denied, no home folder for the default) each says so in one line naming the
setting (``data_dir`` / ``NEXUS_MCP_DATA_DIR`` / ``--data-dir``), with no traceback and
nothing on stdout, however the data directory was chosen. With the default data directory
inside the served folder (serving the home folder), the file tools cannot reach it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from nexus_mcp.observability.audit import JsonlAuditSink
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings
from tests.support.unprivileged import Unprivileged, read_only_prefix, unprivileged_user

from .conftest import DEMO_WORKSPACE, wire
from .servers import free_port, server_env

pytestmark = pytest.mark.slow

EXIT_CONFIG_ERROR = 2
NO_PASSWD_UID = 54321  # a uid with no passwd entry: no home folder to be found
COMMANDS: dict[str, tuple[str, ...]] = {
    "serve-stdio": ("serve", "--transport", "stdio", "--subject", "alice"),
    "serve-http": ("serve", "--transport", "http", "--mode", "dev"),
    "profiles-assign": ("profiles", "assign", "alice", "minimal"),
}


def nexus(*args: str) -> list[str]:
    return [sys.executable, "-m", "nexus_mcp", *args]


def command_for(name: str, workspace: Path) -> list[str]:
    args = COMMANDS[name]
    if args[0] == "serve":
        args = (*args, "--workspace", str(workspace))
    if name == "serve-http":
        args = (*args, "--port", str(free_port()))
    return nexus(*args)


def assert_one_line_refusal(done: subprocess.CompletedProcess[str], setting: str) -> str:
    assert done.returncode == EXIT_CONFIG_ERROR, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    # JSON log lines may come first (a start-up warning); the refusal is the one other line.
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith('{"')]
    assert line.startswith(("nexus-mcp: ", "error: "))
    assert setting in line
    return line


def run(argv: list[str], env: dict[str, str], cwd: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "todo.txt").write_text("x")
    return folder


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("shape", ["is-a-file", "under-a-file"])
def test_a_file_in_the_way_of_the_data_dir_is_one_line_and_exit_2(
    tmp_path: Path, ws: Path, command: str, shape: str
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    data_dir = blocker if shape == "is-a-file" else blocker / "state"
    done = run(command_for(command, ws), server_env({"NEXUS_MCP_DATA_DIR": str(data_dir)}), ws)
    line = assert_one_line_refusal(done, "NEXUS_MCP_DATA_DIR")
    assert "--data-dir" in line
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("source", ["flag", "env", "config", "xdg-default"])
def test_the_refusal_is_the_same_however_the_data_dir_was_chosen(
    tmp_path: Path, ws: Path, source: str
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    argv = nexus("serve", "--workspace", str(ws), "--subject", "alice")
    env: dict[str, str] = {}
    if source == "flag":
        argv += ["--data-dir", str(blocker)]
    elif source == "env":
        env["NEXUS_MCP_DATA_DIR"] = str(blocker)
    elif source == "config":
        config = tmp_path / "nexus.yaml"
        config.write_text(f"data_dir: {blocker}\n", encoding="utf-8")
        argv += ["--config", str(config)]
    else:  # the per-user default: $XDG_DATA_HOME/nexus-mcp
        (tmp_path / "xdg").mkdir()
        (tmp_path / "xdg" / "nexus-mcp").write_text("")
        env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    assert_one_line_refusal(run(argv, server_env(env), ws), "NEXUS_MCP_DATA_DIR")


@pytest.mark.parametrize(
    ("command", "state"),
    [("serve-stdio", "to-be-created"), ("serve-stdio", "existing"),
     ("serve-http", "existing"), ("profiles-assign", "to-be-created")],
)  # fmt: skip
def test_a_data_dir_on_a_read_only_file_system_is_one_line_and_exit_2(
    tmp_path: Path, ws: Path, command: str, state: str
) -> None:
    frozen = tmp_path / "frozen"
    (frozen / "existing").mkdir(parents=True)
    prefix = read_only_prefix(frozen)
    data_dir = frozen / state
    done = run(
        [*prefix, *command_for(command, ws)],
        server_env({"NEXUS_MCP_DATA_DIR": str(data_dir)}),
        ws,
    )
    assert_one_line_refusal(done, "NEXUS_MCP_DATA_DIR")
    assert sorted(p.name for p in frozen.iterdir()) == ["existing"]
    assert list((frozen / "existing").iterdir()) == []


@pytest.fixture
def user() -> Iterator[Unprivileged]:
    with unprivileged_user(server_env()) as found:
        yield found


@pytest.mark.parametrize(
    ("command", "where"),
    [("serve-stdio", "in-root"), ("serve-stdio", "locked-folder-itself"),
     ("serve-http", "in-a-locked-folder"), ("profiles-assign", "in-root"),
     ("profiles-assign", "locked-folder-itself")],
)  # fmt: skip
def test_a_data_dir_the_user_may_not_write_is_one_line_and_exit_2(
    user: Unprivileged, command: str, where: str
) -> None:
    workspace = user.make_dir("ws")
    locked = user.area / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)  # not the user's to write, whoever the user is
    data_dir = {
        "in-root": Path("/") / f"nexus-denied-{os.getpid()}",
        "in-a-locked-folder": locked / "state",
        "locked-folder-itself": locked,
    }[where]
    before = set(os.listdir("/"))
    env = server_env({"NEXUS_MCP_DATA_DIR": str(data_dir), "HOME": str(user.area)})
    try:
        done = run(user.command(command_for(command, workspace)), env, "/")
    finally:
        locked.chmod(0o755)
    assert_one_line_refusal(done, "NEXUS_MCP_DATA_DIR")
    assert set(os.listdir("/")) == before
    assert list(locked.iterdir()) == []


def test_audit_tail_and_verify_say_in_one_line_when_the_trail_cannot_be_read(
    user: Unprivileged,
) -> None:
    sealed = user.area / "sealed"  # the server's data dir, not entered by this user
    sealed.mkdir(mode=0o700)
    (sealed / "audit.jsonl").write_text("{}\n")
    if os.geteuid() != 0:
        sealed.chmod(0o000)
    env = server_env({"NEXUS_MCP_DATA_DIR": str(sealed), "HOME": str(user.area)})
    try:
        for action in ("tail", "verify"):
            done = run(user.command(nexus("audit", action)), env, "/")
            assert_one_line_refusal(done, "NEXUS_MCP_DATA_DIR")
    finally:
        sealed.chmod(0o700)


@pytest.mark.parametrize("action", ["tail", "verify"])
def test_an_audit_file_that_is_a_folder_is_one_line_not_a_traceback(
    tmp_path: Path, action: str
) -> None:
    (tmp_path / "d" / "audit.jsonl").mkdir(parents=True)
    done = run(nexus("audit", action, "--data-dir", str(tmp_path / "d")), server_env(), tmp_path)
    assert_one_line_refusal(done, "NEXUS_MCP_DATA_DIR")


@pytest.mark.parametrize(
    "argv",
    [("audit", "tail"), ("audit", "verify"), ("profiles", "assign", "a", "minimal")],
    ids=["audit-tail", "audit-verify", "profiles-assign"],
)
def test_without_a_home_folder_there_is_no_default_and_the_setting_is_named(
    argv: tuple[str, ...],
) -> None:
    # serve is not among them: FastMCP itself needs a home folder to be imported.
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as a uid with no passwd entry")
    try:
        pwd.getpwuid(NO_PASSWD_UID)
        pytest.skip(f"uid {NO_PASSWD_UID} has a passwd entry here")
    except KeyError:
        pass
    env = server_env()
    env.pop("HOME", None)
    env.pop("XDG_DATA_HOME", None)
    drop = ["setpriv", f"--reuid={NO_PASSWD_UID}", f"--regid={NO_PASSWD_UID}", "--clear-groups"]
    before = set(os.listdir("/"))
    assert_one_line_refusal(run([*drop, *nexus(*argv)], env, "/"), "NEXUS_MCP_DATA_DIR")
    assert set(os.listdir("/")) == before


@pytest.mark.parametrize("layout", ["home-default", "xdg-inside-workspace"])
async def test_state_in_the_served_folder_by_default_is_out_of_the_file_tools_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    home = tmp_path / "home"
    shutil.copytree(DEMO_WORKSPACE, home)
    monkeypatch.delenv("NEXUS_MCP_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(home))
    if layout == "home-default":
        monkeypatch.delenv("XDG_DATA_HOME", raising=False)
        relative = ".local/share/nexus-mcp"
    else:
        monkeypatch.setenv("XDG_DATA_HOME", str(home / "state"))
        relative = "state/nexus-mcp"
    settings = Settings(mode="dev", workspace=home)
    assert settings.data_dir == home / relative
    server = build_server(settings, audit_sinks=[JsonlAuditSink(settings.audit_path)])
    try:
        async with Client(server.mcp) as client:
            await client.call_tool_mcp("nexus_read_file", {"path": "todo.txt"})
            for path in (f"{relative}/audit.jsonl", f"{relative}/grants.sqlite3", relative):
                result: dict[str, Any] = wire(
                    await client.call_tool_mcp("nexus_read_file", {"path": path})
                )
                assert result["isError"] is True
                assert json.loads(result["content"][0]["text"])["code"] == "INVALID_PATH"
            listed = wire(
                await client.call_tool_mcp("nexus_list_files", {"path": ".", "recursive": True})
            )
            paths = [e["path"] for e in listed["structuredContent"]["entries"]]
            assert paths and not any(p.startswith(relative) for p in paths)
    finally:
        server.close()
    assert (home / relative / "audit.jsonl").stat().st_size > 0
