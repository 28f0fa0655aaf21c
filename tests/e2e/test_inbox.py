"""The approvals inbox (issue 26, first part): a write waits for a person, then runs once.

A write the policy sends to approval, sent without a token, opens an approval request on
the state backend and is refused ``APPROVAL_REQUIRED`` naming the request (in ``_meta``
too), never the arguments. An approver reads the preview (the file's diff) with
``nexus-mcp approvals show`` and approves or denies with ``approve``/``deny``, a real
subprocess on the same data dir; the agent's retry with the same arguments runs once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastmcp import Client

from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer, build_server
from nexus_mcp.settings import Settings

from .conftest import snapshot, wire
from .servers import server_env

SECRET = "inbox-approval-secret-0123456789abcdef-0123"
META_REQUEST = "nexus.mcp/approval_request_id"
POLICY = {
    "workspace": {
        "allowed_paths": ["scratch/**"],
        "allowed_operations": ["write", "edit", "delete"],
        "require_approval": True,
    }
}
SECRET_LINE = "password = hunter2-CANARY"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "nexus.yaml"
    path.write_text(yaml.safe_dump({"write_policies": POLICY}), encoding="utf-8")
    return path


@pytest.fixture
def server(workspace: Path, data_dir: Path, config: Path) -> Iterator[NexusServer]:
    (workspace / "scratch").mkdir(exist_ok=True)
    (workspace / "scratch" / "plan.md").write_text("line one\nline two\n", encoding="utf-8")
    built = build_server(
        Settings(
            mode="prod",
            subject="agent-7",
            role="editor",
            workspace=workspace,
            data_dir=data_dir,
        ),
        config_file=config,
        audit_sinks=[MemoryAuditSink()],
        env={"NEXUS_MCP_APPROVAL_SECRET": SECRET},
    )
    yield built
    built.close()


def cli(*argv: str, data_dir: Path, config: Path) -> subprocess.CompletedProcess[str]:
    env = server_env({"NEXUS_MCP_APPROVAL_SECRET": SECRET})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nexus_mcp",
            "approvals",
            *argv,
            "--data-dir",
            str(data_dir),
            "--config",
            str(config),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def call(client: Client[Any], tool: str, args: Mapping[str, Any]) -> dict[str, Any]:
    return wire(await client.call_tool_mcp(tool, dict(args)))


def refusal(result: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    assert result["isError"] is True, result
    payload = json.loads(result["content"][0]["text"])
    assert set(payload) == {"error", "code"}
    meta = result.get("_meta") or {}
    return payload, meta.get(META_REQUEST)


WRITE = {
    "path": "scratch/plan.md",
    "content": "line one\nline 2, approved\n" + SECRET_LINE,
    "idempotency_key": "k-0",
}


async def test_a_write_waits_in_the_inbox_and_runs_once_after_approval(
    server: NexusServer, workspace: Path, data_dir: Path, config: Path
) -> None:
    before = snapshot(workspace)
    async with Client(server.mcp) as client:
        first = await call(client, "nexus_write_file", {**WRITE, "idempotency_key": "k-1"})
        payload, request_id = refusal(first)
        assert payload["code"] == "APPROVAL_REQUIRED"
        assert request_id is not None and request_id in payload["error"]
        assert "hunter2" not in json.dumps(first) and "line 2" not in payload["error"]
        assert snapshot(workspace) == before
        # Asking again before a decision: the same request, nothing new in the inbox.
        again = await call(client, "nexus_write_file", {**WRITE, "idempotency_key": "k-2"})
        assert refusal(again)[1] == request_id

        pending = cli("pending", "--json", data_dir=data_dir, config=config)
        assert pending.returncode == 0, pending.stderr
        rows = [json.loads(line) for line in pending.stdout.splitlines()]
        assert [row["id"] for row in rows] == [request_id]
        assert rows[0]["tool"] == "nexus_write_file" and rows[0]["caller"] == "agent-7"
        assert rows[0]["target"] == "scratch/plan.md"

        shown = cli("show", request_id, data_dir=data_dir, config=config)
        assert shown.returncode == 0, shown.stderr
        assert "-line two" in shown.stdout and "+line 2, approved" in shown.stdout
        assert "status    pending" in shown.stdout

        approved = cli(
            "approve", request_id, "--approver", "ops-lead", data_dir=data_dir, config=config
        )
        assert approved.returncode == 0, approved.stderr
        assert snapshot(workspace) == before  # approving runs nothing by itself

        # Changed arguments are another call: not approved.
        changed = await call(
            client, "nexus_write_file", {**WRITE, "content": "other", "idempotency_key": "k-3"}
        )
        _, other_id = refusal(changed)
        assert other_id is not None and other_id != request_id

        done = await call(client, "nexus_write_file", {**WRITE, "idempotency_key": "k-4"})
        assert done["isError"] is False, done
        assert (workspace / "scratch/plan.md").read_text() == WRITE["content"]
        # Once: the next identical call needs a new approval.
        (workspace / "scratch/plan.md").write_text("reset\n")
        once_more = await call(client, "nexus_write_file", {**WRITE, "idempotency_key": "k-5"})
        payload, newest = refusal(once_more)
        assert payload["code"] == "APPROVAL_REQUIRED" and newest not in (None, request_id)
        assert (workspace / "scratch/plan.md").read_text() == "reset\n"
    decided = cli("approve", request_id, data_dir=data_dir, config=config)
    assert decided.returncode == 1 and "decided" in decided.stderr
    audit = (data_dir / "audit.jsonl").read_text().splitlines()
    decision = [json.loads(line) for line in audit if '"approval_decided"' in line]
    assert decision and decision[0]["approver"] == "ops-lead"
    assert decision[0]["outcome"] == "APPROVED" and "hunter2" not in json.dumps(decision)


async def test_a_denied_write_never_runs(
    server: NexusServer, workspace: Path, data_dir: Path, config: Path
) -> None:
    before = snapshot(workspace)
    async with Client(server.mcp) as client:
        _, request_id = refusal(await call(client, "nexus_write_file", dict(WRITE)))
        assert request_id is not None
        denied = cli(
            "deny", request_id, "--reason", "not this week", data_dir=data_dir, config=config
        )
        assert denied.returncode == 0, denied.stderr
        retry = await call(client, "nexus_write_file", dict(WRITE))
        payload, same = refusal(retry)
        assert payload["code"] == "APPROVAL_INVALID" and same == request_id
        assert "not this week" not in payload["error"]
    assert snapshot(workspace) == before
    shown = cli("show", request_id, data_dir=data_dir, config=config)
    assert "status    denied" in shown.stdout and "not this week" in shown.stdout


async def test_an_approver_may_not_approve_their_own_request(
    server: NexusServer, data_dir: Path, config: Path
) -> None:
    async with Client(server.mcp) as client:
        _, request_id = refusal(await call(client, "nexus_write_file", dict(WRITE)))
    assert request_id is not None
    own = cli("approve", request_id, "--approver", "agent-7", data_dir=data_dir, config=config)
    assert own.returncode == 1 and "own request" in own.stderr


async def test_the_preview_is_escaped_for_the_terminal(
    server: NexusServer, data_dir: Path, config: Path
) -> None:
    hostile = {
        "path": "scratch/plan.md",
        "content": "ok\n\x1b]52;c;Y2xpcA==\x07\x1b[2J\u202e",
        "idempotency_key": "k-h",
    }
    async with Client(server.mcp) as client:
        _, request_id = refusal(await call(client, "nexus_write_file", hostile))
    assert request_id is not None
    shown = cli("show", request_id, data_dir=data_dir, config=config)
    assert shown.returncode == 0, shown.stderr
    assert (
        "\x1b" not in shown.stdout and "\u202e" not in shown.stdout and "\x07" not in shown.stdout
    )
    assert "\\x1b" in shown.stdout


def test_unknown_requests_are_refused(data_dir: Path, config: Path, server: NexusServer) -> None:
    for command in ("show", "approve", "deny"):
        done = cli(
            command, "0190c1f0-0000-7000-8000-000000000000", data_dir=data_dir, config=config
        )
        assert done.returncode == 1 and "no such approval request" in done.stderr


async def test_one_caller_cannot_flood_the_inbox(
    server: NexusServer, data_dir: Path, config: Path
) -> None:
    async with Client(server.mcp) as client:
        ids = set()
        for n in range(20):
            write = {"path": f"scratch/f{n}.md", "content": "x", "idempotency_key": f"f{n}"}
            ids.add(refusal(await call(client, "nexus_write_file", write))[1])
        assert len(ids) == 20 and None not in ids
        full = await call(
            client,
            "nexus_write_file",
            {"path": "scratch/f99.md", "content": "x"} | {"idempotency_key": "f99"},
        )
        payload, request_id = refusal(full)
        assert payload["code"] == "APPROVAL_REQUIRED" and request_id is None
        assert "already wait" in payload["error"]
    pending = cli("pending", "--json", data_dir=data_dir, config=config)
    assert len(pending.stdout.splitlines()) == 20


async def test_a_file_that_is_not_text_is_not_shown(
    server: NexusServer, workspace: Path, data_dir: Path, config: Path
) -> None:
    (workspace / "scratch" / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    write = {"path": "scratch/blob.bin", "content": "text now", "idempotency_key": "b"}
    async with Client(server.mcp) as client:
        _, request_id = refusal(await call(client, "nexus_write_file", write))
    assert request_id is not None
    shown = cli("show", request_id, data_dir=data_dir, config=config)
    assert "the file exists but is not shown" in shown.stdout
    assert "/dev/null" not in shown.stdout  # never presented as a new file
