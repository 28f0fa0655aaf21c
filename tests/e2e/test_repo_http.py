"""The repo toolset over a real socket: ``nexus-mcp serve --transport http`` as a subprocess,
a bearer token per caller, the JSONL audit file and the server's log read back.

Proves on the wire what the in-memory tests prove in process: an approved patch lands,
a refused one changes nothing, and no patch body, commit message, branch name or git
output reaches the refusal, the audit file or the log, at DEBUG.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from nexus_mcp.policy.approvals import (
    load_approval_keys,
    load_approval_settings,
    mint_approval_token,
)
from tests.support.git_repos import git, make_patch, make_repo, refs, rev

from .conftest import wire
from .repo_harness import FILES, POLICY, envelope, ok
from .servers import free_port, http_server

pytestmark = pytest.mark.slow

SECRET = "repo-http-approval-secret-0123456789abcdef"
JWT_SECRET = "repo-http-bearer-secret-0123456789abcdef"
CANARY = "CANARY-repo-http-51d2"


def bearer(subject: str) -> str:
    now = int(time.time())
    claims = {
        "sub": subject,
        "aud": "nexus-mcp",
        "iat": now,
        "exp": now + 600,
        "role": "editor",
        "profile": "repo",
    }
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


def mint(tool: str, arguments: dict[str, Any]) -> str:
    section = {"approvals": {"secret": SECRET}}
    return mint_approval_token(
        load_approval_keys({}, section),
        load_approval_settings({}, section),
        approver="bob-approver",
        subject="alice",
        tool=tool,
        arguments=arguments,
        host_id="http-test",
    )


def test_repo_writes_over_http_land_or_refuse_and_leave_no_trace_of_the_patch(
    workspace: Path, tmp_path: Path
) -> None:
    project = make_repo(tmp_path / "roots" / "project", FILES)
    git(project, "branch", "feature/http", "main")
    good = make_patch(project, "main", {"src/app.py": f"# {CANARY} ok\n"}, scratch=tmp_path)
    bad = make_patch(
        project, "main", {".github/workflows/ci.yml": f"# {CANARY} evil\n"}, scratch=tmp_path
    )
    config = {
        "approvals": {"secret": SECRET},
        "repos": {
            "allowed_roots": [str(project.parent)],
            "repositories": {"proj": {"path": str(project), "write_policy": POLICY}},
        },
    }
    path = tmp_path / "nexus.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    audit_file = tmp_path / "audit.jsonl"
    stderr_file = tmp_path / "stderr.log"
    args = [
        "--mode",
        "prod",
        "--config",
        str(path),
        "--workspace",
        str(workspace),
        "--data-dir",
        str(tmp_path / "data"),
        "--log-level",
        "DEBUG",
    ]
    env = {"NEXUS_MCP_AUTH__JWT_SECRET": JWT_SECRET, "NEXUS_MCP_AUDIT_FILE": str(audit_file)}
    apply_good = {
        "repo": "proj",
        "branch": "feature/http",
        "patch": good,
        "message": f"Good {CANARY} message",
        "idempotency_key": "http-good",
    }
    apply_bad = {**apply_good, "patch": bad, "idempotency_key": "http-bad"}
    port = free_port()

    async def session() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        transport = StreamableHttpTransport(
            f"http://127.0.0.1:{port}/mcp", headers={"Authorization": f"Bearer {bearer('alice')}"}
        )
        async with Client(transport) as client:
            refused = wire(
                await client.call_tool_mcp(
                    "apply_patch", {**apply_bad, "approval_token": mint("apply_patch", apply_bad)}
                )
            )
            before = refs(project)
            assert before["refs/heads/feature/http"] == rev(project, "main")
            landed = wire(
                await client.call_tool_mcp(
                    "apply_patch",
                    {**apply_good, "approval_token": mint("apply_patch", apply_good)},
                )
            )
            listed = wire(
                await client.call_tool_mcp(
                    "list_repo_files", {"repo": "proj", "path": "src", "ref": "feature/http"}
                )
            )
        return refused, landed, listed

    with stderr_file.open("wb") as errlog, http_server(args, env, port=port, stderr=errlog):
        refused, landed, listed = asyncio.run(session())
    assert envelope(refused)["code"] == "WRITE_POLICY_DENIED"
    commit = ok(landed)["commit_sha"]
    assert commit == rev(project, "feature/http")
    assert CANARY in git(project, "show", "feature/http:src/app.py")
    assert "src/app.py" in {e["path"] for e in ok(listed)["entries"]}
    # Nothing the caller sent as content reaches the refusal, the audit or the log.
    assert CANARY not in str(refused)
    audit = audit_file.read_text(encoding="utf-8")
    log = stderr_file.read_text(encoding="utf-8", errors="replace")
    assert commit in audit  # target_ref of the write that landed
    for text in (audit, log):
        assert CANARY not in text
        assert "diff --git" not in text
        assert ".github/workflows" not in text
