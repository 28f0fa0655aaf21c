"""``nexus-mcp console`` beside a stdio server: the same inbox, from the data dir.

A stdio server's agent (the in-process server on a data dir, as a desktop client would
launch it) sends a write that waits; ``nexus-mcp console`` (a real subprocess on the same
data dir and configuration) prints a one-time link, serves the console on loopback, and
the approver's decision there lets the agent's retry run once.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml
from fastmcp import Client

from nexus_mcp.observability.audit import read_audit_file
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .servers import server_env

pytestmark = pytest.mark.slow

SECRET = "console-standalone-approval-secret-0123456789"
POLICY = {
    "workspace": {
        "allowed_paths": ["scratch/**"],
        "allowed_operations": ["write"],
        "require_approval": True,
    }
}
WRITE = {"path": "scratch/a.md", "content": "approved from the console\n", "idempotency_key": "k"}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "nexus.yaml"
    path.write_text(yaml.safe_dump({"write_policies": POLICY}), encoding="utf-8")
    return path


@pytest.fixture
def stdio_server(workspace: Path, tmp_path: Path, config: Path) -> Iterator[NexusServer]:
    (workspace / "scratch").mkdir(exist_ok=True)
    built = build_server(
        Settings(
            mode="prod",
            subject="agent-9",
            role="editor",
            workspace=workspace,
            data_dir=tmp_path / "data",
        ),
        config_file=config,
        env={"NEXUS_MCP_APPROVAL_SECRET": SECRET},
    )
    yield built
    built.close()


def console_process(tmp_path: Path, config: Path, *extra: str) -> subprocess.Popen[str]:
    env = server_env({"NEXUS_MCP_APPROVAL_SECRET": SECRET})
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nexus_mcp",
            "console",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--config",
            str(config),
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_link(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+/console/login\?t=\S+)", line)
        if found:
            return found.group(1)
        assert line or process.poll() is None, "the console exited before printing a link"
    raise AssertionError("no login link printed")


async def call(client: Client[Any]) -> dict[str, Any]:
    result = await client.call_tool_mcp("nexus_write_file", dict(WRITE))
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


async def test_a_stdio_agents_write_is_approved_in_the_console_beside_it(
    stdio_server: NexusServer, workspace: Path, tmp_path: Path, config: Path
) -> None:
    async with Client(stdio_server.mcp) as agent:
        first = await call(agent)
        request_id = first["_meta"]["nexus.mcp/approval_request_id"]
        process = console_process(tmp_path, config)
        try:
            link = read_link(process)
            base = link.split("/console/")[0]
            token = parse_qs(urlsplit(link).query)["t"][0]
            async with httpx.AsyncClient(base_url=base, timeout=30) as browser:
                assert (
                    await browser.post(
                        "/console/login", data={"t": token}, headers={"Origin": base}
                    )
                ).status_code == 303
                inbox = (await browser.get("/console/inbox")).text
                assert request_id in inbox and "beside a stdio server" in inbox
                csrf = re.search(r'name="csrf" value="([^"]+)"', inbox)
                assert csrf is not None
                # Only loopback names reach it (no DNS rebinding through another name).
                rebound = await browser.get("/console/inbox", headers={"Host": "evil.example"})
                assert rebound.status_code == 400
                decided = await browser.post(
                    f"/console/inbox/{request_id}",
                    data={"decision": "approve", "csrf": csrf.group(1)},
                    headers={"Origin": base},
                )
                assert decided.status_code == 303
        finally:
            process.terminate()
            process.communicate(timeout=30)
        second = await call(agent)
    assert second.get("isError") is not True, second
    assert (workspace / "scratch" / "a.md").read_text(encoding="utf-8") == WRITE["content"]
    records = [r for _, r, _ in read_audit_file(tmp_path / "data" / "audit.jsonl") if r]
    decided_records = [r for r in records if r.get("event") == "approval_decided"]
    assert [(r["outcome"], r["transport"], r["host_id"]) for r in decided_records] == [
        ("APPROVED", "console", "console:standalone")
    ]
    assert {r.get("event") for r in records} >= {"console_signed_in", "approval_decided"}


def test_a_link_for_a_running_server_needs_its_data_dir(tmp_path: Path, config: Path) -> None:
    env = server_env({})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nexus_mcp",
            "console",
            "--link",
            "--url",
            "http://127.0.0.1:9999",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"http://127\.0\.0\.1:9999/console/login\?t=\S+\n", done.stdout)
    key = tmp_path / "data" / "console.key"
    assert key.exists() and (key.stat().st_mode & 0o777) == 0o600
    bad = subprocess.run(
        [sys.executable, "-m", "nexus_mcp", "console", "--link", "--url", "javascript:x"],
        env={**env, "NEXUS_MCP_DATA_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "javascript" not in bad.stderr
