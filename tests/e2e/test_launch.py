"""Launch settings without a subject, through a real ``nexus-mcp serve`` process.

dev: they narrow the dev principal (tools/list and calls show it, the workspace is left
untouched); prod: start-up stops with one line naming the setting; a setting that would
widen the dev principal never starts a server. Every transport logs the effective
principal at start-up, never a token or a secret-looking subject.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from .access_helpers import registry_write_tools, resolved_profiles, role_profiles
from .conftest import snapshot
from .servers import free_port, http_server, serve_command, server_env

pytestmark = pytest.mark.slow

PROFILES = resolved_profiles()
ALL_TOOLS = PROFILES["full"]
WRITE_TOOLS = registry_write_tools()
VIEWER_TOOLS = PROFILES[role_profiles()["viewer"]]
WRITE_ARGS = {"path": "launch-probe.txt", "content": "x", "idempotency_key": "launch-probe"}
NARROW_DEV_CONFIG = "dev_principal:\n  role: viewer\n  profile: minimal\n"
EXIT_CONFIG_ERROR = 2
SECRET = "launch-e2e-secret-0123456789abcdef-xyz"
AUDIENCE = "nexus-launch-e2e"


def stdio_params(*flags: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    command = serve_command("--transport", "stdio", *flags)
    return StdioServerParameters(command=command[0], args=command[1:], env=server_env(env))


def logged(stderr: str, event: str) -> list[dict[str, Any]]:
    """The JSON log lines on stderr for one event."""
    # The dev HTTP banner prints a client config over several lines; log lines are whole.
    lines = (json.loads(ln) for ln in stderr.splitlines() if ln.startswith('{"'))
    return [line for line in lines if line.get("event") == event]


def unknown_tool(result: Any, name: str) -> bool:
    """FastMCP's own answer for a tool that does not exist (what a hidden tool gets)."""
    texts = [c.text for c in result.content if c.type == "text"]
    return result.is_error is True and texts == [f"Unknown tool: '{name}'"]


@pytest.mark.parametrize(
    ("env", "flags", "expected", "narrowed_by"),
    [
        ({"NEXUS_MCP_READ_ONLY": "true"}, (), ALL_TOOLS - WRITE_TOOLS, ["read_only"]),
        ({}, ("--read-only",), ALL_TOOLS - WRITE_TOOLS, ["read_only"]),
        ({}, ("--profile", "minimal"), PROFILES["minimal"], ["profile"]),
        ({"NEXUS_MCP_PROFILE": "minimal"}, (), PROFILES["minimal"], ["profile"]),
        ({}, ("--role", "viewer"), VIEWER_TOOLS, ["role"]),
        ({"NEXUS_MCP_ROLE": "superuser"}, (), VIEWER_TOOLS, ["role"]),  # unknown: viewer
    ],
    ids=["env-read-only", "flag-read-only", "flag-profile", "env-profile", "flag-role",
         "env-unknown-role"],
)  # fmt: skip
async def test_dev_launch_settings_without_a_subject_narrow_what_a_stdio_caller_sees_and_does(
    workspace: Path,
    tmp_path: Path,
    env: dict[str, str],
    flags: tuple[str, ...],
    expected: frozenset[str],
    narrowed_by: list[str],
) -> None:
    before = snapshot(workspace)
    errlog_path = tmp_path / "stderr.log"
    base = ("--mode", "dev", "--workspace", str(workspace), "--data-dir", str(tmp_path / "d"))
    with errlog_path.open("w") as errlog:
        async with (
            stdio_client(stdio_params(*base, *flags, env=env), errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
            written = await session.call_tool("nexus_write_file", WRITE_ARGS)
            deleted = await session.call_tool(
                "nexus_delete_file", {"path": "todo.txt", "idempotency_key": "launch-del"}
            )
            read_back = await session.call_tool("nexus_read_file", {"path": "todo.txt"})
    assert names == expected
    assert unknown_tool(written, "nexus_write_file")
    assert unknown_tool(deleted, "nexus_delete_file")
    assert read_back.is_error is False
    assert snapshot(workspace) == before
    [line] = logged(errlog_path.read_text(), "effective_principal")
    assert (line["transport"], line["source"], line["subject"]) == ("stdio", "dev-default", "dev")
    assert line["narrowed_by"] == narrowed_by


@pytest.mark.parametrize(
    ("env", "flags", "setting"),
    [
        ({"NEXUS_MCP_READ_ONLY": "true"}, (), "NEXUS_MCP_READ_ONLY"),
        ({}, ("--read-only",), "NEXUS_MCP_READ_ONLY"),
        ({}, ("--profile", "minimal"), "NEXUS_MCP_PROFILE"),
        ({}, ("--role", "viewer"), "NEXUS_MCP_ROLE"),
        ({"NEXUS_MCP_SCOPES": "notes:read"}, (), "NEXUS_MCP_SCOPES"),
        ({}, ("--vault-id", "v1"), "NEXUS_MCP_VAULT_ID"),
        ({"NEXUS_MCP_CANISTER_USER_ID": "c1"}, (), "NEXUS_MCP_CANISTER_USER_ID"),
        ({}, ("--config", "role: viewer\n"), "NEXUS_MCP_ROLE"),  # from the YAML file
    ],
    ids=["env-read-only", "flag-read-only", "flag-profile", "flag-role", "env-scopes",
         "flag-vault", "env-canister-user", "yaml-role"],
)  # fmt: skip
def test_prod_refuses_to_start_with_launch_settings_but_no_subject(
    tmp_path: Path, env: dict[str, str], flags: tuple[str, ...], setting: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    data = tmp_path / "data"
    if flags[:1] == ("--config",):
        config = tmp_path / "nexus.yaml"
        config.write_text(flags[1], encoding="utf-8")
        flags = ("--config", str(config))
    done = subprocess.run(
        serve_command("--transport", "stdio", "--mode", "prod", "--workspace", str(workspace),
                      "--data-dir", str(data), *flags),
        env=server_env(env), stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG_ERROR
    assert done.stdout == b""  # nothing reached the protocol channel
    [line] = done.stderr.decode().splitlines()
    assert line.startswith("nexus-mcp: ")
    assert setting in line and "NEXUS_MCP_SUBJECT" in line
    assert not data.exists()  # refused before any state was created


@pytest.mark.parametrize(
    ("env", "flags", "setting"),
    [
        ({}, ("--role", "admin"), "NEXUS_MCP_ROLE"),
        ({"NEXUS_MCP_ROLE": "editor"}, (), "NEXUS_MCP_ROLE"),
        ({}, ("--role", "evaluator"), "NEXUS_MCP_ROLE"),
        ({}, ("--profile", "full"), "NEXUS_MCP_PROFILE"),
        ({"NEXUS_MCP_PROFILE": "coding"}, (), "NEXUS_MCP_PROFILE"),
        ({}, ("--read-only", "--profile", "full"), "NEXUS_MCP_PROFILE"),
        ({}, ("--profile", "no-such-profile"), "NEXUS_MCP_PROFILE"),
        ({"NEXUS_MCP_SCOPES": "admin"}, (), "NEXUS_MCP_SCOPES"),
    ],
    ids=["flag-admin", "env-editor", "flag-evaluator", "flag-full", "env-coding",
         "read-only-with-full", "unknown-profile", "env-scopes"],
)  # fmt: skip
def test_dev_launch_settings_never_widen_a_dev_principal_configured_narrower(
    workspace: Path, tmp_path: Path, env: dict[str, str], flags: tuple[str, ...], setting: str
) -> None:
    config = tmp_path / "nexus.yaml"
    config.write_text(NARROW_DEV_CONFIG, encoding="utf-8")
    before = snapshot(workspace)
    done = subprocess.run(
        serve_command("--transport", "stdio", "--mode", "dev", "--config", str(config),
                      "--workspace", str(workspace), "--data-dir", str(tmp_path / "d"), *flags),
        env=server_env(env), stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG_ERROR
    assert done.stdout == b""
    stderr = done.stderr.decode()
    assert "Traceback" not in stderr
    [refusal] = [ln for ln in stderr.splitlines() if ln.startswith("nexus-mcp: ")]
    assert setting in refusal
    assert logged(stderr, "effective_principal") == []  # it never got as far as serving
    assert snapshot(workspace) == before


async def test_a_dev_principal_configured_narrower_still_takes_a_narrowing(
    workspace: Path, tmp_path: Path
) -> None:
    """The control for the refusals above: the same file with a narrowing starts and applies it."""
    config = tmp_path / "nexus.yaml"
    config.write_text(NARROW_DEV_CONFIG, encoding="utf-8")
    flags = ("--mode", "dev", "--config", str(config), "--workspace", str(workspace),
             "--data-dir", str(tmp_path / "d"), "--role", "viewer", "--read-only")  # fmt: skip
    async with (
        stdio_client(stdio_params(*flags)) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
    assert names == PROFILES["minimal"] - WRITE_TOOLS


async def test_prod_stdio_logs_its_principal_with_a_secret_looking_subject_hashed(
    workspace: Path, tmp_path: Path
) -> None:
    subject = "sk-live-0123456789abcdef0123456789"
    env = {"NEXUS_MCP_SUBJECT": subject, "NEXUS_MCP_ROLE": "editor", "NEXUS_MCP_MODE": "prod"}
    errlog_path = tmp_path / "stderr.log"
    flags = ("--workspace", str(workspace), "--data-dir", str(tmp_path / "d"), "--read-only")
    with errlog_path.open("w") as errlog:
        async with (
            stdio_client(stdio_params(*flags, env=env), errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
    assert names == PROFILES[role_profiles()["editor"]] - WRITE_TOOLS
    stderr = errlog_path.read_text()
    assert subject not in stderr
    [line] = logged(stderr, "effective_principal")
    assert line["subject"].startswith("sha256:")
    assert (line["source"], line["role"], line["read_only"]) == ("env", "editor", True)


def bearer(**claims: Any) -> str:
    now = int(time.time())
    body = {"sub": "carol", "aud": AUDIENCE, "iat": now, "exp": now + 300, **claims}
    return jwt.encode(body, SECRET, algorithm="HS256")


async def list_and_write(url: str, headers: dict[str, str]) -> tuple[set[str], Any]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=10) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
        result = await session.call_tool("nexus_write_file", WRITE_ARGS)
    return names, result


async def test_dev_http_without_tokens_serves_callers_as_the_narrowed_dev_principal(
    workspace: Path, tmp_path: Path
) -> None:
    before = snapshot(workspace)
    port = free_port()
    args = ["--mode", "dev", "--workspace", str(workspace), "--data-dir", str(tmp_path / "d"),
            "--read-only"]  # fmt: skip
    with http_server(args, {}, port=port) as proc:
        names, result = await list_and_write(f"http://127.0.0.1:{port}", {})
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert names == ALL_TOOLS - WRITE_TOOLS
    assert unknown_tool(result, "nexus_write_file")
    assert snapshot(workspace) == before
    [line] = logged(stderr.decode(), "effective_principal")
    assert (line["transport"], line["tokens_decide"], line["source"]) == (
        "http",
        False,
        "dev-default",
    )
    assert (line["read_only"], line["narrowed_by"]) == (True, ["read_only"])


async def test_prod_http_says_launch_settings_do_not_apply_because_tokens_decide(
    workspace: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        "NEXUS_MCP_MODE": "prod",
        "NEXUS_MCP_AUTH__JWT_SECRET": SECRET,
        "NEXUS_MCP_AUTH__AUDIENCE": AUDIENCE,
        "NEXUS_MCP_READ_ONLY": "true",
        "NEXUS_MCP_ROLE": "viewer",
    }
    token = bearer(role="editor")
    args = ["--workspace", str(workspace), "--data-dir", str(tmp_path / "d")]
    with http_server(args, env, port=port) as proc:
        names, result = await list_and_write(
            f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
        )
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    # The token decides: an editor token sees and reaches the write tools whatever the
    # launch settings say (prod's default write policy then refuses the write itself).
    assert names == PROFILES[role_profiles()["editor"]]
    assert not unknown_tool(result, "nexus_write_file")
    assert result.is_error is True and result.structured_content is None
    assert json.loads(result.content[0].text)["code"] == "WRITE_POLICY_DENIED"
    text = stderr.decode()
    assert token not in text and SECRET not in text
    [line] = logged(text, "effective_principal")
    assert line == {**line, "transport": "http", "source": "token", "tokens_decide": True}
    [warning] = logged(text, "launch_settings_ignored")
    assert (warning["level"], warning["settings"]) == ("warning", ["role", "read_only"])
