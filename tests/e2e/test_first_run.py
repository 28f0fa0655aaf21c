"""A desktop-style first run: launched from ``/`` by a user without privileges, no data dir.

A desktop client starts ``nexus-mcp serve`` over stdio from ``/`` (or the home folder) with
the configuration in the README: no ``--data-dir``. State must land in the per-user data
directory, never in the folder the client started in, and the operator's own commands
(``audit tail``, ``profiles ...``) must find the same state from any folder. The README's
two setups (reads; writes under a write policy, without and with approval tokens) work
as written. Without an identity, start-up says why every tool is hidden.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.support.unprivileged import Unprivileged, unprivileged_user

from .servers import free_port, http_server, server_env

pytestmark = pytest.mark.slow

APPROVAL_SECRET = "first-run-approval-secret-0123456789abcdef"
# The README's write policy: writes only under notes/ and drafts/, no approval step.
WRITE_POLICY = """\
write_policies:
  workspace:
    allowed_paths: ["notes/**", "drafts/**"]
    allowed_operations: [write, edit, mkdir]
    require_approval: false
"""
# The same with an approval token for every write (minted with `nexus-mcp approvals mint`).
APPROVED_WRITE_POLICY = WRITE_POLICY.replace(
    "require_approval: false", "require_approval: true\n    approval_mode: token"
)
EXIT_CONFIG_ERROR = 2


def desktop_env(home: Path, **extra: str) -> dict[str, str]:
    """What a desktop client passes: its own environment (HOME) plus the config's ``env``."""
    env = server_env(extra)
    env["HOME"] = str(home)
    env.pop("XDG_DATA_HOME", None)
    return env


def stdio_params(
    user: Unprivileged, env: dict[str, str], *args: str, cwd: str = "/"
) -> StdioServerParameters:
    command = user.command([sys.executable, "-m", "nexus_mcp", "serve", *args])
    return StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=cwd)


def run_cli(
    user: Unprivileged, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        user.command([sys.executable, "-m", "nexus_mcp", *args]),
        env=env, cwd="/", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def logged(stderr: str, event: str) -> list[dict[str, Any]]:
    lines = (json.loads(ln) for ln in stderr.splitlines() if ln.startswith('{"'))
    return [line for line in lines if line.get("event") == event]


def result_code(result: Any) -> str | None:
    if not result.is_error:
        return None
    return str(json.loads(result.content[0].text)["code"])


@pytest.fixture
def user() -> Iterator[Unprivileged]:
    with unprivileged_user(server_env()) as found:
        yield found


@pytest.fixture
def desktop(user: Unprivileged) -> dict[str, Path]:
    """A home folder and a workspace owned by the user; the config file beside them."""
    home = user.make_dir("home")
    workspace = user.make_dir("home/project")
    (workspace / "todo.txt").write_text("first run\n", encoding="utf-8")
    (workspace / "notes").mkdir()
    user.give(workspace)
    return {"home": home, "workspace": workspace}


def write_config(user: Unprivileged, home: Path, text: str) -> Path:
    config = home / "nexus.yaml"
    config.write_text(text, encoding="utf-8")
    user.give(config)
    return config


def root_entries() -> set[str]:
    return set(os.listdir("/"))


async def test_a_desktop_launch_from_root_keeps_state_in_the_users_data_directory(
    user: Unprivileged, desktop: dict[str, Path]
) -> None:
    home, workspace = desktop["home"], desktop["workspace"]
    config = write_config(user, home, WRITE_POLICY)
    env = desktop_env(home, NEXUS_MCP_SUBJECT="alice", NEXUS_MCP_ROLE="editor")
    before = root_entries()
    errlog_path = user.area / "stderr.log"
    args = ("--transport", "stdio", "--workspace", str(workspace), "--config", str(config))
    with errlog_path.open("w") as errlog:
        async with (
            stdio_client(stdio_params(user, env, *args), errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
            read_back = await session.call_tool("nexus_read_file", {"path": "todo.txt"})
            written = await session.call_tool(
                "nexus_write_file",
                {"path": "notes/today.md", "content": "# today\n", "idempotency_key": "fr-1"},
            )
            outside = await session.call_tool(
                "nexus_write_file",
                {"path": "todo.txt", "content": "x", "idempotency_key": "fr-2"},
            )
    stderr = errlog_path.read_text()
    assert "Traceback" not in stderr
    assert {"nexus_read_file", "nexus_write_file"} <= names
    assert result_code(read_back) is None
    assert result_code(written) is None, written
    assert result_code(outside) == "WRITE_POLICY_DENIED"
    assert (workspace / "notes" / "today.md").read_text() == "# today\n"
    assert (workspace / "todo.txt").read_text() == "first run\n"
    assert root_entries() == before  # the folder the client started in gained nothing
    data_dir = home / ".local" / "share" / "nexus-mcp"
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert data_dir.stat().st_uid == user.uid
    events = [json.loads(line) for line in (data_dir / "audit.jsonl").read_text().splitlines()]
    assert {e["subject"] for e in events} == {"alice"}
    assert not (workspace / ".nexus-data").exists() and not (home / ".nexus-data").exists()
    assert logged(stderr, "no_principal") == []


async def test_operator_commands_from_any_folder_find_the_servers_state(
    user: Unprivileged, desktop: dict[str, Path]
) -> None:
    home, workspace = desktop["home"], desktop["workspace"]
    env = desktop_env(home, NEXUS_MCP_SUBJECT="bob")
    before = root_entries()
    assigned = run_cli(user, env, "profiles", "assign", "bob", "search")
    assert assigned.returncode == 0, assigned.stderr
    async with (
        stdio_client(stdio_params(user, env, "--workspace", str(workspace))) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
        await session.call_tool("nexus_read_file", {"path": "todo.txt"})
    assert "nexus_grep" in names  # the assignment made from / reached the server
    tail = run_cli(user, env, "audit", "tail")
    assert tail.returncode == 0, tail.stderr
    assert "nexus_read_file" in tail.stdout and "bob" in tail.stdout
    verify = run_cli(user, env, "audit", "verify")
    assert verify.returncode == 0, verify.stdout
    assert root_entries() == before


async def test_the_readme_approved_write_setup_writes_only_with_a_minted_token(
    user: Unprivileged, desktop: dict[str, Path]
) -> None:
    home, workspace = desktop["home"], desktop["workspace"]
    config = write_config(user, home, APPROVED_WRITE_POLICY)
    env = desktop_env(
        home,
        NEXUS_MCP_SUBJECT="alice",
        NEXUS_MCP_ROLE="editor",
        NEXUS_MCP_APPROVAL_SECRET=APPROVAL_SECRET,
    )
    call = {"path": "notes/plan.md", "content": "plan\n", "idempotency_key": "fr-approved"}
    minted = run_cli(
        user, env, "approvals", "mint", "--tool", "nexus_write_file", "--subject", "alice",
        "--approver", "operator", "--args", json.dumps(call),
    )  # fmt: skip
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip()
    args = ("--workspace", str(workspace), "--config", str(config))
    async with (
        stdio_client(stdio_params(user, env, *args)) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        unapproved = await session.call_tool(
            "nexus_write_file", {**call, "idempotency_key": "fr-unapproved"}
        )
        approved = await session.call_tool("nexus_write_file", {**call, "approval_token": token})
    assert result_code(unapproved) == "APPROVAL_REQUIRED"
    assert result_code(approved) is None, approved
    assert (workspace / "notes" / "plan.md").read_text() == "plan\n"


@pytest.mark.parametrize(
    ("flags", "env"),
    [((), {}), (("--mode", "prod"), {}), ((), {"NEXUS_MCP_MODE": "prod"})],
    ids=["default-mode", "flag-prod", "env-prod"],
)
async def test_prod_stdio_without_an_identity_warns_at_start_up_naming_the_settings(
    workspace: Path, tmp_path: Path, flags: tuple[str, ...], env: dict[str, str]
) -> None:
    errlog_path = tmp_path / "stderr.log"
    command = [sys.executable, "-m", "nexus_mcp", "serve", "--workspace", str(workspace),
               "--data-dir", str(tmp_path / "d"), *flags]  # fmt: skip
    params = StdioServerParameters(command=command[0], args=command[1:], env=server_env(env))
    with errlog_path.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = (await session.list_tools()).tools
    assert tools == []
    [warning] = logged(errlog_path.read_text(), "no_principal")
    assert warning["level"] == "warning"
    assert warning["transport"] == "stdio"
    assert warning["settings"] == ["subject", "role", "profile"]
    for name in ("NEXUS_MCP_SUBJECT", "--subject", "NEXUS_MCP_ROLE", "NEXUS_MCP_PROFILE"):
        assert name in warning["hint"]


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        (("--mode", "prod", "--subject", "carol"), {}),
        (("--mode", "prod"), {"NEXUS_MCP_SUBJECT": "carol", "NEXUS_MCP_ROLE": "viewer"}),
        (("--mode", "dev"), {}),
    ],
    ids=["prod-subject-flag", "prod-subject-env", "dev-default-principal"],
)
def test_a_server_whose_callers_have_an_identity_does_not_warn(
    workspace: Path, tmp_path: Path, flags: tuple[str, ...], env: dict[str, str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nexus_mcp", "serve", "--workspace", str(workspace),
         "--data-dir", str(tmp_path / "d"), *flags],
        env=server_env(env), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # stdin closed: the session ends cleanly
    assert logged(done.stderr, "effective_principal")
    assert logged(done.stderr, "no_principal") == []


def test_dev_http_without_tokens_or_a_dev_principal_warns_naming_the_token_settings(
    workspace: Path, tmp_path: Path
) -> None:
    port = free_port()
    args = ["--mode", "dev", "--workspace", str(workspace), "--data-dir", str(tmp_path / "d")]
    env = {"NEXUS_MCP_DEV_PRINCIPAL__SUBJECT": ""}
    with http_server(args, env, port=port) as proc:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    [warning] = logged(stderr.decode(), "no_principal")
    assert warning["transport"] == "http"
    assert "NEXUS_MCP_AUTH__JWT_SECRET" in warning["hint"]
    assert "NEXUS_MCP_DEV_PRINCIPAL__SUBJECT" in warning["hint"]
